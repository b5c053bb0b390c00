package main

import (
	"fmt"
	"io"
	"slices"
)

// printTable writes one row per burst, then per set the median of its
// runs, as Markdown.
func printTable(w io.Writer, c config, rs []result) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%d pods at once on one lab node, %d run(s) per set (times in seconds; CNI p50/p90 per operation in ms)\n\n", c.Pods, c.Runs)
	fmt.Fprintln(w, "| set | run | create→all Ready | pod start p50 / p90 | ADD sum | ADD p50 / p90 ms | ADD sum / wall | ADD p50 / pod p50 | delete→all gone | pod stop p50 / p90 | DEL sum | DEL p50 / p90 ms | DEL sum / wall | DEL p50 / pod p50 |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		row(w, r.Set, fmt.Sprint(r.Run), r)
	}
	for _, s := range c.Sets {
		var mine []result
		for _, r := range rs {
			if r.Set == s.Name {
				mine = append(mine, r)
			}
		}
		if len(mine) > 0 {
			row(w, "**"+s.Name+"**", "median", medianResult(mine))
		}
	}
}

func row(w io.Writer, set, run string, r result) {
	fmt.Fprintf(w, "| %s | %s | %.2f | %.2f / %.2f | %.2f | %.0f / %.0f | %.2f | %.0f%% | %.2f | %.2f / %.2f | %.2f | %.0f / %.0f | %.2f | %.0f%% |\n",
		set, run, r.ReadySeconds, r.StartP50, r.StartP90, r.Add.Sum, r.Add.P50*1000, r.Add.P90*1000, r.Add.ShareOfWall, r.Add.ShareOfPod*100,
		r.GoneSeconds, r.StopP50, r.StopP90, r.Del.Sum, r.Del.P50*1000, r.Del.P90*1000, r.Del.ShareOfWall, r.Del.ShareOfPod*100)
}

// medianResult is, field by field, the median of rs.
func medianResult(rs []result) result {
	m := func(f func(result) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	op := func(f func(result) opStats) opStats {
		return opStats{
			Sum: m(func(r result) float64 { return f(r).Sum }), P50: m(func(r result) float64 { return f(r).P50 }),
			P90: m(func(r result) float64 { return f(r).P90 }), ShareOfWall: m(func(r result) float64 { return f(r).ShareOfWall }),
			ShareOfPod: m(func(r result) float64 { return f(r).ShareOfPod }),
		}
	}
	return result{
		Set: rs[0].Set, Pods: rs[0].Pods,
		ReadySeconds: m(func(r result) float64 { return r.ReadySeconds }), StartP50: m(func(r result) float64 { return r.StartP50 }),
		StartP90: m(func(r result) float64 { return r.StartP90 }), GoneSeconds: m(func(r result) float64 { return r.GoneSeconds }),
		StopP50: m(func(r result) float64 { return r.StopP50 }), StopP90: m(func(r result) float64 { return r.StopP90 }),
		Add: op(func(r result) opStats { return r.Add }), Del: op(func(r result) opStats { return r.Del }),
	}
}
