package ifconf

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var cidr = testutil.CIDR

func TestNetlinkRoute(t *testing.T) {
	gw4, gw6 := net.ParseIP("10.1.0.1"), net.ParseIP("fd00:1::1")
	link, host, site := int(netlink.SCOPE_LINK), int(netlink.SCOPE_HOST), int(netlink.SCOPE_SITE)
	for _, tc := range []struct {
		name  string
		route types.Route
		gw    string
	}{
		{"no gateway: the family's", types.Route{Dst: cidr("0.0.0.0/0")}, "10.1.0.1"},
		{"no gateway, IPv6", types.Route{Dst: cidr("::/0")}, "fd00:1::1"},
		{"own gateway", types.Route{Dst: cidr("10.9.0.0/16"), GW: net.ParseIP("10.1.0.254")}, "10.1.0.254"},
		{"link scope: on-link", types.Route{Dst: cidr("10.1.0.1/32"), Scope: &link}, "<nil>"},
		{"host scope: on-link", types.Route{Dst: cidr("10.1.0.1/32"), Scope: &host}, "<nil>"},
		{"site scope: the family's", types.Route{Dst: cidr("10.8.0.0/16"), Scope: &site}, "10.1.0.1"},
	} {
		r := netlinkRoute(7, &tc.route, gw4, gw6)
		if r.Gw.String() != tc.gw || r.LinkIndex != 7 || r.Dst.String() != tc.route.Dst.String() {
			t.Errorf("%s: route %+v, want gateway %s", tc.name, r, tc.gw)
		}
		if tc.route.Scope != nil && int(r.Scope) != *tc.route.Scope {
			t.Errorf("%s: scope %v", tc.name, r.Scope)
		}
	}
	if r := netlinkRoute(7, &types.Route{Dst: cidr("0.0.0.0/0")}, nil, gw6); r.Gw != nil {
		t.Errorf("no IPv4 gateway: route %+v", r)
	}
}

// TestRootConfigure applies a ptp-shaped result (a /32 address, a link
// route to the gateway, routes through it) in a test namespace.
func TestRootConfigure(t *testing.T) {
	ns := testutil.NewNetNS(t)
	testutil.RequireFreeRange(t, "10.233.0.0/24")
	testutil.Run(t, "ip", "-n", testutil.NSName(ns), "link", "add", "fni0", "type", "veth", "peer", "name", "fni1")
	link := int(netlink.SCOPE_LINK)
	res := &current.Result{
		Interfaces: []*current.Interface{{Name: "fni0"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: net.IPNet{IP: net.ParseIP("10.233.0.5"), Mask: net.CIDRMask(32, 32)}, Gateway: net.ParseIP("10.233.0.1")}},
		Routes: []*types.Route{
			{Dst: cidr("10.233.0.1/32"), Scope: &link},
			{Dst: cidr("10.233.0.0/24")},
		},
	}
	var routes []string
	err := netns.Do(ns, func() error {
		for range 2 { // twice: idempotent
			if err := Configure("fni0", res); err != nil {
				return err
			}
		}
		l, err := netlinkx.LinkByName("fni0")
		if err != nil {
			return err
		}
		rs, err := netlinkx.RouteList(l, netlink.FAMILY_V4)
		for _, r := range rs {
			routes = append(routes, strings.TrimSpace(r.Dst.String()+" via "+r.Gw.String()+" "+r.Scope.String()))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(routes)
	want := []string{"10.233.0.0/24 via 10.233.0.1 universe", "10.233.0.1/32 via <nil> link"}
	if !slices.Equal(routes, want) {
		t.Errorf("routes %q, want %q", routes, want)
	}
}
