package main

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one measured quantity.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

// Percentile returns the p-th percentile (0..100) of sorted by linear
// interpolation between closest ranks (numpy's default, R type 7), so the
// 50th is the usual median. It returns NaN for no samples.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return math.NaN()
	case n == 1 || p <= 0:
		return sorted[0]
	case p >= 100:
		return sorted[n-1]
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	frac := rank - float64(lo)
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// Summarize computes a Summary in milliseconds.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	ms := make([]float64, len(ds))
	var sum float64
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	return Summary{
		N:      len(ms),
		Median: Percentile(ms, 50),
		P90:    Percentile(ms, 90),
		P99:    Percentile(ms, 99),
		Mean:   sum / float64(len(ms)),
		Min:    ms[0],
		Max:    ms[len(ms)-1],
	}
}

// Ratio returns a/b, or NaN when either side has no data.
func Ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}
