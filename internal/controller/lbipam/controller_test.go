package lbipam

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

const cmName = "kube-system/flatnet-lb"

type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	c        *Controller
	recorder *record.FakeRecorder
	svcs     cache.Indexer
	cms      cache.Indexer
	// cached are the objects the test put into the static cache, copies
	// their deep copies: the controller must never write to the cache.
	cached, copies []runtime.Object
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// lb is a LoadBalancer Service created age seconds after epoch, with
// status IPs ips.
func lb(name string, age int, ips ...string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(age) * time.Second))},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Port: 80, NodePort: 30080}}},
	}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func configMap(pool string) *corev1.ConfigMap {
	ns, name, _ := strings.Cut(cmName, "/")
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{PoolKey: pool}}
}

// newFixture builds a controller over a fake clientset holding objs, with
// the command line's pool and, when withCM, the ConfigMap cmName. With
// live, the informers run against the clientset and Run is started;
// without, the caches are static indexers that only the test changes, the
// controller has read the pool and adopted the cached statuses (what Run
// does before its workers), and the test calls Sync itself.
func newFixture(t *testing.T, pool string, withCM, live bool, objs ...runtime.Object) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	rec := record.NewFakeRecorder(100)
	cfg := Config{Pool: mustPool(t, pool)}
	var cmInf = factory.Core().V1().ConfigMaps()
	if withCM {
		cfg.ConfigMap = cmName
	}
	c, err := New(client, factory.Core().V1().Services(), cmInf, cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: ctx, client: client, c: c, recorder: rec,
		svcs: factory.Core().V1().Services().Informer().GetIndexer(), cms: cmInf.Informer().GetIndexer()}
	if live {
		factory.Start(ctx.Done())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := c.Run(ctx, 2); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
		return f
	}
	for _, o := range objs {
		f.cache(o)
	}
	c.reloadPool(ctx)
	if err := c.rebuild(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.checkCacheUntouched)
	client.ClearActions()
	return f
}

// cache puts o into the static cache (replacing an older version) and
// into the fake API server (without recording an action), as if the
// informer had just seen it.
func (f *fixture) cache(o runtime.Object) {
	f.t.Helper()
	idx := f.svcs
	if _, ok := o.(*corev1.ConfigMap); ok {
		idx = f.cms
	}
	if err := idx.Update(o); err != nil {
		f.t.Fatal(err)
	}
	if err := f.client.Tracker().Add(o.DeepCopyObject()); apierrors.IsAlreadyExists(err) {
		gvr := corev1.SchemeGroupVersion.WithResource("services")
		if _, ok := o.(*corev1.ConfigMap); ok {
			gvr = corev1.SchemeGroupVersion.WithResource("configmaps")
		}
		err = f.client.Tracker().Update(gvr, o.DeepCopyObject(), o.(metav1.Object).GetNamespace())
		if err != nil {
			f.t.Fatal(err)
		}
	} else if err != nil {
		f.t.Fatal(err)
	}
	f.cached = append(f.cached, o)
	f.copies = append(f.copies, o.DeepCopyObject())
}

func (f *fixture) uncache(o runtime.Object) {
	f.t.Helper()
	idx := f.svcs
	if _, ok := o.(*corev1.ConfigMap); ok {
		idx = f.cms
	}
	if err := idx.Delete(o); err != nil {
		f.t.Fatal(err)
	}
	gvr := corev1.SchemeGroupVersion.WithResource("services")
	if _, ok := o.(*corev1.ConfigMap); ok {
		gvr = corev1.SchemeGroupVersion.WithResource("configmaps")
	}
	m := o.(metav1.Object)
	if err := f.client.Tracker().Delete(gvr, m.GetNamespace(), m.GetName()); err != nil && !apierrors.IsNotFound(err) {
		f.t.Fatal(err)
	}
}

func (f *fixture) checkCacheUntouched() {
	for i, o := range f.cached {
		if !apiequality.Semantic.DeepEqual(o, f.copies[i]) {
			f.t.Errorf("the controller modified a cached object:\n%s", cmp.Diff(f.copies[i], o))
		}
	}
}

func (f *fixture) sync(keys ...string) {
	f.t.Helper()
	for _, k := range keys {
		if err := f.c.Sync(f.ctx, k); err != nil {
			f.t.Fatalf("sync %s: %v", k, err)
		}
	}
}

// writes returns "name=ip,ip" for each status update the client saw since
// the last call, and fails on any other write.
func (f *fixture) writes() []string {
	f.t.Helper()
	var out []string
	for _, a := range f.client.Actions() {
		if v := a.GetVerb(); v == "list" || v == "watch" || v == "get" {
			continue
		}
		u, ok := a.(k8stesting.UpdateAction)
		if !ok || a.GetResource().Resource != "services" || a.GetSubresource() != "status" {
			f.t.Errorf("unexpected API action %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
			continue
		}
		svc := u.GetObject().(*corev1.Service)
		var ips []string
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, ing.IP)
			if ing.IPMode == nil || *ing.IPMode != corev1.LoadBalancerIPModeVIP {
				f.t.Errorf("%s: ingress %s without ipMode VIP", svc.Name, ing.IP)
			}
		}
		out = append(out, svc.Name+"="+strings.Join(ips, ","))
	}
	f.client.ClearActions()
	return out
}

// written returns the Service as the API server now has it.
func (f *fixture) written(name string) *corev1.Service {
	f.t.Helper()
	s, err := f.client.CoreV1().Services("default").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.client.ClearActions()
	return s
}

// events drains the recorder.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// queued drains the queue's keys (without syncing them).
func (f *fixture) queued() []string {
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

func eq(t *testing.T, what string, got, want []string) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

func hasEvent(events []string, typ, reason, text string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, typ+" "+reason+" ") && strings.Contains(e, text) {
			return true
		}
	}
	return false
}

func TestAssignsOneAddressPerFamily(t *testing.T) {
	dual := lb("dual", 1)
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	v4 := lb("v4", 2)
	class := lb("ours", 3)
	class.Spec.LoadBalancerClass = ptr(Class)
	f := newFixture(t, "10.251.0.0/30, fd00:1b::/126", false, false, dual, v4, class)

	f.sync("default/dual", "default/v4", "default/ours")
	eq(t, "writes", f.writes(), []string{"dual=fd00:1b::,10.251.0.0", "v4=10.251.0.1", "ours=10.251.0.2"})
	if ev := f.events(); len(ev) != 4 || !hasEvent(ev, "Normal", ReasonAllocated, "Assigned load-balancer IP 10.251.0.1 from pool 10.251.0.0/30,fd00:1b::/126") {
		t.Errorf("events: %q", ev)
	}

	// A sync before the cache has seen the write gives the same addresses
	// again (no second allocation).
	f.sync("default/v4")
	eq(t, "writes with a stale cache", f.writes(), []string{"v4=10.251.0.1"})

	// Once the cache has the status, syncs write nothing.
	for _, n := range []string{"dual", "v4", "ours"} {
		f.cache(f.written(n))
	}
	f.sync("default/dual", "default/v4", "default/ours", "default/v4")
	eq(t, "writes when in line", f.writes(), nil)
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events when in line: %q", ev)
	}
}

func TestLeavesOtherServicesAlone(t *testing.T) {
	cip := lb("cip", 1)
	cip.Spec.Type = corev1.ServiceTypeClusterIP
	np := lb("np", 2)
	np.Spec.Type = corev1.ServiceTypeNodePort
	other := lb("other", 3, "10.251.0.0") // another implementation's class and pool
	other.Spec.LoadBalancerClass = ptr("example.com/lb")
	other2 := lb("other-no-status", 4)
	other2.Spec.LoadBalancerClass = ptr("example.com/lb")
	f := newFixture(t, "10.251.0.0/30", false, false, cip, np, other, other2)
	f.sync("default/cip", "default/np", "default/other", "default/other-no-status", "default/gone")
	eq(t, "writes", f.writes(), nil)
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events: %q", ev)
	}
}

// A restarted controller reads the allocations back from the statuses:
// nothing moves, nothing is given twice, and of two Services claiming one
// address the older keeps it.
func TestRestartRebuildsFromStatus(t *testing.T) {
	older := lb("older", 1, "10.251.0.1")
	newer := lb("newer", 2, "10.251.0.1")
	outside := lb("outside", 3, "10.9.9.9") // the pool shrank while we were down
	fresh := lb("fresh", 4)
	f := newFixture(t, "10.251.0.0/30", false, false, fresh, newer, outside, older)
	f.sync("default/fresh", "default/newer", "default/older", "default/outside")
	eq(t, "writes", f.writes(), []string{"fresh=10.251.0.0", "newer=10.251.0.2"})
	// The pool's last address is the only one left.
	last := lb("last", 5)
	f.cache(last)
	another := lb("another", 6)
	f.cache(another)
	f.sync("default/last", "default/another")
	eq(t, "writes", f.writes(), []string{"last=10.251.0.3"})
	if ev := f.events(); !hasEvent(ev, "Warning", ReasonAllocationFailed, "all 4 IPv4 addresses of the pool 10.251.0.0/30 are in use") {
		t.Errorf("events: %q", ev)
	}
}

func TestExhaustionWaitsForRelease(t *testing.T) {
	a, b := lb("a", 1), lb("b", 2)
	f := newFixture(t, "10.251.0.7", false, false, a, b)
	f.sync("default/a", "default/b")
	eq(t, "writes", f.writes(), []string{"a=10.251.0.7"})
	ev := f.events()
	if !hasEvent(ev, "Warning", ReasonAllocationFailed, "no IPv4 load-balancer IP for the Service: no free address: all 1 IPv4 addresses of the pool 10.251.0.7 are in use") {
		t.Errorf("events: %q", ev)
	}
	// Retries do not repeat the event.
	f.sync("default/b", "default/b")
	eq(t, "writes", f.writes(), nil)
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("repeated events: %q", ev)
	}
	eq(t, "queued", f.queued(), nil)

	// Deleting a frees the address and queues b, which gets it.
	f.uncache(a)
	f.sync("default/a")
	eq(t, "queued after release", f.queued(), []string{"default/b"})
	f.sync("default/b")
	eq(t, "writes", f.writes(), []string{"b=10.251.0.7"})
}

func TestReleaseOnTypeChange(t *testing.T) {
	a, waiter := lb("a", 1), lb("waiter", 2)
	f := newFixture(t, "10.251.0.7", false, false, a, waiter)
	f.sync("default/a", "default/waiter")
	f.writes()
	f.events()
	a = f.written("a")
	f.cache(a)
	// The apiserver keeps the status when the type changes.
	cip := a.DeepCopy()
	cip.Spec.Type = corev1.ServiceTypeClusterIP
	f.cache(cip)
	f.sync("default/a")
	eq(t, "writes", f.writes(), []string{"a="})
	if got := f.written("a").Status.LoadBalancer; len(got.Ingress) != 0 {
		t.Errorf("status after type change: %+v", got)
	}
	if ev := f.events(); !hasEvent(ev, "Normal", ReasonReleased, "Released load-balancer IP 10.251.0.7: no longer type LoadBalancer") {
		t.Errorf("events: %q", ev)
	}
	eq(t, "queued", f.queued(), []string{"default/waiter"})
	f.sync("default/waiter")
	eq(t, "writes", f.writes(), []string{"waiter=10.251.0.7"})
	// The cleared Service stays cleared.
	f.cache(f.written("a"))
	f.sync("default/a")
	eq(t, "writes", f.writes(), nil)
}

// A Service deleted and created again under the same name between two
// syncs starts afresh.
func TestRecreatedService(t *testing.T) {
	a := lb("a", 1)
	f := newFixture(t, "10.251.0.0/30", false, false, a)
	f.sync("default/a")
	eq(t, "writes", f.writes(), []string{"a=10.251.0.0"})
	again := lb("a", 5)
	again.UID = "uid-a-2"
	again.Spec.LoadBalancerIP = "10.251.0.2"
	f.cache(again)
	f.sync("default/a")
	eq(t, "writes", f.writes(), []string{"a=10.251.0.2"})
	b := lb("b", 6)
	f.cache(b)
	f.sync("default/b")
	eq(t, "writes", f.writes(), []string{"b=10.251.0.0"})
}

func TestLoadBalancerIP(t *testing.T) {
	want := lb("want", 1)
	want.Spec.LoadBalancerIP = "10.251.0.2"
	same := lb("same", 2)
	same.Spec.LoadBalancerIP = "10.251.0.2"
	outside := lb("outside", 3)
	outside.Spec.LoadBalancerIP = "10.9.9.9"
	f := newFixture(t, "10.251.0.0/30", false, false, want, same, outside)
	f.sync("default/want", "default/same", "default/outside")
	eq(t, "writes", f.writes(), []string{"want=10.251.0.2"})
	ev := f.events()
	for _, text := range []string{"spec.loadBalancerIP 10.251.0.2 is in use by Service default/want",
		"spec.loadBalancerIP 10.9.9.9 is outside the load-balancer pool 10.251.0.0/30"} {
		if !hasEvent(ev, "Warning", ReasonAllocationFailed, text) {
			t.Errorf("no event %q in %q", text, ev)
		}
	}
	// Changing the requested address moves the Service to it.
	f.cache(f.written("want"))
	moved := f.written("want").DeepCopy()
	moved.Spec.LoadBalancerIP = "10.251.0.3"
	f.cache(moved)
	f.sync("default/want")
	eq(t, "writes", f.writes(), []string{"want=10.251.0.3"})
	eq(t, "queued after the move", f.queued(), []string{"default/outside", "default/same"})
	f.sync("default/same")
	eq(t, "writes", f.writes(), []string{"same=10.251.0.2"})
}

func TestConfigMapPool(t *testing.T) {
	a, b, c := lb("a", 1), lb("b", 2), lb("c", 3)
	f := newFixture(t, "", true, false, configMap("10.251.0.0/31"), a, b, c)
	f.sync("default/a", "default/b", "default/c")
	eq(t, "writes", f.writes(), []string{"a=10.251.0.0", "b=10.251.0.1"})
	f.events()
	for _, n := range []string{"a", "b"} {
		f.cache(f.written(n))
	}

	// Shrink away 10.251.0.0 and add 10.251.0.2: a keeps its address, c
	// is woken and gets the new one.
	f.cache(configMap("10.251.0.1-10.251.0.2"))
	f.sync(poolKey)
	eq(t, "queued after the pool change", f.queued(), []string{"default/c"})
	f.sync("default/a", "default/b", "default/c")
	eq(t, "writes", f.writes(), []string{"c=10.251.0.2"})
	f.cache(f.written("c"))

	// An invalid pool is refused with an event on the ConfigMap; the last
	// valid one stays.
	f.events()
	f.cache(configMap("10.251.0.1-10.251.0.2,10.251.0.300"))
	f.sync(poolKey)
	if ev := f.events(); !hasEvent(ev, "Warning", ReasonInvalidPool, `item 2 "10.251.0.300": not a CIDR, a range a-b or an address; keeping the pool 10.251.0.1-10.251.0.2`) {
		t.Errorf("events: %q", ev)
	}
	if got := f.c.poolString(); got != "10.251.0.1-10.251.0.2" {
		t.Errorf("pool after an invalid ConfigMap: %s", got)
	}

	// a leaves: 10.251.0.0 is outside the pool, so nothing is woken for
	// it; a new Service waits.
	f.uncache(a)
	f.sync("default/a")
	d := lb("d", 4)
	f.cache(d)
	f.sync("default/d")
	eq(t, "writes", f.writes(), nil)
	if ev := f.events(); !hasEvent(ev, "Warning", ReasonAllocationFailed, "pool 10.251.0.1-10.251.0.2 are in use") {
		t.Errorf("events: %q", ev)
	}

	// The ConfigMap goes: its pool goes with it.
	f.uncache(configMap(""))
	f.sync(poolKey)
	f.queued()
	f.sync("default/b", "default/c", "default/d")
	eq(t, "writes", f.writes(), nil)
	if got := f.c.poolString(); got != "(empty)" {
		t.Errorf("pool without the ConfigMap: %s", got)
	}
}

// TestRun runs the controller with live informers: assignment, exhaustion
// with an event, release on deletion waking the waiting Service, and a
// restarted controller that writes nothing.
func TestRun(t *testing.T) {
	pool := "10.251.0.7"
	f := newFixture(t, pool, false, true)
	svcs := f.client.CoreV1().Services("default")
	create := func(s *corev1.Service) {
		if _, err := svcs.Create(f.ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitIP := func(name, ip string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(f.ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			s, err := svcs.Get(ctx, name, metav1.GetOptions{})
			return err == nil && fmt.Sprint(statusIPs(s)) == "["+ip+"]", nil
		})
		if err != nil {
			t.Fatalf("service %s never got %s", name, ip)
		}
	}
	create(lb("a", 1))
	waitIP("a", "10.251.0.7")
	create(lb("b", 2))
	select {
	case e := <-f.recorder.Events:
		if !strings.Contains(e, "Assigned") {
			t.Fatalf("first event %q", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event for a")
	}
	select {
	case e := <-f.recorder.Events:
		if !strings.HasPrefix(e, "Warning "+ReasonAllocationFailed) || !strings.Contains(e, pool) {
			t.Fatalf("event %q, want AllocationFailed naming the pool", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no AllocationFailed event for b")
	}
	if err := svcs.Delete(f.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIP("b", "10.251.0.7")

	// A second controller over the same API writes nothing.
	g := newFixture(t, pool, false, false)
	list, err := svcs.List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		g.cache(&list.Items[i])
	}
	if err := g.c.rebuild(g.ctx); err != nil {
		t.Fatal(err)
	}
	g.sync("default/b")
	eq(t, "writes after restart", g.writes(), nil)
}
