package endpointslice

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

type fixture struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	client *fake.Clientset
	c      *Controller
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset(objs...)
	// New sets Transform on the Pod and EndpointSlice informers; the
	// factory's transform trims Nodes and Services, as the controller's
	// shared factory does.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(Transform))
	c, err := New(client, factory, 100)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() }) // Shutdown waits for the stop
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v did not sync", typ)
		}
	}
	// And the handlers (the pod index), as Run waits for them.
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t.Fatal("the controller's handlers did not sync")
	}
	return &fixture{t: t, ctx: ctx, cancel: cancel, client: client, c: c}
}

// sync runs one sync of s and returns its writes (creates, updates, deletes).
func (f *fixture) sync(s string) [3]int {
	f.t.Helper()
	f.client.ClearActions()
	if err := f.c.Sync(f.ctx, ns+"/"+s); err != nil {
		f.t.Fatalf("sync %s: %v", s, err)
	}
	cr, up, del := writes(f.client)
	return [3]int{cr, up, del}
}

// makeNotReady turns pod not ready in the API and waits for the cache.
func (f *fixture) makeNotReady(pod *corev1.Pod) {
	f.t.Helper()
	p := pod.DeepCopy()
	notReady(p)
	if _, err := f.client.CoreV1().Pods(ns).UpdateStatus(f.ctx, p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.waitFor("pod update in cache", func() bool {
		got, ok := f.cachedPod(p.Name)
		return ok && !got.ready()
	})
}

// cachedPod is pod name (of ns) as a sync reads it: in the controller's
// pod index, which its event handler updates after the informer's store.
func (f *fixture) cachedPod(name string) (*Pod, bool) {
	p := f.c.pods.get(ns, name)
	return p, p != nil
}

// sliceLister reads the controller's slice cache.
func (f *fixture) sliceLister() discoverylisters.EndpointSliceLister {
	return discoverylisters.NewEndpointSliceLister(f.c.sliceIndex)
}

// waitSlices waits until the slice cache matches the API (our writes seen).
func (f *fixture) waitSlices() {
	f.t.Helper()
	err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		api := list(f.t, f.client)
		cached, err := f.sliceLister().List(labels.Everything())
		if err != nil || len(api) != len(cached) {
			return false, err
		}
		for _, a := range api {
			got, err := f.sliceLister().EndpointSlices(a.Namespace).Get(a.Name)
			if err != nil || got.ResourceVersion != a.ResourceVersion || len(got.Endpoints) != len(a.Endpoints) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		f.t.Fatalf("slice cache did not catch up: %v", err)
	}
}

func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	if err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		f.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// cachedCopies snapshots every object in the informer caches: the
// pointers, and deep copies to compare them with later.
func (f *fixture) cachedCopies() (ptrs, copies []runtime.Object) {
	svcs, _ := f.c.services.List(labels.Everything())
	pods := f.c.podStore.List()
	nodes, _ := f.c.nodes.List(labels.Everything())
	sls, _ := f.sliceLister().List(labels.Everything())
	for _, o := range svcs {
		ptrs, copies = append(ptrs, o), append(copies, o.DeepCopy())
	}
	for _, o := range pods {
		p := o.(*Pod)
		ptrs, copies = append(ptrs, p), append(copies, p.DeepCopy())
	}
	for _, o := range nodes {
		ptrs, copies = append(ptrs, o), append(copies, o.DeepCopy())
	}
	for _, o := range sls {
		ptrs, copies = append(ptrs, o), append(copies, o.DeepCopy())
	}
	return ptrs, copies
}

func objects(svc *corev1.Service, pods []*corev1.Pod) []runtime.Object {
	objs := []runtime.Object{svc, node("node-a", "zone-a"), node("node-b", "zone-b")}
	for _, p := range pods {
		objs = append(objs, p)
	}
	return objs
}

func TestControllerWritesUpdatesAndRemoves(t *testing.T) {
	pods := manyPods("s", 250)
	f := newFixture(t, objects(service("s"), pods)...)

	ptrs, copies := f.cachedCopies()
	if got := f.sync("s"); got != [3]int{3, 0, 0} {
		t.Errorf("first sync writes %v, want 3 creates", got)
	}
	for i := range ptrs {
		if d := cmp.Diff(copies[i], ptrs[i]); d != "" {
			t.Fatalf("sync modified a cached object:\n%s", d)
		}
	}
	f.waitSlices()
	if got := f.sync("s"); got != [3]int{} {
		t.Errorf("second sync writes %v, want none", got)
	}
	before := map[string]bool{}
	for _, s := range list(t, f.client) {
		before[s.Name] = true
		if len(s.Endpoints) > 100 || s.Labels[discovery.LabelManagedBy] != ManagedBy {
			t.Errorf("slice %s: %d endpoints, labels %v", s.Name, len(s.Endpoints), s.Labels)
		}
	}

	// One pod turns not ready: one slice updated, no churn.
	f.makeNotReady(pods[42])
	ptrs, copies = f.cachedCopies()
	if got := f.sync("s"); got != [3]int{0, 1, 0} {
		t.Errorf("one pod changed: writes %v, want 1 update", got)
	}
	for i := range ptrs {
		if d := cmp.Diff(copies[i], ptrs[i]); d != "" {
			t.Fatalf("sync modified a cached object:\n%s", d)
		}
	}
	found := false
	for _, s := range list(t, f.client) {
		if !before[s.Name] {
			t.Errorf("new slice %s after one pod changed", s.Name)
		}
		for _, e := range s.Endpoints {
			if e.TargetRef.Name == pods[42].Name {
				found = true
				if *e.Conditions.Ready || *e.Conditions.Serving {
					t.Errorf("endpoint of not-ready pod: %+v", e.Conditions)
				}
			}
		}
	}
	if !found {
		t.Errorf("pod %s lost its endpoint", pods[42].Name)
	}
	f.waitSlices()

	// The Service goes: its slices go with it (no garbage collector).
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("service deletion in cache", func() bool { _, err := f.c.services.Services(ns).Get("s"); return err != nil })
	if got := f.sync("s"); got != [3]int{0, 0, 3} {
		t.Errorf("service deleted: writes %v, want 3 deletes", got)
	}
	if left := list(t, f.client); len(left) != 0 {
		t.Errorf("%d slices left after the Service was deleted", len(left))
	}
}

func TestControllerLeavesOthersSlicesAlone(t *testing.T) {
	svc := service("s")
	other := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s-kcm", Namespace: ns, Labels: map[string]string{
			discovery.LabelServiceName: "s", discovery.LabelManagedBy: "endpointslice-controller.k8s.io",
		}},
		AddressType: discovery.AddressTypeIPv4,
	}
	f := newFixture(t, append(objects(svc, manyPods("s", 2)), other)...)
	if got := f.sync("s"); got != [3]int{1, 0, 0} {
		t.Errorf("writes %v, want 1 create", got)
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Get(f.ctx, "s-kcm", metav1.GetOptions{}); err != nil {
		t.Errorf("kube-controller-manager's slice: %v", err)
	}
	// A Service without selector: ours go, the user's stay.
	f.waitSlices()
	svc = svc.DeepCopy()
	svc.Spec.Selector = nil
	if _, err := f.client.CoreV1().Services(ns).Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("selector removal in cache", func() bool { s, err := f.c.services.Services(ns).Get("s"); return err == nil && s.Spec.Selector == nil })
	if got := f.sync("s"); got != [3]int{0, 0, 1} {
		t.Errorf("selector removed: writes %v, want 1 delete", got)
	}
	if left := list(t, f.client); len(left) != 1 || left[0].Name != "s-kcm" {
		t.Errorf("left: %v", left)
	}
}

func TestControllerExternalNameHasNoSlices(t *testing.T) {
	svc := service("s")
	f := newFixture(t, objects(svc, manyPods("s", 2))...)
	if got := f.sync("s"); got != [3]int{1, 0, 0} {
		t.Errorf("writes %v, want 1 create", got)
	}
	f.waitSlices()
	// Turned into a DNS alias, the selector kept: the slices go.
	svc = svc.DeepCopy()
	svc.Spec.Type, svc.Spec.ExternalName, svc.Spec.ClusterIP, svc.Spec.ClusterIPs = corev1.ServiceTypeExternalName, "example.org", "", nil
	if _, err := f.client.CoreV1().Services(ns).Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("type change in cache", func() bool {
		s, err := f.c.services.Services(ns).Get("s")
		return err == nil && s.Spec.Type == corev1.ServiceTypeExternalName
	})
	if got := f.sync("s"); got != [3]int{0, 0, 1} {
		t.Errorf("ExternalName: writes %v, want 1 delete", got)
	}
	if left := list(t, f.client); len(left) != 0 {
		t.Errorf("left: %v", left)
	}
}

func TestControllerWaitsForItsOwnWrites(t *testing.T) {
	f := newFixture(t, objects(service("s"), manyPods("s", 2))...)
	f.sync("s")
	// Pretend the cache has not seen the create yet.
	f.c.mu.Lock()
	for _, p := range f.c.pending {
		p["s-notyet"] = expectation{kind: wroteCreate, at: time.Now()}
	}
	f.c.mu.Unlock()
	f.client.ClearActions()
	if err := f.c.Sync(f.ctx, ns+"/s"); !errors.Is(err, errStale) {
		t.Errorf("sync on a stale cache: %v, want errStale", err)
	}
	if cr, up, del := writes(f.client); cr+up+del != 0 {
		t.Errorf("stale cache: writes %d/%d/%d, want none", cr, up, del)
	}
}

// An update of ours is waited for until the cache shows its generation
// (or the slice gone); an expectation the cache never shows is given up
// after pendingTimeout.
func TestControllerWaitsForItsOwnUpdates(t *testing.T) {
	f := newFixture(t, objects(service("s"), manyPods("s", 2))...)
	f.sync("s")
	f.waitSlices()
	name := list(t, f.client)[0].Name
	f.c.expect(ns+"/s", name, expectation{kind: wroteUpdate, generation: 3})
	f.client.ClearActions()
	if err := f.c.Sync(f.ctx, ns+"/s"); !errors.Is(err, errStale) {
		t.Fatalf("sync with the cache at an older generation: %v, want errStale", err)
	}
	if cr, up, del := writes(f.client); cr+up+del != 0 {
		t.Errorf("stale cache: writes %d/%d/%d, want none", cr, up, del)
	}
	// The API's copy reaches generation 3 (the real API server counts
	// them; the fake keeps what it is given).
	sl, err := f.client.DiscoveryV1().EndpointSlices(ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sl.Generation = 3
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Update(f.ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("generation 3 in the cache", func() bool {
		got, err := f.sliceLister().EndpointSlices(ns).Get(name)
		return err == nil && got.Generation == 3
	})
	if got := f.sync("s"); got != [3]int{} {
		t.Errorf("caught up: writes %v, want none", got)
	}
	// Never shown, but given up in time.
	f.c.mu.Lock()
	f.c.pending[ns+"/s"] = map[string]expectation{"s-never": {kind: wroteCreate, at: time.Now().Add(-pendingTimeout - time.Second)}}
	f.c.mu.Unlock()
	if got := f.sync("s"); got != [3]int{} {
		t.Errorf("expectation past its timeout: writes %v, want none", got)
	}
}

// An update refused as a conflict (our cached copy is older than the
// API's) is a stale cache, not a failure: the workers leave it to the
// slice informer and a recheck, not to the rate limiter, whose shared
// bucket held a burst's retries to 10 a second.
func TestControllerConflictWaitsForTheInformer(t *testing.T) {
	pods := manyPods("s", 2)
	f := newFixture(t, objects(service("s"), pods)...)
	f.sync("s")
	f.waitSlices()
	conflicts := 0
	f.client.PrependReactor("update", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			return false, nil, nil
		}
		conflicts++
		return true, nil, apierrors.NewConflict(discovery.Resource("endpointslices"), "x", errors.New("the object has been modified"))
	})
	f.makeNotReady(pods[0])
	key := ns + "/s"
	if err := f.c.Sync(f.ctx, key); !errors.Is(err, errStale) {
		t.Fatalf("sync refused as a conflict: %v, want errStale", err)
	}
	// Through the workers' path: no error, no rate-limited retry, the
	// key back after staleRecheck.
	conflicts = 0
	if err := f.c.syncOrWait(f.ctx, key); err != nil {
		t.Fatalf("syncOrWait: %v", err)
	}
	if n := f.c.queue.NumRequeues(key); n != 0 {
		t.Errorf("%d rate-limited requeues, want 0", n)
	}
	f.waitFor("the recheck", func() bool { return f.c.queue.Len() == 1 })
	if got := f.sync("s"); got != [3]int{0, 1, 0} {
		t.Errorf("after the conflict: writes %v, want the update", got)
	}
}

// The slice event that only shows our own write queues nothing (and
// forgets the write); another version, or any event while a sync of the
// Service waits for the cache, queues the Service.
func TestControllerIgnoresTheEchoOfItsWrites(t *testing.T) {
	f := newFixture(t)
	key := ns + "/s"
	slice := func(name, rv string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv,
			Labels: map[string]string{discovery.LabelServiceName: "s", discovery.LabelManagedBy: ManagedBy}}}
	}
	queued := func() bool {
		if f.c.queue.Len() == 0 {
			return false
		}
		k, _ := f.c.queue.Get()
		f.c.queue.Done(k)
		return true
	}
	f.c.expect(key, "a", expectation{kind: wroteUpdate, generation: 2, resourceVersion: "10"})
	f.c.expect(key, "b", expectation{kind: wroteCreate, resourceVersion: "11"})
	f.c.expect(key, "c", expectation{kind: wroteDelete})
	f.c.sliceChanged(slice("a", "9"), false) // an older version than ours
	if !queued() {
		t.Error("an older version of the slice did not queue the Service")
	}
	for _, ev := range []struct {
		s       *discovery.EndpointSlice
		deleted bool
	}{{slice("a", "10"), false}, {slice("b", "11"), false}, {slice("c", "3"), true}} {
		f.c.sliceChanged(ev.s, ev.deleted)
		if queued() {
			t.Errorf("the echo of our write of %s queued the Service", ev.s.Name)
		}
	}
	if len(f.c.pending) != 0 {
		t.Errorf("writes left expected after their echoes: %v", f.c.pending)
	}
	// The same version again is no longer ours to ignore.
	f.c.sliceChanged(slice("a", "10"), false)
	if !queued() {
		t.Error("a second event for a version already seen did not queue the Service")
	}
	// A sync waiting for the cache takes every slice event.
	f.c.expect(key, "a", expectation{kind: wroteUpdate, resourceVersion: "12"})
	f.c.mu.Lock()
	f.c.waiting[key] = true
	f.c.mu.Unlock()
	f.c.sliceChanged(slice("a", "12"), false)
	if !queued() {
		t.Error("the echo did not queue a Service whose sync waits for it")
	}
}

func TestControllerRun(t *testing.T) {
	f := newFixture(t, objects(service("s"), manyPods("s", 1))...)
	done := make(chan error, 1)
	go func() { done <- f.c.Run(f.ctx, 2) }()

	endpoints := func() []string {
		var names []string
		for _, s := range list(t, f.client) {
			for _, e := range s.Endpoints {
				names = append(names, e.TargetRef.Name)
			}
		}
		return names
	}
	f.waitFor("the first pod's endpoint", func() bool { return cmp.Equal(endpoints(), []string{"s-000"}) })

	// A new pod, on the informers' events alone.
	p := pod("s-new", "s", "node-b", "10.2.0.9")
	if _, err := f.client.CoreV1().Pods(ns).Create(f.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the new pod's endpoint", func() bool { return len(endpoints()) == 2 })
	if n := len(list(t, f.client)); n != 1 {
		t.Errorf("%d slices, want 1 (the new pod fills the existing slice)", n)
	}
	// A slice deleted behind our back is rewritten.
	s := list(t, f.client)[0]
	if err := f.client.DiscoveryV1().EndpointSlices(ns).Delete(f.ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the slice rewritten", func() bool { return len(endpoints()) == 2 })
	// The Service deleted: slices gone.
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("no slices", func() bool { return len(list(t, f.client)) == 0 })
	f.cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestControllerStampsTriggerTime(t *testing.T) {
	pods := []*corev1.Pod{
		with(pod("p1", "s", "node-a", "10.1.0.1"), readySince(at(1))),
		with(pod("p2", "s", "node-b", "10.1.0.2"), readySince(at(2))),
	}
	f := newFixture(t, objects(service("s", createdAt(at(0))), pods)...)
	triggerTimes := func() []string {
		var out []string
		for _, s := range list(t, f.client) {
			out = append(out, s.Annotations[corev1.EndpointsLastChangeTriggerTime])
		}
		return out
	}
	rfc := func(t time.Time) []string { return []string{t.Format(time.RFC3339Nano)} }
	setReady := func(p *corev1.Pod, ready bool, since time.Time) {
		t.Helper()
		p = p.DeepCopy()
		p.Status.Conditions[0].Status = map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[ready]
		p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(since)
		if _, err := f.client.CoreV1().Pods(ns).UpdateStatus(f.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.waitFor("pod update in cache", func() bool {
			got, ok := f.cachedPod(p.Name)
			return ok && got.triggerTime().Equal(since)
		})
	}

	// First sight: the Service's creation.
	if got := f.sync("s"); got != [3]int{1, 0, 0} {
		t.Fatalf("first sync writes %v, want 1 create", got)
	}
	if d := cmp.Diff(rfc(at(0)), triggerTimes()); d != "" {
		t.Errorf("first sync: trigger times (-want +got):\n%s", d)
	}
	f.waitSlices()
	if got := f.sync("s"); got != [3]int{} {
		t.Errorf("second sync writes %v, want none", got)
	}

	// A pod turns not ready: the slice is rewritten with that moment.
	setReady(pods[0], false, at(30))
	if got := f.sync("s"); got != [3]int{0, 1, 0} {
		t.Fatalf("pod not ready: writes %v, want 1 update", got)
	}
	if d := cmp.Diff(rfc(at(30)), triggerTimes()); d != "" {
		t.Errorf("pod not ready: trigger times (-want +got):\n%s", d)
	}
	f.waitSlices()

	// A sync that must wait for the cache does not use up the change:
	// the one after it still stamps it.
	setReady(pods[0], true, at(40))
	f.c.expect(ns+"/s", "s-notyet", expectation{kind: wroteCreate})
	if err := f.c.Sync(f.ctx, ns+"/s"); !errors.Is(err, errStale) {
		t.Fatalf("sync on a stale cache: %v, want errStale", err)
	}
	f.c.mu.Lock()
	delete(f.c.pending, ns+"/s")
	f.c.mu.Unlock()
	if got := f.sync("s"); got != [3]int{0, 1, 0} {
		t.Fatalf("pod ready again: writes %v, want 1 update", got)
	}
	if d := cmp.Diff(rfc(at(40)), triggerTimes()); d != "" {
		t.Errorf("pod ready again: trigger times (-want +got):\n%s", d)
	}
	f.waitSlices()

	// The Service goes: the tracker forgets it, and a new Service of the
	// same name starts from its own creation.
	if err := f.client.CoreV1().Services(ns).Delete(f.ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("service deletion in cache", func() bool { _, err := f.c.services.Services(ns).Get("s"); return err != nil })
	f.sync("s")
	f.c.triggers.mu.Lock()
	_, kept := f.c.triggers.states[ns+"/s"]
	f.c.triggers.mu.Unlock()
	if kept {
		t.Error("trigger time state kept after the Service was deleted")
	}
	f.waitSlices()
	again := service("s", createdAt(at(100)))
	again.UID = "uid-s-again"
	if _, err := f.client.CoreV1().Services(ns).Create(f.ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("new service in cache", func() bool { s, err := f.c.services.Services(ns).Get("s"); return err == nil && s.UID == again.UID })
	if got := f.sync("s"); got != [3]int{1, 0, 0} {
		t.Fatalf("service recreated: writes %v, want 1 create", got)
	}
	if d := cmp.Diff(rfc(at(100)), triggerTimes()); d != "" {
		t.Errorf("service recreated: trigger times (-want +got):\n%s", d)
	}
}

// The slice informer's transform points an endpoint's targetRef name and
// uid at the cached pod's strings, only where the uid is that pod's.
func TestSliceSharesPodStrings(t *testing.T) {
	f := newFixture(t)
	p := PodOf(pod("web-1", "web", "node-a", "10.1.0.1"))
	if err := f.c.podStore.Add(p); err != nil {
		t.Fatal(err)
	}
	ref := func(name, uid string) *corev1.ObjectReference {
		// Decoded copies: strings of their own, as a watch gives them.
		return &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: strings.Clone(name), UID: types.UID(strings.Clone(uid))}
	}
	s := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-abcde", Namespace: ns}, Endpoints: []discovery.Endpoint{
		{Addresses: []string{"10.1.0.1"}, TargetRef: ref("web-1", string(p.UID))},
		{Addresses: []string{"10.1.0.2"}, TargetRef: ref("web-1", "uid-of-an-older-web-1")},
		{Addresses: []string{"10.1.0.3"}, TargetRef: ref("web-2", "uid-web-2")},
	}}
	want := s.DeepCopy()
	got, err := f.c.transformSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	gs := got.(*discovery.EndpointSlice)
	if !equality.Semantic.DeepEqual(want, gs) {
		t.Fatalf("transformed slice differs:\n%+v\nwant\n%+v", gs, want)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if r := gs.Endpoints[0].TargetRef; !same(r.Name, p.Name) || !same(string(r.UID), string(p.UID)) {
		t.Error("the cached pod's endpoint keeps its own copies of the pod's name and uid")
	}
	if r := gs.Endpoints[1].TargetRef; same(r.Name, p.Name) || same(string(r.UID), string(p.UID)) {
		t.Error("an endpoint of another pod of that name shares the cached pod's strings")
	}
}
