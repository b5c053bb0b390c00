package endpointslice

import (
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// Pods of the same labels and ports share one map and one port list; a
// set no cached Pod holds any more leaves the table.
func TestLabelsInterned(t *testing.T) {
	a := PodOf(with(pod("a", "web", "n1", "10.1.0.1"), containerPort("http", 8080)))
	b := PodOf(with(pod("b", "web", "n1", "10.1.0.2"), containerPort("http", 8080)))
	c := PodOf(with(pod("c", "db", "n1", "10.1.0.3"), containerPort("http", 8080)))
	if a.template == nil || a.template != b.template || a.template == c.template {
		t.Fatalf("label sets: a %p b %p c %p, want a and b shared, c its own", a.template, b.template, c.template)
	}
	if &a.Ports[0] != &b.Ports[0] || &a.Ports[0] == &c.Ports[0] {
		t.Fatal("ports: want a and b (one template) sharing one list, c its own")
	}
	a.Labels["probe"] = "x" // the map is the set's
	if b.Labels["probe"] != "x" {
		t.Fatal("a and b do not share their labels map")
	}
	delete(a.Labels, "probe")
	if PodOf(pod("n", "", "n1")).template == nil {
		t.Fatal("pod with labels {app: \"\"} got no set")
	}
	before := internedTemplates()
	d := PodOf(pod("d", "gone-soon", "n1", "10.1.0.4"))
	if got := internedTemplates(); got != before+1 {
		t.Fatalf("table %d sets, want %d", got, before+1)
	}
	runtime.KeepAlive(d)
	d = nil
	deadline := time.Now().Add(5 * time.Second)
	for internedTemplates() > before {
		if time.Now().After(deadline) {
			t.Fatalf("table still holds %d sets after the only pod went, want %d", internedTemplates(), before)
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

// A cached Pod fits the allocator's 256-byte size class (the next is
// 288): 3 MB at 100,000 pods.
func TestPodSize(t *testing.T) {
	if n := unsafe.Sizeof(Pod{}); n > 256 {
		t.Fatalf("a Pod is %d bytes, over the 256-byte size class", n)
	}
}

// internedTemplates is how many label sets the table holds (for tests).
func internedTemplates() int { return templateTable.len() }
