package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The workload is what the run relies on: the sizes asked for, unique
// names, probe targets that no policy selects (a deny is then a change),
// a rate target that policies select and one admits the client's
// namespace, and a client that no policy selects.
func TestBuild(t *testing.T) {
	l := layout{namespaces: 100, pods: 500, policies: 1000, targets: 8,
		nodes: []string{"n1", "n2", "n3"}, clientNode: "n1", enforcerNode: "n2"}
	w := build(l)
	if got := len(w.Policies); got != 1000 {
		t.Errorf("%d policies, want 1000", got)
	}
	if got, want := len(w.Pods), 500+1+1+8+1; got != want {
		t.Errorf("%d pods, want %d", got, want)
	}
	if got, want := len(w.Namespaces), 103; got != want {
		t.Errorf("%d namespaces, want %d", got, want)
	}
	seen := map[string]bool{}
	kinds := map[string]int{}
	for _, p := range w.Policies {
		k := p.Namespace + "/" + p.Name
		if seen[k] {
			t.Errorf("policy %s twice", k)
		}
		seen[k] = true
		kinds[p.Name]++
	}
	if kinds["default-deny"] == 0 || kinds["api-from-team"] == 0 || kinds["web-egress"] == 0 {
		t.Errorf("policy mix lacks a kind: %v", kinds)
	}
	for _, p := range w.Pods {
		k := p.Namespace + "/" + p.Name
		if seen["pod:"+k] {
			t.Errorf("pod %s twice", k)
		}
		seen["pod:"+k] = true
		var selectedBy []string
		for _, np := range w.Policies {
			s, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			if np.Namespace == p.Namespace && s.Matches(labels.Set(p.Labels)) {
				selectedBy = append(selectedBy, np.Name)
			}
		}
		switch {
		case p.Namespace == probeNS && p.Name == "rate":
			if len(selectedBy) != 5 {
				t.Errorf("rate target selected by %v, want the 5 rate policies", selectedBy)
			}
		case p.Namespace == probeNS || p.Namespace == clientNS:
			if len(selectedBy) != 0 {
				t.Errorf("%s selected by %v, want none", k, selectedBy)
			}
		case p.Namespace == canaryNS:
			if len(selectedBy) != 1 || p.Spec.NodeName != "n2" {
				t.Errorf("canary selected by %v on %s", selectedBy, p.Spec.NodeName)
			}
		}
	}
	if p := w.Pods[len(w.Pods)-1]; p.Spec.NodeName != l.enforcerNode {
		t.Errorf("canary on %s", p.Spec.NodeName)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ p, want float64 }{{50, 3}, {99, 5}, {100, 5}, {20, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("p%.0f = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	m := map[string]float64{
		`a_sum{full="false"}`: 2, `a_count{full="false"}`: 4,
		"b_sum": 10, "b_count": 5, "c": 7, `d_count{v="x"}`: 3,
	}
	want := `a{full="false"} mean 0.5 over 4; b mean 2 over 5; c = 7; d_count{v="x"} = 3`
	if got := summarize(m); got != want {
		t.Errorf("summarize = %q, want %q", got, want)
	}
}
