package portmap

import (
	"encoding/json"
	"net"
	"net/netip"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
)

func TestContainerIPs(t *testing.T) {
	var r current.Result
	err := json.Unmarshal([]byte(`{"cniVersion":"1.0.0",
		"interfaces":[{"name":"vethhost"},{"name":"eth0","sandbox":"/x"},{"name":"eth1","sandbox":"/x"}],
		"ips":[{"address":"10.9.9.9/24","interface":0},{"address":"10.8.0.2/24","interface":2},
		       {"address":"fd00::2/64","interface":1},{"address":"10.1.0.2/24","interface":1},{"address":"10.1.0.3/24","interface":1}]}`), &r)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := containerIPs(&r, "eth0")
	if v4 != netip.MustParsePrefix("10.1.0.2/24") || v6 != netip.MustParsePrefix("fd00::2/64") {
		t.Fatalf("eth0: %v %v", v4, v6)
	}
	if v4, v6 = containerIPs(&r, "eth1"); v4 != netip.MustParsePrefix("10.8.0.2/24") || v6.IsValid() {
		t.Fatalf("eth1: %v %v", v4, v6)
	}
	// An IPAM-style result names no interface: its addresses are taken.
	var ipam current.Result
	_ = json.Unmarshal([]byte(`{"cniVersion":"1.0.0","ips":[{"address":"10.2.0.2/24"}]}`), &ipam)
	if v4, _ = containerIPs(&ipam, "eth0"); v4 != netip.MustParsePrefix("10.2.0.2/24") {
		t.Fatalf("no interface index: %v", v4)
	}
	// An address with no mask stands for itself alone.
	bare := &current.Result{IPs: []*current.IPConfig{{Address: net.IPNet{IP: net.ParseIP("10.3.0.2")}}}}
	if v4, _ = containerIPs(bare, "eth0"); v4 != netip.MustParsePrefix("10.3.0.2/32") {
		t.Fatalf("no mask: %v", v4)
	}
	if v4, v6 = containerIPs(nil, "eth0"); v4.IsValid() || v6.IsValid() {
		t.Fatal("nil result gave addresses")
	}
}

func TestBuildPlanFamilies(t *testing.T) {
	cfg := &Config{Name: "n", SNAT: true, MarkBit: 13, ConditionsV6: []string{"ip6 saddr fd00::/8"}, Mappings: []Mapping{
		{Protocol: "tcp", HostPort: 1, ContainerPort: 1},
		{Protocol: "tcp", HostPort: 2, ContainerPort: 2, HostIP: netip.MustParseAddr("10.0.0.1")},
		{Protocol: "udp", HostPort: 3, ContainerPort: 3, HostIP: netip.MustParseAddr("fd00::1")},
		{Protocol: "udp", HostPort: 4, ContainerPort: 4, HostIP: netip.MustParseAddr("0.0.0.0")},
	}}
	v4, v6 := netip.MustParsePrefix("10.1.0.2/24"), netip.MustParsePrefix("fd00::2/64")
	p := buildPlan(cfg, Attachment{"n", "c", "eth0"}, v4, v6)
	if len(p.Families) != 2 {
		t.Fatalf("families: %+v", p.Families)
	}
	// The pod network is the address's own, masked.
	if f := p.Families[0]; f.ContainerIP != v4.Addr() || f.PodNet != netip.MustParsePrefix("10.1.0.0/24") {
		t.Errorf("IPv4 family: container %v, pod network %v", f.ContainerIP, f.PodNet)
	}
	if f := p.Families[1]; f.ContainerIP != v6.Addr() || f.PodNet != netip.MustParsePrefix("fd00::/64") {
		t.Errorf("IPv6 family: container %v, pod network %v", f.ContainerIP, f.PodNet)
	}
	ports := func(f Family) (out []uint16) {
		for _, m := range f.Mappings {
			out = append(out, m.HostPort)
		}
		return
	}
	if got := ports(p.Families[0]); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 4 || p.Families[0].IPv6 {
		t.Errorf("IPv4 mappings %v", got)
	}
	if got := ports(p.Families[1]); len(got) != 2 || got[0] != 1 || got[1] != 3 || len(p.Families[1].Conditions) != 1 {
		t.Errorf("IPv6 mappings %v, conditions %v", got, p.Families[1].Conditions)
	}
	if got := p.UDPPorts(false); len(got) != 1 || got[0] != 4 {
		t.Errorf("UDP v4 ports %v", got)
	}
	if got := p.UDPPorts(true); len(got) != 1 || got[0] != 3 {
		t.Errorf("UDP v6 ports %v", got)
	}
	if restricts(cfg.Mappings[3]) || !restricts(cfg.Mappings[1]) {
		t.Error("restricts: 0.0.0.0 must not restrict, 10.0.0.1 must")
	}
	// An IPv4-only container gets no IPv6 family; a container whose only
	// mappings are for the other family gets no rules at all.
	if p := buildPlan(cfg, Attachment{"n", "c", "eth0"}, v4, netip.Prefix{}); len(p.Families) != 1 || p.Families[0].IPv6 {
		t.Errorf("v4-only: %+v", p.Families)
	}
	only6 := &Config{Name: "n", Mappings: []Mapping{{Protocol: "tcp", HostPort: 1, ContainerPort: 1, HostIP: netip.MustParseAddr("fd00::1")}}}
	if p := buildPlan(only6, Attachment{"n", "c", "eth0"}, v4, netip.Prefix{}); len(p.Families) != 0 {
		t.Errorf("v6 hostIP on a v4 container: %+v", p.Families)
	}
}
