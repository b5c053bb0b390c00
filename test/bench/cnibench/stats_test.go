package main

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	cases := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"median even", ten, 50, 5.5},
		{"median odd", []float64{1, 2, 30}, 50, 2},
		{"p90", ten, 90, 9.1},
		{"p99", ten, 99, 9.91},
		{"p0", ten, 0, 1},
		{"p100", ten, 100, 10},
		{"one sample", []float64{7}, 99, 7},
		{"interpolates", []float64{0, 100}, 25, 25},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Percentile(c.sorted, c.p); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("Percentile(%v, %v) = %v, want %v", c.sorted, c.p, got, c.want)
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(nil) = %v, want NaN", got)
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for _, ms := range []int{30, 10, 20, 40, 1000} { // unsorted, one outlier
		ds = append(ds, time.Duration(ms)*time.Millisecond)
	}
	s := Summarize(ds)
	if s.N != 5 || s.Median != 30 || s.Min != 10 || s.Max != 1000 || s.Mean != 220 {
		t.Errorf("Summarize = %+v", s)
	}
	if want := 40 + 0.6*960; math.Abs(s.P90-want) > 1e-9 {
		t.Errorf("P90 = %v, want %v", s.P90, want)
	}
	if (Summarize(nil) != Summary{}) {
		t.Errorf("Summarize(nil) not zero")
	}
}

func TestRatio(t *testing.T) {
	if r := Ratio(10, 100); r != 0.1 {
		t.Errorf("Ratio = %v", r)
	}
	if !math.IsNaN(Ratio(1, 0)) || finite(Ratio(1, 0)) != nil || finite(0.5, 3, 0) != nil {
		t.Errorf("empty ratios must be n/a")
	}
}

func TestWindows(t *testing.T) {
	var ds []time.Duration
	for i := range 10 {
		ds = append(ds, time.Duration(i+1)*time.Millisecond)
	}
	w := windows(ds, 5)
	if len(w) != 5 || w[0].First != 1 || w[0].Last != 2 || w[4].First != 9 || w[4].Last != 10 {
		t.Fatalf("windows = %+v", w)
	}
	if w[4].Total.Median != 9.5 || w[0].Total.N != 2 {
		t.Errorf("last window %+v, first %+v", w[4].Total, w[0].Total)
	}
	if windows(ds[:9], 5) != nil {
		t.Error("fewer than two pods per window: want none")
	}
}
