package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flatnet/flatnet/test/gotestjson"
)

// Test is one test or subtest as the events tell it.
type Test = gotestjson.Test

// Run is one run of the runner.
type Run struct {
	*gotestjson.Run
	Skips map[string]string // ShortName -> reason, from SKIP-TEST lines
	// SetupStart and SetupReady are when the suite began applying its base
	// manifests and when it found every StatefulSet Ready (zero: not seen).
	SetupStart, SetupReady time.Time
}

const baselineName = "LabBaseline"

var skipLine = regexp.MustCompile(`SKIP-TEST (\S+): (.*)$`)

// Parse reads go test -json events (gotestjson.Parse) and the runner's
// own lines.
func Parse(r io.Reader) (*Run, error) {
	run := &Run{Skips: map[string]string{}}
	var err error
	run.Run, err = gotestjson.Parse(r, func(e gotestjson.Event, o string) {
		switch {
		case strings.Contains(o, "Test Setup: Applying base manifests"):
			run.SetupStart = e.Time
		case strings.Contains(o, "namespaces are ready") && run.SetupReady.IsZero():
			run.SetupReady = e.Time
		}
		if m := skipLine.FindStringSubmatch(o); m != nil {
			run.Skips[m[1]] = m[2]
		}
	})
	return run, err
}

// children are the direct subtests of name, in start order.
func (r *Run) children(name string) []*Test { return r.Children(name) }

// Case is one test of the suite, classified.
type Case struct {
	Short   string
	Result  string // passed, failed, skipped, not supported, not run
	Why     string // the skip's reason or the unsupported feature
	Subs    []*Test
	Elapsed float64
	T       *Test
}

var unsupported = regexp.MustCompile(`suite does not support (\S+)`)

// Cases are the suite's tests (the root's subtests but the baseline).
func (r *Run) Cases() []Case {
	var out []Case
	for _, t := range r.children(r.Root) {
		short := strings.TrimPrefix(t.Name, r.Root+"/")
		if short == baselineName {
			continue
		}
		c := Case{Short: short, Subs: r.children(t.Name), Elapsed: t.Elapsed, T: t}
		switch {
		case t.Result == "pass" && r.Skips[short] != "":
			// The suite's SkipTests returns without t.Skip: a pass.
			c.Result, c.Why = "skipped", r.Skips[short]
		case t.Result == "pass":
			c.Result = "passed"
		case t.Result == "fail":
			c.Result = "failed"
		case t.Result == "skip":
			c.Result = "not supported"
			for _, o := range t.Output {
				if m := unsupported.FindStringSubmatch(o); m != nil {
					c.Why = "feature " + m[1] + " not claimed"
				}
			}
		default:
			c.Result = "not run"
		}
		out = append(out, c)
	}
	return out
}

// Totals count the cases by result.
type Totals struct{ Tests, Passed, Failed, Skipped, NotSupported, NotRun int }

func (r *Run) Totals() Totals {
	var t Totals
	for _, c := range r.Cases() {
		t.Tests++
		switch c.Result {
		case "passed":
			t.Passed++
		case "failed":
			t.Failed++
		case "skipped":
			t.Skipped++
		case "not supported":
			t.NotSupported++
		default:
			t.NotRun++
		}
	}
	return t
}

// excerptLine picks the lines of a test's output that say what failed:
// the suite's probe verdicts and testify's error lines.
var excerptLine = regexp.MustCompile(`Expected connection|FAILED to execute|Error:|unable to|error waiting|panic:|timed out`)

// noise is testify's line for require.Eventually: it says only that the
// probe lines above it never turned out as expected.
const noise = "Condition never satisfied"

func excerpt(lines []string, max int) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if !excerptLine.MatchString(l) || strings.Contains(l, noise) || seen[l] {
			continue
		}
		seen[l] = true
		out = append(out, l)
		if len(out) == max {
			break
		}
	}
	return out
}

func secs(s float64) string { return fmt.Sprintf("%.0fs", s) }

// setupLines are the root test's lines about the suite's Setup: the base
// manifests and the StatefulSets becoming Ready.
func (r *Run) setupLines() []string {
	t := r.Tests[r.Root]
	if t == nil {
		return nil
	}
	var out []string
	var waiting string
	for _, l := range t.Output {
		l = strings.TrimSpace(l)
		switch {
		case strings.Contains(l, "not rolled out yet"):
			waiting = l // only the last one
		case strings.Contains(l, "Test Setup"), strings.Contains(l, "are ready"), strings.Contains(l, "error waiting"),
			strings.Contains(l, "Error:"):
			out = append(out, l)
		}
	}
	if waiting != "" && r.Tests[r.Root+"/"+baselineName] == nil && len(r.Cases()) == 0 {
		out = append(out, "last: "+waiting)
	}
	return out
}

// Summary is summary.md.
func Summary(r *Run, title string, info []string, suiteReport []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", title)
	for _, i := range info {
		fmt.Fprintf(&b, "%s  \n", i)
	}
	cases := r.Cases()
	t := r.Totals()
	fmt.Fprintf(&b, "\n**%d tests: %d passed, %d failed, %d skipped, %d not supported, %d not run**", t.Tests, t.Passed, t.Failed, t.Skipped, t.NotSupported, t.NotRun)
	if !r.Finished {
		b.WriteString(" (the run did not finish: see the end of the log)")
	}
	b.WriteString("\n\n")

	b.WriteString("## Setup\n\n")
	if root := r.Tests[r.Root]; root == nil {
		b.WriteString("The runner never started a test.\n")
	} else {
		b.WriteString("The suite's Setup (conformance/base/manifests.yaml: 5 namespaces, 5 StatefulSets of 2 pods with 8 agnhost containers each, one of them hostNetwork):\n\n")
		for _, l := range r.setupLines() {
			fmt.Fprintf(&b, "    %s\n", l)
		}
		b.WriteString("\n")
		if !r.SetupStart.IsZero() && !r.SetupReady.IsZero() {
			fmt.Fprintf(&b, "Every StatefulSet Ready %s after the base manifests were applied.\n\n", r.SetupReady.Sub(r.SetupStart).Round(time.Second))
		}
	}
	if bl := r.Tests[r.Root+"/"+baselineName]; bl != nil {
		fmt.Fprintf(&b, "Lab baseline (the runner's own check, before any policy: `agnhost connect` by exec from gryffindor's harry-potter-0 to a pod of each house, TCP 80/8080 and UDP 53/5353, the suite's PokeServer expecting a connection): **%s** in %s.\n", bl.Result, secs(bl.Elapsed))
		for _, l := range excerpt(bl.Output, 6) {
			fmt.Fprintf(&b, "\n    %s", l)
		}
		b.WriteString("\n\n")
	}

	if len(cases) > 0 {
		b.WriteString("## Tests\n\n| result | test | subtests passed/run | time |\n|---|---|---|---|\n")
		order := map[string]int{"failed": 0, "not run": 1, "passed": 2, "skipped": 3, "not supported": 4}
		sorted := append([]Case(nil), cases...)
		sort.SliceStable(sorted, func(i, j int) bool {
			if order[sorted[i].Result] != order[sorted[j].Result] {
				return order[sorted[i].Result] < order[sorted[j].Result]
			}
			return sorted[i].Short < sorted[j].Short
		})
		for _, c := range sorted {
			pass := 0
			for _, s := range c.Subs {
				if s.Result == "pass" {
					pass++
				}
			}
			subs := "-"
			if len(c.Subs) > 0 {
				subs = fmt.Sprintf("%d/%d", pass, len(c.Subs))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Result, c.Short, subs, secs(c.Elapsed))
		}
		b.WriteString("\n")
	}
	if skips := only(cases, "skipped", "not supported"); len(skips) > 0 {
		b.WriteString("## Skipped\n\n")
		for _, c := range skips {
			fmt.Fprintf(&b, "- %s (%s): %s\n", c.Short, c.Result, c.Why)
		}
		b.WriteString("\n")
	}

	if failed := only(cases, "failed", "not run"); len(failed) > 0 {
		b.WriteString("## Failures\n\nThe first failing probe of each failed subtest (a subtest stops at its first failed probe: `require.Eventually`, PokeTimeout 10 s):\n\n")
		for _, c := range failed {
			fmt.Fprintf(&b, "### %s\n\n", c.Short)
			any := false
			for _, s := range c.Subs {
				if s.Result == "pass" {
					continue
				}
				any = true
				fmt.Fprintf(&b, "- %s (%s):\n", strings.TrimPrefix(s.Name, c.T.Name+"/"), orStr(s.Result, "not finished"))
				for _, l := range excerpt(s.Output, 3) {
					fmt.Fprintf(&b, "  `%s`\n", l)
				}
			}
			if !any {
				for _, l := range excerpt(c.T.Output, 4) {
					fmt.Fprintf(&b, "- `%s`\n", l)
				}
			}
			b.WriteString("\n")
		}
	}
	if len(r.Package) > 0 && !r.Finished {
		b.WriteString("## End of the log\n\n```\n")
		from := max(0, len(r.Package)-15)
		for _, l := range r.Package[from:] {
			b.WriteString(l + "\n")
		}
		b.WriteString("```\n\n")
	}
	if len(suiteReport) > 0 {
		b.WriteString("## The suite's report\n\n`suite.ConformanceProfileTestSuite.Report()` for profile ClusterNetworkPolicy, as the suite writes it (report.yaml):\n\n```yaml\n")
		b.Write(suiteReport)
		b.WriteString("```\n")
	}
	return b.String()
}

// only are the cases with one of results.
func only(cases []Case, results ...string) []Case {
	var out []Case
	for _, c := range cases {
		if slices.Contains(results, c.Result) {
			out = append(out, c)
		}
	}
	return out
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string        `xml:"name,attr"`
	Time    string        `xml:"time,attr"`
	Failure *junitMessage `xml:"failure,omitempty"`
	Skipped *junitMessage `xml:"skipped,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// JUnit is one testcase per subtest of each test (the test itself when it
// has none), skips with their reasons.
func JUnit(r *Run) ([]byte, error) {
	s := junitSuite{Name: "network-policy-api v0.3.0 conformance (ClusterNetworkPolicy)"}
	add := func(name string, t *Test, result, why string) {
		c := junitCase{Name: name, Time: fmt.Sprintf("%.3f", t.Elapsed)}
		switch result {
		case "failed", "not run":
			ex := excerpt(t.Output, 5)
			msg := result
			if len(ex) > 0 {
				msg = ex[0]
			}
			c.Failure = &junitMessage{Message: msg, Text: strings.Join(ex, "\n")}
			s.Failures++
		case "skipped", "not supported":
			c.Skipped = &junitMessage{Message: why}
			s.Skipped++
		}
		s.Cases = append(s.Cases, c)
		s.Tests++
	}
	for _, c := range r.Cases() {
		if len(c.Subs) == 0 || c.Result == "skipped" || c.Result == "not supported" {
			add(c.Short, c.T, c.Result, c.Why)
			continue
		}
		for _, sub := range c.Subs {
			res := map[string]string{"pass": "passed", "fail": "failed", "skip": "skipped"}[sub.Result]
			add(strings.TrimPrefix(sub.Name, r.Root+"/"), sub, orStr(res, "not run"), "")
		}
	}
	out, err := xml.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), append(out, '\n')...), nil
}
