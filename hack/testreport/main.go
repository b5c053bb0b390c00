// Command testreport turns `go test -json` (on stdin) into what a person
// reads: a line per package (ok or FAIL), build errors and the output of
// every failing test as they happen, and at the end every skipped test with
// its reason and one closing line "tests: N passed, N failed, N skipped".
// hack/test.sh pipes the suite through it.
//
// A skip is listed, not hidden: in CI nothing may skip (testutil.Skip fails
// there), and outside CI the list says what a run did not cover. The exit
// status is 1 when anything failed, including a package that did not build
// or whose test binary died (a timeout, os.Exit) with tests still running:
// those tests count as failed and their output is shown.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string // build-output, build-fail
}

type test struct{ pkg, name string }

type skipped struct {
	test
	reason string
}

// report accumulates the run; its methods print as events arrive.
type report struct {
	w    io.Writer
	trim string        // import path prefix left out of names
	slow time.Duration // passing tests at least this slow are shown

	out     map[test][]string // output of each test (name "" = the package) so far
	running map[test]bool
	passed  int
	failed  int
	skips   []skipped
	badPkgs []string       // packages that failed
	pkgFail map[string]int // failed tests per package
}

func newReport(w io.Writer, trim string, slow time.Duration) *report {
	return &report{w: w, trim: trim, slow: slow, out: map[test][]string{}, running: map[test]bool{}, pkgFail: map[string]int{}}
}

func (r *report) short(pkg string) string { return strings.TrimPrefix(pkg, r.trim) }

// line handles one input line; what is not JSON is passed through.
func (r *report) line(b []byte) {
	var e event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &e) != nil {
		fmt.Fprintf(r.w, "%s\n", b)
		return
	}
	k := test{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.w, e.Output)
	case "start", "pause", "cont":
	case "run":
		r.running[k] = true
	case "output":
		r.out[k] = append(r.out[k], e.Output)
	case "pass", "fail", "skip":
		if e.Test == "" {
			r.pkgDone(e)
		} else {
			r.testDone(k, e)
		}
	}
}

func (r *report) testDone(k test, e event) {
	delete(r.running, k)
	out := r.out[k]
	delete(r.out, k)
	switch e.Action {
	case "pass":
		r.passed++
		if d := time.Duration(e.Elapsed * float64(time.Second)); r.slow > 0 && d >= r.slow {
			fmt.Fprintf(r.w, "    pass %s %s (%.1fs)\n", r.short(k.pkg), k.name, e.Elapsed)
		}
	case "fail":
		r.fail(k, out)
	case "skip":
		r.skips = append(r.skips, skipped{k, skipReason(out)})
	}
}

func (r *report) pkgDone(e event) {
	pkg := test{pkg: e.Package}
	out := r.out[pkg]
	delete(r.out, pkg)
	switch e.Action {
	case "pass":
		fmt.Fprintf(r.w, "ok  \t%s\t%.1fs\n", r.short(e.Package), e.Elapsed)
	case "skip": // no test files
	case "fail":
		// Tests still running when their binary died (a timeout panic,
		// os.Exit) never report; their output holds the reason.
		var died []test
		for k := range r.running {
			if k.pkg == e.Package {
				died = append(died, k)
			}
		}
		slices.SortFunc(died, func(a, b test) int { return strings.Compare(a.name, b.name) })
		for _, k := range died {
			delete(r.running, k)
			r.fail(k, append(r.out[k], "--- FAIL: "+k.name+" (did not finish: the test binary exited)\n"))
			delete(r.out, k)
		}
		r.badPkgs = append(r.badPkgs, e.Package)
		sawFail := false
		for _, l := range out {
			if t := strings.TrimSpace(l); t == "FAIL" || t == "PASS" {
				continue
			}
			if strings.HasPrefix(l, "FAIL\t") {
				sawFail = true
				l = strings.Replace(l, e.Package, r.short(e.Package), 1)
			}
			fmt.Fprint(r.w, l)
		}
		if !sawFail {
			fmt.Fprintf(r.w, "FAIL\t%s\n", r.short(e.Package))
		}
	}
}

func (r *report) fail(k test, out []string) {
	r.failed++
	r.pkgFail[k.pkg]++
	r.printTest(k, out)
}

// printTest shows a failing test's output without the === framing lines.
func (r *report) printTest(k test, out []string) {
	fmt.Fprintf(r.w, "=== %s %s\n", r.short(k.pkg), k.name)
	for _, l := range out {
		if strings.HasPrefix(l, "=== ") {
			continue
		}
		fmt.Fprint(r.w, l)
		if !strings.HasSuffix(l, "\n") {
			fmt.Fprintln(r.w)
		}
	}
}

// logLine starts a message of t.Log/t.Skip: "    file_test.go:12: ...".
var logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// skipReason is the last message a skipped test logged (its t.Skip
// message, continuation lines included), without the file:line prefix.
func skipReason(out []string) string {
	var msg []string
	for _, l := range out {
		l = strings.TrimRight(l, "\n")
		switch {
		case strings.HasPrefix(l, "=== "), strings.HasPrefix(l, "--- "):
		case logLine.MatchString(l):
			msg = []string{logLine.ReplaceAllString(l, "")}
		case msg != nil && strings.TrimSpace(l) != "":
			msg = append(msg, strings.TrimSpace(l))
		}
	}
	if msg == nil {
		return "(no reason given)"
	}
	return strings.Join(msg, " / ")
}

// summary prints the skipped tests and the closing line; it reports
// whether the run failed.
func (r *report) summary() bool {
	// A package that failed with no failing test (a build error, TestMain)
	// counts once, so the closing line never says 0 failed for a failed run.
	failed := r.failed
	var bad []string
	for _, p := range r.badPkgs {
		if r.pkgFail[p] == 0 {
			failed++
		}
		bad = append(bad, r.short(p))
	}
	fmt.Fprintln(r.w)
	if len(r.skips) > 0 {
		fmt.Fprintf(r.w, "skipped (%d):\n", len(r.skips))
		for _, s := range r.skips {
			fmt.Fprintf(r.w, "  %s %s: %s\n", r.short(s.pkg), s.name, s.reason)
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(r.w, "FAIL: %s\n", strings.Join(bad, " "))
	}
	fmt.Fprintf(r.w, "tests: %d passed, %d failed, %d skipped\n", r.passed, failed, len(r.skips))
	return failed > 0
}

func main() {
	trim := flag.String("trim", "", "import path prefix to leave out of package names")
	slow := flag.Duration("slow", 10*time.Second, "show passing tests that take at least this long (0: never)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go test -json ... | testreport [flags]\n       testreport [flags] STREAM...   (several go test -json streams at once, e.g. FIFOs)")
		flag.PrintDefaults()
	}
	flag.Parse()
	r := newReport(os.Stdout, *trim, *slow)
	inputs := []io.Reader{os.Stdin}
	if flag.NArg() > 0 {
		inputs = nil
		for _, name := range flag.Args() {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
				os.Exit(1)
			}
			defer f.Close()
			inputs = append(inputs, f)
		}
	}
	if err := readLines(inputs, r.line); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: reading go test -json: %v\n", err)
		os.Exit(1)
	}
	if r.summary() {
		os.Exit(1)
	}
}

// readLines calls line with every line of every input, whole lines only,
// from one goroutine: the inputs are read at once, so several go test
// runs side by side (hack/test.sh) report as their events come.
func readLines(inputs []io.Reader, line func([]byte)) error {
	lines := make(chan []byte, 64)
	errs := make(chan error, len(inputs))
	for _, in := range inputs {
		go func() {
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 1<<20), 64<<20)
			for sc.Scan() {
				lines <- slices.Clone(sc.Bytes())
			}
			errs <- sc.Err()
		}()
	}
	var first error
	for open := len(inputs); open > 0; {
		select {
		case l := <-lines:
			line(l)
		case err := <-errs:
			open--
			if first == nil {
				first = err
			}
		}
	}
	// What was sent before its reader ended.
	for {
		select {
		case l := <-lines:
			line(l)
		default:
			return first
		}
	}
}
