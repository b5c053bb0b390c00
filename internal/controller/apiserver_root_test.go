package controller

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/controller/nodeipam"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/testutil"
)

// apiserver starts a real etcd + kube-apiserver on 127.0.0.1 (loopback
// only) for the test and returns the admin kubeconfig and the binaries'
// directory (kubectl). It skips when the upstream binaries are not built
// (outside CI).
func apiserver(t *testing.T) (kubeconfig, binDir string) {
	t.Helper()
	info, binDir := apiserverInfo(t)
	return info.Kubeconfig, binDir
}

// apiserverInfo is apiserver with the processes' pids.
func apiserverInfo(t *testing.T) (*controlplane.Info, string) {
	t.Helper()
	testutil.RequireRoot(t)
	binDir, err := controlplane.BinDir()
	if err != nil {
		testutil.Skip(t, "%v (make k8s builds them)", err)
	}
	state := t.TempDir()
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	info, err := controlplane.Up(ctx, controlplane.Config{StateDir: state, BinDir: binDir, Addr: netip.MustParseAddr("127.0.0.1")}, &log)
	t.Cleanup(func() {
		if err := controlplane.Down(state); err != nil {
			t.Errorf("control plane down: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("control plane up: %v\n%s", err, log.String())
	}
	return info, binDir
}

func repoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// startController runs the controllers until the returned stop is called.
func startController(t *testing.T, client kubernetes.Interface, o Options) (stop func()) {
	t.Helper()
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(o.ClusterCIDR)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, client, nodeipam.Config{ClusterCIDR: p, NodeMaskSize: o.NodeCIDRMaskSize}, o)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func createReadyNode(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitPodCIDR(t *testing.T, client kubernetes.Interface, name string) string {
	t.Helper()
	var cidr string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if n.Spec.PodCIDR != "" && (len(n.Spec.PodCIDRs) != 1 || n.Spec.PodCIDRs[0] != n.Spec.PodCIDR) {
			return false, fmt.Errorf("node %s: podCIDR %s but podCIDRs %v", name, n.Spec.PodCIDR, n.Spec.PodCIDRs)
		}
		cidr = n.Spec.PodCIDR
		return cidr != "", nil
	})
	if err != nil {
		t.Fatalf("node %s got no podCIDR: %v", name, err)
	}
	return cidr
}

func hasEvent(client kubernetes.Interface, reason, name string) bool {
	evs, err := client.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if e.Reason == reason && e.InvolvedObject.Name == name {
			return true
		}
	}
	return false
}

// TestRootAgainstAPIServer runs the controller against a real
// kube-apiserver: allocation, restart stability, exhaustion and release,
// pod binding; and server-side validates deploy/flatnet.yaml.
func TestRootAgainstAPIServer(t *testing.T) {
	kubeconfig, binDir := apiserver(t)

	// The deploy manifests pass the API server's own validation.
	out, err := exec.Command(filepath.Join(binDir, "kubectl"), "--kubeconfig", kubeconfig,
		"apply", "--dry-run=server", "-f", filepath.Join(repoRoot(), "deploy", "flatnet.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server deploy/flatnet.yaml: %v\n%s", err, out)
	}
	for _, want := range []string{"configmap/flatnet-config", "daemonset.apps/flatnet-agent", "deployment.apps/flatnet-controller",
		"clusterrole.rbac.authorization.k8s.io/flatnet-controller", "serviceaccount/flatnet-agent"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("dry run output lacks %s:\n%s", want, out)
		}
	}

	client, err := kube.Client(kubeconfig, "flatnet-controller-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Four /24s: n1..n4 fill the pool.
	o := Options{ClusterCIDR: "10.244.0.0/22", NodeCIDRMaskSize: 24, AllocateNodeCIDRs: true, BindPods: true, Workers: 2,
		NodeIPAMWorkers: 2, KubeAPIQPS: DefaultKubeAPIQPS, KubeAPIBurst: DefaultKubeAPIBurst}
	stop := startController(t, client, o)
	got := map[string]string{}
	for _, n := range []string{"n1", "n2", "n3"} {
		createReadyNode(t, client, n)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		got[n] = waitPodCIDR(t, client, n)
	}
	if len(map[string]bool{got["n1"]: true, got["n2"]: true, got["n3"]: true}) != 3 {
		t.Fatalf("podCIDRs not distinct: %v", got)
	}

	// Pods without a node are bound round-robin.
	for i := range 3 {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "default"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bound := map[string]bool{}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		bound = map[string]bool{}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" {
				return false, nil
			}
			bound[p.Spec.NodeName] = true
		}
		return true, nil
	})
	if err != nil || len(bound) != 3 {
		t.Fatalf("pods bound to %v (%v), want one on each of 3 nodes", bound, err)
	}

	// A restarted controller keeps every allocation and fills the gap.
	stop()
	startController(t, client, o)
	createReadyNode(t, client, "n4")
	got["n4"] = waitPodCIDR(t, client, "n4")
	for _, n := range []string{"n1", "n2", "n3"} {
		if c := waitPodCIDR(t, client, n); c != got[n] {
			t.Errorf("node %s moved from %s to %s across a restart", n, got[n], c)
		}
	}
	if len(map[string]bool{got["n1"]: true, got["n2"]: true, got["n3"]: true, got["n4"]: true}) != 4 {
		t.Fatalf("podCIDRs not distinct after restart: %v", got)
	}

	// The pool is empty: n5 waits with an event, until n2 goes.
	createReadyNode(t, client, "n5")
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return hasEvent(client, nodeipam.ReasonCIDRNotAvailable, "n5"), nil
	})
	if err != nil {
		t.Fatalf("no %s event for n5", nodeipam.ReasonCIDRNotAvailable)
	}
	if n, _ := client.CoreV1().Nodes().Get(ctx, "n5", metav1.GetOptions{}); n.Spec.PodCIDR != "" {
		t.Fatalf("n5 got %s from a full pool", n.Spec.PodCIDR)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if c := waitPodCIDR(t, client, "n5"); c != got["n2"] {
		t.Errorf("n5 got %s, want n2's freed %s", c, got["n2"])
	}
}
