package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func readyNodes(n int) []*corev1.Node {
	out := make([]*corev1.Node, n)
	for i := range out {
		out[i] = readyNode(fmt.Sprintf("n%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
	}
	return out
}

// More nodes than one frontend EndpointSlice holds: the frontend gets
// several; a node that comes or goes rewrites one of them (a new one takes
// the gap a gone one left); fewer slices again when the cluster shrinks.
func TestFrontendSlicesOfManyNodes(t *testing.T) {
	in := planInput{Gateways: []*gwv1.Gateway{gateway("a", "gw", 1, 80)}, Nodes: readyNodes(250), Range: PortRange{20000, 20010}}
	p, errs := plan(in)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	var names []string
	var sizes []int
	seen := map[string]bool{}
	for _, es := range p.Slices[0] {
		names, sizes = append(names, es.Name), append(sizes, len(es.Endpoints))
		for _, e := range es.Endpoints {
			if seen[*e.NodeName] {
				t.Fatalf("node %s in two slices", *e.NodeName)
			}
			seen[*e.NodeName] = true
		}
		if es.Labels[discoveryv1.LabelServiceName] != "gw-flatnet-gw" || es.Labels[discoveryv1.LabelManagedBy] != SliceManagedBy {
			t.Errorf("slice %s labels %v", es.Name, es.Labels)
		}
	}
	if fmt.Sprint(names) != "[gw-flatnet-gw gw-flatnet-gw-2 gw-flatnet-gw-3]" || fmt.Sprint(sizes) != "[100 100 50]" || len(seen) != 250 {
		t.Fatalf("slices %v of %v endpoints (%d nodes), want 3 of 100, 100, 50", names, sizes, len(seen))
	}

	ctx := context.Background()
	c := fake.NewClientset()
	if err := applyFrontends(ctx, c, p, nil, nil); err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services("a").Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := func() map[string]*discoveryv1.EndpointSlice {
		list, err := c.DiscoveryV1().EndpointSlices("a").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*discoveryv1.EndpointSlice{}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
		return out
	}
	if got := have(); len(got) != 3 || got["gw-flatnet-gw-3"].OwnerReferences[0].UID != svc.UID {
		t.Fatalf("slices after the first apply: %d, owner of the third %v", len(got), got["gw-flatnet-gw-3"].OwnerReferences)
	}
	key := types.NamespacedName{Namespace: "a", Name: "gw-flatnet-gw"}
	// apply plans nodes against the slices there are and applies it; it
	// returns the slices it updated, created or deleted.
	apply := func(nodes []*corev1.Node) []string {
		t.Helper()
		before := have()
		in.Existing, in.ExistingSlices, in.Nodes = []*corev1.Service{svc}, map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{key: before}, nodes
		p, _ := plan(in)
		c.ClearActions()
		if err := applyFrontends(ctx, c, p, []*corev1.Service{svc}, in.ExistingSlices); err != nil {
			t.Fatal(err)
		}
		var touched []string
		for _, a := range c.Actions() {
			if a.GetResource().Resource != "endpointslices" {
				continue
			}
			switch a.GetVerb() {
			case "delete":
				touched = append(touched, "delete "+a.(k8stesting.DeleteAction).GetName())
			case "create", "update":
				touched = append(touched, a.GetVerb()+" "+a.(k8stesting.CreateAction).GetObject().(*discoveryv1.EndpointSlice).Name)
			}
		}
		return touched
	}
	// Node n00042 (in the first slice) leaves, a new node comes: the
	// first slice alone is rewritten, the newcomer in n00042's place.
	nodes := readyNodes(250)
	nodes = append(slices.Delete(nodes, 42, 43), readyNode("zz-new", "10.9.9.9"))
	if got := apply(nodes); fmt.Sprint(got) != "[update gw-flatnet-gw]" {
		t.Fatalf("a node replaced: slice writes %v, want the first slice's update alone", got)
	}
	first := have()["gw-flatnet-gw"]
	if !slices.ContainsFunc(first.Endpoints, func(e discoveryv1.Endpoint) bool { return *e.NodeName == "zz-new" }) || len(first.Endpoints) != 100 {
		t.Fatalf("the new node should fill the first slice's gap: %d endpoints", len(first.Endpoints))
	}
	// A node's address changes: its slice alone.
	nodes[120] = readyNode(nodes[120].Name, "10.8.8.8")
	if got := apply(nodes); fmt.Sprint(got) != "[update gw-flatnet-gw-2]" {
		t.Fatalf("an address changed: slice writes %v, want the second slice's update alone", got)
	}
	// Applied again for the first 120 nodes: the third slice goes, and
	// the second keeps its 20.
	if got := apply(readyNodes(120)); fmt.Sprint(got) != "[update gw-flatnet-gw update gw-flatnet-gw-2 delete gw-flatnet-gw-3]" {
		t.Fatalf("shrinking to 120 nodes: slice writes %v", got)
	}
	got := have()
	if len(got) != 2 || len(got["gw-flatnet-gw"].Endpoints) != 100 || len(got["gw-flatnet-gw-2"].Endpoints) != 20 {
		t.Fatalf("slices after shrinking to 120 nodes: %d (want gw-flatnet-gw of 100 and -2 of 20)", len(got))
	}
	// No nodes: one empty slice, the Service's own name.
	if apply(nil); len(have()) != 1 || have()["gw-flatnet-gw"] == nil || len(have()["gw-flatnet-gw"].Endpoints) != 0 {
		t.Fatalf("no nodes: want the one empty slice gw-flatnet-gw, have %v", have())
	}
}

func TestFrontendSliceIndex(t *testing.T) {
	for name, want := range map[string]int{"gw": 0, "gw-2": 1, "gw-17": 16, "gw-1": -1, "gw-02": -1, "gw-x": -1, "gw2": -1, "other-2": -1} {
		k, ok := frontendSliceIndex("gw", name)
		if !ok {
			k = -1
		}
		if k != want {
			t.Errorf("frontendSliceIndex(gw, %q) = %d, want %d", name, k, want)
		}
	}
}
