package portmap

import (
	"net/netip"
	"strings"
	"testing"
)

// Three attachments used by the backend tests:
//   - A: net1/ctr1/eth0, dual-stack (10.1.0.2/24, fd00::2/64), snat, tcp
//     8080->80 on every address
//     and udp 10.0.0.1:5353->53 (IPv4 only, by its hostIP).
//   - B: net1/ctr2/eth0, IPv4 only, snat off, udp 53->5353.
//   - C: net2/ctr3/net1, dual-stack, masqAll with mark bit 5 and an IPv4
//     condition (nft syntax, or iptables syntax for the iptables tests).
var (
	attA = Attachment{"net1", "ctr1", "eth0"}
	attB = Attachment{"net1", "ctr2", "eth0"}
	attC = Attachment{"net2", "ctr3", "net1"}
)

func planA() *Plan {
	cfg := &Config{Name: "net1", SNAT: true, MarkBit: 13, Mappings: []Mapping{
		{Protocol: "tcp", HostPort: 8080, ContainerPort: 80},
		{Protocol: "udp", HostPort: 5353, ContainerPort: 53, HostIP: netip.MustParseAddr("10.0.0.1")},
	}}
	return buildPlan(cfg, attA, netip.MustParsePrefix("10.1.0.2/24"), netip.MustParsePrefix("fd00::2/64"))
}

func planB() *Plan {
	cfg := &Config{Name: "net1", SNAT: false, MarkBit: 13, Mappings: []Mapping{{Protocol: "udp", HostPort: 53, ContainerPort: 5353}}}
	return buildPlan(cfg, attB, netip.MustParsePrefix("10.1.0.3/24"), netip.Prefix{})
}

func planC(cond ...string) *Plan {
	cfg := &Config{Name: "net2", SNAT: true, MasqAll: true, MarkBit: 5, ConditionsV4: cond,
		Mappings: []Mapping{{Protocol: "tcp", HostPort: 443, ContainerPort: 8443}}}
	return buildPlan(cfg, attC, netip.MustParsePrefix("10.2.0.2/24"), netip.MustParsePrefix("fd00:2::2/64"))
}

// lines turns an indented literal into the dump format (one line each,
// trailing newline).
func lines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "\n") + "\n"
}

func TestIDs(t *testing.T) {
	// The IDs are part of the on-node state: changing the hash would make
	// DEL and GC miss rules written by an older flatnet.
	for _, c := range []struct {
		a    Attachment
		want string
	}{{attA, "ujajvl-cbftli2xat"}, {attB, "ujajvl-fty67ey7oh"}, {attC, "wqnkqj-efyokcjjcq"}} {
		if got := c.a.ID().String(); got != c.want {
			t.Errorf("ID(%v) = %s, want %s", c.a, got, c.want)
		}
	}
	if id, ok := parseID("UJAJVL-CBFTLI2XAT"); !ok || id != attA.ID() {
		t.Errorf("parseID(iptables form) = %v, %v", id, ok)
	}
	for _, bad := range []string{"", "ujajvl", "ujajvl-", "ujajv-cbftli2xat", "ujajvl-cbftli2xa", "hostports"} {
		if _, ok := parseID(bad); ok {
			t.Errorf("parseID(%q) accepted", bad)
		}
	}
}
