package controller

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func readyNodes(n int) []*corev1.Node {
	out := make([]*corev1.Node, n)
	for i := range out {
		out[i] = readyNode(fmt.Sprintf("n%05d", i), fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
	}
	return out
}

// More nodes than one EndpointSlice may name (the API refuses a slice
// of over 1,000 endpoints): the frontend gets several, and fewer again
// when the cluster shrinks.
func TestFrontendSlicesOfManyNodes(t *testing.T) {
	in := planInput{Gateways: []*gwv1.Gateway{gateway("a", "gw", 1, 80)}, Nodes: readyNodes(2500), Range: PortRange{20000, 20010}}
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
	if fmt.Sprint(names) != "[gw-flatnet-gw gw-flatnet-gw-2 gw-flatnet-gw-3]" || fmt.Sprint(sizes) != "[1000 1000 500]" || len(seen) != 2500 {
		t.Fatalf("slices %v of %v endpoints (%d nodes), want 3 of 1000, 1000, 500", names, sizes, len(seen))
	}

	// Applied, then applied again for 1,200 nodes: the third slice goes.
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
	in.Existing, in.Nodes = []*corev1.Service{svc}, readyNodes(1200)
	p2, _ := plan(in)
	key := types.NamespacedName{Namespace: "a", Name: "gw-flatnet-gw"}
	if err := applyFrontends(ctx, c, p2, []*corev1.Service{svc}, map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{key: have()}); err != nil {
		t.Fatal(err)
	}
	got := have()
	if len(got) != 2 || len(got["gw-flatnet-gw"].Endpoints) != 1000 || len(got["gw-flatnet-gw-2"].Endpoints) != 200 {
		t.Fatalf("slices after shrinking to 1,200 nodes: %d (want gw-flatnet-gw of 1000 and -2 of 200)", len(got))
	}
}
