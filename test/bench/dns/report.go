package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// servers in table order: the anchor first.
var servers = []string{"coredns", "flatnet"}

// summary is the runs of one case against one server.
type summary struct {
	runs                int
	qps, qpsMin, qpsMax float64
	p50, p99, cpuShare  float64 // medians over the runs
	lost                int
	rssMiB              float64 // after the last run
}

func summarize(rs []result) summary {
	med := func(f func(result) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		return xs[len(xs)/2] // the median of 3; the upper middle of an even count
	}
	s := summary{runs: len(rs)}
	s.qps = med(func(r result) float64 { return r.QPS })
	s.qpsMin = slices.MinFunc(rs, func(a, b result) int { return cmpF(a.QPS, b.QPS) }).QPS
	s.qpsMax = slices.MaxFunc(rs, func(a, b result) int { return cmpF(a.QPS, b.QPS) }).QPS
	s.p50 = med(func(r result) float64 { return r.P50Ms })
	s.p99 = med(func(r result) float64 { return r.P99Ms })
	s.cpuShare = med(func(r result) float64 { return r.CPUS / max(r.Duration, 1e-9) })
	for _, r := range rs {
		s.lost += r.Lost
	}
	last := slices.MaxFunc(rs, func(a, b result) int { return a.Run - b.Run })
	s.rssMiB = float64(last.RSSKiB) / 1024
	return s
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func kqps(q float64) string { return fmt.Sprintf("%.1fk", q/1000) }

func readResults(r io.Reader) ([]result, error) {
	var rs []result
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var res result
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			return nil, fmt.Errorf("result line %q: %w", sc.Text(), err)
		}
		rs = append(rs, res)
	}
	return rs, sc.Err()
}

// writeReport prints one markdown table: per case, each server's median
// QPS [range], names resolved per second, p50/p99, the server's CPU share
// during the runs (about 100 %: the server, not dnsperf, was the limit;
// well below: the client or something the server waited on was), QPS per
// core of the server's CPU, lost queries and resident memory after the
// case; then what each case is.
func writeReport(w io.Writer, rs []result) {
	by := map[string]map[string][]result{}
	for _, r := range rs {
		if by[r.Case] == nil {
			by[r.Case] = map[string][]result{}
		}
		by[r.Case][r.Server] = append(by[r.Case][r.Server], r)
	}
	fmt.Fprintln(w, "| case | server | QPS (median) [range] | names/s | p50 | p99 | server CPU | QPS per server core | lost | RSS after |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range cases {
		var anchor *summary
		for _, srv := range servers {
			runs := by[c.ID][srv]
			if len(runs) == 0 {
				fmt.Fprintf(w, "| (%s) | %s | not run | | | | | | | |\n", c.ID, srv)
				continue
			}
			s := summarize(runs)
			ratio := ""
			if anchor == nil {
				anchor = &s
			} else {
				ratio = fmt.Sprintf(" (%.2f×)", s.qps/anchor.qps)
			}
			fmt.Fprintf(w, "| (%s) | %s | **%s**%s [%s–%s] | %s | %.2f ms | %.2f ms | %.0f %% | %s | %d | %.1f MiB |\n",
				c.ID, srv, kqps(s.qps), ratio, kqps(s.qpsMin), kqps(s.qpsMax), kqps(s.qps/c.PerName),
				s.p50, s.p99, 100*s.cpuShare, kqps(s.qps/max(s.cpuShare, 1e-9)), s.lost, s.rssMiB)
		}
	}
	fmt.Fprintln(w)
	for _, c := range cases {
		ap := ""
		if c.Autopath {
			ap = " [servers with autopath on]"
		}
		fmt.Fprintf(w, "- (%s) %s; queries per name: %g%s\n", c.ID, c.What, c.PerName, ap)
	}
}

func reportCmd(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	in := fs.String("in", "", "results (JSON lines) from parse")
	_ = fs.Parse(args)
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	rs, err := readResults(f)
	if err != nil {
		return err
	}
	writeReport(os.Stdout, rs)
	return nil
}
