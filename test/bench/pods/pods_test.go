package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestQuantile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0.5: 5, 0.9: 9, 1: 10, 0: 1} {
		if got := quantile(xs, q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if !math.IsNaN(quantile(nil, 0.5)) {
		t.Error("quantile of nothing is not NaN")
	}
}

func TestMedianResult(t *testing.T) {
	rs := []result{{Set: "a", ReadySeconds: 3, Add: opStats{Sum: 1}}, {Set: "a", ReadySeconds: 1, Add: opStats{Sum: 5}}, {Set: "a", ReadySeconds: 2, Add: opStats{Sum: 2}}}
	if m := medianResult(rs); m.ReadySeconds != 2 || m.Add.Sum != 2 || m.Set != "a" {
		t.Errorf("median = %+v", m)
	}
	if m := medianResult(rs[:2]); m.ReadySeconds != 2 || m.Add.Sum != 3 {
		t.Errorf("median of two = %+v", m)
	}
}

// The conflist libcni takes first (lexical order) names the style.
func TestFirstPluginType(t *testing.T) {
	dir := t.TempDir()
	if _, err := firstPluginType(dir); err == nil {
		t.Error("no conflist: no error")
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("20-other.conflist", `{"plugins":[{"type":"ptp"}]}`)
	write("10-flatnet.conflist", `{"cniVersion":"1.0.0","plugins":[{"type":"bridge"},{"type":"portmap"}]}`)
	if got, err := firstPluginType(dir); err != nil || got != "bridge" {
		t.Errorf("first plugin type = %q, %v; want bridge", got, err)
	}
}
