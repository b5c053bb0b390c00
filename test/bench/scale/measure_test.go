package main

import (
	"math"
	"testing"
)

func TestHistQuantile(t *testing.T) {
	// 10 observations: 4 in (0, 0.1], 4 in (0.1, 1], 2 in (1, +Inf).
	h := hist{Bounds: []float64{0.1, 1, math.Inf(1)}, Counts: []float64{4, 8, 10}, Count: 10, Sum: 9}
	for _, c := range []struct{ q, want float64 }{
		{0.2, 0.05}, // rank 2 of 4 in the first bucket: halfway to 0.1
		{0.6, 0.55}, // rank 6: halfway through (0.1, 1]
		{0.99, 1},   // the +Inf bucket answers with the highest finite bound
	} {
		if got := h.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	before := hist{Bounds: h.Bounds, Counts: []float64{4, 4, 4}, Count: 4, Sum: 0.2}
	d := h.minus(before)
	if d.Count != 6 || d.Counts[0] != 0 || d.Counts[1] != 4 {
		t.Fatalf("minus = %+v", d)
	}
	// Of the 6 new observations none is below 0.1: the median is inside (0.1, 1].
	if got := d.quantile(0.5); got <= 0.1 || got > 1 {
		t.Errorf("median of the difference = %v, want in (0.1, 1]", got)
	}
	if !math.IsNaN((hist{}).quantile(0.5)) {
		t.Error("quantile of an empty histogram is not NaN")
	}
}
