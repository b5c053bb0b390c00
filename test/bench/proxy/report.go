package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// rows says how each metric is shown, in table order: the aggregate of
// its samples (median, or p99 by nearest rank), what it is, its unit.
var rows = []struct {
	metric, agg, what, unit string
	scale                   float64
	dataPath                bool // also compared with kube-proxy's iptables mode
}{
	{"cold_start_s", "median", "cold start: process start → all N programmed, first and last Service answering", "s", 1, false},
	{"cold_start_cpu_s", "median", "cold start: CPU until all programmed (with children: nft, iptables-restore)", "s", 1, false},
	{"rss_mib", "median", "resident memory after the cold start", "MiB", 1, false},
	{"rss_peak_mib", "median", "peak resident memory (VmHWM) by then", "MiB", 1, false},
	{"rss_end_mib", "median", "resident memory after the endpoint changes and the burst", "MiB", 1, false},
	{"full_sync_s", "median", "full sync (the proxy's sync_full_proxy_rules_duration_seconds)", "ms", 1000, false},
	{"change_s", "median", "one endpoint change: API → programmed, median", "ms", 1000, false},
	{"change_s", "p99", "one endpoint change: API → programmed, p99", "ms", 1000, false},
	{"change_connect_s", "median", "one endpoint change: API → the new endpoint answering, median", "ms", 1000, false},
	{"change_netprog_s", "median", "one endpoint change: the proxy's network_programming_duration_seconds, median", "ms", 1000, false},
	{"burst_issue_s", "median", "burst of endpoint changes (1,000 from N=1,000 on), one per Service, issued evenly over 1 s: time the API took for them", "s", 1, false},
	{"burst_s", "median", "burst: last update returned → all programmed", "s", 1, false},
	{"burst_cpu_s", "median", "burst: the proxy's CPU from the burst's start until all programmed", "s", 1, false},
	{"dp_cps", "median", "data path: new connections per second to one ClusterIP", "/s", 1, true},
	{"dp_p50_s", "median", "data path: connect latency p50", "µs", 1e6, true},
	{"dp_p99_s", "median", "data path: connect latency p99", "µs", 1e6, true},
	{"rules", "median", "installed: nft rules / iptables rules / listening sockets", "", 1, false},
}

const (
	anchor    = "kube-proxy-nftables"
	anchorIPT = "kube-proxy-iptables"
	flatnetNF = "flatnet-nftables"
)

func reportCmd(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	in := fs.String("in", "", "results (JSON lines) from run")
	all := fs.Bool("all", false, "every run in the file (default: the last run only)")
	_ = fs.Parse(args)
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	res, err := readResults(f)
	if err != nil {
		return err
	}
	if !*all && len(res) > 0 {
		last := res[len(res)-1].Run
		res = slices.DeleteFunc(res, func(x result) bool { return x.Run != last })
	}
	report(os.Stdout, res)
	return nil
}

func readResults(r io.Reader) ([]result, error) {
	var res []result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var x result
		if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
			return nil, err
		}
		res = append(res, x)
	}
	return res, sc.Err()
}

type key struct {
	n      int
	metric string
}

// table holds every sample by size, metric and proxy.
type table map[key]map[string][]float64

func (t table) value(n int, metric, agg, proxy string) (float64, bool) {
	v, ok := t[key{n, metric}][proxy]
	if !ok || len(v) == 0 {
		return 0, false
	}
	if agg == "p99" {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return percentile(s, 99), true
	}
	return median(v), true
}

// report prints, per size, one Markdown row per measure with a column per
// proxy: the value and its ratio to kube-proxy's nftables mode (the
// issue's anchor; for the data path also to kube-proxy's iptables mode),
// then the acceptance checks at the largest size.
func report(w io.Writer, res []result) {
	t := table{}
	var proxies []string
	sizes := map[int]bool{}
	for _, x := range res {
		switch x.Metric {
		case "create_s":
			fmt.Fprintf(w, "N=%d: created %s in %.1f s\n", x.N, x.Note, x.Value)
			continue
		case "unavailable", "error", "monitor_lost":
			continue
		}
		k := key{x.N, x.Metric}
		if t[k] == nil {
			t[k] = map[string][]float64{}
		}
		t[k][x.Proxy] = append(t[k][x.Proxy], x.Value)
		sizes[x.N] = true
		if !slices.Contains(proxies, x.Proxy) {
			proxies = append(proxies, x.Proxy)
		}
	}
	order := func(p string) int {
		if i := slices.Index(allModes, p); i >= 0 {
			return i
		}
		return len(allModes)
	}
	sort.Slice(proxies, func(i, j int) bool { return order(proxies[i]) < order(proxies[j]) })
	ns := make([]int, 0, len(sizes))
	for n := range sizes {
		ns = append(ns, n)
	}
	sort.Ints(ns)

	fmt.Fprintln(w)
	fmt.Fprintf(w, "| N | measure | %s |\n", strings.Join(proxies, " | "))
	fmt.Fprintf(w, "|---:|---|%s\n", strings.Repeat("---:|", len(proxies)))
	for _, n := range ns {
		for _, row := range rows {
			cells := make([]string, len(proxies))
			any := false
			for i, p := range proxies {
				v, ok := t.value(n, row.metric, row.agg, p)
				if !ok {
					cells[i] = "–"
					continue
				}
				any = true
				cells[i] = format(v*row.scale, row.unit)
				var ratios []string
				if a, ok := t.value(n, row.metric, row.agg, anchor); ok && p != anchor && a > 0 {
					ratios = append(ratios, fmt.Sprintf("%s×", ratio(v/a)))
				}
				if a, ok := t.value(n, row.metric, row.agg, anchorIPT); ok && row.dataPath && p != anchorIPT && a > 0 {
					ratios = append(ratios, fmt.Sprintf("%s× ipt", ratio(v/a)))
				}
				if len(ratios) > 0 {
					cells[i] += " (" + strings.Join(ratios, ", ") + ")"
				}
			}
			if any {
				fmt.Fprintf(w, "| %d | %s | %s |\n", n, row.what, strings.Join(cells, " | "))
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Ratios: the proxy's value / %s's (for the data path also / %s's, \"ipt\").\n", anchor, anchorIPT)
	for _, x := range res {
		switch x.Metric {
		case "unavailable":
			fmt.Fprintf(w, "- %s: not available: %s\n", x.Proxy, x.Note)
		case "error":
			fmt.Fprintf(w, "- %s at N=%d failed: %s\n", x.Proxy, x.N, x.Note)
		case "monitor_lost":
			fmt.Fprintf(w, "- %s at N=%d, %s: the nft monitor lost events; timed by listing every second\n", x.Proxy, x.N, x.Note)
		}
	}
	acceptance(w, t, ns)
}

// acceptance prints issue 14's checks at the largest size measured.
func acceptance(w io.Writer, t table, ns []int) {
	if len(ns) < 2 {
		return
	}
	n, base := ns[len(ns)-1], ns[0]
	fmt.Fprintf(w, "\nAcceptance (issue 14) at N=%d:\n\n", n)
	fmt.Fprintln(w, "| check | target | measured | |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	check := func(what string, num, den float64, okN, okD bool, target float64, atMost bool) {
		if !okN || !okD || den == 0 {
			fmt.Fprintf(w, "| %s | %s %.2f× | – | not measured |\n", what, map[bool]string{true: "≤", false: "≥"}[atMost], target)
			return
		}
		r := num / den
		pass := r <= target
		if !atMost {
			pass = r >= target
		}
		fmt.Fprintf(w, "| %s | %s %.2f× | %s× | %s |\n", what, map[bool]string{true: "≤", false: "≥"}[atMost], target, ratio(r),
			map[bool]string{true: "pass", false: "FAIL"}[pass])
	}
	pair := func(metric, agg, p, q string, np, nq int) (float64, float64, bool, bool) {
		a, okA := t.value(np, metric, agg, p)
		b, okB := t.value(nq, metric, agg, q)
		return a, b, okA, okB
	}
	a, b, oa, ob := pair("change_s", "median", flatnetNF, anchor, n, n)
	check("one endpoint change median, flatnet nftables / kube-proxy nftables", a, b, oa, ob, 0.10, true)
	a, b, oa, ob = pair("cold_start_s", "median", flatnetNF, anchor, n, n)
	check("cold start to all reachable, flatnet nftables / kube-proxy nftables", a, b, oa, ob, 0.20, true)
	a, b, oa, ob = pair("cold_start_cpu_s", "median", flatnetNF, anchor, n, n)
	check("CPU until then, flatnet nftables / kube-proxy nftables", a, b, oa, ob, 1, true)
	a, b, oa, ob = pair("rss_mib", "median", flatnetNF, anchor, n, n)
	check("memory, flatnet nftables / kube-proxy nftables", a, b, oa, ob, 0.5, true)
	a, b, oa, ob = pair("dp_cps", "median", flatnetNF, anchorIPT, n, n)
	check("new connections/s, flatnet nftables / kube-proxy iptables", a, b, oa, ob, 2, false)
	a, b, oa, ob = pair("dp_cps", "median", flatnetNF, flatnetNF, n, base)
	check(fmt.Sprintf("new connections/s, flatnet nftables at %d / at %d Services", n, base), a, b, oa, ob, 0.9, false)
}

func ratio(r float64) string {
	switch {
	case r >= 10:
		return fmt.Sprintf("%.0f", r)
	case r >= 0.1:
		return fmt.Sprintf("%.2f", r)
	default:
		return fmt.Sprintf("%.3f", r)
	}
}

func format(v float64, unit string) string {
	var s string
	switch {
	case unit == "" || unit == "/s" || v >= 100:
		s = fmt.Sprintf("%.0f", v)
	case v >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	if unit == "/s" {
		return s + "/s"
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}
