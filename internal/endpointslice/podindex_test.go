package endpointslice

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestPodIndexRandom: after random adds, updates (relabels, moves to
// another node, status-only copies) and deletes, given as the informer
// gives them (the cached pointer, or a copy of it), every lookup equals a
// scan of the pods that exist, and no bucket is left empty or holds a pod
// twice.
func TestPodIndexRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := newPodIndex()
	live := map[string]*Pod{} // namespace/name -> the cached pod
	mk := func(namespace, name string) *Pod {
		labels := map[string]string{"app": fmt.Sprint("a", rng.IntN(4))}
		if rng.IntN(2) == 0 {
			labels["tier"] = fmt.Sprint("t", rng.IntN(2))
		}
		node := ""
		if rng.IntN(5) > 0 {
			node = fmt.Sprint("node-", rng.IntN(3))
		}
		return &Pod{PodMeta: PodMeta{Namespace: namespace, Name: name, Labels: labels}, NodeName: node}
	}
	given := func(p *Pod) *Pod {
		if rng.IntN(3) == 0 {
			return p.DeepCopy() // a tombstone's or a test's copy
		}
		return p
	}
	for step := range 20000 {
		namespace, name := fmt.Sprint("ns", rng.IntN(2)), fmt.Sprint("p", rng.IntN(60))
		key := namespace + "/" + name
		old := live[key]
		switch {
		case old == nil:
			p := mk(namespace, name)
			x.update(nil, p)
			live[key] = p
		case rng.IntN(4) == 0:
			x.update(given(old), nil)
			delete(live, key)
		default:
			cur := old.DeepCopy()
			if rng.IntN(3) == 0 {
				nw := mk(namespace, name)
				cur.Labels, cur.NodeName = nw.Labels, nw.NodeName
			}
			x.update(given(old), cur)
			live[key] = cur
		}
		if step%97 != 0 {
			continue
		}
		for _, namespace := range []string{"ns0", "ns1"} {
			for _, sel := range []map[string]string{{}, {"app": "a1"}, {"app": "a2", "tier": "t0"}, {"tier": "t1"}, {"app": "none"}} {
				var want []*Pod
				for _, p := range live {
					if p.Namespace == namespace && selects(sel, p.Labels) {
						want = append(want, p)
					}
				}
				if d := cmp.Diff(names(want), names(x.selected(namespace, sel))); d != "" {
					t.Fatalf("step %d: %s %v (-scan +index):\n%s", step, namespace, sel, d)
				}
			}
		}
		for n := range 3 {
			node := fmt.Sprint("node-", n)
			var want []*Pod
			for _, p := range live {
				if p.NodeName == node {
					want = append(want, p)
				}
			}
			if d := cmp.Diff(names(want), names(x.onNode(node))); d != "" {
				t.Fatalf("step %d: %s (-scan +index):\n%s", step, node, d)
			}
		}
		// The pointers a sync reads are the cached pods themselves.
		for _, p := range x.selected("ns0", map[string]string{}) {
			if live["ns0/"+p.Name] != p {
				t.Fatalf("step %d: the index holds a stale copy of %s", step, p.Name)
			}
		}
		checkBuckets(t, x.byLabel)
		checkBuckets(t, x.byNode)
		checkBuckets(t, x.byNamespace)
	}
}

func checkBuckets[K comparable](t *testing.T, m map[K][]*Pod) {
	t.Helper()
	for k, b := range m {
		if len(b) == 0 {
			t.Fatalf("bucket %v is empty", k)
		}
		seen := map[*Pod]bool{}
		for _, p := range b {
			if seen[p] {
				t.Fatalf("bucket %v holds %s twice", k, p.Name)
			}
			seen[p] = true
		}
	}
}

func names(pods []*Pod) []string {
	out := []string{}
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return out
}

// A bucket that was large and is mostly emptied gives its room back.
func TestPodIndexShrinks(t *testing.T) {
	x := newPodIndex()
	var pods []*Pod
	for i := range 1000 {
		p := &Pod{PodMeta: PodMeta{Namespace: "ns", Name: fmt.Sprint("p", i), Labels: map[string]string{"app": "a"}}}
		pods = append(pods, p)
		x.update(nil, p)
	}
	for _, p := range pods[10:] {
		x.update(p, nil)
	}
	b := x.byLabel[labelPair{"ns", "app", "a"}]
	if len(b) != 10 || cap(b) > 64 {
		t.Fatalf("after deleting 990 of 1,000: len %d cap %d", len(b), cap(b))
	}
}
