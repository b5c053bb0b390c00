package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// Baseline is the target the others are compared with: node to node over
// the underlay, no pod network in the way.
const Baseline = "baseline"

// Row is one target's summary over its repetitions.
type Row struct {
	Target string
	Path   string
	MTU    int

	TCPReps                int
	Gbps, GbpsMin, GbpsMax float64 // median and range over repetitions
	Retrans                float64 // median retransmits per run

	RRReps     int
	P50us      float64 // median over repetitions of each run's p50
	P99us      float64 // same for p99
	RoundTrips int     // total measured round trips
}

// Summarize groups records by target: baseline first, the others in the
// order they first appear.
func Summarize(recs []Record) []Row {
	var order []string
	byTarget := map[string][]Record{}
	for _, r := range recs {
		if _, ok := byTarget[r.Target]; !ok {
			order = append(order, r.Target)
		}
		byTarget[r.Target] = append(byTarget[r.Target], r)
	}
	slices.SortStableFunc(order, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == Baseline:
			return -1
		case b == Baseline:
			return 1
		}
		return 0
	})
	rows := make([]Row, 0, len(order))
	for _, t := range order {
		row := Row{Target: t}
		var gbps, retr, p50, p99 []float64
		for _, r := range byTarget[t] {
			switch r.Kind {
			case KindTCP:
				gbps = append(gbps, r.BitsPerSec/1e9)
				retr = append(retr, float64(r.Retrans))
			case KindRR:
				p50 = append(p50, r.P50us)
				p99 = append(p99, r.P99us)
				row.RoundTrips += r.N
			case KindInfo:
				if r.MTU != 0 {
					row.MTU = r.MTU
				}
				if r.Path != "" {
					row.Path = r.Path
				}
			}
		}
		row.TCPReps, row.RRReps = len(gbps), len(p50)
		row.Gbps, row.Retrans = median(gbps), median(retr)
		if len(gbps) > 0 {
			row.GbpsMin, row.GbpsMax = slices.Min(gbps), slices.Max(gbps)
		}
		row.P50us, row.P99us = median(p50), median(p99)
		rows = append(rows, row)
	}
	return rows
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Percentile(s, 50)
}

// ratio formats a/b, or "-" when either is missing.
func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func num(x float64, format string) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf(format, x)
}

// WriteTable prints the side-by-side table (markdown) with every target's
// ratio to the baseline.
func WriteTable(w io.Writer, rows []Row) {
	base := Row{Gbps: math.NaN(), P50us: math.NaN(), P99us: math.NaN()}
	for _, r := range rows {
		if r.Target == Baseline {
			base = r
		}
	}
	fmt.Fprintln(w, "| path | MTU | TCP Gbit/s (min-max) | /baseline | retransmits | RR p50 µs | /baseline | RR p99 µs | /baseline |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		name := r.Target
		if r.Path != "" {
			name += " (" + r.Path + ")"
		}
		mtu := "-"
		if r.MTU != 0 {
			mtu = fmt.Sprint(r.MTU)
		}
		gb := "-"
		if r.TCPReps > 0 {
			gb = fmt.Sprintf("%.2f (%.2f-%.2f)", r.Gbps, r.GbpsMin, r.GbpsMax)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, mtu,
			gb, ratio(r.Gbps, base.Gbps), num(r.Retrans, "%.0f"),
			num(r.P50us, "%.1f"), ratio(r.P50us, base.P50us),
			num(r.P99us, "%.1f"), ratio(r.P99us, base.P99us))
	}
}

// WriteReps prints every repetition, for judging the spread.
func WriteReps(w io.Writer, recs []Record) {
	fmt.Fprintln(w, "| rep | path | TCP Gbit/s | retransmits | RR p50 µs | RR p99 µs | round trips |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|")
	type key struct {
		rep    int
		target string
	}
	var keys []key
	tcp, rr := map[key]Record{}, map[key]Record{}
	for _, r := range recs {
		k := key{r.Rep, r.Target}
		switch r.Kind {
		case KindTCP:
			tcp[k] = r
		case KindRR:
			rr[k] = r
		default:
			continue
		}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		t, okT := tcp[k]
		q, okQ := rr[k]
		cols := []string{"-", "-", "-", "-", "-"}
		if okT {
			cols[0], cols[1] = fmt.Sprintf("%.2f", t.BitsPerSec/1e9), fmt.Sprint(t.Retrans)
		}
		if okQ {
			cols[2], cols[3], cols[4] = fmt.Sprintf("%.1f", q.P50us), fmt.Sprintf("%.1f", q.P99us), fmt.Sprint(q.N)
		}
		fmt.Fprintf(w, "| %d | %s | %s |\n", k.rep, k.target, strings.Join(cols, " | "))
	}
}

func reportMain(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	reps := fs.Bool("reps", false, "also print every repetition")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("want one results file")
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer f.Close()
	recs, err := ReadRecords(f)
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	if len(recs) == 0 {
		return fmt.Errorf("%s: no measurements", fs.Arg(0))
	}
	rows := Summarize(recs)
	WriteTable(os.Stdout, rows)
	if *reps {
		fmt.Println()
		WriteReps(os.Stdout, recs)
	}
	return nil
}
