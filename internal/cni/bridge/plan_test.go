package bridge

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"

	"github.com/flatnet/flatnet/internal/testutil"
)

var cidr = testutil.CIDR

func ipnet(s string) *net.IPNet { n := cidr(s); return &n }

func TestPlanAddrs(t *testing.T) {
	ipamRes := func() *current.Result {
		return &current.Result{
			IPs: []*current.IPConfig{
				{Address: cidr("10.10.0.5/16")},
				{Address: cidr("fd00:10::5/64"), Gateway: net.ParseIP("fd00:10::fe")},
			},
			Routes: []*types.Route{{Dst: cidr("10.20.0.0/16")}},
			DNS:    types.DNS{Nameservers: []string{"10.10.0.53"}},
		}
	}
	t.Run("gateway and default gateway", func(t *testing.T) {
		n := &NetConf{IsGW: true, IsDefaultGW: true}
		p, err := planAddrs(n, ipamRes(), 2)
		if err != nil {
			t.Fatal(err)
		}
		want := &addrPlan{
			IPs: []*current.IPConfig{
				{Interface: current.Int(2), Address: cidr("10.10.0.5/16"), Gateway: net.ParseIP("10.10.0.1").To4()},
				{Interface: current.Int(2), Address: cidr("fd00:10::5/64"), Gateway: net.ParseIP("fd00:10::fe")},
			},
			Routes: []*types.Route{
				{Dst: cidr("10.20.0.0/16")},
				{Dst: cidr("0.0.0.0/0"), GW: net.ParseIP("10.10.0.1").To4()},
				{Dst: cidr("::/0"), GW: net.ParseIP("fd00:10::fe")},
			},
			DNS:      types.DNS{Nameservers: []string{"10.10.0.53"}},
			Gateways: []net.IPNet{{IP: net.ParseIP("10.10.0.1").To4(), Mask: net.CIDRMask(16, 32)}, {IP: net.ParseIP("fd00:10::fe"), Mask: net.CIDRMask(64, 128)}},
			Forward4: true, Forward6: true,
			Masq: []netip.Prefix{netip.MustParsePrefix("10.10.0.5/16"), netip.MustParsePrefix("fd00:10::5/64")},
		}
		if d := cmp.Diff(want, p, cmp.AllowUnexported(addrPlan{}), cmp.Comparer(func(a, b net.IP) bool { return a.Equal(b) }),
			cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
			t.Errorf("plan (-want +got):\n%s", d)
		}
	})
	t.Run("no gateway", func(t *testing.T) {
		p, err := planAddrs(&NetConf{}, ipamRes(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.IPs[0].Gateway != nil || len(p.Gateways) != 0 || p.Forward4 || len(p.Routes) != 1 {
			t.Errorf("plan = %+v", p)
		}
	})
	t.Run("IPAM default route with gateway wins", func(t *testing.T) {
		r := ipamRes()
		r.Routes = append(r.Routes, &types.Route{Dst: cidr("0.0.0.0/0"), GW: net.ParseIP("10.10.0.254")})
		p, err := planAddrs(&NetConf{IsGW: true, IsDefaultGW: true}, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		defaults := 0
		for _, rt := range p.Routes {
			if isDefault(rt.Dst) && rt.Dst.IP.To4() != nil {
				defaults++
			}
		}
		if defaults != 1 {
			t.Errorf("%d IPv4 default routes: %v", defaults, p.Routes)
		}
	})
	t.Run("config DNS wins", func(t *testing.T) {
		p, _ := planAddrs(&NetConf{NetConf: types.NetConf{DNS: types.DNS{Domain: "x"}}}, ipamRes(), 2)
		if p.DNS.Domain != "x" || p.DNS.Nameservers != nil {
			t.Errorf("DNS = %+v", p.DNS)
		}
	})
	t.Run("does not modify the IPAM result", func(t *testing.T) {
		r := ipamRes()
		_, _ = planAddrs(&NetConf{IsGW: true, IsDefaultGW: true}, r, 2)
		if d := cmp.Diff(ipamRes(), r); d != "" {
			t.Errorf("IPAM result changed:\n%s", d)
		}
	})
	t.Run("no IPs", func(t *testing.T) {
		_, err := planAddrs(&NetConf{}, &current.Result{}, 2)
		if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig {
			t.Errorf("err = %v", err)
		}
	})
}

func TestGatewayOps(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing []string
		want     string
		force    bool
		del      []string
		add      bool
		err      string
	}{
		{name: "empty", want: "10.0.0.1/24", add: true},
		{name: "present", existing: []string{"10.0.0.1/24"}, want: "10.0.0.1/24"},
		{name: "other v4 refused", existing: []string{"10.9.0.1/24"}, want: "10.0.0.1/24", err: "forceAddress"},
		{name: "other v4 forced", existing: []string{"10.9.0.1/24", "10.0.0.1/24"}, want: "10.0.0.1/24", force: true, del: []string{"10.9.0.1/24"}},
		{name: "v6 disjoint subnets coexist", existing: []string{"fd00:1::1/64", "fe80::1/64"}, want: "fd00:2::1/64", add: true},
		{name: "v6 overlapping refused", existing: []string{"fd00:1::2/64"}, want: "fd00:1::1/64", err: "already has address"},
		{name: "v6 overlapping forced", existing: []string{"fd00:1::2/64"}, want: "fd00:1::1/64", force: true, del: []string{"fd00:1::2/64"}, add: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ex []net.IPNet
			for _, e := range tc.existing {
				ex = append(ex, cidr(e))
			}
			del, add, err := gatewayOps("br0", ex, cidr(tc.want), tc.force)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig {
					t.Errorf("code = %d", code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range del {
				got = append(got, d.String())
			}
			if d := cmp.Diff(tc.del, got); d != "" || add != tc.add {
				t.Errorf("del (-want +got):\n%s add=%v want %v", d, add, tc.add)
			}
		})
	}
}

func TestAssemble(t *testing.T) {
	prev := &current.Result{
		Interfaces: []*current.Interface{{Name: "lo", Sandbox: "/ns"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: cidr("127.0.0.1/8")}},
		DNS:        types.DNS{Domain: "prev"},
	}
	ifaces := []*current.Interface{{Name: "br"}, {Name: "veth"}, {Name: "eth0", Sandbox: "/ns"}}
	p := &addrPlan{IPs: []*current.IPConfig{{Interface: current.Int(3), Address: cidr("10.0.0.2/24")}}}
	r := assemble(prev, ifaces, p)
	if len(r.Interfaces) != 4 || r.Interfaces[3].Name != "eth0" || len(r.IPs) != 2 || *r.IPs[1].Interface != 3 || r.DNS.Domain != "prev" {
		t.Errorf("assemble = %+v", r)
	}
	if r := assemble(nil, ifaces, nil); len(r.Interfaces) != 3 || len(r.IPs) != 0 {
		t.Errorf("L2 assemble = %+v", r)
	}
}

func TestCompareContainer(t *testing.T) {
	want := &current.Interface{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: "/run/netns/x"}
	ips := []*current.IPConfig{{Address: cidr("10.0.0.2/24")}}
	routes := []*types.Route{{Dst: cidr("0.0.0.0/0"), GW: net.ParseIP("10.0.0.1")}, {Dst: cidr("10.9.0.0/16")}}
	good := &containerState{
		found: true, isVeth: true, mac: "02:00:00:00:00:01",
		addrs: []net.IPNet{cidr("10.0.0.2/24"), cidr("fe80::1/64")},
		routes: []netlink.Route{
			{Family: netlink.FAMILY_V4, Gw: net.ParseIP("10.0.0.1")},
			{Family: netlink.FAMILY_V4, Dst: ipnet("10.9.0.0/16"), Gw: net.ParseIP("10.0.0.1")},
		},
	}
	if p := compareContainer("eth0", want, ips, routes, good); len(p) != 0 {
		t.Errorf("good state: %v", p)
	}
	bad := &containerState{found: true, mac: "02:00:00:00:00:09", routes: []netlink.Route{{Family: netlink.FAMILY_V4, Gw: net.ParseIP("10.0.0.9")}}}
	p := compareContainer("eth0", want, ips, routes, bad)
	joined := strings.Join(p, "\n")
	for _, s := range []string{"not a veth", "has MAC 02:00:00:00:00:09", "lacks address 10.0.0.2/24", "lacks route 0.0.0.0/0 via 10.0.0.1", "lacks route 10.9.0.0/16"} {
		if !strings.Contains(joined, s) {
			t.Errorf("problems %q lack %q", joined, s)
		}
	}
	if p := compareContainer("eth0", want, ips, routes, &containerState{}); len(p) != 1 || !strings.Contains(p[0], "missing") {
		t.Errorf("missing interface: %v", p)
	}
}

func TestMasqAddrs(t *testing.T) {
	link := []netlink.Addr{{IPNet: ipnet("10.0.0.2/24")}, {IPNet: ipnet("fe80::1/64")}}
	prev := &current.Result{IPs: []*current.IPConfig{{Address: cidr("10.0.0.2/24")}, {Address: cidr("fd00::2/64")}}}
	got := masqAddrs(link, prev)
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24"), netip.MustParsePrefix("fd00::2/64")}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("masqAddrs (-want +got):\n%s", d)
	}
	if got := masqAddrs(nil, nil); got != nil {
		t.Errorf("masqAddrs(nil, nil) = %v", got)
	}
}
