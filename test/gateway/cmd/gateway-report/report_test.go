package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/test/gotestjson"
)

// events writes go test -json lines: each entry is test, action, output.
func events(t *testing.T, es [][3]string) string {
	t.Helper()
	var b strings.Builder
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	for i, e := range es {
		line, err := json.Marshal(gotestjson.Event{Time: at.Add(time.Duration(i) * time.Second), Action: e[1], Test: e[0], Output: e[2], Elapsed: 2})
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

const root = "TestGatewayAPIConformance"

// output is one output event per line of test.
func output(test string, lines ...string) [][3]string {
	var es [][3]string
	for _, l := range lines {
		es = append(es, [3]string{test, "output", l + "\n"})
	}
	return es
}

// classified parses and classifies the events of the given groups.
func classified(t *testing.T, groups ...[][3]string) *Report {
	t.Helper()
	run, err := Parse(strings.NewReader(events(t, slices.Concat(groups...))))
	if err != nil {
		t.Fatal(err)
	}
	return Classify(run)
}

// testifyError is what require prints for a failed assertion.
func testifyError(test string, err ...string) [][3]string {
	lines := []string{"    helpers.go:1: ", "        \tError Trace:\thelpers.go:1", "        \tError:      \t" + err[0]}
	for _, e := range err[1:] {
		lines = append(lines, "        \t            \t"+e)
	}
	return output(test, append(lines, "        \tTest:       \t"+test)...)
}

func TestClassify(t *testing.T) {
	exact := root + "/HTTPRouteExactPathMatching"
	r := classified(t,
		[][3]string{{root, "run", ""}},
		output(root, "    gateway_test.go:150: SUPPORTED-FEATURES Gateway,HTTPRoute,HTTPRouteQueryParamMatching,ReferenceGrant",
			"    suite.go:395: 2026-12-02T03:00:01Z: Test Setup: Applying base manifests",
			"    helpers.go:309: 2026-12-02T03:00:09Z: Gateways and Pods in gateway-conformance-infra namespaces ready"),
		[][3]string{{root + "/HTTPRouteSimpleSameNamespace", "run", ""}, {root + "/HTTPRouteSimpleSameNamespace", "pass", ""}, {exact, "run", ""}},
		testifyError(exact, "Condition never satisfied", "after 30s"),
		[][3]string{{exact, "fail", ""}, {root + "/HTTPRouteQueryParamMatching", "run", ""}, {root + "/HTTPRouteQueryParamMatching", "pass", ""},
			{root + "/HTTPRouteRedirectPath", "run", ""}},
		output(root+"/HTTPRouteRedirectPath", "    conformance.go:56: Skipping HTTPRouteRedirectPath: suite does not support HTTPRoutePathRedirect"),
		[][3]string{{root + "/HTTPRouteRedirectPath", "skip", ""}, {root, "fail", ""}, {"", "fail", ""}})
	run := r.Run
	if r.SetupFailed || !run.Finished {
		t.Errorf("setup failed %v, finished %v", r.SetupFailed, run.Finished)
	}
	byName := map[string]Case{}
	for _, c := range append(r.Core, r.Extended...) {
		byName[c.Short] = c
	}
	for name, want := range map[string]string{
		"HTTPRouteSimpleSameNamespace": "passed", "HTTPRouteExactPathMatching": "failed", "HTTPRouteQueryParamMatching": "passed",
		"HTTPRouteRedirectPath": "not supported", "HTTPRouteWeight": "not run",
	} {
		if got := byName[name].Result; got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if !byName["HTTPRouteSimpleSameNamespace"].Core || byName["HTTPRouteQueryParamMatching"].Core {
		t.Error("core/extended mixed up")
	}
	if f := byName["HTTPRouteExactPathMatching"].Failure; strings.Join(f, "|") != "Error:      \tCondition never satisfied|after 30s" {
		t.Errorf("failure lines %q", f)
	}
	feats := map[string]string{}
	for _, f := range r.Features {
		feats[f.Name] = f.Result
	}
	if feats["HTTPRouteQueryParamMatching"] != "passed" || feats["HTTPRoutePathRedirect"] != "not supported" {
		t.Errorf("features %v", feats)
	}
	if r.OK() {
		t.Error("a failed core test, yet OK")
	}
	s := Summary(r, "T", []string{"Date: x"}, []byte("kind: ConformanceReport\n"))
	for _, want := range []string{"| failed | HTTPRouteExactPathMatching |", "| HTTPRouteQueryParamMatching | passed | passed: HTTPRouteQueryParamMatching |",
		"Every Gateway and pod ready 1s after", "### HTTPRouteExactPathMatching", "kind: ConformanceReport"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}

// A Setup that times out: every test not run, what Setup waited for.
func TestSetupFailed(t *testing.T) {
	r := classified(t,
		[][3]string{{root, "run", ""}},
		output(root, "    suite.go:395: 2026-12-02T03:00:01Z: Test Setup: Applying base manifests",
			"    gateway_test.go:200: SETUP-STATE",
			"          Gateway gateway-conformance-infra/same-namespace: Accepted=none Programmed=none",
			"          gateway-conformance-infra: 10 of 10 pods Ready"),
		testifyError(root, "Received unexpected error:", "context deadline exceeded"),
		output(root, "        \tMessages:   \terror waiting for gateway-conformance-infra namespaces to be ready"),
		[][3]string{{root, "fail", ""}, {"", "fail", ""}})
	if !r.SetupFailed || r.OK() {
		t.Fatalf("SetupFailed %v OK %v", r.SetupFailed, r.OK())
	}
	if c := counts(r.Core); c["not run"] != len(r.Core) {
		t.Errorf("core %v", c)
	}
	s := Summary(r, "T", nil, nil)
	for _, want := range []string{"**Setup failed**", "context deadline exceeded", "Messages:   \terror waiting",
		"Gateway gateway-conformance-infra/same-namespace: Accepted=none Programmed=none", "10 of 10 pods Ready"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}
