package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUpdateDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.md")
	orig := "# Bench\nintro\n" + docBegin + ": refresh -->\n### Figures\n\nold figures\n" + docEnd + "\n\n### After\nkept\n"
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	v := 0.25
	r := &Results{Machine: map[string]string{"cpus": "2"}, Pods: 3, Order: "ref, ours",
		Sets: []SetResult{
			{Name: "ref", Add: Summary{N: 3, Median: 100}, Del: Summary{N: 3, Median: 200}, Total: Summary{N: 3, Median: 300}},
			{Name: "ours", Add: Summary{N: 3, Median: 25}, Failures: []Failure{{Verb: "DEL", Plugin: "bridge", Msg: "boom"}}, Pods: 4, OKPods: 3},
		},
		Ratio: map[string]*float64{"add": &v}}
	for i := 0; i < 2; i++ { // twice: the markers survive a rewrite
		if err := updateDoc(path, r); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(path)
	got := string(data)
	for _, want := range []string{"# Bench\nintro\n", docBegin + ": refresh -->\n### Figures\n", "| ref | ADD | 3 | 100.0 |", "ADD 0.250 (4.0× faster)", "DEL n/a", "ours: 1 of 4 pods failed", docEnd + "\n\n### After\nkept\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("updated doc lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old figures") || strings.Count(got, "### Figures") != 1 || strings.Count(got, docBegin) != 1 {
		t.Errorf("section not replaced exactly once:\n%s", got)
	}
	if err := os.WriteFile(path, []byte("no markers"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := updateDoc(path, r); err == nil {
		t.Error("a file without markers must be an error")
	}
}
