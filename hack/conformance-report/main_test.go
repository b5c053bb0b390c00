package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/summary.md from the current output")

func TestParseSkipList(t *testing.T) {
	entries, err := readSkipList("testdata/skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	type e struct {
		Pattern, Reason string
		Line            int
	}
	var got []e
	for _, x := range entries {
		got = append(got, e{x.Pattern, x.Reason, x.Line})
	}
	want := []e{
		{`\[Disruptive\]`, "Disruptive specs restart components.", 4},
		{`\[Feature:SCTPConnectivity\]`, "SCTP: the kernel here has no sctp module. (two comment lines make one reason)", 8},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("entries (-want +got):\n%s", d)
	}
	if got, want := skipRegexp(entries), `(\[Disruptive\])|(\[Feature:SCTPConnectivity\])`; got != want {
		t.Errorf("skipRegexp = %q, want %q", got, want)
	}
}

func TestParseSkipListErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no reason", "# header\n\nSlow\n", `x:3: "Slow" has no reason`},
		{"reason used once", "# why\nA\nB\n", `x:3: "B" has no reason`},
		{"bad regexp", "# why\n[unclosed\n", `x:2: "[unclosed" is not a Go regexp`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseSkipList(strings.NewReader(tc.in), "x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestSummary renders the checked-in sample (ginkgo's JUnit format as the
// e2e framework writes it) and compares it with testdata/summary.md.
func TestSummary(t *testing.T) {
	out := filepath.Join(t.TempDir(), "summary.md")
	var stderr bytes.Buffer
	code, err := runSummary([]string{"-junit", "testdata/junit_01.xml", "-skip-file", "testdata/skip.txt",
		"-title", "sample", "-info", "e2e.test v1.37.2", "-o", out}, &bytes.Buffer{}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 {
		t.Errorf("exit code %d, want 1 (two focused specs failed)", code)
	}
	wantLine := "sample: 6 specs focused: 2 passed, 2 failed, 1 skipped by the skip list, 1 skipped by the suite\n"
	if stderr.String() != wantLine {
		t.Errorf("stderr = %q, want %q", stderr.String(), wantLine)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("testdata/summary.md", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/summary.md")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("summary (-want +got):\n%s", d)
	}
}

func TestSummaryExitCodes(t *testing.T) {
	suite := func(cases ...junitCase) *junitSuite {
		return &junitSuite{Name: "Kubernetes e2e suite", Cases: cases}
	}
	it := func(text, status string) junitCase { return junitCase{Name: "[It] " + text, Status: status} }
	for _, tc := range []struct {
		name  string
		suite *junitSuite
		fail  bool
	}{
		{"all passed", suite(it("[sig-network] a", "passed"), it("[sig-apps] b", "failed")), false},
		{"one panicked", suite(it("[sig-network] a", "panicked")), true},
		{"before suite failed", suite(junitCase{Name: "[SynchronizedBeforeSuite]", Status: "failed"}, it("[sig-network] a", "skipped")), true},
		{"skipped by the suite", suite(junitCase{Name: "[It] [sig-network] a", Status: "skipped", Skipped: &junitMessage{Message: "skipped - Need at least 3 schedulable nodes"}}), false},
		{"not run (suite timeout)", suite(it("[sig-network] a", "passed"), junitCase{Name: "[It] [sig-network] b", Status: "skipped", Skipped: &junitMessage{Message: "skipped"}}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := summarize(tc.suite, `\[sig-network\]`, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			if s.failed() != tc.fail {
				t.Errorf("failed() = %v, want %v (%s)", s.failed(), tc.fail, s.totals())
			}
		})
	}
}

// TestSummaryExtraSkip: what a phase leaves to another phase (or SKIP)
// is not listed, while the skip list's entries are, with their reason.
func TestSummaryExtraSkip(t *testing.T) {
	entries, err := parseSkipList(strings.NewReader("# needs a cloud\n\\[Feature:LoadBalancer\\]\n"), "skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	suite := &junitSuite{Name: "Kubernetes e2e suite", Cases: []junitCase{
		{Name: "[It] [sig-network] Services a [Conformance]", Status: "skipped"},
		{Name: "[It] [sig-network] Services b [Feature:LoadBalancer]", Status: "skipped"},
		{Name: "[It] [sig-network] Services c", Status: "passed"},
	}}
	s, err := summarize(suite, `\[sig-network\] Services`, `\[Conformance\]`, entries)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range s.Rows {
		got = append(got, r.label()+": "+r.Spec+": "+r.Detail)
	}
	want := []string{
		"passed: [sig-network] Services c: ",
		"skipped (skip list): [sig-network] Services b [Feature:LoadBalancer]: skip.txt:2: needs a cloud",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
}

// TestPrunedJUnit: the JUnit kept in the repo holds the suite nodes and the
// listed specs, with ginkgo's counts, and summarizes as the full one does.
func TestPrunedJUnit(t *testing.T) {
	dir := t.TempDir()
	args := func(junit, md string) []string {
		return []string{"-junit", junit, "-skip-file", "testdata/skip.txt", "-title", "sample", "-o", md, "-junit-out", filepath.Join(dir, "pruned-"+filepath.Base(md)+".xml")}
	}
	if _, err := runSummary(args("testdata/junit_01.xml", filepath.Join(dir, "full.md")), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	pruned := filepath.Join(dir, "pruned-full.md.xml")
	f, err := os.Open(pruned)
	if err != nil {
		t.Fatal(err)
	}
	suite, err := parseJUnit(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := []int{len(suite.Cases), suite.Tests, suite.Failures, suite.Skipped, suite.Errors}
	// 2 suite nodes + 6 focused specs; 2 failed, 2 skipped.
	if d := cmp.Diff([]int{8, 8, 2, 2, 0}, got); d != "" {
		t.Errorf("cases, tests, failures, skipped, errors (-want +got):\n%s", d)
	}
	if suite.property("FocusStrings") == "" || suite.Timestamp != "2026-12-01T21:05:00" {
		t.Errorf("properties or timestamp lost: %+v", suite)
	}
	if _, err := runSummary(args(pruned, filepath.Join(dir, "again.md")), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	full, _ := os.ReadFile(filepath.Join(dir, "full.md"))
	again, _ := os.ReadFile(filepath.Join(dir, "again.md"))
	if d := cmp.Diff(string(full), string(again)); d != "" {
		t.Errorf("summary of the pruned report differs (-full +pruned):\n%s", d)
	}
}

// TestRepoSkipList: the list make conformance uses parses (every entry has
// its reason and compiles).
func TestRepoSkipList(t *testing.T) {
	entries, err := readSkipList("../../test/conformance/skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("test/conformance/skip.txt has no entries")
	}
}
