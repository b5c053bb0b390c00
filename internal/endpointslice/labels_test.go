package endpointslice

import (
	"runtime"
	"testing"
	"time"
)

// Pods of the same labels share one map; a set no cached Pod holds any
// more leaves the table.
func TestLabelsInterned(t *testing.T) {
	a := PodOf(pod("a", "web", "n1", "10.1.0.1"))
	b := PodOf(pod("b", "web", "n1", "10.1.0.2"))
	c := PodOf(pod("c", "db", "n1", "10.1.0.3"))
	if a.labelSet == nil || a.labelSet != b.labelSet || a.labelSet == c.labelSet {
		t.Fatalf("label sets: a %p b %p c %p, want a and b shared, c its own", a.labelSet, b.labelSet, c.labelSet)
	}
	a.Labels["probe"] = "x" // the map is the set's
	if b.Labels["probe"] != "x" {
		t.Fatal("a and b do not share their labels map")
	}
	delete(a.Labels, "probe")
	if PodOf(pod("n", "", "n1")).labelSet == nil {
		t.Fatal("pod with labels {app: \"\"} got no set")
	}
	before := internedLabelSets()
	d := PodOf(pod("d", "gone-soon", "n1", "10.1.0.4"))
	if got := internedLabelSets(); got != before+1 {
		t.Fatalf("table %d sets, want %d", got, before+1)
	}
	runtime.KeepAlive(d)
	d = nil
	deadline := time.Now().Add(5 * time.Second)
	for internedLabelSets() > before {
		if time.Now().After(deadline) {
			t.Fatalf("table still holds %d sets after the only pod went, want %d", internedLabelSets(), before)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

// internedLabelSets is how many label sets the table holds (for tests).
func internedLabelSets() int { return labelTable.len() }
