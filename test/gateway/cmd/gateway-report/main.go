// Command gateway-report turns the `go test -json` events of the Gateway
// API conformance runner (test/gateway) and the suite's report.yaml into
// docs/conformance/gateway/summary.md: the profile's core tests each with
// its result, each extended feature passed, failed or not supported (with
// its tests), the first lines of each failure, what Setup waited for, and
// the suite's own report.
//
//	gateway-report -events events.json -report report.yaml -o summary.md \
//	    -title T -info "Date: ..." -info "Command: ..."
//
// Exits 1 when a test that ran failed, Setup failed, or the run did not
// finish.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/flatnet/flatnet/test/gotestjson"
)

func main() {
	tool := gotestjson.NewTool("gateway-report", "Gateway API conformance")
	run, rep := gotestjson.Start(tool, func(f *os.File) (*Run, error) { return Parse(io.Reader(f)) })
	r := Classify(run)
	tool.Write(Summary(r, *tool.Title, tool.Info, rep), run.Run)
	fmt.Printf("gateway-report: %s; %s\n", r.Headline(), *tool.Out)
	if !r.OK() {
		os.Exit(1)
	}
}
