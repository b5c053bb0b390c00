package nodeipam

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	c        *Controller
	recorder *record.FakeRecorder
	indexer  cache.Indexer
	// cached are the informer's objects as the controller first saw them,
	// and copies their deep copies: the controller must never write to
	// the cache.
	cached, copies []*corev1.Node
}

func node(name string, podCIDRs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
		n.Spec.PodCIDRs = podCIDRs
	}
	return n
}

// newFixture builds a controller over a fake clientset holding nodes. With
// live, the informer runs against the clientset; without, the cache is a
// static indexer that only the test changes (f.cache), so that what the
// controller sees is deterministic.
func newFixture(t *testing.T, cluster string, mask int, live bool, nodes ...*corev1.Node) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	rec := record.NewFakeRecorder(100)
	informer := factory.Core().V1().Nodes()
	c, err := New(client, informer, Config{ClusterCIDR: netip.MustParsePrefix(cluster), NodeMaskSize: mask}, rec)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: ctx, client: client, c: c, recorder: rec, indexer: informer.Informer().GetIndexer()}
	if live {
		factory.Start(ctx.Done())
		factory.WaitForCacheSync(ctx.Done())
	} else {
		for _, n := range nodes {
			f.cache(n.DeepCopy())
		}
	}
	f.cached, _ = c.nodes.List(labels.Everything())
	for _, n := range f.cached {
		f.copies = append(f.copies, n.DeepCopy())
	}
	t.Cleanup(f.checkCacheUntouched)
	client.ClearActions()
	return f
}

// cache puts n into the static cache.
func (f *fixture) cache(n *corev1.Node) {
	if err := f.indexer.Add(n); err != nil {
		f.t.Fatal(err)
	}
}

// uncache removes node name from the static cache.
func (f *fixture) uncache(name string) {
	if err := f.indexer.Delete(node(name)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) checkCacheUntouched() {
	for i, n := range f.cached {
		if !apiequality.Semantic.DeepEqual(n, f.copies[i]) {
			f.t.Errorf("the controller modified the cached Node %s:\n%s", n.Name, cmp.Diff(f.copies[i], n))
		}
	}
}

// syncAll runs one sync per Node the cache knows, in name order.
func (f *fixture) syncAll(names ...string) {
	f.t.Helper()
	for _, name := range names {
		if err := f.c.sync(f.ctx, name); err != nil {
			f.t.Fatalf("sync %s: %v", name, err)
		}
	}
}

// patches returns "node=podCIDR" for each node patch the client saw.
func (f *fixture) patches() []string {
	var out []string
	for _, a := range f.client.Actions() {
		if v := a.GetVerb(); v == "list" || v == "watch" || v == "get" || v == "create" {
			continue
		}
		pa, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetResource().Resource != "nodes" {
			f.t.Errorf("unexpected API action %s %s", a.GetVerb(), a.GetResource().Resource)
			continue
		}
		out = append(out, pa.GetName()+"="+string(pa.GetPatch()))
	}
	return out
}

// waitCache waits until the informer shows cond for node name.
func (f *fixture) waitCache(name string, cond func(*corev1.Node, error) bool) {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return cond(f.c.nodes.Get(name)), nil
	})
	if err != nil {
		f.t.Fatalf("cache never showed the expected state of node %s", name)
	}
}

func (f *fixture) podCIDR(name string) string {
	n, err := f.client.CoreV1().Nodes().Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return n.Spec.PodCIDR + " " + strings.Join(n.Spec.PodCIDRs, ",")
}

func TestAllocatesOnlyToNodesWithout(t *testing.T) {
	f := newFixture(t, "10.244.0.0/16", 24, false,
		node("a", "10.244.0.0/24"), // allocated by kube-controller-manager
		node("b"), node("c"),
		node("v6", "fd00::/64", "10.244.7.0/24")) // dual-stack: the IPv4 one counts
	if err := f.c.rebuild(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.syncAll("a", "b", "c", "v6")
	// One PATCH a Node is the whole cost: no GET, no event.
	for _, a := range f.client.Actions() {
		if a.GetVerb() != "patch" {
			t.Errorf("unexpected API action %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	select {
	case ev := <-f.recorder.Events:
		t.Errorf("event for an allocation: %q", ev)
	default:
	}
	want := []string{
		`b={"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}`,
		`c={"spec":{"podCIDR":"10.244.2.0/24","podCIDRs":["10.244.2.0/24"]}}`,
	}
	if d := cmp.Diff(want, f.patches()); d != "" {
		t.Errorf("patches (-want +got):\n%s", d)
	}
	if got := f.podCIDR("b"); got != "10.244.1.0/24 10.244.1.0/24" {
		t.Errorf("node b: %s", got)
	}
	if got := f.podCIDR("a"); got != "10.244.0.0/24 10.244.0.0/24" {
		t.Errorf("node a changed: %s", got)
	}

	// A sync before the cache has seen our patch reuses the reservation.
	f.client.ClearActions()
	f.syncAll("b")
	if d := cmp.Diff([]string{`b={"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}`}, f.patches()); d != "" {
		t.Errorf("resync before the cache caught up (-want +got):\n%s", d)
	}
	// Once the cache has it, syncing again changes nothing.
	f.cache(node("b", "10.244.1.0/24"))
	f.cache(node("c", "10.244.2.0/24"))
	f.client.ClearActions()
	f.syncAll("a", "b", "c", "v6")
	if p := f.patches(); len(p) != 0 {
		t.Errorf("second round patched: %v", p)
	}
	if f.c.alloc.Used() != 4 {
		t.Errorf("in use: %d, want 4 (a, b, c, v6's 10.244.7.0/24)", f.c.alloc.Used())
	}
}

func TestStableAcrossRestart(t *testing.T) {
	// A restarted controller sees what the previous run wrote and fills
	// the gap, never moving a Node.
	f := newFixture(t, "10.244.0.0/16", 24, false,
		node("n1", "10.244.0.0/24"), node("n3", "10.244.2.0/24"), node("new"))
	if err := f.c.rebuild(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.syncAll("n1", "n3", "new")
	if d := cmp.Diff([]string{`new={"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}}`}, f.patches()); d != "" {
		t.Errorf("patches (-want +got):\n%s", d)
	}
}

func TestExhaustedThenFreedOnDelete(t *testing.T) {
	f := newFixture(t, "10.244.0.0/23", 24, false, node("a", "10.244.0.0/24"), node("b", "10.244.1.0/24"), node("c"))
	if err := f.c.rebuild(f.ctx); err != nil {
		t.Fatal(err)
	}
	err := f.c.sync(f.ctx, "c")
	if err == nil || !strings.Contains(err.Error(), "--cluster-cidr") {
		t.Fatalf("sync on a full pool: %v", err)
	}
	if p := f.patches(); len(p) != 0 {
		t.Errorf("patched on a full pool: %v", p)
	}
	select {
	case ev := <-f.recorder.Events:
		if !strings.HasPrefix(ev, "Warning CIDRNotAvailable No pod CIDR for node c") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no CIDRNotAvailable event")
	}

	// Node a goes: its subnet is freed and c, waiting, is queued again.
	if err := f.client.CoreV1().Nodes().Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.uncache("a")
	f.client.ClearActions()
	f.syncAll("a")
	if f.c.queue.Len() != 1 {
		t.Fatalf("releasing a subnet queued %d nodes, want 1 (c)", f.c.queue.Len())
	}
	if k, _ := f.c.queue.Get(); k != "c" {
		t.Fatalf("queued %q", k)
	}
	f.syncAll("c")
	if d := cmp.Diff([]string{`c={"spec":{"podCIDR":"10.244.0.0/24","podCIDRs":["10.244.0.0/24"]}}`}, f.patches()); d != "" {
		t.Errorf("patches (-want +got):\n%s", d)
	}
}

func TestOutsideClusterCIDRIsLeftAlone(t *testing.T) {
	f := newFixture(t, "10.244.0.0/16", 24, false, node("x", "10.99.0.0/24"), node("bad", "not-a-cidr"))
	if err := f.c.rebuild(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.syncAll("x", "bad")
	if p := f.patches(); len(p) != 0 {
		t.Errorf("patched: %v", p)
	}
	if f.c.alloc.Used() != 0 {
		t.Errorf("in use: %d", f.c.alloc.Used())
	}
}

func TestRun(t *testing.T) {
	f := newFixture(t, "10.244.0.0/16", 24, true, node("n1", "10.244.0.0/24"), node("n2"))
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.c.Run(ctx, 2) }()
	if _, err := f.client.CoreV1().Nodes().Create(ctx, node("n3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"n2", "n3"} {
		f.waitCache(name, func(n *corev1.Node, err error) bool { return err == nil && n.Spec.PodCIDR != "" })
	}
	got := map[string]bool{}
	for _, name := range []string{"n1", "n2", "n3"} {
		got[f.podCIDR(name)] = true
	}
	if len(got) != 3 || !got["10.244.0.0/24 10.244.0.0/24"] {
		t.Errorf("subnets %v: want three distinct, n1 unchanged", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(f.patches()); n != 2 {
		t.Errorf("%d patches, want 2", n)
	}
}
