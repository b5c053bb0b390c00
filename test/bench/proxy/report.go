package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// metricInfo says how each metric is shown, in table order.
var metricInfo = []struct {
	name, what, unit string
	scale            float64
}{
	{"churn_catchup_s", "bulk create, both running: last create returned → all in the kernel", "s", 1},
	{"cold_start_s", "cold start: process start → all N in the kernel", "s", 1},
	{"cold_start_cpu_s", "cold start: CPU used until then", "s", 1},
	{"full_sync_s", "full sync (the proxy's sync_full_proxy_rules_duration_seconds)", "ms", 1000},
	{"partial_kernel_s", "one endpoint changed: API update → kernel (median)", "ms", 1000},
	{"partial_sync_s", "one endpoint changed: the proxy's sync_proxy_rules_duration_seconds (median)", "ms", 1000},
	{"partial_netprog_s", "one endpoint changed: network_programming_duration_seconds (median)", "ms", 1000},
	{"rss_mib", "resident memory after the cold start", "MiB", 1},
	{"nft_rules", "nft rules in the table (IPv4)", "", 1},
	{"nft_chains", "nft chains", "", 1},
	{"nft_elements", "map and set elements", "", 1},
	{"nft_lines", "lines of `nft list table`", "", 1},
}

func reportCmd(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	in := fs.String("in", "", "results (JSON lines) from run")
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
	report(os.Stdout, res)
	return nil
}

func readResults(r io.Reader) ([]result, error) {
	var res []result
	sc := bufio.NewScanner(r)
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
	n       int
	minSync string
	metric  string
}

// report prints one Markdown row per size, min sync period and metric:
// the value for kube-proxy (the anchor), for flatnet, and their ratio
// kube-proxy / flatnet (above 1: flatnet takes less).
func report(w io.Writer, res []result) {
	vals := map[key]map[string][]float64{}
	var keys []key
	for _, x := range res {
		if x.Proxy == "api" {
			continue
		}
		k := key{x.N, x.MinSync, x.Metric}
		if vals[k] == nil {
			vals[k] = map[string][]float64{}
			keys = append(keys, k)
		}
		vals[k][x.Proxy] = append(vals[k][x.Proxy], x.Value)
	}
	order := map[string]int{}
	for i, m := range metricInfo {
		order[m.name] = i
	}
	minOrder := map[string]int{}
	for _, x := range res {
		if _, ok := minOrder[x.MinSync]; !ok {
			minOrder[x.MinSync] = len(minOrder)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.n != b.n {
			return a.n < b.n
		}
		if minOrder[a.minSync] != minOrder[b.minSync] {
			return minOrder[a.minSync] < minOrder[b.minSync]
		}
		return order[a.metric] < order[b.metric]
	})
	for _, x := range res {
		if x.Proxy == "api" {
			fmt.Fprintf(w, "N=%d: created %s in %.1f s\n", x.N, x.Note, x.Value)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| N | min sync | measure | kube-proxy | flatnet | kube-proxy / flatnet |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|")
	for _, k := range keys {
		o, ok := order[k.metric]
		if !ok {
			continue
		}
		mi := metricInfo[o]
		kp, okK := vals[k]["kube-proxy"]
		fl, okF := vals[k]["flatnet"]
		cell := func(v []float64, ok bool) string {
			if !ok {
				return "–"
			}
			return format(median(v)*mi.scale, mi.unit)
		}
		ratio := "–"
		if okK && okF && median(fl) > 0 {
			ratio = fmt.Sprintf("%.2f", median(kp)/median(fl))
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", k.n, k.minSync, mi.what, cell(kp, okK), cell(fl, okF), ratio)
	}
}

func format(v float64, unit string) string {
	var s string
	switch {
	case unit == "":
		s = fmt.Sprintf("%.0f", v)
	case v >= 100:
		s = fmt.Sprintf("%.0f", v)
	case v >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}
