package main

import (
	"io"
	"strings"
	"testing"
)

// run feeds go test -json lines (one per line of in) through a report.
func run(in string) (string, bool) {
	var b strings.Builder
	r := newReport(&b, "m/", 0)
	for _, l := range strings.Split(strings.TrimSpace(in), "\n") {
		r.line([]byte(strings.TrimSpace(l)))
	}
	failed := r.summary()
	return b.String(), failed
}

func requireAll(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestPassAndSkipCounted(t *testing.T) {
	out, failed := run(`
{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestOK"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"m/a","Test":"TestOK","Output":"    a_test.go:3: chatter\n"}
{"Action":"pass","Package":"m/a","Test":"TestOK","Elapsed":0}
{"Action":"run","Package":"m/a","Test":"TestRoot"}
{"Action":"output","Package":"m/a","Test":"TestRoot","Output":"=== RUN   TestRoot\n"}
{"Action":"output","Package":"m/a","Test":"TestRoot","Output":"    a_test.go:9: an earlier log line\n"}
{"Action":"output","Package":"m/a","Test":"TestRoot","Output":"    a_test.go:10: skipping: needs root\n"}
{"Action":"output","Package":"m/a","Test":"TestRoot","Output":"        run sudo make test\n"}
{"Action":"output","Package":"m/a","Test":"TestRoot","Output":"--- SKIP: TestRoot (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestRoot","Elapsed":0}
{"Action":"output","Package":"m/a","Output":"PASS\n"}
{"Action":"pass","Package":"m/a","Elapsed":0.5}
{"Action":"start","Package":"m/none"}
{"Action":"output","Package":"m/none","Output":"?   \tm/none\t[no test files]\n"}
{"Action":"skip","Package":"m/none","Elapsed":0}
`)
	if failed {
		t.Error("a run with no failure reported as failed")
	}
	requireAll(t, out,
		"ok  \ta\t0.5s\n",
		"skipped (1):\n  a TestRoot: skipping: needs root / run sudo make test\n",
		"\ntests: 1 passed, 0 failed, 1 skipped\n")
	if strings.Contains(out, "chatter") || strings.Contains(out, "no test files") {
		t.Errorf("a passing test's or an empty package's output shown:\n%s", out)
	}
	if !strings.HasSuffix(out, "tests: 1 passed, 0 failed, 1 skipped\n") {
		t.Errorf("the count is not the closing line:\n%s", out)
	}
}

func TestFailuresShownAndCounted(t *testing.T) {
	out, failed := run(`
{"ImportPath":"m/b [m/b.test]","Action":"build-output","Output":"# m/b [m/b.test]\n"}
{"ImportPath":"m/b [m/b.test]","Action":"build-output","Output":"b/b_test.go:3:32: undefined: x\n"}
{"ImportPath":"m/b [m/b.test]","Action":"build-fail"}
{"Action":"start","Package":"m/b"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b [build failed]\n"}
{"Action":"fail","Package":"m/b","Elapsed":0,"FailedBuild":"m/b [m/b.test]"}
{"Action":"start","Package":"m/c"}
{"Action":"run","Package":"m/c","Test":"TestBad"}
{"Action":"output","Package":"m/c","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"m/c","Test":"TestBad","Output":"    c_test.go:4: got 1, want 2\n"}
{"Action":"output","Package":"m/c","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"m/c","Test":"TestBad","Elapsed":0}
{"Action":"run","Package":"m/c","Test":"TestHang"}
{"Action":"output","Package":"m/c","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"m/c","Test":"TestHang","Output":"panic: test timed out after 20m0s\n"}
{"Action":"output","Package":"m/c","Output":"FAIL\tm/c\t1200.1s\n"}
{"Action":"fail","Package":"m/c","Elapsed":1200.1}
`)
	if !failed {
		t.Error("a failed run reported as passed")
	}
	requireAll(t, out,
		"b/b_test.go:3:32: undefined: x\n",
		"FAIL\tb [build failed]\n",
		"c_test.go:4: got 1, want 2\n",
		"panic: test timed out after 20m0s\n--- FAIL: TestHang (did not finish",
		"FAIL: b c\n",
		// 2 tests in c, and b that never built
		"tests: 0 passed, 3 failed, 0 skipped\n")
}

// Two streams read at once (hack/test.sh runs test/e2e beside the other
// packages): every line of each arrives whole and in its stream's order,
// long lines too, and a failure in either fails the run.
func TestReadLinesMergesStreams(t *testing.T) {
	long := strings.Repeat("x", 200_000)
	a := `{"Action":"run","Package":"m/a","Test":"TestA"}
{"Action":"output","Package":"m/a","Test":"TestA","Output":"` + long + `\n"}
{"Action":"pass","Package":"m/a","Test":"TestA","Elapsed":0}
{"Action":"pass","Package":"m/a","Elapsed":0.1}
`
	b := `{"Action":"run","Package":"m/e2e","Test":"TestB"}
{"Action":"output","Package":"m/e2e","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}
{"Action":"fail","Package":"m/e2e","Test":"TestB","Elapsed":0}
{"Action":"fail","Package":"m/e2e","Elapsed":0.1}
`
	var out strings.Builder
	r := newReport(&out, "m/", 0)
	var got []string
	err := readLines([]io.Reader{strings.NewReader(a), strings.NewReader(b)}, func(l []byte) {
		got = append(got, string(l))
		r.line(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("%d lines, want 8", len(got))
	}
	var fromA []string
	for _, l := range got {
		if strings.Contains(l, `"m/a"`) {
			fromA = append(fromA, l)
		}
	}
	if strings.Join(fromA, "\n")+"\n" != a {
		t.Errorf("stream a's lines out of order or cut")
	}
	if !r.summary() {
		t.Error("a failure in the second stream did not fail the run")
	}
	requireAll(t, out.String(), "tests: 1 passed, 1 failed, 0 skipped")
}
