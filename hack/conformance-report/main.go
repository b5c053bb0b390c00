// Command conformance-report is make conformance's reporting half
// (hack/conformance.sh runs it):
//
//	conformance-report skip FILE
//	    prints the skip list FILE (test/conformance/skip.txt) as the one
//	    regexp --ginkgo.skip takes; fails on an entry without a reason.
//	conformance-report summary -junit junit_01.xml -skip-file FILE -focus RE [-skip RE] [-title T] [-info LINE]... [-o summary.md] [-junit-out junit.xml]
//	    (-skip: the phase's skips on top of the list, left out of the table;
//	    -junit-out: the report pruned to the suite nodes and the specs listed)
//	    turns the e2e suite's JUnit report into summary.md: totals, then one
//	    row per focused spec (result, spec, time) sorted by result then name,
//	    each failure's first lines, and each spec the skip list left out with
//	    the list's reason for it. Exits 1 when a focused spec (or a suite
//	    node such as SynchronizedBeforeSuite) failed.
//
// The JUnit report holds every spec of the suite; which ones a phase ran is
// recomputed from the same regexps ginkgo applied (matched against the
// suite's name and the spec's full text, as ginkgo's focus.go does), so the
// summary can tell a spec the skip list removed from one outside the focus.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	code := 0
	switch os.Args[1] {
	case "skip":
		err = runSkip(os.Args[2:], os.Stdout)
	case "summary":
		code, err = runSummary(os.Args[2:], os.Stdout, os.Stderr)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance-report:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: conformance-report skip FILE\n"+
		"       conformance-report summary -junit FILE -skip-file FILE -focus RE [-skip RE] [-title T] [-info LINE]... [-o FILE] [-junit-out FILE]")
	os.Exit(2)
}

func readSkipList(path string) ([]skipEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSkipList(f, path)
}

func runSkip(args []string, out io.Writer) error {
	if len(args) != 1 {
		return fmt.Errorf("skip takes one file, got %d arguments", len(args))
	}
	entries, err := readSkipList(args[0])
	if err != nil {
		return err
	}
	fmt.Fprintln(out, skipRegexp(entries))
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, "; ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runSummary(args []string, stdout, stderr io.Writer) (int, error) {
	fs := flag.NewFlagSet("summary", flag.ContinueOnError)
	junitPath := fs.String("junit", "", "the suite's JUnit report (<report-dir>/junit_01.xml)")
	skipFile := fs.String("skip-file", "", "the skip list the run used")
	focus := fs.String("focus", "", "the run's --ginkgo.focus (default: the report's FocusStrings)")
	extra := fs.String("skip", "", "what the run skipped on top of the skip list (specs other phases run, SKIP=...): left out of the summary")
	title := fs.String("title", "Conformance", "the summary's heading")
	outPath := fs.String("o", "", "write the summary here (default: stdout)")
	junitOut := fs.String("junit-out", "", "write the report's suite nodes and focused specs (with the skip list's) here as JUnit")
	var info multiFlag
	fs.Var(&info, "info", "a line for the summary's header (command, versions); repeatable")
	if err := fs.Parse(args); err != nil {
		return 0, err
	}
	if *junitPath == "" {
		return 0, fmt.Errorf("summary needs -junit")
	}
	f, err := os.Open(*junitPath)
	if err != nil {
		return 0, err
	}
	suite, err := parseJUnit(f)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", *junitPath, err)
	}
	var entries []skipEntry
	if *skipFile != "" {
		if entries, err = readSkipList(*skipFile); err != nil {
			return 0, err
		}
	}
	if *focus == "" {
		*focus = suite.property("FocusStrings")
	}
	s, err := summarize(suite, *focus, *extra, entries)
	if err != nil {
		return 0, err
	}
	s.Title, s.Info = *title, info
	if *junitOut != "" {
		if err := writeFile(*junitOut, func(w io.Writer) error { return writeJUnit(w, suite, s.Kept) }); err != nil {
			return 0, err
		}
	}
	if *outPath == "" {
		s.write(stdout)
	} else if err := writeFile(*outPath, func(w io.Writer) error { s.write(w); return nil }); err != nil {
		return 0, err
	}
	fmt.Fprintf(stderr, "%s: %s\n", s.Title, s.totals())
	if s.failed() {
		return 1, nil
	}
	return 0, nil
}

// result is how a focused spec ended, in the order the table lists them.
type result int

const (
	resFailed    result = iota // failed, timedout, panicked, interrupted, aborted
	resPassed                  //
	resNotRun                  // skipped with no reason: the suite stopped before it (timeout, interrupt)
	resSuiteSkip               // the suite skipped it at run time (e2eskipper)
	resSkipList                // the skip list removed it
)

type row struct {
	Spec   string
	Status string // ginkgo's state
	Result result
	Time   float64
	Detail string // failure text, skip reason
}

type summary struct {
	Title       string
	Info        []string
	Start       string
	Time        float64
	Focus, Skip string
	Rows        []row
	SuiteFails  []row       // suite nodes (BeforeSuite, ReportAfterSuite...) that failed
	Kept        []junitCase // the suite nodes and the rows' cases, for the pruned JUnit
}

func summarize(suite *junitSuite, focus, extraSkip string, entries []skipEntry) (*summary, error) {
	var focusRE, extraRE *regexp.Regexp
	var err error
	if focus != "" {
		if focusRE, err = regexp.Compile(focus); err != nil {
			return nil, fmt.Errorf("focus %q: %w", focus, err)
		}
	}
	if extraSkip != "" {
		if extraRE, err = regexp.Compile(extraSkip); err != nil {
			return nil, fmt.Errorf("skip %q: %w", extraSkip, err)
		}
	}
	s := &summary{Start: suite.Timestamp, Time: suite.Time, Focus: focus, Skip: extraSkip}
	for _, c := range suite.Cases {
		node, text := c.split()
		if node != "It" {
			s.Kept = append(s.Kept, c)
			if c.failed() {
				s.SuiteFails = append(s.SuiteFails, row{Spec: "[" + node + "]", Status: c.Status, Result: resFailed, Time: c.Time, Detail: c.failureText()})
			}
			continue
		}
		// ginkgo matches "<suite description> <spec text>".
		full := suite.Name + " " + text
		if focusRE != nil && !focusRE.MatchString(full) {
			continue
		}
		if extraRE != nil && extraRE.MatchString(full) && !c.failed() && c.Status != "passed" {
			continue // another phase's, or left out on purpose (SKIP)
		}
		r := row{Spec: text, Status: c.Status, Time: c.Time}
		switch {
		case c.failed():
			r.Result, r.Detail = resFailed, c.failureText()
		case c.Status == "passed":
			r.Result = resPassed
		case c.Status == "pending":
			continue
		default: // skipped
			if e := match(entries, full); e != nil {
				r.Result, r.Detail = resSkipList, fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
			} else {
				r.Result, r.Detail = resSuiteSkip, c.skipMessage()
				if r.Detail == "" {
					r.Result = resNotRun
				}
			}
		}
		s.Rows = append(s.Rows, r)
		s.Kept = append(s.Kept, c)
	}
	slices.SortFunc(s.Rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(a.Result, b.Result), strings.Compare(a.Spec, b.Spec))
	})
	return s, nil
}

func (s *summary) count(r result) int {
	n := 0
	for _, x := range s.Rows {
		if x.Result == r {
			n++
		}
	}
	return n
}

// failed: a focused spec failed or never ran, or a suite node failed.
func (s *summary) failed() bool {
	return s.count(resFailed)+s.count(resNotRun) > 0 || len(s.SuiteFails) > 0
}

func (s *summary) totals() string {
	t := fmt.Sprintf("%d specs focused: %d passed, %d failed, %d skipped by the skip list, %d skipped by the suite",
		len(s.Rows), s.count(resPassed), s.count(resFailed), s.count(resSkipList), s.count(resSuiteSkip))
	if n := s.count(resNotRun); n > 0 {
		t += fmt.Sprintf("; %d not run (the suite stopped first)", n)
	}
	if len(s.SuiteFails) > 0 {
		t += fmt.Sprintf("; %d suite nodes failed", len(s.SuiteFails))
	}
	return t
}

func (r row) label() string {
	switch r.Result {
	case resPassed:
		return "passed"
	case resSuiteSkip:
		return "skipped (suite)"
	case resNotRun:
		return "**not run**"
	case resSkipList:
		return "skipped (skip list)"
	}
	return "**" + r.Status + "**"
}

func dur(secs float64) string {
	return time.Duration(secs * float64(time.Second)).Round(100 * time.Millisecond).String()
}

// cell makes text safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// excerpt is the first lines of a failure, enough to tell failures apart.
func excerpt(s string, lines int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > lines {
		l = append(l[:lines], "...")
	}
	return strings.ReplaceAll(strings.Join(l, "\n"), "```", "'''")
}

func (s *summary) write(w io.Writer) {
	fmt.Fprintf(w, "# %s\n\n", s.Title)
	if s.Start != "" {
		fmt.Fprintf(w, "- Started %s, ran %s\n", s.Start, dur(s.Time))
	}
	for _, i := range s.Info {
		fmt.Fprintf(w, "- %s\n", i)
	}
	fmt.Fprintf(w, "- Focus: `%s`\n", s.Focus)
	if s.Skip != "" {
		fmt.Fprintf(w, "- Left to other phases or skipped on purpose (not listed below): `%s`\n", s.Skip)
	}
	fmt.Fprintf(w, "\n**%s.**\n\n", s.totals())
	if len(s.SuiteFails) > 0 {
		fmt.Fprintf(w, "## Suite nodes that failed\n\n")
		for _, r := range s.SuiteFails {
			fmt.Fprintf(w, "%s (%s, %s):\n\n```\n%s\n```\n\n", r.Spec, r.Status, dur(r.Time), excerpt(r.Detail, 15))
		}
	}
	fmt.Fprintf(w, "| result | spec | time |\n|---|---|---|\n")
	for _, r := range s.Rows {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.label(), cell(r.Spec), dur(r.Time))
	}
	if n := s.count(resFailed); n > 0 {
		fmt.Fprintf(w, "\n## Failures\n")
		for _, r := range s.Rows {
			if r.Result == resFailed {
				fmt.Fprintf(w, "\n### %s\n\n```\n%s\n```\n", cell(r.Spec), excerpt(r.Detail, 12))
			}
		}
	}
	if s.count(resSkipList)+s.count(resSuiteSkip) > 0 {
		fmt.Fprintf(w, "\n## Skipped, and why\n\n| spec | reason |\n|---|---|\n")
		for _, r := range s.Rows {
			if r.Result == resSkipList || r.Result == resSuiteSkip {
				fmt.Fprintf(w, "| %s | %s |\n", cell(r.Spec), cell(r.Detail))
			}
		}
	}
}
