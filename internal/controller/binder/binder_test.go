package binder

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

func readyNode(name string, ready bool) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}},
	}
}

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
}

func TestFits(t *testing.T) {
	taint := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name string
		pod  func(*corev1.Pod)
		node func(*corev1.Node)
		want bool
	}{
		{"ready", nil, nil, true},
		{"not ready", nil, func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, false},
		{"no condition", nil, func(n *corev1.Node) { n.Status.Conditions = nil }, false},
		{"cordoned", nil, func(n *corev1.Node) { n.Spec.Unschedulable = true }, false},
		{"selector matches", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "n"} }, nil, true},
		{"selector does not", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"disk": "ssd"} }, nil, false},
		{"tainted", nil, func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{taint} }, false},
		{"tolerated", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
		}, func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{taint} }, true},
		{"tolerate all", func(p *corev1.Pod) { p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}} },
			func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{taint} }, true},
		{"prefer-no-schedule is only a preference", nil, func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, n := pod("p"), readyNode("n", true)
			if tc.pod != nil {
				tc.pod(p)
			}
			if tc.node != nil {
				tc.node(n)
			}
			if got := Fits(p, n); got != tc.want {
				t.Errorf("Fits = %v, want %v", got, tc.want)
			}
		})
	}
}

type fixture struct {
	ctx      context.Context
	client   *fake.Clientset
	b        *Binder
	recorder *record.FakeRecorder
	podIdx   cache.Indexer
	nodeIdx  cache.Indexer
}

// persistBindings makes the fake clientset act as the API server on
// pods/binding: set spec.nodeName, refuse a second binding.
func persistBindings(client *fake.Clientset) {
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		bnd := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), bnd.Namespace, bnd.Name)
		if err != nil {
			return true, nil, err
		}
		p := obj.(*corev1.Pod).DeepCopy()
		if p.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(corev1.Resource("pods/binding"), p.Name, errors.New("pod is already assigned"))
		}
		p.Spec.NodeName = bnd.Target.Name
		return true, nil, client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), p, p.Namespace)
	})
}

func newFixture(t *testing.T, live bool, objs ...runtime.Object) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset(objs...)
	persistBindings(client)
	factory := informers.NewSharedInformerFactory(client, 0)
	pods := UnboundPods(factory)
	nodes := factory.Core().V1().Nodes()
	rec := record.NewFakeRecorder(100)
	b, err := New(client, pods, nodes, rec)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: ctx, client: client, b: b, recorder: rec, podIdx: pods.GetIndexer(), nodeIdx: nodes.Informer().GetIndexer()}
	if live {
		factory.Start(ctx.Done())
		factory.WaitForCacheSync(ctx.Done())
	} else {
		for _, o := range objs {
			switch o := o.(type) {
			case *corev1.Pod:
				f.podIdx.Add(o)
			case *corev1.Node:
				f.nodeIdx.Add(o)
			}
		}
	}
	// The binder must never write to cached objects.
	cached := append(f.podIdx.List(), f.nodeIdx.List()...)
	var copies []runtime.Object
	for _, o := range cached {
		copies = append(copies, o.(runtime.Object).DeepCopyObject())
	}
	t.Cleanup(func() {
		for i, o := range cached {
			if !apiequality.Semantic.DeepEqual(o, copies[i]) {
				t.Errorf("binder modified a cached object: %s", cmp.Diff(copies[i], o))
			}
		}
	})
	client.ClearActions()
	return f
}

// bindings returns "pod->node" for each pods/binding create.
func (f *fixture) bindings(t *testing.T) []string {
	var out []string
	for _, a := range f.client.Actions() {
		switch a.GetVerb() {
		case "list", "watch", "get":
			continue
		}
		if a.GetVerb() != "create" || a.GetSubresource() != "binding" {
			t.Errorf("unexpected action %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
			continue
		}
		b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		out = append(out, b.Name+"->"+b.Target.Name)
	}
	return out
}

func TestRoundRobinOverReadyNodes(t *testing.T) {
	objs := []runtime.Object{readyNode("n1", true), readyNode("n2", true), readyNode("n3", true), readyNode("down", false)}
	for i := range 6 {
		objs = append(objs, pod(fmt.Sprintf("p%d", i)))
	}
	bound := pod("bound")
	bound.Spec.NodeName = "n2"
	done := pod("done")
	done.Status.Phase = corev1.PodSucceeded
	gone := pod("terminating")
	gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	objs = append(objs, bound, done, gone)
	f := newFixture(t, false, objs...)
	for _, name := range []string{"p0", "p1", "p2", "p3", "p4", "p5", "bound", "done", "terminating", "missing"} {
		if err := f.b.sync(f.ctx, "default/"+name); err != nil {
			t.Fatalf("sync %s: %v", name, err)
		}
	}
	want := []string{"p0->n1", "p1->n2", "p2->n3", "p3->n1", "p4->n2", "p5->n3"}
	if d := cmp.Diff(want, f.bindings(t)); d != "" {
		t.Errorf("bindings (-want +got):\n%s", d)
	}
	if ev := <-f.recorder.Events; ev != "Normal Scheduled Successfully assigned default/p0 to n1" {
		t.Errorf("event %q", ev)
	}
	// The API server refuses a second binding: a stale cache is harmless.
	f.client.ClearActions()
	if err := f.b.sync(f.ctx, "default/p0"); err != nil {
		t.Errorf("rebinding a bound pod: %v", err)
	}
}

func TestNoNodeFits(t *testing.T) {
	f := newFixture(t, false, readyNode("down", false), pod("p"))
	err := f.b.sync(f.ctx, "default/p")
	if !errors.Is(err, errNoNode) {
		t.Fatalf("sync: %v, want errNoNode", err)
	}
	if b := f.bindings(t); len(b) != 0 {
		t.Errorf("bound: %v", b)
	}
}

func TestRunBindsWhenANodeTurnsReady(t *testing.T) {
	f := newFixture(t, true, readyNode("n1", false), pod("p"))
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.b.Run(ctx, 1) }()
	// Nothing fits yet (the pod is requeued after errNoNode: the positive
	// signal that the binder tried); then n1 turns Ready and the waiting
	// pod is bound.
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return f.b.queue.NumRequeues("default/p") > 0, nil
	}); err != nil {
		t.Fatal("the binder never tried the pod while no node fit")
	}
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(ctx, readyNode("n1", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := f.client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "n1", nil
	})
	if err != nil {
		t.Fatal("pod was not bound to n1 after it turned Ready")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
