package gotestjson

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Lines is a repeatable string flag.
type Lines []string

func (l *Lines) String() string     { return strings.Join(*l, "; ") }
func (l *Lines) Set(v string) error { *l = append(*l, v); return nil }

// Tool is the command line the report tools share: the runner's events,
// the suite's report (YAML, optional), where the summary and the -v text
// go, the title and the lines under it.
type Tool struct {
	Name                            string
	Events, Report, Out, Log, Title *string
	Info                            Lines
}

// NewTool registers the shared flags on the command line.
func NewTool(name, title string) *Tool {
	t := &Tool{Name: name}
	t.Events = flag.String("events", "", "go test -json output of the runner")
	t.Report = flag.String("report", "", "the suite's conformance report (YAML), optional")
	t.Out = flag.String("o", "", "summary.md to write")
	t.Log = flag.String("log", "", "the run's -v text to write, optional")
	t.Title = flag.String("title", title, "summary title")
	flag.Var(&t.Info, "info", "a line under the title (repeatable)")
	return t
}

// Start parses the command line, parses the events with parse and reads
// the suite's report (nil when there is none); it exits on an error.
func Start[R any](t *Tool, parse func(*os.File) (R, error)) (R, []byte) {
	flag.Parse()
	if *t.Events == "" || *t.Out == "" {
		fmt.Fprintf(os.Stderr, "%s: -events and -o are required\n", t.Name)
		os.Exit(2)
	}
	f, err := os.Open(*t.Events)
	if err != nil {
		t.Fail(err)
	}
	run, err := parse(f)
	f.Close()
	if err != nil {
		t.Fail(err)
	}
	var rep []byte
	if *t.Report != "" {
		if rep, err = os.ReadFile(*t.Report); err != nil && !os.IsNotExist(err) {
			t.Fail(err)
		}
	}
	return run, rep
}

// Write writes the summary and, when asked, the run's -v text.
func (t *Tool) Write(summary string, run *Run) {
	if err := os.WriteFile(*t.Out, []byte(summary), 0o644); err != nil {
		t.Fail(err)
	}
	if *t.Log != "" {
		if err := os.WriteFile(*t.Log, []byte(strings.Join(run.Log, "")), 0o644); err != nil {
			t.Fail(err)
		}
	}
}

// Fail prints err and exits 2.
func (t *Tool) Fail(err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", t.Name, err)
	os.Exit(2)
}
