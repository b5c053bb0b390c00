package macvlan

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func cidr(t testing.TB, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}

func load(t testing.TB, stdin string) *NetConf {
	t.Helper()
	n, err := Load([]byte(stdin), "")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPlanLink(t *testing.T) {
	m := master{Name: "eth1", Index: 7, MTU: 1450}
	n := load(t, `{"cniVersion":"1.1.0","name":"mv","master":"eth1","mode":"private","mtu":1450,"mac":"02:00:00:00:00:09","bcqueuelen":50}`)
	p, err := planLink(n, m, "net1", "fmv00000001")
	if err != nil {
		t.Fatal(err)
	}
	want := linkPlan{TmpName: "fmv00000001", IfName: "net1", ParentIndex: 7, MTU: 1450,
		MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, Mode: netlink.MACVLAN_MODE_PRIVATE, BCQueueLen: 50}
	if d := cmp.Diff(want, p); d != "" {
		t.Errorf("plan (-want +got):\n%s", d)
	}
	l := p.link()
	if l.Name != "fmv00000001" || l.ParentIndex != 7 || l.MTU != 1450 || l.Mode != netlink.MACVLAN_MODE_PRIVATE ||
		l.BCQueueLen != 50 || l.HardwareAddr.String() != "02:00:00:00:00:09" || l.Namespace != nil {
		t.Errorf("netlink link = %+v", l)
	}

	n.MTU = 1451
	_, err = planLink(n, m, "net1", "fmv00000001")
	if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig || !strings.Contains(err.Error(), `master "eth1"'s MTU 1450`) {
		t.Errorf("MTU above the master's: %v (code %d)", err, code)
	}
}

func TestDefaultRouteLink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes []netlink.Route
		want   int
		ok     bool
	}{
		{"none", nil, 0, false},
		{"only subnet routes", []netlink.Route{{LinkIndex: 2, Dst: cidr(t, "10.0.0.0/24")}}, 0, false},
		{"nil dst", []netlink.Route{{LinkIndex: 2, Dst: cidr(t, "10.0.0.0/24")}, {LinkIndex: 3, Family: netlink.FAMILY_V4, Gw: net.ParseIP("10.0.0.1")}}, 3, true},
		{"zero-length dst", []netlink.Route{{LinkIndex: 4, Dst: cidr(t, "0.0.0.0/0"), Family: netlink.FAMILY_V4}}, 4, true},
		{"v4 preferred over an earlier v6", []netlink.Route{
			{LinkIndex: 5, Family: netlink.FAMILY_V6, Dst: cidr(t, "::/0")},
			{LinkIndex: 6, Family: netlink.FAMILY_V4},
		}, 6, true},
		{"v6 only", []netlink.Route{{LinkIndex: 5, Family: netlink.FAMILY_V6, Gw: net.ParseIP("fd00::1")}}, 5, true},
		{"no link index (blackhole)", []netlink.Route{{LinkIndex: 0, Family: netlink.FAMILY_V4}}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := defaultRouteLink(tc.routes)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %d %v, want %d %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func ipamResult(t testing.TB) *current.Result {
	return &current.Result{
		CNIVersion: "1.1.0",
		IPs: []*current.IPConfig{
			{Address: *cidr(t, "10.9.0.5/24"), Gateway: net.ParseIP("10.9.0.1")},
			{Address: *cidr(t, "fd00:9::5/64")},
		},
		Routes: []*types.Route{{Dst: *cidr(t, "0.0.0.0/0")}},
		DNS:    types.DNS{Nameservers: []string{"10.9.0.53"}},
	}
}

func TestOwnResult(t *testing.T) {
	iface := &current.Interface{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: "/run/netns/c"}
	n := load(t, `{"cniVersion":"1.1.0","name":"mv","ipam":{"type":"host-local"}}`)
	in := ipamResult(t)
	r, err := ownResult(n, iface, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Interfaces) != 1 || r.Interfaces[0] != iface || len(r.IPs) != 2 {
		t.Fatalf("result = %+v", r)
	}
	for _, ip := range r.IPs {
		if ip.Interface == nil || *ip.Interface != 0 {
			t.Errorf("ip %s not bound to interface 0", ip.Address.String())
		}
	}
	if in.IPs[0].Interface != nil {
		t.Error("ownResult modified the IPAM result")
	}
	if r.DNS.Nameservers[0] != "10.9.0.53" {
		t.Errorf("IPAM DNS not kept without config DNS: %+v", r.DNS)
	}
	n2 := load(t, `{"cniVersion":"1.1.0","name":"mv","ipam":{"type":"host-local"},"dns":{"nameservers":["1.1.1.1"]}}`)
	r, _ = ownResult(n2, iface, in)
	if r.DNS.Nameservers[0] != "1.1.1.1" {
		t.Errorf("config DNS should win: %+v", r.DNS)
	}

	_, err = ownResult(n, iface, &current.Result{})
	if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig {
		t.Errorf("IPAM without IPs: %v (code %d)", err, code)
	}
	r, err = ownResult(load(t, `{"cniVersion":"1.1.0","name":"mv"}`), iface, nil)
	if err != nil || len(r.IPs) != 0 || len(r.Interfaces) != 1 {
		t.Errorf("L2 result = %+v, %v", r, err)
	}
}

func TestMerge(t *testing.T) {
	own := &current.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "net1", Sandbox: "/run/netns/c"}},
		IPs:        []*current.IPConfig{{Address: *cidr(t, "10.9.0.5/24"), Interface: current.Int(0)}},
	}
	if merge(nil, own) != own {
		t.Error("without prevResult the result is ours")
	}
	prev := &current.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*current.Interface{{Name: "br0"}, {Name: "eth0", Sandbox: "/run/netns/c"}},
		IPs:        []*current.IPConfig{{Address: *cidr(t, "10.1.0.5/24"), Interface: current.Int(1)}},
		DNS:        types.DNS{Domain: "cluster.local"},
	}
	got := merge(prev, own)
	if len(got.Interfaces) != 3 || got.Interfaces[2].Name != "net1" || len(got.IPs) != 2 ||
		*got.IPs[0].Interface != 1 || *got.IPs[1].Interface != 2 || got.DNS.Domain != "cluster.local" || got.CNIVersion != "1.1.0" {
		t.Errorf("merged = %+v", got)
	}
	if *own.IPs[0].Interface != 0 || len(prev.Interfaces) != 2 {
		t.Error("merge modified its inputs")
	}
}

func TestCheckAttachment(t *testing.T) {
	const nsPath = "/run/netns/c"
	n := load(t, `{"cniVersion":"1.1.0","name":"mv","master":"eth1","mode":"bridge","ipam":{"type":"host-local"}}`)
	m := master{Name: "eth1", Index: 7, MTU: 1500}
	prev := &current.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: nsPath}},
		IPs: []*current.IPConfig{
			{Address: *cidr(t, "10.9.0.5/24"), Gateway: net.ParseIP("10.9.0.1"), Interface: current.Int(0)},
			{Address: *cidr(t, "10.8.0.5/24"), Interface: current.Int(3)}, // another plugin's
		},
		Routes: []*types.Route{{Dst: *cidr(t, "0.0.0.0/0")}, {Dst: *cidr(t, "10.20.0.0/16"), GW: net.ParseIP("10.9.0.254")}},
	}
	good := func() *observed {
		return &observed{
			Kind: "macvlan", ParentIndex: 7, Mode: netlink.MACVLAN_MODE_BRIDGE, MAC: "02:00:00:00:00:01",
			Addrs: []net.IPNet{*cidr(t, "10.9.0.5/24"), *cidr(t, "fe80::1/64")},
			Routes: []route{
				{Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: net.ParseIP("10.9.0.1")},
				{Dst: cidr(t, "10.9.0.0/24")},
				{Dst: cidr(t, "10.20.0.0/16"), GW: net.ParseIP("10.9.0.254")},
			},
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(o *observed, ifName *string, p *current.Result)
		msg    string // "" = pass
	}{
		{"ok", func(*observed, *string, *current.Result) {}, ""},
		{"not in prevResult", func(_ *observed, ifName *string, _ *current.Result) { *ifName = "eth9" }, `no interface "eth9"`},
		{"other sandbox", func(_ *observed, _ *string, p *current.Result) { p.Interfaces[0].Sandbox = "/run/netns/x" }, "no interface"},
		{"wrong kind", func(o *observed, _ *string, _ *current.Result) { o.Kind = "veth" }, "is a veth, not a macvlan"},
		{"wrong master", func(o *observed, _ *string, _ *current.Result) { o.ParentIndex = 8 }, `not on master "eth1"`},
		{"wrong mode", func(o *observed, _ *string, _ *current.Result) { o.Mode = netlink.MACVLAN_MODE_VEPA }, "mode vepa, config says bridge"},
		{"wrong mac", func(o *observed, _ *string, _ *current.Result) { o.MAC = "02:00:00:00:00:02" }, "MAC 02:00:00:00:00:02"},
		{"no mac in prevResult is fine", func(o *observed, _ *string, p *current.Result) { p.Interfaces[0].Mac = ""; o.MAC = "x" }, ""},
		{"missing address", func(o *observed, _ *string, _ *current.Result) { o.Addrs = o.Addrs[1:] }, "lacks address 10.9.0.5/24"},
		{"address with another mask", func(o *observed, _ *string, _ *current.Result) { o.Addrs[0] = *cidr(t, "10.9.0.5/16") }, "lacks address 10.9.0.5/24"},
		{"missing default route", func(o *observed, _ *string, _ *current.Result) { o.Routes = o.Routes[1:] }, "lacks route 0.0.0.0/0"},
		{"v6 default is not v4's", func(o *observed, _ *string, _ *current.Result) {
			o.Routes[0].Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}, "lacks route 0.0.0.0/0"},
		{"route via another gateway", func(o *observed, _ *string, _ *current.Result) { o.Routes[2].GW = net.ParseIP("10.9.0.1") }, "lacks route 10.20.0.0/16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			ifName := "eth0"
			p := *prev
			p.Interfaces = []*current.Interface{{Name: "eth0", Mac: "02:00:00:00:00:01", Sandbox: nsPath}}
			tc.mutate(o, &ifName, &p)
			err := checkAttachment(n, &p, nsPath, ifName, m, o)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			code, _ := cnierr.Code(err)
			if code != cnierr.CheckFailed || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v (code %d), want 106 mentioning %q", err, code, tc.msg)
			}
		})
	}
}
