package portmap

import (
	"encoding/json"
	"net"
	"net/netip"
	"strings"
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

// TestHairpinSources: with snat, connections from the container's whole
// pod network (and 127.0.0.1) are marked for masquerade, in both backends;
// an address without a mask marks the container alone.
func TestHairpinSources(t *testing.T) {
	cfg := &Config{Name: "n", SNAT: true, MarkBit: 13, Mappings: []Mapping{{Protocol: "tcp", HostPort: 8080, ContainerPort: 80}}}
	for _, c := range []struct {
		v4, v6    string
		nft, ipt4 string
		nft6      string
		ipt6      string
	}{
		{"10.244.1.7/24", "fd00:244:1::7/64",
			"ip saddr { 10.244.1.0/24, 127.0.0.1 } tcp dport 8080 meta mark set meta mark | 0x2000",
			"-s 10.244.1.0/24 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK",
			"ip6 saddr fd00:244:1::/64 tcp dport 8080 meta mark set meta mark | 0x2000",
			"-s fd00:244:1::/64 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK"},
		{"10.244.1.7/32", "fd00:244:1::7/128",
			"ip saddr { 10.244.1.7, 127.0.0.1 } tcp dport 8080 meta mark set meta mark | 0x2000",
			"-s 10.244.1.7/32 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK",
			"ip6 saddr fd00:244:1::7 tcp dport 8080 meta mark set meta mark | 0x2000",
			"-s fd00:244:1::7/128 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK"},
	} {
		p := buildPlan(cfg, Attachment{"n", "c", "eth0"}, netip.MustParsePrefix(c.v4), netip.MustParsePrefix(c.v6))
		nftRules := renderNFT(p).Rules
		if got := nftRules[0].Rule; got != c.nft {
			t.Errorf("%s: nft mark rule %q, want %q", c.v4, got, c.nft)
		}
		if got := nftRules[2].Rule; got != c.nft6 {
			t.Errorf("%s: nft IPv6 mark rule %q, want %q", c.v6, got, c.nft6)
		}
		fams := renderIPT(p)
		if got := strings.Join(fams[0].Rules[0], " "); got != c.ipt4 {
			t.Errorf("%s: iptables mark rule %q, want %q", c.v4, got, c.ipt4)
		}
		if got := strings.Join(fams[0].Rules[1], " "); got != "-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK" {
			t.Errorf("%s: iptables localhost rule %q", c.v4, got)
		}
		if got := strings.Join(fams[1].Rules[0], " "); got != c.ipt6 {
			t.Errorf("%s: ip6tables mark rule %q, want %q", c.v6, got, c.ipt6)
		}
	}
}
