package ptp

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"

	"github.com/flatnet/flatnet/internal/testutil"
)

var cidr = testutil.CIDR

func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		code       uint
		msg        string
	}{
		{name: "reference example", conf: `{"cniVersion":"1.0.0","name":"mynet","type":"ptp","ipMasq":true,"mtu":1400,
			"ipam":{"type":"host-local","subnet":"10.1.1.0/24"},"dns":{"nameservers":["10.1.1.1"]}}`},
		{name: "not JSON", conf: `{`, code: cnierr.DecodingFailure},
		{name: "bad type", conf: `{"ipMasq":"yes","ipam":{"type":"host-local"}}`, code: cnierr.DecodingFailure},
		{name: "no ipam", conf: `{"name":"n"}`, code: cnierr.InvalidConfig, msg: `"ipam"`},
		{name: "bad mtu", conf: `{"mtu":-5,"ipam":{"type":"host-local"}}`, code: cnierr.InvalidConfig, msg: `"mtu"`},
		{name: "bad backend", conf: `{"ipMasqBackend":"x","ipam":{"type":"host-local"}}`, code: cnierr.InvalidConfig, msg: "ipMasqBackend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.conf))
			if tc.code == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if code, _ := cnierr.Code(err); code != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err = %v (code %d), want code %d mentioning %q", err, code, tc.code, tc.msg)
			}
		})
	}
}

func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"mynet","type":"ptp","ipMasq":true,"mtu":1400,"ipam":{"type":"host-local","subnet":"10.1.1.0/24"}}`,
		`{"ipam":{"type":"x"},"prevResult":{"cniVersion":"1.0.0"}}`, `null`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, conf []byte) {
		n, err := Load(conf)
		if err != nil {
			if _, ok := cnierr.Code(err); !ok {
				t.Errorf("error without a code: %v", err)
			}
			return
		}
		if n.IPAM.Type == "" || n.MTU < 0 {
			t.Errorf("accepted %+v", n)
		}
	})
}

func TestMakePlan(t *testing.T) {
	link := unix.RT_SCOPE_LINK
	ipamRes := &current.Result{
		IPs: []*current.IPConfig{
			{Address: cidr("10.1.0.5/24"), Gateway: net.ParseIP("10.1.0.1")},
			{Address: cidr("fd00:1::5/64")}, // no gateway: the subnet's first address
		},
		Routes: []*types.Route{{Dst: cidr("0.0.0.0/0")}, {Dst: cidr("10.9.0.0/16"), GW: net.ParseIP("10.1.0.254")}},
		DNS:    types.DNS{Nameservers: []string{"10.1.0.53"}},
	}
	p, err := makePlan(&NetConf{}, ipamRes, 1)
	if err != nil {
		t.Fatal(err)
	}
	v4gw, v6gw := net.ParseIP("10.1.0.1").To4(), net.ParseIP("fd00:1::1")
	want := &plan{
		ContIPs: []*current.IPConfig{
			{Interface: current.Int(0), Address: cidr("10.1.0.5/32")},
			{Interface: current.Int(0), Address: cidr("fd00:1::5/128")},
		},
		ContRoutes: []*types.Route{
			{Dst: cidr("10.1.0.1/32"), Scope: &link},
			{Dst: cidr("fd00:1::1/128"), Scope: &link},
			{Dst: cidr("10.1.0.0/24"), GW: v4gw},
			{Dst: cidr("fd00:1::/64"), GW: v6gw},
			{Dst: cidr("0.0.0.0/0"), GW: v4gw},
			{Dst: cidr("10.9.0.0/16"), GW: net.ParseIP("10.1.0.254")},
		},
		HostAddrs:  []net.IPNet{cidr("10.1.0.1/32"), cidr("fd00:1::1/128")},
		HostRoutes: []net.IPNet{cidr("10.1.0.5/32"), cidr("fd00:1::5/128")},
		Forward4:   true, Forward6: true,
		Masq: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("fd00:1::5/64")},
		IPs: []*current.IPConfig{
			{Interface: current.Int(1), Address: cidr("10.1.0.5/32"), Gateway: v4gw},
			{Interface: current.Int(1), Address: cidr("fd00:1::5/128"), Gateway: v6gw},
		},
		Routes: ipamRes.Routes,
		DNS:    ipamRes.DNS,
	}
	opts := []cmp.Option{cmp.AllowUnexported(plan{}), cmp.Comparer(func(a, b net.IP) bool { return a.Equal(b) }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
	if d := cmp.Diff(want, p, opts...); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
	// The IPAM result is not modified.
	if ipamRes.Routes[0].GW != nil || ipamRes.IPs[1].Gateway != nil {
		t.Error("makePlan modified the IPAM result")
	}

	// Two ranges with one gateway: one host address, one link route.
	two := &current.Result{IPs: []*current.IPConfig{
		{Address: cidr("10.1.0.5/24"), Gateway: net.ParseIP("10.1.0.1")},
		{Address: cidr("10.1.0.6/24"), Gateway: net.ParseIP("10.1.0.1")},
	}}
	if p, err := makePlan(&NetConf{}, two, 1); err != nil || len(p.HostAddrs) != 1 || len(p.HostRoutes) != 2 {
		t.Errorf("two addresses: %+v, %v", p, err)
	}
	for name, bad := range map[string]*current.Result{
		"no IPs":            {},
		"gateway is the IP": {IPs: []*current.IPConfig{{Address: cidr("10.1.0.1/24"), Gateway: net.ParseIP("10.1.0.1")}}},
		"mixed families":    {IPs: []*current.IPConfig{{Address: cidr("10.1.0.5/24"), Gateway: net.ParseIP("fd00::1")}}},
		"route without family gateway": {IPs: []*current.IPConfig{{Address: cidr("10.1.0.5/24")}},
			Routes: []*types.Route{{Dst: cidr("::/0")}}},
	} {
		if _, err := makePlan(&NetConf{}, bad, 1); err == nil {
			t.Errorf("%s: no error", name)
		} else if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig {
			t.Errorf("%s: code %d", name, code)
		}
	}
}

func TestCompare(t *testing.T) {
	want := &current.Interface{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: "/ns"}
	ips := []*current.IPConfig{{Address: cidr("10.1.0.5/32"), Gateway: net.ParseIP("10.1.0.1")}}
	routes := []*types.Route{{Dst: cidr("0.0.0.0/0")}}
	gw32 := cidr("10.1.0.1/32")
	pod32 := cidr("10.1.0.5/32")
	cont := &linkState{found: true, isVeth: true, mac: "02:00:00:00:00:01", addrs: []net.IPNet{cidr("10.1.0.5/32")},
		routes: []netlink.Route{{Family: netlink.FAMILY_V4, Dst: &gw32}, {Family: netlink.FAMILY_V4, Gw: net.ParseIP("10.1.0.1")}}}
	host := &linkState{found: true, name: "vethX", addrs: []net.IPNet{gw32}, routes: []netlink.Route{{Family: netlink.FAMILY_V4, Dst: &pod32}}}
	if p := compare("eth0", "/ns", want, ips, routes, cont, host); len(p) != 0 {
		t.Errorf("good state: %v", p)
	}
	p := strings.Join(compare("eth0", "/ns", want, ips, routes, &linkState{found: true, mac: "x"}, &linkState{name: "vethX"}), "\n")
	for _, s := range []string{"not a veth", "has MAC x", "lacks address 10.1.0.5/32", "link route to gateway", "lacks gateway address", "no route to 10.1.0.5", "lacks route 0.0.0.0/0"} {
		if !strings.Contains(p, s) {
			t.Errorf("problems %q lack %q", p, s)
		}
	}
	if p := compare("eth0", "/ns", want, ips, routes, cont, nil); len(p) != 1 || !strings.Contains(p[0], "host end") {
		t.Errorf("missing host end: %v", p)
	}
}
