package main

// What the harness watches through the API: simulated Nodes (created,
// with a podCIDR, Ready: when each first happened), the pod events the
// controllers receive (counted, to turn CPU into CPU per event), and the
// ready endpoints in the harness's namespaces' EndpointSlices.
//
// Two lags split the programming latency (trigger time to the proxy's
// rules) into its stages, each seen through the API: a pod's Ready
// condition time to the harness seeing the pod Ready (the simulator's
// write and the API's delivery), and a slice's trigger time to the
// harness seeing the slice carry it (that plus the EndpointSlice
// controller's queue, sync and write). What the programming latency adds
// to the second is the agent's: its watch, its proxy's coalescing, sync
// and commit.

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

type watcher struct {
	real map[string]bool // the lab's real nodes

	mu        sync.Mutex
	nodes     map[string]*nodeSeen
	nodeEv    int            // simulated node adds, deletes and updates that change podCIDR or addresses
	allNodeEv int            // every simulated node event
	podEv     int            // pod adds, updates, deletes in the harness's namespaces
	sliceEv   int            // slice adds, updates, deletes there
	ready     map[string]int // slice ns/name -> ready endpoints
	readySum  int
	lastSlice time.Time
	// readyLags: when the harness saw a pod turn Ready, and how long after
	// the Ready condition's own time (what the trigger time is made of).
	readyLags lagLog
	// sliceLags: when the harness saw a slice with a new trigger time, and
	// how long after that time.
	sliceLags lagLog
}

// lagLog is a list of lags, each with when the harness saw it.
type lagLog []seenLag

type seenLag struct {
	seen time.Time
	lag  time.Duration
}

// quantiles is the p50 and p99 of the lags seen at or after since, and
// how many there were.
func (l lagLog) quantiles(since time.Time) (p50, p99 time.Duration, n int) {
	var lags []time.Duration
	for _, r := range l {
		if !r.seen.Before(since) {
			lags = append(lags, r.lag)
		}
	}
	if len(lags) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lags)
	at := func(q float64) time.Duration { return lags[min(len(lags)-1, int(q*float64(len(lags))))] }
	return at(0.5), at(0.99), len(lags)
}

type nodeSeen struct {
	created, cidr, ready time.Time
	settled              time.Time // Ready and untainted (kube-controller-manager took the not-ready taint off)
}

func newWatcher(realNodes []string) *watcher {
	w := &watcher{real: map[string]bool{}, nodes: map[string]*nodeSeen{}, ready: map[string]int{}}
	for _, n := range realNodes {
		w.real[n] = true
	}
	return w
}

// stripMeta keeps the informers' caches small: the harness reads names,
// labels, a node's podCIDR, addresses and conditions, and a slice's
// endpoints' readiness and trigger time.
func stripMeta(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		var keep map[string]string
		if t, ok := m.GetAnnotations()[corev1.EndpointsLastChangeTriggerTime]; ok {
			keep = map[string]string{corev1.EndpointsLastChangeTriggerTime: t}
		}
		m.SetAnnotations(keep)
	}
	if p, ok := obj.(*corev1.Pod); ok {
		p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName}
		var ready []corev1.PodCondition
		if c := podReady(p); c != nil {
			ready = []corev1.PodCondition{*c}
		}
		p.Status = corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, Conditions: ready}
	}
	return obj, nil
}

func (w *watcher) start(ctx context.Context, c kubernetes.Interface) error {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTransform(stripMeta))
	ni := f.Core().V1().Nodes().Informer()
	pi := f.Core().V1().Pods().Informer()
	si := f.Discovery().V1().EndpointSlices().Informer()
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.node(nil, o.(*corev1.Node)) },
		UpdateFunc: func(o, n any) { w.node(o.(*corev1.Node), n.(*corev1.Node)) },
		DeleteFunc: func(o any) {
			if n, ok := o.(*corev1.Node); ok && !w.real[n.Name] {
				w.mu.Lock()
				delete(w.nodes, n.Name)
				w.nodeEv++
				w.allNodeEv++
				w.mu.Unlock()
			}
		},
	}); err != nil {
		return err
	}
	podEvent := func(o any) {
		if m, ok := o.(metav1.Object); ok && strings.HasPrefix(m.GetNamespace(), nsPrefix) {
			w.mu.Lock()
			w.podEv++
			w.mu.Unlock()
		}
	}
	if _, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: podEvent,
		UpdateFunc: func(o, n any) {
			podEvent(n)
			w.readyTransition(o, n)
		},
		DeleteFunc: podEvent,
	}); err != nil {
		return err
	}
	if _, err := si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { w.slice(o, false) },
		UpdateFunc: func(o, n any) {
			w.slice(n, false)
			w.sliceTriggered(o, n)
		},
		DeleteFunc: func(o any) { w.slice(o, true) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return ctx.Err()
		}
		_ = typ
	}
	return nil
}

// podReady is p's Ready condition when it is True.
func podReady(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

// readyTransition records a harness pod turning Ready: the time from its
// Ready condition's own time (second precision, as the trigger time the
// proxy's latency is counted from) to the harness seeing it through the
// API. Compared with the programming latency, it tells the simulator's
// (kwok's) write lag and the API's delivery from flatnet's own part.
func (w *watcher) readyTransition(o, n any) {
	op, ok1 := o.(*corev1.Pod)
	np, ok2 := n.(*corev1.Pod)
	if !ok1 || !ok2 || !strings.HasPrefix(np.Namespace, nsPrefix) || podReady(op) != nil {
		return
	}
	c := podReady(np)
	if c == nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	w.readyLags = append(w.readyLags, seenLag{seen: now, lag: now.Sub(c.LastTransitionTime.Time)})
	w.mu.Unlock()
}

// sliceTriggered records a harness slice updated with a new trigger time
// (as the proxy counts it: an update whose trigger time changed), with
// its lag from that time. A slice's first version is not counted: its
// trigger time can be a Service's creation.
func (w *watcher) sliceTriggered(o, n any) {
	os, ok1 := o.(*discoveryv1.EndpointSlice)
	ns, ok2 := n.(*discoveryv1.EndpointSlice)
	if !ok1 || !ok2 || !strings.HasPrefix(ns.Namespace, nsPrefix) {
		return
	}
	v := ns.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if v == "" || v == os.Annotations[corev1.EndpointsLastChangeTriggerTime] {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return
	}
	now := time.Now()
	w.mu.Lock()
	w.sliceLags = append(w.sliceLags, seenLag{seen: now, lag: now.Sub(t)})
	w.mu.Unlock()
}

// lagQuantiles is the p50 and p99 of the Ready lags (slice: the trigger
// time lags) seen at or after since, and how many there were.
func (w *watcher) lagQuantiles(slice bool, since time.Time) (p50, p99 time.Duration, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if slice {
		return w.sliceLags.quantiles(since)
	}
	return w.readyLags.quantiles(since)
}

func (w *watcher) node(old, n *corev1.Node) {
	if w.real[n.Name] {
		return
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.allNodeEv++
	s := w.nodes[n.Name]
	if s == nil {
		s = &nodeSeen{created: now}
		w.nodes[n.Name] = s
	}
	if old == nil || old.Spec.PodCIDR != n.Spec.PodCIDR || !sameAddrs(old, n) {
		w.nodeEv++
	}
	if n.Spec.PodCIDR != "" && s.cidr.IsZero() {
		s.cidr = now
	}
	if s.ready.IsZero() {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				s.ready = now
			}
		}
	}
	if !s.ready.IsZero() && s.settled.IsZero() && !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady }) {
		s.settled = now
	}
}

func sameAddrs(a, b *corev1.Node) bool {
	if len(a.Status.Addresses) != len(b.Status.Addresses) {
		return false
	}
	for i := range a.Status.Addresses {
		if a.Status.Addresses[i] != b.Status.Addresses[i] {
			return false
		}
	}
	return true
}

func (w *watcher) slice(o any, deleted bool) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok || !strings.HasPrefix(s.Namespace, nsPrefix) {
		return
	}
	n := 0
	if !deleted {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				n++
			}
		}
	}
	key := s.Namespace + "/" + s.Name
	w.mu.Lock()
	w.readySum += n - w.ready[key]
	if n == 0 {
		delete(w.ready, key)
	} else {
		w.ready[key] = n
	}
	w.lastSlice = time.Now()
	w.sliceEv++
	w.mu.Unlock()
}

// nodeStats: simulated nodes known, with a podCIDR, Ready; the first
// creation and the last podCIDR and Ready seen.
type nodeStats struct {
	n, cidr, ready, settled   int // settled: Ready, and the not-ready taint gone
	firstCreated, lastCreated time.Time
	lastCIDR, lastReady       time.Time
}

// nodeStats counts every simulated node (known, with a podCIDR, Ready);
// the times are of those first seen at or after since.
func (w *watcher) nodeStats(since time.Time) nodeStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	var st nodeStats
	for _, s := range w.nodes {
		st.n++
		if !s.cidr.IsZero() {
			st.cidr++
		}
		if !s.ready.IsZero() {
			st.ready++
		}
		if !s.settled.IsZero() {
			st.settled++
		}
		if s.created.Before(since) {
			continue
		}
		if st.firstCreated.IsZero() || s.created.Before(st.firstCreated) {
			st.firstCreated = s.created
		}
		if s.created.After(st.lastCreated) {
			st.lastCreated = s.created
		}
		if !s.cidr.IsZero() {
			if s.cidr.After(st.lastCIDR) {
				st.lastCIDR = s.cidr
			}
		}
		if !s.ready.IsZero() {
			if s.ready.After(st.lastReady) {
				st.lastReady = s.ready
			}
		}
	}
	return st
}

func (w *watcher) simNodes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.nodes))
	for n := range w.nodes {
		out = append(out, n)
	}
	return out
}

// sliceEvents is how many slice events the harness's namespaces saw.
func (w *watcher) sliceEvents() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sliceEv
}

// allNodeEvents counts every simulated node event (nodeEv: those a peer
// route or entry depends on).
func (w *watcher) allNodeEvents() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allNodeEv
}

func (w *watcher) counts() (nodeEv, podEv, ready int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodeEv, w.podEv, w.readySum
}
