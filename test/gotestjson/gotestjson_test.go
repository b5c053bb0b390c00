package gotestjson

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `build note
{"Action":"run","Test":"TestA"}
{"Action":"output","Test":"TestA","Output":"    a_test.go:1: hello\n"}
{"Action":"run","Test":"TestA/one"}
{"Action":"pass","Test":"TestA/one","Elapsed":1.5}
{"Action":"run","Test":"TestA/one/deep"}
{"Action":"run","Test":"TestA/two"}
{"Action":"fail","Test":"TestA","Elapsed":3}
{"Action":"output","Output":"FAIL\n"}
{"Action":"fail"}
`
	var seen []string
	run, err := Parse(strings.NewReader(in), func(e Event, line string) { seen = append(seen, e.Test+": "+line) })
	if err != nil {
		t.Fatal(err)
	}
	if run.Root != "TestA" || !run.Finished || run.Tests["TestA"].Result != "fail" || run.Tests["TestA/one"].Elapsed != 1.5 {
		t.Errorf("run %+v", run)
	}
	if run.Tests["TestA/two"].Result != "" {
		t.Error("a test that never ended has a result")
	}
	var kids []string
	for _, c := range run.Children("TestA") {
		kids = append(kids, c.Name)
	}
	if strings.Join(kids, ",") != "TestA/one,TestA/two" {
		t.Errorf("children %v", kids)
	}
	if strings.Join(run.Package, "|") != "build note|FAIL" || strings.Join(seen, "|") != "TestA:     a_test.go:1: hello" {
		t.Errorf("package %q, seen %q", run.Package, seen)
	}
}
