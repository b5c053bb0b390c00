package main

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/flatnet/flatnet/test/gotestjson"
	"sigs.k8s.io/gateway-api/conformance/tests"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
)

// Run is one run of the runner.
type Run struct {
	*gotestjson.Run
	// Supported are the features the suite claimed (the runner's
	// SUPPORTED-FEATURES line); nil when it never said.
	Supported []string
	// Setup are the suite's "Test Setup:" lines; SetupState the last
	// SETUP-STATE block the runner logged (what Setup still waited for).
	Setup      []string
	SetupState []string
	// SetupStart and SetupReady are when the suite applied its base
	// manifests and when it found every Gateway and pod ready.
	SetupStart, SetupReady time.Time
}

// Parse reads go test -json events (gotestjson.Parse) and the lines of
// the suite and the runner about Setup.
func Parse(r io.Reader) (*Run, error) {
	run := &Run{}
	inState := false
	var err error
	run.Run, err = gotestjson.Parse(r, func(e gotestjson.Event, o string) {
		if strings.Contains(e.Test, "/") {
			return
		}
		// A multi-line t.Logf: its further lines are indented by 8.
		if inState && strings.HasPrefix(o, "        ") {
			run.SetupState = append(run.SetupState, o)
			return
		}
		inState = false
		switch _, msg, _ := strings.Cut(strings.TrimSpace(o), ": "); {
		case strings.HasPrefix(msg, "SETUP-STATE"):
			inState = true
			run.SetupState = []string{msg}
		case strings.HasPrefix(msg, "SUPPORTED-FEATURES"):
			run.Supported = strings.FieldsFunc(strings.TrimPrefix(msg, "SUPPORTED-FEATURES"), func(r rune) bool { return r == ',' || r == ' ' })
		case strings.Contains(msg, "Test Setup:"):
			run.Setup = append(run.Setup, strings.TrimSpace(o))
			if strings.Contains(msg, "Applying base manifests") {
				run.SetupStart = e.Time
			}
		case strings.Contains(msg, "namespaces ready") && run.SetupReady.IsZero():
			run.Setup = append(run.Setup, strings.TrimSpace(o))
			run.SetupReady = e.Time
		}
	})
	return run, err
}

// Case is one test of the profile, classified.
type Case struct {
	Short       string
	Core        bool
	Provisional bool
	Features    []string
	Result      string // passed, failed, skipped, not supported, not run
	Why         string // the skip's reason
	Elapsed     float64
	Failure     []string // the first lines that say why it failed
}

// Feature is one extended feature of the profile.
type Feature struct {
	Name   string
	Result string // passed, failed, not supported, not tested
	Passed []string
	Failed []string
	Other  []string // tests of it that did not run, with why
}

// Report is a run against the GATEWAY-HTTP profile.
type Report struct {
	Run      *Run
	Profile  suite.ConformanceProfile
	Core     []Case
	Extended []Case
	Features []Feature
	// Others are the tests outside the profile that ran (their features
	// were claimed too: GATEWAY-GRPC's, say).
	Others      []Case
	SetupFailed bool
}

// Classify sorts the suite's tests into the profile's core and extended
// tests (as the suite's report does: a test is extended when one of its
// features is not a core feature of the profile; tests needing features
// outside the profile are not counted).
func Classify(run *Run) *Report {
	p := suite.GatewayHTTPConformanceProfile
	r := &Report{Run: run, Profile: p}
	root := run.Tests[run.Root]
	r.SetupFailed = root != nil && root.Result == "fail" && run.SetupReady.IsZero()
	byFeature := map[features.FeatureName][]*Case{}
	for _, ct := range tests.ConformanceTests {
		in, core := true, true
		var fs []string
		for _, f := range ct.Features {
			fs = append(fs, string(f))
			if !p.CoreFeatures.Has(f) {
				core = false
				in = in && p.ExtendedFeatures.Has(f)
			}
		}
		c := Case{Short: ct.ShortName, Core: core, Provisional: ct.Provisional, Features: fs}
		r.classify(&c)
		if !in {
			if c.Result == "passed" || c.Result == "failed" {
				r.Others = append(r.Others, c)
			}
			continue
		}
		if core {
			r.Core = append(r.Core, c)
		} else {
			r.Extended = append(r.Extended, c)
		}
	}
	sortCases(r.Core)
	sortCases(r.Extended)
	sortCases(r.Others)
	for i := range r.Extended {
		for _, f := range r.Extended[i].Features {
			byFeature[features.FeatureName(f)] = append(byFeature[features.FeatureName(f)], &r.Extended[i])
		}
	}
	supported := sets.New(run.Supported...)
	for _, f := range sets.List(p.ExtendedFeatures) {
		ft := Feature{Name: string(f), Result: "not supported"}
		if supported.Has(string(f)) {
			for _, c := range byFeature[f] {
				switch c.Result {
				case "passed":
					ft.Passed = append(ft.Passed, c.Short)
				case "failed":
					ft.Failed = append(ft.Failed, c.Short)
				default:
					ft.Other = append(ft.Other, c.Short+" ("+c.Result+")")
				}
			}
			switch {
			case len(ft.Failed) > 0:
				ft.Result = "failed"
			case len(ft.Passed) > 0:
				ft.Result = "passed"
			default:
				ft.Result = "not tested"
			}
		}
		r.Features = append(r.Features, ft)
	}
	return r
}

var skipReason = regexp.MustCompile(`Skipping \S+: (.*)$`)

func (r *Report) classify(c *Case) {
	t := r.Run.Tests[r.Run.Root+"/"+c.Short]
	if t == nil {
		c.Result = "not run"
		if r.SetupFailed {
			c.Why = "Setup failed"
		}
		return
	}
	c.Elapsed = t.Elapsed
	switch t.Result {
	case "pass":
		c.Result = "passed"
	case "fail":
		c.Result = "failed"
		c.Failure = r.failure(t.Name)
	case "skip":
		c.Result = "skipped"
		for _, o := range t.Output {
			if m := skipReason.FindStringSubmatch(o); m != nil {
				c.Why = m[1]
				break
			}
		}
		if strings.Contains(c.Why, "does not support") {
			c.Result = "not supported"
		}
	default:
		c.Result, c.Why = "not run", "did not finish"
	}
}

var resultOrder = []string{"failed", "passed", "skipped", "not supported", "not run"}

func sortCases(cs []Case) {
	slices.SortStableFunc(cs, func(a, b Case) int {
		if d := slices.Index(resultOrder, a.Result) - slices.Index(resultOrder, b.Result); d != 0 {
			return d
		}
		return strings.Compare(a.Short, b.Short)
	})
}

// failure says why test name failed: the failed subtests (named), then
// the distinct lines that say why (testify's Error and Messages with their
// continuation lines, lines naming an error, a timeout or an expectation),
// without file:line, timestamps, request uuids and "(after ...)", each cut
// to 300 characters; the last lines when none says why.
func (r *Report) failure(name string) []string {
	var subs, out, all []string
	seen := map[string]bool{}
	add := func(l string) {
		l = normalize(l)
		if l != "" && !seen[l] && len(out) < 10 {
			seen[l] = true
			out = append(out, l)
		}
	}
	for _, n := range r.Run.Order {
		if n != name && !strings.HasPrefix(n, name+"/") {
			continue
		}
		t := r.Run.Tests[n]
		if n != name && t.Result != "fail" {
			continue
		}
		if n != name && len(r.Run.Children(n)) == 0 {
			subs = append(subs, strings.TrimPrefix(n, name+"/"))
		}
		keep := false
		for _, o := range t.Output {
			trimmed := strings.TrimSpace(o)
			if strings.HasPrefix(trimmed, "--- ") || strings.HasPrefix(trimmed, "=== ") {
				continue
			}
			all = append(all, trimmed)
			label, _, hasLabel := strings.Cut(trimmed, ":")
			switch {
			case strings.HasPrefix(trimmed, "Error:") || strings.HasPrefix(trimmed, "Messages:"):
				keep = true
			case hasLabel && (label == "Error Trace" || label == "Test"):
				keep = false
				continue
			case keep && strings.HasPrefix(o, "        \t"):
			default:
				keep = false
			}
			if keep || why.MatchString(trimmed) && !strings.Contains(trimmed, "matched expectations") {
				add(trimmed)
			}
		}
	}
	if len(out) == 0 && len(all) > 0 {
		for _, l := range all[max(0, len(all)-5):] {
			add(l)
		}
	}
	if len(subs) > 0 {
		head := fmt.Sprintf("failed subtests (%d): %s", len(subs), strings.Join(subs[:min(len(subs), 5)], ", "))
		if len(subs) > 5 {
			head += ", ..."
		}
		out = append([]string{head}, out...)
	}
	return out
}

var (
	why       = regexp.MustCompile(`(?i)error|timeout|timed out|expected|expectation|unexpected|not ready`)
	logPrefix = regexp.MustCompile(`^\S+\.go:\d+: `)
	timestamp = regexp.MustCompile(`^\d{4}-\d\d-\d\dT[0-9:.]+Z:? ?`)
	uuid      = regexp.MustCompile(`uuid=[0-9a-f-]+`)
	after     = regexp.MustCompile(` \(after [^)]*\)$`)
	// The suite's request dump: only the path and what was wrong.
	request = regexp.MustCompile(`for request: \{URL: \{.*?Path:(\S*) .*\}\s\s+(.*)$`)
	cres    = regexp.MustCompile(` CRes: .*$`)
)

// normalize makes a log line comparable across attempts.
func normalize(l string) string {
	l = timestamp.ReplaceAllString(logPrefix.ReplaceAllString(strings.TrimSpace(l), ""), "")
	l = after.ReplaceAllString(uuid.ReplaceAllString(l, "uuid=..."), "")
	l = cres.ReplaceAllString(request.ReplaceAllString(l, "for a request to $1: $2"), "")
	if len(l) > 300 {
		l = l[:300] + " ..."
	}
	return strings.TrimSpace(l)
}

// counts counts cases by result.
func counts(cs []Case) map[string]int {
	m := map[string]int{}
	for _, c := range cs {
		m[c.Result]++
	}
	return m
}

func countLine(cs []Case) string {
	m := counts(cs)
	s := fmt.Sprintf("%d tests: %d passed, %d failed", len(cs), m["passed"], m["failed"])
	for _, k := range resultOrder[2:] {
		if m[k] > 0 {
			s += fmt.Sprintf(", %d %s", m[k], k)
		}
	}
	return s
}

// Headline is the run in one line.
func (r *Report) Headline() string {
	fm := map[string]int{}
	for _, f := range r.Features {
		fm[f.Result]++
	}
	s := fmt.Sprintf("core: %s; extended features: %d passed, %d failed, %d not tested, %d not supported",
		countLine(r.Core), fm["passed"], fm["failed"], fm["not tested"], fm["not supported"])
	if r.SetupFailed {
		s = "Setup failed; " + s
	}
	if !r.Run.Finished {
		s += "; the run did not finish"
	}
	return s
}

// OK: the run finished, Setup worked and nothing that ran failed.
func (r *Report) OK() bool {
	root := r.Run.Tests[r.Run.Root]
	return r.Run.Finished && !r.SetupFailed && counts(r.Core)["failed"] == 0 && counts(r.Extended)["failed"] == 0 &&
		root != nil && root.Result == "pass"
}

func dur(s float64) string {
	if s < 60 {
		return fmt.Sprintf("%.1fs", s)
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

// Summary is summary.md.
func Summary(r *Report, title string, info []string, report []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", title)
	for _, l := range info {
		fmt.Fprintf(&b, "%s  \n", l)
	}
	fm := map[string]int{}
	for _, f := range r.Features {
		fm[f.Result]++
	}
	fmt.Fprintf(&b, "\n**Core (profile %s): %s**  \n", r.Profile.Name, countLine(r.Core))
	fmt.Fprintf(&b, "**Extended: %d features: %d passed, %d failed, %d not tested, %d not supported** (%s)\n\n",
		len(r.Features), fm["passed"], fm["failed"], fm["not tested"], fm["not supported"], countLine(r.Extended))
	if len(r.Run.Supported) > 0 {
		fmt.Fprintf(&b, "Features claimed: %s.\n\n", strings.Join(r.Run.Supported, ", "))
	}

	b.WriteString("## Setup\n\n")
	b.WriteString("The suite's Setup: GatewayClass Accepted, its base manifests (conformance/base/manifests.yaml: 3 namespaces, 4 Gateways, 14 Deployments of echo-basic and coredns), then every Gateway Accepted and Programmed and every pod Ready (300 s at most):\n\n")
	for _, l := range r.Run.Setup {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	switch {
	case !r.Run.SetupReady.IsZero() && !r.Run.SetupStart.IsZero():
		fmt.Fprintf(&b, "\nEvery Gateway and pod ready %s after the base manifests were applied.\n", r.Run.SetupReady.Sub(r.Run.SetupStart).Round(time.Second))
	case r.SetupFailed:
		b.WriteString("\n**Setup failed**, so no test ran:\n\n")
		if root := r.Run.Tests[r.Run.Root]; root != nil {
			for _, l := range r.failure(root.Name) {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	if len(r.Run.SetupState) > 0 && r.Run.SetupReady.IsZero() {
		b.WriteString("\nWhat Setup still waited for (the runner's last look):\n\n")
		for _, l := range r.Run.SetupState {
			fmt.Fprintf(&b, "    %s\n", strings.TrimSpace(l))
		}
	}

	fmt.Fprintf(&b, "\n## Core tests\n\nThe profile's tests whose features are all core (%s):\n\n", joinSet(r.Profile.CoreFeatures))
	b.WriteString("| result | test | time |\n|---|---|---|\n")
	for _, c := range r.Core {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Result, c.Short, dur(c.Elapsed))
	}

	b.WriteString("\n## Extended features\n\n| feature | result | tests |\n|---|---|---|\n")
	for _, f := range r.Features {
		var ts []string
		for _, t := range f.Failed {
			ts = append(ts, "failed: "+t)
		}
		for _, t := range f.Passed {
			ts = append(ts, "passed: "+t)
		}
		ts = append(ts, f.Other...)
		fmt.Fprintf(&b, "| %s | %s | %s |\n", f.Name, f.Result, strings.Join(ts, ", "))
	}

	b.WriteString("\n## Extended tests\n\n| result | test | features | time |\n|---|---|---|---|\n")
	for _, c := range r.Extended {
		p := ""
		if c.Provisional {
			p = " (provisional)"
		}
		fmt.Fprintf(&b, "| %s | %s%s | %s | %s |\n", c.Result, c.Short, p, strings.Join(c.Features, ", "), dur(c.Elapsed))
	}

	if len(r.Others) > 0 {
		fmt.Fprintf(&b, "\n## Other tests\n\nTests outside profile %s that ran (their features were claimed too; not counted above):\n\n", r.Profile.Name)
		b.WriteString("| result | test | features | time |\n|---|---|---|---|\n")
		for _, c := range r.Others {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Result, c.Short, strings.Join(c.Features, ", "), dur(c.Elapsed))
		}
	}

	var failed []Case
	for _, c := range slices.Concat(r.Core, r.Extended, r.Others) {
		if c.Result == "failed" {
			failed = append(failed, c)
		}
	}
	if len(failed) > 0 {
		b.WriteString("\n## Failures\n")
		for _, c := range failed {
			fmt.Fprintf(&b, "\n### %s\n\n", c.Short)
			for _, l := range c.Failure {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	var skipped []string
	for _, c := range r.Core {
		if c.Result == "skipped" || c.Result == "not run" {
			skipped = append(skipped, fmt.Sprintf("- %s (%s): %s", c.Short, c.Result, orDash(c.Why)))
		}
	}
	if len(skipped) > 0 {
		b.WriteString("\n## Core tests not run\n\n" + strings.Join(skipped, "\n") + "\n")
	}
	if !r.Run.Finished {
		b.WriteString("\n## The run did not finish\n\nThe runner's last output outside any test:\n\n")
		pk := r.Run.Package
		for _, l := range pk[max(0, len(pk)-15):] {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	if len(report) > 0 {
		fmt.Fprintf(&b, "\n## The suite's report\n\n[report.yaml](report.yaml):\n\n```yaml\n%s```\n", report)
	}
	return b.String()
}

func joinSet(s sets.Set[features.FeatureName]) string {
	var out []string
	for _, f := range sets.List(s) {
		out = append(out, string(f))
	}
	return strings.Join(out, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
