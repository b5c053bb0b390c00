package agent

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flatnet/flatnet/internal/agent/routes"
)

func TestRelevantChange(t *testing.T) {
	base := k8sNode("n", "10.244.1.0/24", "10.250.0.11")
	hb := base.DeepCopy()
	hb.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	hb.ResourceVersion = "2"
	if relevantChange(base, hb) {
		t.Error("a heartbeat counts as a change")
	}
	if !relevantChange(base, k8sNode("n", "10.244.2.0/24", "10.250.0.11")) || !relevantChange(base, k8sNode("n", "10.244.1.0/24", "10.250.0.99")) {
		t.Error("podCIDR or InternalIP change missed")
	}
	ann := base.DeepCopy()
	ann.Annotations = map[string]string{"flatnet.io/vtep-mac": "02:00:00:00:00:01"}
	if !relevantChange(base, ann) {
		t.Error("a flatnet.io/ annotation change missed")
	}
	other := base.DeepCopy()
	other.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0"}
	if relevantChange(base, other) {
		t.Error("another annotation counts as a change")
	}
}

// signalRoutes passes every route write on to a channel.
type signalRoutes struct {
	routes.Kernel
	wrote chan []routes.Change
}

func (s signalRoutes) Write(cs []routes.Change) []error {
	errs := s.Kernel.Write(cs)
	s.wrote <- cs
	return errs
}

// TestRunLoop: the loop reconciles in full at start; a peer's change is
// programmed on its own (Reconciler.Peer: the new route added, not
// replaced as a full reconcile does, and nothing else written); this
// Node getting its podCIDR (an informer event, long before the resync)
// is a full reconcile again.
func TestRunLoop(t *testing.T) {
	f := newFakeNode(t, "n1")
	wrote := make(chan []routes.Change, 100)
	f.r.Kernel.Routes = signalRoutes{Kernel: f.routes, wrote: wrote}
	client := fake.NewClientset(k8sNode("n1", "", "10.250.0.11"), k8sNode("n2", "10.244.2.0/24", "10.250.0.12"))
	ctx, cancel := context.WithCancel(context.Background())
	reconciled := make(chan struct{}, 100)
	annotate := f.r.Annotate
	f.r.Annotate = func(ctx context.Context, set map[string]*string) error {
		reconciled <- struct{}{}
		return annotate(ctx, set)
	}
	waitFor := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30s", what)
		}
	}
	done := make(chan error, 1)
	w, err := watchNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		w.factory.Shutdown()
	}()
	go func() { done <- runLoop(ctx, w, f.r, time.Hour) }()

	// Each full reconcile publishes the node's annotations (the fake
	// client never gets them): the positive signal.
	waitFor("reconcile", reconciled)
	if cs := <-wrote; len(cs) != 1 || cs[0].Op != routes.Replace {
		t.Fatalf("first reconcile wrote %+v", cs)
	}
	patch := []byte(`{"spec":{"podCIDR":"10.244.22.0/24","podCIDRs":["10.244.22.0/24"]}}`)
	if _, err := client.CoreV1().Nodes().Patch(ctx, "n2", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var cs []routes.Change
	select {
	case cs = <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("no route change within 30s of n2's new podCIDR")
	}
	want := []routes.Change{
		{Op: routes.Add, Route: routes.Route{Dst: netip.MustParsePrefix("10.244.22.0/24"), Gw: netip.MustParseAddr("10.250.0.12"), Node: "n2"}},
		{Op: routes.Delete, Route: routes.Route{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("10.250.0.12"), Node: "n2"}},
	}
	if d := cmp.Diff(want, cs, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("n2's change (-want +got):\n%s", d)
	}
	if _, err := os.Stat(f.conf); !os.IsNotExist(err) {
		t.Fatalf("conflist before the podCIDR: %v", err)
	}
	patch = []byte(`{"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}`)
	if _, err := client.CoreV1().Nodes().Patch(ctx, "n1", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("reconcile after this Node's podCIDR", reconciled)
	if _, err := os.Stat(f.conf); err != nil {
		t.Fatal("no conflist after the Node got its podCIDR")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if f.routes.Dump() != "10.244.22.0/24 via 10.250.0.12\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}
}
