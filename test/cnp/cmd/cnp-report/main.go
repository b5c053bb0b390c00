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
	"io"
	"os"

	"github.com/flatnet/flatnet/test/gotestjson"
)

func main() {
	tool := gotestjson.NewTool("cnp-report", "ClusterNetworkPolicy conformance")
	junit := flag.String("junit", "", "JUnit XML to write, optional")
	run, rep := gotestjson.Start(tool, func(f *os.File) (*Run, error) { return Parse(io.Reader(f)) })
	tool.Write(Summary(run, *tool.Title, tool.Info, rep), run.Run)
	if *junit != "" {
		b, err := JUnit(run)
		if err != nil {
			tool.Fail(err)
		}
		if err := os.WriteFile(*junit, b, 0o644); err != nil {
			tool.Fail(err)
		}
	}
	t := run.Totals()
	fmt.Printf("cnp-report: %d tests: %d passed, %d failed, %d skipped, %d not supported, %d not run; %s\n",
		t.Tests, t.Passed, t.Failed, t.Skipped, t.NotSupported, t.NotRun, *tool.Out)
	if t.Failed > 0 || t.NotRun > 0 || !run.Finished {
		os.Exit(1)
	}
}
