package main

import (
	"bufio"
	"math/rand/v2"
	"strings"
	"testing"
)

// dnsperf 2.10's -v output, abridged: per-query lines, a timeout, the
// statistics block.
const dnsperfOut = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 15353 -d q -v -l 2
> NOERROR svc1.ns1.svc.cluster.local A 0.001000
> NOERROR svc2.ns1.svc.cluster.local A 0.003000
> NXDOMAIN example.com.cluster.local A 0.002000
> NOERROR svc3.ns1.svc.cluster.local AAAA 0.004000
[Timeout] Query timed out: msg id 7
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         5
  Queries completed:    4 (80.00%)
  Queries lost:         1 (20.00%)

  Response codes:       NOERROR 3 (75.00%), NXDOMAIN 1 (25.00%)
  Run time (s):         2.000123
  Queries per second:   2.000000

  Average Latency (s):  0.002500 (min 0.001000, max 0.004000)
`

func TestParseDnsperf(t *testing.T) {
	r, err := parseDnsperf(strings.NewReader(dnsperfOut))
	if err != nil {
		t.Fatal(err)
	}
	if r.Sent != 5 || r.Completed != 4 || r.Lost != 1 || r.QPS != 2 || r.Duration != 2.000123 {
		t.Errorf("statistics: %+v", r)
	}
	if r.Rcodes["NOERROR"] != 3 || r.Rcodes["NXDOMAIN"] != 1 || len(r.Rcodes) != 2 {
		t.Errorf("rcodes: %v", r.Rcodes)
	}
	if r.AvgMs != 2.5 || r.P50Ms != 2 || r.P99Ms != 4 {
		t.Errorf("latency: avg %v p50 %v p99 %v, want 2.5, 2, 4", r.AvgMs, r.P50Ms, r.P99Ms)
	}
	if _, err := parseDnsperf(strings.NewReader("Queries per second: 5\n")); err == nil {
		t.Error("output without -v lines: no error")
	}
}

// The search-path case without autopath asks, per name, for the tries
// glibc makes up to the answer; with autopath for the first try of the
// same names; PerName matches the files.
func TestSearchCases(t *testing.T) {
	lines := func(id string) []string {
		c, _ := caseByID(id)
		var b strings.Builder
		w := bufio.NewWriter(&b)
		c.write(w, rand.New(rand.NewPCG(1, 'd')), 100, 100)
		w.Flush()
		return strings.Split(strings.TrimSpace(b.String()), "\n")
	}
	search, auto := lines("d-search"), lines("d-autopath")
	if len(auto) != 2*externals || float64(len(search))/float64(len(auto)) != 3 {
		t.Fatalf("%d search-path queries for %d names, want 3 each on average", len(search), len(auto))
	}
	firsts := map[string]bool{}
	for _, l := range search {
		if strings.Count(l, "."+clientNS+".svc.") == 1 {
			firsts[l] = true
		}
	}
	for _, l := range auto {
		if !firsts[l] {
			t.Fatalf("autopath query %q is not a first try of the search-path file", l)
		}
	}
	if got := searchPath(searchName{extName(3), true}); strings.Join(got, " ") !=
		"h3.example.com.ns0.svc.cluster.local h3.example.com.svc.cluster.local h3.example.com.cluster.local h3.example.com." {
		t.Errorf("external search path: %v", got)
	}
}

func TestReport(t *testing.T) {
	var rs []result
	for i, q := range []float64{50000, 60000, 55000} {
		rs = append(rs, result{Case: "a", Server: "coredns", Run: i + 1, QPS: q, P50Ms: 1, P99Ms: 4, RSSKiB: 100 << 10, CPUS: 19, Duration: 20})
		rs = append(rs, result{Case: "a", Server: "flatnet", Run: i + 1, QPS: 2 * q, P50Ms: 0.5, P99Ms: 2, RSSKiB: 50 << 10, CPUS: 20, Duration: 20})
	}
	var b strings.Builder
	writeReport(&b, rs)
	for _, want := range []string{
		"| (a) | coredns | **55.0k** [50.0k–60.0k] | 55.0k | 1.00 ms | 4.00 ms | 95 % | 57.9k | 0 | 100.0 MiB |",
		"| (a) | flatnet | **110.0k** (2.00×) [100.0k–120.0k] | 110.0k | 0.50 ms | 2.00 ms | 100 % | 110.0k | 0 | 50.0 MiB |",
		"| (b) | coredns | not run |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
