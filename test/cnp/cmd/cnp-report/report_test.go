package main

import (
	"os"
	"strings"
	"testing"
)

func parseSample(t *testing.T) *Run {
	t.Helper()
	f, err := os.Open("testdata/events.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCases: the suite's SkipTests returns without t.Skip (a pass to go
// test): such a test is reported as skipped with the runner's reason; an
// unclaimed feature's t.Skip as not supported; the baseline is no test of
// the suite.
func TestCases(t *testing.T) {
	r := parseSample(t)
	var got []string
	for _, c := range r.Cases() {
		got = append(got, c.Short+" "+c.Result+" "+c.Why)
	}
	want := []string{
		"CNPAdminTierEgressNamedPort not supported feature ClusterNetworkPolicyNamedPorts not claimed",
		"CNPAdminTierEgressSCTP skipped an SCTP test; no SCTP here",
		"CNPAdminTierEgressTCP failed ",
		"CNPBaselineTierEgressTCP passed ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("cases:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if tot := r.Totals(); tot != (Totals{Tests: 4, Passed: 1, Failed: 1, Skipped: 1, NotSupported: 1}) {
		t.Errorf("totals %+v", tot)
	}
	if !r.Finished {
		t.Error("the package's fail event was not seen")
	}
	if d := r.SetupReady.Sub(r.SetupStart); d.Seconds() != 9 {
		t.Errorf("setup took %v, want 9s", d)
	}
}

func TestSummaryAndJUnit(t *testing.T) {
	r := parseSample(t)
	s := Summary(r, "T", []string{"Date: now"}, []byte("kind: ConformanceReport\n"))
	for _, want := range []string{
		"**4 tests: 1 passed, 1 failed, 1 skipped, 1 not supported, 0 not run**",
		"Every StatefulSet Ready 9s after",
		"**pass** in 4s",
		"| failed | CNPAdminTierEgressTCP | 1/2 | 10s |",
		"- CNPAdminTierEgressSCTP (skipped): an SCTP test; no SCTP here",
		"- deny (fail):\n  `helper.go:71: Expected connection to fail from g/h-0 to 10.244.0.4, but instead it successfully connected.`\n",
		"kind: ConformanceReport",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "Condition never satisfied") {
		t.Error("testify's Eventually line made it into the summary")
	}
	j, err := JUnit(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tests="5" failures="1" skipped="2"`,
		`<testcase name="CNPAdminTierEgressTCP/deny" time="10.000">`,
		`<skipped message="an SCTP test; no SCTP here">`,
	} {
		if !strings.Contains(string(j), want) {
			t.Errorf("junit lacks %q:\n%s", want, j)
		}
	}
}
