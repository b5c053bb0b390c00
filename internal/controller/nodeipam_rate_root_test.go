package controller

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flatnet/flatnet/internal/kube"
)

// TestRootNodeIPAMRate measures how fast node IPAM gives N new Nodes a
// podCIDR against a real kube-apiserver and etcd, with the old client
// settings (kube.Client's 50 qps, burst 100, 2 workers) and with the
// flags' defaults, in the same run. The Nodes are all created first (by a
// client of 5,000 qps and 16 goroutines), then the controller starts: the
// time is from the last Node created to every Node holding a podCIDR,
// which includes the controller's initial list. N is 200, or
// $FLATNET_NODEIPAM_NODES (5000 for docs/benchmarks.md);
// $FLATNET_NODEIPAM_EXTRA=QPS/BURST/WORKERS adds a third setting, to find
// where the API server, not the client, is the limit.
func TestRootNodeIPAMRate(t *testing.T) {
	n := 200
	if s := os.Getenv("FLATNET_NODEIPAM_NODES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("FLATNET_NODEIPAM_NODES=%q: want a positive number", s)
		}
	}
	info, _ := apiserverInfo(t)
	fast, err := kube.ClientWithRate(info.Kubeconfig, "nodeipam-rate-test", 5000, 5000)
	if err != nil {
		t.Fatal(err)
	}
	type setting struct {
		name         string
		qps          float32
		burst, works int
	}
	settings := []setting{
		{"old", kube.DefaultQPS, kube.DefaultBurst, 2},
		{"new", DefaultKubeAPIQPS, DefaultKubeAPIBurst, DefaultNodeIPAMWorkers},
	}
	if s := os.Getenv("FLATNET_NODEIPAM_EXTRA"); s != "" {
		x := setting{name: "extra"}
		if _, err := fmt.Sscanf(s, "%g/%d/%d", &x.qps, &x.burst, &x.works); err != nil {
			t.Fatalf("FLATNET_NODEIPAM_EXTRA=%q: want QPS/BURST/WORKERS: %v", s, err)
		}
		settings = append(settings, x)
	}
	rates := map[string]float64{}
	for _, c := range settings {
		// 10.0.0.0/8 in /24s: 65,536 subnets.
		o := DefaultOptions()
		o.ClusterCIDR, o.KubeAPIQPS, o.KubeAPIBurst, o.NodeIPAMWorkers = "10.0.0.0/8", c.qps, c.burst, c.works
		if err := o.validate(); err != nil {
			t.Fatal(err)
		}
		client, err := kube.ClientWithRate(info.Kubeconfig, "flatnet-controller", o.KubeAPIQPS, o.KubeAPIBurst)
		if err != nil {
			t.Fatal(err)
		}
		createNodes(t, fast, c.name, n)
		assigned := watchPodCIDRs(t, fast, n)
		cpu0, etcd0 := cpuSeconds(t, info.APIServerPID), cpuSeconds(t, info.EtcdPID)
		t0 := time.Now()
		stop := startController(t, client, o)
		cidrs := <-assigned
		d := time.Since(t0)
		cpu, etcd := cpuSeconds(t, info.APIServerPID)-cpu0, cpuSeconds(t, info.EtcdPID)-etcd0
		stop()
		if len(cidrs) != n {
			t.Fatalf("%s: %d distinct podCIDRs for %d nodes", c.name, len(cidrs), n)
		}
		rates[c.name] = float64(n) / d.Seconds()
		t.Logf("%s (qps %g, burst %d, %d workers): %d nodes in %.2fs = %.0f nodes/s; kube-apiserver CPU %.1fs (%.0f%% of one core), etcd %.1fs (%.0f%%)",
			c.name, c.qps, c.burst, c.works, n, d.Seconds(), rates[c.name], cpu, 100*cpu/d.Seconds(), etcd, 100*etcd/d.Seconds())
		deleteNodes(t, fast)
	}
	t.Logf("new/old: %.1fx", rates["new"]/rates["old"])
	// The old settings are bound by their 50 qps (after the first 100):
	// the new ones must do clearly better even on a loaded machine.
	if rates["new"] < 2*rates["old"] {
		t.Errorf("new settings %.0f nodes/s, old %.0f: want at least twice as fast", rates["new"], rates["old"])
	}
}

// createNodes creates n Nodes named prefix-0.. with 16 goroutines.
func createNodes(t *testing.T, client kubernetes.Interface, prefix string, n int) {
	t.Helper()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)}}
				if _, err := client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("creating nodes: %v", errs[0])
	}
}

// watchPodCIDRs watches the n Nodes (already created) and sends the set
// of their podCIDRs once every one has its own. It fails the test on a
// podCIDR that two Nodes share or that changes, and after 10 minutes.
func watchPodCIDRs(t *testing.T, client kubernetes.Interface, n int) <-chan map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	factory := informers.NewSharedInformerFactory(client, 0)
	var (
		mu     sync.Mutex
		byNode = map[string]string{}
		taken  = map[string]bool{}
		done   = make(chan map[string]bool, 1)
	)
	note := func(obj any) {
		node := obj.(*corev1.Node)
		if node.Spec.PodCIDR == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if old, ok := byNode[node.Name]; ok {
			if old != node.Spec.PodCIDR {
				t.Errorf("node %s: podCIDR changed from %s to %s", node.Name, old, node.Spec.PodCIDR)
			}
			return
		}
		if taken[node.Spec.PodCIDR] {
			t.Errorf("node %s: podCIDR %s already given to another node", node.Name, node.Spec.PodCIDR)
		}
		byNode[node.Name], taken[node.Spec.PodCIDR] = node.Spec.PodCIDR, true
		if len(byNode) == n {
			done <- taken
		}
	}
	inf := factory.Core().V1().Nodes().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, cur any) { note(cur) }}); err != nil {
		t.Fatal(err)
	}
	factory.StartWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("node watch did not sync")
	}
	out := make(chan map[string]bool, 1)
	go func() {
		defer factory.Shutdown()
		defer cancel()
		select {
		case m := <-done:
			out <- m
		case <-ctx.Done():
			mu.Lock()
			t.Errorf("only %d of %d nodes got a podCIDR in 10 minutes", len(byNode), n)
			mu.Unlock()
			out <- nil
		}
	}()
	return out
}

// deleteNodes deletes every Node and waits until none is left.
func deleteNodes(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	if err := client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("nodes not deleted: %v", err)
	}
}

// cpuSeconds is the CPU time (user and system) process pid has used.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after comm's last ')': f[0] is field 3, utime (14) is f[11].
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks float64
	for _, s := range f[11:13] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return ticks / 100 // USER_HZ
}
