package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func reportCmd(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	in := fs.String("in", "", "result (JSON) of policybench run")
	_ = fs.Parse(args)
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var res result
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	report(os.Stdout, res)
	return nil
}

// report prints the result as the markdown table of docs/benchmarks.md.
func report(w io.Writer, res result) {
	s := res.Setup
	fmt.Fprintf(w, "%s, %s, load %s at the start, %s at the end; %s; lab: %s; %d namespaces, %d pods (%d on the enforcer node %s), %d NetworkPolicies; %d deny+allow cycles, %d x %.0fs connection runs with %d workers\n\n",
		res.Date, s.Machine, s.LoadStart, s.LoadEnd, s.Flatnet, s.Lab, s.Namespaces, s.Pods, s.PodsOnEnforcerNode, s.EnforcerNode, s.Policies, s.Samples, s.RateRuns, s.RateSeconds, s.RateWorkers)
	fmt.Fprintln(w, "| enforcer | create → enforced p50 / p99 (ms) | deny p50 / p99 | allow p50 / p99 | start → enforcing (s) | ruleset lines on the node | process RSS / peak (MiB) | process CPU (s) | new TCP conn/s (vs none) | process CPU in the conn runs (s) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range res.Rows {
		if r.Note != "" && r.ConnPerSec == 0 {
			fmt.Fprintf(w, "| %s | %s | | | | | | | | |\n", r.Enforcer, r.Note)
			continue
		}
		lat, deny, allow, start := "–", "–", "–", "–"
		if r.Enforcer != none {
			lat = fmt.Sprintf("%.0f / %.0f", r.P50Ms, r.P99Ms)
			deny = fmt.Sprintf("%.0f / %.0f", r.DenyP50Ms, r.DenyP99Ms)
			allow = fmt.Sprintf("%.0f / %.0f", r.AllowP50Ms, r.AllowP99Ms)
			start = fmt.Sprintf("%.2f", r.StartToEnforcingS)
			if r.Failures > 0 {
				lat += fmt.Sprintf(" (%d timed out)", r.Failures)
			}
		}
		ratio := ""
		if r.ConnRatio > 0 {
			ratio = fmt.Sprintf(" (%.0f %%)", 100*r.ConnRatio)
		}
		name := r.Enforcer
		if r.Enforcer == knp {
			name = "kube-network-policies v0.8.0"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d | %.0f / %.0f | %.1f | %.0f%s | %.1f |\n",
			name, lat, deny, allow, start, r.RulesetLines, r.RSSMiB, r.PeakRSSMiB, r.CPUSeconds, r.ConnPerSec, ratio, r.ConnCPUSeconds)
	}
	fmt.Fprintln(w)
	for _, r := range res.Rows {
		if r.Process != "" {
			fmt.Fprintf(w, "- %s: process measured: %s\n", r.Enforcer, r.Process)
		}
		if r.Note != "" && r.ConnPerSec > 0 {
			fmt.Fprintf(w, "- %s: %s\n", r.Enforcer, r.Note)
		}
		if m := summarize(r.Metrics); m != "" {
			fmt.Fprintf(w, "- %s: its metrics: %s\n", r.Enforcer, m)
		}
		if n := len(r.DenyMs) + len(r.AllowMs); n > 0 {
			fmt.Fprintf(w, "- %s: %d create → enforced samples (p99 by nearest rank: the %s)\n", r.Enforcer, n, largest(n-int(float64(n)*0.99+0.999999)+1))
		}
	}
}

// largest names the k-th largest sample.
func largest(k int) string {
	if k == 1 {
		return "largest"
	}
	suffix := map[int]string{1: "st", 2: "nd", 3: "rd"}[k%10]
	if suffix == "" || (k%100 >= 11 && k%100 <= 13) {
		suffix = "th"
	}
	return fmt.Sprintf("%d%s largest", k, suffix)
}

// summarize says what the enforcer's own metrics say in one line: mean
// histogram values from their sums and counts.
func summarize(m map[string]float64) string {
	var parts []string
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// A histogram's or summary's _count beside its _sum gives a mean.
		name, labels, _ := strings.Cut(k, "{")
		if labels != "" {
			labels = "{" + labels
		}
		if b, ok := strings.CutSuffix(name, "_count"); ok {
			if sum, ok := m[b+"_sum"+labels]; ok {
				if m[k] > 0 {
					parts = append(parts, fmt.Sprintf("%s%s mean %.4g over %.0f", b, labels, sum/m[k], m[k]))
				}
				continue
			}
		}
		if b, ok := strings.CutSuffix(name, "_sum"); ok {
			if _, ok := m[b+"_count"+labels]; ok {
				continue
			}
		}
		parts = append(parts, fmt.Sprintf("%s = %.4g", k, m[k]))
	}
	return strings.Join(parts, "; ")
}
