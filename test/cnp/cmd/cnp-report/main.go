// Command cnp-report turns the `go test -json` events of the CNP
// conformance runner (test/cnp) into docs/conformance/cnp/summary.md and a
// JUnit file: one row per test of the suite with its result and subtests,
// the first lines of each failure, each skip with its reason, the setup's
// and the lab baseline's outcome, and the suite's own report.
//
//	cnp-report -events go-test.json -report report.yaml -o summary.md -junit junit.xml \
//	    -title T -info "Date: ..." -info "Command: ..."
//
// Exits 1 when a test that ran failed, or the run did not finish.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, "; ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	events := flag.String("events", "", "go test -json output")
	report := flag.String("report", "", "the suite's conformance report (YAML), optional")
	out := flag.String("o", "", "summary.md to write")
	junit := flag.String("junit", "", "JUnit XML to write, optional")
	logOut := flag.String("log", "", "the run's -v text to write, optional")
	title := flag.String("title", "ClusterNetworkPolicy conformance", "summary title")
	var info multi
	flag.Var(&info, "info", "a line under the title (repeatable)")
	flag.Parse()
	if *events == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "cnp-report: -events and -o are required")
		os.Exit(2)
	}
	f, err := os.Open(*events)
	if err != nil {
		fail(err)
	}
	run, err := Parse(f)
	f.Close()
	if err != nil {
		fail(err)
	}
	var rep []byte
	if *report != "" {
		if rep, err = os.ReadFile(*report); err != nil && !os.IsNotExist(err) {
			fail(err)
		}
	}
	if err := os.WriteFile(*out, []byte(Summary(run, *title, info, rep)), 0o644); err != nil {
		fail(err)
	}
	if *logOut != "" {
		if err := os.WriteFile(*logOut, []byte(strings.Join(run.Log, "")), 0o644); err != nil {
			fail(err)
		}
	}
	if *junit != "" {
		b, err := JUnit(run)
		if err != nil {
			fail(err)
		}
		if err := os.WriteFile(*junit, b, 0o644); err != nil {
			fail(err)
		}
	}
	t := run.Totals()
	fmt.Printf("cnp-report: %d tests: %d passed, %d failed, %d skipped, %d not supported, %d not run; %s\n",
		t.Tests, t.Passed, t.Failed, t.Skipped, t.NotSupported, t.NotRun, *out)
	if t.Failed > 0 || t.NotRun > 0 || !run.Finished {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cnp-report:", err)
	os.Exit(2)
}
