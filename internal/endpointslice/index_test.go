package endpointslice

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// handlerFixture is a controller whose informers never run: the test
// fills the stores and calls the handlers, as the informers would.
type handlerFixture struct {
	t                     *testing.T
	c                     *Controller
	pods, svcs, nodeStore cache.Indexer
}

func newHandlerFixture(t *testing.T) *handlerFixture {
	t.Helper()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, factory, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.queue.ShutDown)
	return &handlerFixture{t: t, c: c,
		pods:      factory.Core().V1().Pods().Informer().GetIndexer(),
		svcs:      factory.Core().V1().Services().Informer().GetIndexer(),
		nodeStore: factory.Core().V1().Nodes().Informer().GetIndexer(),
	}
}

// queued empties the queue and returns its keys, sorted.
func (f *handlerFixture) queued() []string {
	var out []string
	for f.c.queue.Len() > 0 {
		k, _ := f.c.queue.Get()
		f.c.queue.Done(k)
		f.c.queue.Forget(k)
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (f *handlerFixture) expectQueued(what string, want ...string) {
	f.t.Helper()
	if d := cmp.Diff(want, f.queued()); d != "" {
		f.t.Errorf("%s: queued (-want +got):\n%s", what, d)
	}
}

func (f *handlerFixture) addService(s *corev1.Service) {
	f.t.Helper()
	if err := f.svcs.Add(s); err != nil {
		f.t.Fatal(err)
	}
	f.c.onServiceAdd(s)
}

func (f *handlerFixture) addPod(p *corev1.Pod) {
	f.t.Helper()
	if err := f.pods.Add(PodOf(p)); err != nil {
		f.t.Fatal(err)
	}
	f.c.onPodAdd(PodOf(p))
}

func (f *handlerFixture) updatePod(old *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod {
	f.t.Helper()
	p := old.DeepCopy()
	change(p)
	if err := f.pods.Update(PodOf(p)); err != nil {
		f.t.Fatal(err)
	}
	f.c.onPodUpdate(PodOf(old), PodOf(p))
	return p
}

// selected are the names of the pods a sync of Service name would read.
func (f *handlerFixture) selected(name string) []string {
	f.t.Helper()
	obj, ok, err := f.svcs.GetByKey(ns + "/" + name)
	if err != nil || !ok {
		f.t.Fatalf("service %s: %v %v", name, ok, err)
	}
	pods := f.c.pods.selected(ns, obj.(*corev1.Service).Spec.Selector)
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func selector(sel map[string]string) svcOpt {
	return func(s *corev1.Service) { s.Spec.Selector = sel }
}

func TestPodEventsQueueTheServicesThatSelectThePod(t *testing.T) {
	f := newHandlerFixture(t)
	f.addService(service("a"))
	f.addService(service("b"))
	// Both select tier=web; the pair they share is no shortcut.
	f.addService(service("web-a", selector(map[string]string{"tier": "web", "app": "a"})))
	f.addService(service("web-b", selector(map[string]string{"tier": "web", "app": "b"})))
	f.addService(service("everything", selector(map[string]string{})))
	f.addService(service("nothing", selector(nil)))
	f.addService(service("alias", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }))
	f.queued()

	p := with(pod("p1", "a", "node-a", "10.1.0.1"), func(p *corev1.Pod) { p.Labels["tier"] = "web" })
	f.addPod(p)
	f.expectQueued("pod added", ns+"/a", ns+"/everything", ns+"/web-a")
	if d := cmp.Diff([]string{"p1"}, f.selected("web-a")); d != "" {
		t.Errorf("pods of web-a (-want +got):\n%s", d)
	}

	p = f.updatePod(p, func(p *corev1.Pod) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", RestartCount: 3}}
	})
	f.expectQueued("status update no endpoint shows")

	p = f.updatePod(p, notReady)
	f.expectQueued("pod not ready", ns+"/a", ns+"/everything", ns+"/web-a")

	// Relabelled out of a and web-a, into b and web-b: the Services it
	// left and joined, not everything (selects it before and after).
	p = f.updatePod(p, func(p *corev1.Pod) { p.Labels["app"] = "b" })
	f.expectQueued("pod relabelled", ns+"/a", ns+"/b", ns+"/web-a", ns+"/web-b")
	if got := f.selected("web-a"); len(got) != 0 {
		t.Errorf("pods of web-a after the relabel: %v, want none", got)
	}
	if d := cmp.Diff([]string{"p1"}, f.selected("web-b")); d != "" {
		t.Errorf("pods of web-b (-want +got):\n%s", d)
	}

	// Relabelled and changed at once: before and after.
	p = f.updatePod(p, func(p *corev1.Pod) { p.Labels["app"] = "a"; p.Status.PodIPs[0].IP = "10.1.0.9" })
	f.expectQueued("pod relabelled and changed", ns+"/a", ns+"/b", ns+"/everything", ns+"/web-a", ns+"/web-b")

	// A Service's selector changes: pod events follow the new one.
	old, _, _ := f.svcs.GetByKey(ns + "/b")
	nb := old.(*corev1.Service).DeepCopy()
	nb.Spec.Selector = map[string]string{"app": "a"}
	if err := f.svcs.Update(nb); err != nil {
		t.Fatal(err)
	}
	f.c.onServiceAdd(nb)
	f.expectQueued("selector changed", ns+"/b")
	f.addPod(pod("p2", "b", "node-a", "10.1.0.2"))
	f.expectQueued("pod of app=b after b's selector moved on", ns+"/everything")
	p = f.updatePod(p, notReady)
	f.queued()
	p = f.updatePod(p, func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionTrue })
	f.expectQueued("pod ready under b's new selector", ns+"/a", ns+"/b", ns+"/everything", ns+"/web-a")
	if d := cmp.Diff([]string{"p1"}, f.selected("b")); d != "" {
		t.Errorf("pods of b after its selector changed (-want +got):\n%s", d)
	}

	// A Service deleted: gone from the index.
	if err := f.svcs.Delete(nb); err != nil {
		t.Fatal(err)
	}
	f.c.onServiceDelete(cache.DeletedFinalStateUnknown{Key: ns + "/b", Obj: nb})
	f.expectQueued("service deleted", ns+"/b")

	// The pod deleted, its last state unknown to the informer.
	if err := f.pods.Delete(PodOf(p)); err != nil {
		t.Fatal(err)
	}
	f.c.onPodDelete(cache.DeletedFinalStateUnknown{Key: ns + "/p1", Obj: PodOf(p)})
	f.expectQueued("pod deleted (tombstone)", ns+"/a", ns+"/everything", ns+"/web-a")
	if got := f.selected("a"); len(got) != 0 {
		t.Errorf("pods of a after the delete: %v, want none", got)
	}
}

func TestNodeEventsQueueOnlyTheServicesOfItsPods(t *testing.T) {
	f := newHandlerFixture(t)
	f.addService(service("a"))
	f.addService(service("b"))
	f.addService(service("c"))
	f.addPod(pod("a1", "a", "node-a", "10.1.0.1"))
	f.addPod(pod("b1", "b", "node-b", "10.1.0.2"))
	f.addPod(pod("c1", "c", "node-a", "10.1.0.3"))
	f.queued()

	na, nb := node("node-a", "zone-a"), node("node-b", "zone-b")
	f.c.onNodeAddOrDelete(na)
	f.expectQueued("node-a added", ns+"/a", ns+"/c")

	relabelled := nb.DeepCopy()
	relabelled.Labels["other"] = "x"
	f.c.onNodeUpdate(nb, relabelled)
	f.expectQueued("node-b relabelled, same zone")
	moved := nb.DeepCopy()
	moved.Labels[corev1.LabelTopologyZone] = "zone-c"
	f.c.onNodeUpdate(nb, moved)
	f.expectQueued("node-b changes zone", ns+"/b")

	f.c.onNodeAddOrDelete(cache.DeletedFinalStateUnknown{Key: "node-a", Obj: na})
	f.expectQueued("node-a deleted (tombstone)", ns+"/a", ns+"/c")
	f.c.onNodeAddOrDelete(node("node-z", ""))
	f.expectQueued("a node without pods")
}

func TestPodDeletionReachesTheTriggerTimeTracker(t *testing.T) {
	f := newHandlerFixture(t)
	svc := service("a", createdAt(at(0)))
	f.addService(svc)
	f.addService(service("b", createdAt(at(0))))
	withIP := pod("p1", "a", "node-a", "10.1.0.1")
	noIP := pod("p2", "a", "node-a")
	f.addPod(withIP)
	f.addPod(noIP)
	f.queued()
	f.c.triggers.ComputeEndpointLastChangeTriggerTime(ns, svc, podsOf(withIP, noIP)) // a's first sync

	before := time.Now()
	for _, p := range []*corev1.Pod{withIP, noIP} {
		if err := f.pods.Delete(PodOf(p)); err != nil {
			t.Fatal(err)
		}
		f.c.onPodDelete(cache.DeletedFinalStateUnknown{Key: ns + "/" + p.Name, Obj: PodOf(p)})
	}
	f.expectQueued("pods deleted", ns+"/a")
	f.c.triggers.mu.Lock()
	removed := maps.Clone(f.c.triggers.removed[ns+"/a"])
	f.c.triggers.mu.Unlock()
	if len(removed) != 1 || removed["p1"].Before(before) {
		t.Fatalf("removals recorded: %v, want p1 (the pod with an address) at or after %v", removed, before)
	}
	if got := f.c.triggers.ComputeEndpointLastChangeTriggerTime(ns, svc, nil); !got.Equal(removed["p1"]) {
		t.Errorf("sync after the delete: trigger time %v, want %v", got, removed["p1"])
	}
}

// Our slices are indexed by their Service's key; others' slices, and ours
// without a Service name, are not.
func TestSliceServiceIndex(t *testing.T) {
	slice := func(managedBy, svc string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x",
			Labels: map[string]string{discovery.LabelManagedBy: managedBy, discovery.LabelServiceName: svc}}}
	}
	for _, c := range []struct {
		s    any
		want []string
	}{
		{slice(ManagedBy, "web"), []string{"ns/web"}},
		{slice("endpointslice-controller.k8s.io", "web"), nil},
		{slice(ManagedBy, ""), nil},
		{&corev1.Pod{}, nil},
	} {
		got, err := sliceServiceIndex(c.s)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v, %v; want %v", c.s, got, err, c.want)
		}
	}
}

// A pod created without an address can be no endpoint yet: its creation
// queues nothing; the update that gives it one queues its Services.
func TestPodAddedWithoutAddressQueuesNothing(t *testing.T) {
	f := newHandlerFixture(t)
	f.addService(service("a"))
	f.queued()
	early := pod("p0", "a", "node-a")
	early.Status = corev1.PodStatus{Phase: corev1.PodPending}
	f.addPod(early)
	f.expectQueued("pod added without an address")
	f.updatePod(early, func(p *corev1.Pod) { p.Status.PodIP = "10.1.0.9"; p.Status.Phase = corev1.PodRunning })
	f.expectQueued("pod given an address", ns+"/a")
}
