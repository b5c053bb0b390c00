package promhist

import (
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestQuantile(t *testing.T) {
	// 10 observations: 4 in (0, 0.1], 4 in (0.1, 1], 2 in (1, +Inf).
	h := Hist{Bounds: []float64{0.1, 1, math.Inf(1)}, Counts: []float64{4, 8, 10}, Count: 10, Sum: 9}
	for _, c := range []struct{ q, want float64 }{
		{0.2, 0.05}, // rank 2 of 4 in the first bucket: halfway to 0.1
		{0.6, 0.55}, // rank 6: halfway through (0.1, 1]
		{0.99, 1},   // the +Inf bucket answers with the highest finite bound
	} {
		if got := h.Quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	before := Hist{Bounds: h.Bounds, Counts: []float64{4, 4, 4}, Count: 4, Sum: 0.2}
	d := h.Minus(before)
	if d.Count != 6 || d.Counts[0] != 0 || d.Counts[1] != 4 {
		t.Fatalf("minus = %+v", d)
	}
	// Of the 6 new observations none is below 0.1: the median is inside (0.1, 1].
	if got := d.Quantile(0.5); got <= 0.1 || got > 1 {
		t.Errorf("median of the difference = %v, want in (0.1, 1]", got)
	}
	if !math.IsNaN((Hist{}).Quantile(0.5)) {
		t.Error("quantile of an empty histogram is not NaN")
	}
}

// Series are summed, or picked by their labels.
func TestHistogramLabels(t *testing.T) {
	text := `# TYPE op_seconds histogram
op_seconds_bucket{op="ADD",le="0.1"} 1
op_seconds_bucket{op="ADD",le="+Inf"} 2
op_seconds_sum{op="ADD"} 0.5
op_seconds_count{op="ADD"} 2
op_seconds_bucket{op="DEL",le="0.1"} 3
op_seconds_bucket{op="DEL",le="+Inf"} 3
op_seconds_sum{op="DEL"} 0.2
op_seconds_count{op="DEL"} 3
`
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if h := Histogram(mf, "op_seconds"); h.Count != 5 || math.Abs(h.Sum-0.7) > 1e-9 || h.Counts[0] != 4 {
		t.Errorf("all series: %+v", h)
	}
	if h := Histogram(mf, "op_seconds", "op", "DEL"); h.Count != 3 || math.Abs(h.Sum-0.2) > 1e-9 || h.Counts[0] != 3 {
		t.Errorf("op=DEL: %+v", h)
	}
	if h := Histogram(mf, "op_seconds", "op", "CHECK"); h.Count != 0 {
		t.Errorf("op=CHECK: %+v", h)
	}
}
