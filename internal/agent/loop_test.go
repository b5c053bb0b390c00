package agent

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
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

// TestRunLoop: the loop reconciles at start, and again when this Node gets
// its podCIDR (an informer event, long before the resync).
func TestRunLoop(t *testing.T) {
	f := newFakeNode(t, "n1")
	client := fake.NewClientset(k8sNode("n1", "", "10.250.0.11"), k8sNode("n2", "10.244.2.0/24", "10.250.0.12"))
	ctx, cancel := context.WithCancel(context.Background())
	reconciled := make(chan struct{}, 100)
	annotate := f.r.Annotate
	f.r.Annotate = func(ctx context.Context, set map[string]*string) error {
		reconciled <- struct{}{}
		return annotate(ctx, set)
	}
	waitReconcile := func() {
		t.Helper()
		select {
		case <-reconciled:
		case <-time.After(30 * time.Second):
			t.Fatal("no reconcile within 30s")
		}
	}
	done := make(chan error, 1)
	go func() { done <- runLoop(ctx, client, f.r, time.Hour) }()

	// Each reconcile publishes the node's annotations: the positive
	// signal. Once a second one has begun (after a change to n2), the
	// first, without a podCIDR, is over and must have written no conflist.
	waitReconcile()
	if _, err := client.CoreV1().Nodes().Patch(ctx, "n2", "application/merge-patch+json", []byte(`{"metadata":{"annotations":{"flatnet.io/vtep-mac":"02:00:00:00:00:02"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReconcile()
	if _, err := os.Stat(f.conf); !os.IsNotExist(err) {
		t.Fatalf("conflist before the podCIDR: %v", err)
	}
	patch := []byte(`{"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}`)
	if _, err := client.CoreV1().Nodes().Patch(ctx, "n1", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(f.conf)
		return err == nil, nil
	})
	if err != nil {
		t.Fatal("no conflist after the Node got its podCIDR")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if f.routes.Dump() != "10.244.2.0/24 via 10.250.0.12\n" {
		t.Errorf("routes:\n%s", f.routes.Dump())
	}
}
