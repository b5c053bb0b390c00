package cnp

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/network-policy-api/conformance"
)

// TestSCTPTests: the tests of v0.3.0 that probe SCTP, read from its
// sources (grep -c '"sctp"' conformance/tests/*.go lists the same files).
func TestSCTPTests(t *testing.T) {
	got, err := sctpTests(conformance.Manifests)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n, why := range got {
		names = append(names, fmt.Sprintf("%s (%s)", n, strings.Fields(why)[0]))
	}
	sort.Strings(names)
	want := []string{
		"CNPAdminTierEgressInlineCIDRPeers (probes)",
		"CNPAdminTierEgressNodePeers (probes)",
		"CNPAdminTierEgressSCTP (an)",
		"CNPAdminTierGress (probes)",
		"CNPAdminTierIngressSCTP (an)",
		"CNPAdminTierPortRange (probes)",
		"CNPBaselineTierEgressInlineCIDRPeers (probes)",
		"CNPBaselineTierEgressNodePeers (probes)",
		"CNPBaselineTierEgressSCTP (an)",
		"CNPBaselineTierGress (probes)",
		"CNPBaselineTierIngressSCTP (an)",
		"CNPBaselineTierPortRange (probes)",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
}

func TestParseSkips(t *testing.T) {
	got, err := parseSkips(" A=why one , B=two,")
	if err != nil || len(got) != 2 || got["A"] != "why one" || got["B"] != "two" {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := parseSkips("A"); err == nil {
		t.Error("a skip without a reason was accepted")
	}
}
