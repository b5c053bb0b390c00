// Package gotestjson reads the events of `go test -json` (cmd/test2json)
// into tests with their results and output: what the conformance runners'
// report tools (test/cnp, test/gateway) build their summaries from. A
// module of its own, standard library only, so both runner modules can
// require it (with a replace) without taking in each other's dependencies.
package gotestjson

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"time"
)

// Event is one line of `go test -json`.
type Event struct {
	Time    time.Time
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// Test is one test or subtest as the events tell it.
type Test struct {
	Name    string // full name: Root/Sub/...
	Result  string // pass, fail, skip; "" when it never ended
	Elapsed float64
	Output  []string // its output lines, without the newline
}

// Run is one run of a test binary.
type Run struct {
	Root     string // the first test's top-level name
	Tests    map[string]*Test
	Order    []string // names in start order
	Finished bool     // the package reported pass or fail
	Package  []string // lines outside any test (panics, timeouts, build errors)
	Log      []string // every output line, in order (the -v text)
}

// Parse reads go test -json events. Lines that are not JSON (a build
// failure printed before the events) go to Package. onOutput, when not
// nil, sees each output line of a test as it is read.
func Parse(r io.Reader, onOutput func(e Event, line string)) (*Run, error) {
	run := &Run{Tests: map[string]*Test{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e Event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			run.Package = append(run.Package, string(line))
			continue
		}
		if e.Action == "output" {
			run.Log = append(run.Log, e.Output)
		}
		if e.Test == "" {
			switch e.Action {
			case "pass", "fail":
				run.Finished = true
			case "output":
				run.Package = append(run.Package, strings.TrimRight(e.Output, "\n"))
			}
			continue
		}
		if run.Root == "" {
			run.Root, _, _ = strings.Cut(e.Test, "/")
		}
		t := run.Tests[e.Test]
		if t == nil {
			t = &Test{Name: e.Test}
			run.Tests[e.Test] = t
			run.Order = append(run.Order, e.Test)
		}
		switch e.Action {
		case "pass", "fail", "skip":
			t.Result, t.Elapsed = e.Action, e.Elapsed
		case "output":
			o := strings.TrimRight(e.Output, "\n")
			t.Output = append(t.Output, o)
			if onOutput != nil {
				onOutput(e, o)
			}
		}
	}
	return run, sc.Err()
}

// Children are the direct subtests of name, in start order.
func (r *Run) Children(name string) []*Test {
	var out []*Test
	for _, n := range r.Order {
		if rest, ok := strings.CutPrefix(n, name+"/"); ok && !strings.Contains(rest, "/") {
			out = append(out, r.Tests[n])
		}
	}
	return out
}
