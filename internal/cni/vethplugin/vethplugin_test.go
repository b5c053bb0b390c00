package vethplugin

import (
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/testutil"
)

var cidr = testutil.CIDR

func TestFirstIP(t *testing.T) {
	for in, want := range map[string]string{
		"10.10.3.4/16":  "10.10.0.1",
		"10.0.0.255/24": "10.0.0.1",
		"fd00::5/64":    "fd00::1",
		"10.0.0.0/31":   "10.0.0.1",
	} {
		if got := FirstIP(cidr(in)).String(); got != want {
			t.Errorf("FirstIP(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestToPrefix(t *testing.T) {
	for in, want := range map[string]string{"10.1.0.5/24": "10.1.0.5/24", "fd00::5/64": "fd00::5/64"} {
		if p, ok := ToPrefix(cidr(in)); !ok || p.String() != want {
			t.Errorf("ToPrefix(%s) = %v, %v", in, p, ok)
		}
	}
	// IPv4 in 16-byte form with a 16-byte mask.
	if p, ok := ToPrefix(net.IPNet{IP: net.ParseIP("10.1.0.5"), Mask: net.CIDRMask(120, 128)}); !ok || p.String() != "10.1.0.5/24" {
		t.Errorf("ToPrefix(4in6) = %v, %v", p, ok)
	}
	if _, ok := ToPrefix(net.IPNet{IP: net.IP{1, 2}}); ok {
		t.Error("ToPrefix accepted a 2-byte address")
	}
}

func result() *current.Result {
	return &current.Result{
		Interfaces: []*current.Interface{
			{Name: "cni0"},
			{Name: "veth1", Mac: "02:00:00:00:00:01"},
			{Name: "eth0", Mac: "02:00:00:00:00:02", Sandbox: "/ns"},
		},
		IPs: []*current.IPConfig{
			{Interface: current.Int(2), Address: cidr("10.1.0.5/24")},
			{Interface: current.Int(0), Address: cidr("10.1.0.1/24")},
		},
	}
}

func TestLookups(t *testing.T) {
	prev := result()
	want, idx, ips := ContainerIface(prev, "eth0", "/ns")
	if want != prev.Interfaces[2] || idx != 2 || len(ips) != 1 || ips[0] != prev.IPs[0] {
		t.Errorf("ContainerIface = %v, %d, %v", want, idx, ips)
	}
	if want, idx, ips := ContainerIface(prev, "eth0", "/other"); want != nil || idx != -1 || ips != nil {
		t.Errorf("ContainerIface(other netns) = %v, %d, %v", want, idx, ips)
	}
	if name, mac := HostEnd(prev, "eth0", "/ns"); name != "veth1" || mac != "02:00:00:00:00:01" {
		t.Errorf("HostEnd = %q, %q", name, mac)
	}
	if name, _ := HostEnd(nil, "eth0", "/ns"); name != "" {
		t.Error("HostEnd without prevResult")
	}
	prev.Interfaces[1].Sandbox = "/elsewhere"
	if name, _ := HostEnd(prev, "eth0", "/ns"); name != "" {
		t.Errorf("HostEnd took an interface in a sandbox: %q", name)
	}
}

func TestCheckHostVeth(t *testing.T) {
	prev := result()
	if p := CheckHostVeth(prev, "veth1", "02:00:00:00:00:01"); len(p) != 0 {
		t.Errorf("good: %v", p)
	}
	if p := CheckHostVeth(prev, "veth1", "02:00:00:00:00:09"); len(p) != 1 || !strings.Contains(p[0], "has MAC 02:00:00:00:00:09, prevResult says 02:00:00:00:00:01") {
		t.Errorf("MAC: %v", p)
	}
	if p := CheckHostVeth(prev, "veth2", "x"); len(p) != 1 || !strings.Contains(p[0], "veth2 is not in prevResult") {
		t.Errorf("unlisted: %v", p)
	}
}

func TestMatching(t *testing.T) {
	gw32 := cidr("10.1.0.1/32")
	routes := []netlink.Route{{Family: netlink.FAMILY_V4, Dst: &gw32}, {Family: netlink.FAMILY_V4, Gw: net.ParseIP("10.1.0.1")}}
	for _, tc := range []struct {
		dst  string
		gw   string
		want bool
	}{
		{"10.1.0.1/32", "", true},
		{"0.0.0.0/0", "", true},
		{"0.0.0.0/0", "10.1.0.1", true},
		{"0.0.0.0/0", "10.1.0.2", false},
		{"::/0", "", false},
		{"10.1.0.0/24", "", false},
	} {
		if got := HasRoute(routes, cidr(tc.dst), net.ParseIP(tc.gw)); got != tc.want {
			t.Errorf("HasRoute(%s via %q) = %v", tc.dst, tc.gw, got)
		}
	}
	have := []net.IPNet{cidr("10.1.0.5/24")}
	if !HasAddr(have, cidr("10.1.0.5/24")) || HasAddr(have, cidr("10.1.0.5/32")) {
		t.Error("HasAddr")
	}
}

func TestResult(t *testing.T) {
	prev := result()
	prev.DNS = types.DNS{Nameservers: []string{"10.0.0.53"}}
	ifaces := []*current.Interface{{Name: "veth2"}, {Name: "net1", Sandbox: "/ns"}}
	ips := []*current.IPConfig{{Interface: current.Int(4), Address: cidr("10.2.0.5/24")}}
	r := Result(prev, ifaces, ips, nil, types.DNS{})
	if len(r.Interfaces) != 5 || len(r.IPs) != 3 || r.DNS.Nameservers[0] != "10.0.0.53" || r.CNIVersion != current.ImplementedSpecVersion {
		t.Errorf("chained: %+v", r)
	}
	r = Result(nil, ifaces, ips, nil, types.DNS{Domain: "example"})
	if len(r.Interfaces) != 2 || len(r.IPs) != 1 || r.DNS.Domain != "example" {
		t.Errorf("first: %+v", r)
	}
}
