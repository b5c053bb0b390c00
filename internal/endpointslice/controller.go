package endpointslice

// The controller: informers for Services, Pods, Nodes and EndpointSlices
// feed a queue of Service keys; a sync computes Reconcile's plan from the
// listers and applies it through the clientset. Slices are created with a
// client-side name (GenerateName plus a random suffix) so the tracker
// below knows their names before the informer does: a sync that runs
// before the cache has caught up with our own writes would otherwise
// create the same slices twice. Slices of a deleted Service are deleted
// here (the lab runs no garbage collector to follow the ownerReference).
//
// A sync that finds the slice cache behind its own writes (a slice it
// created not there yet, one it deleted still there, one it updated at an
// older generation) or whose update is refused as a conflict does not
// write: it waits for the slice informer, whose event for that write
// queues the Service again, with a fallback recheck after staleRecheck.
// It is not a failure and goes nowhere near the queue's rate limiter,
// which in a burst of pod events (every Service synced several times
// within milliseconds) held such retries to 10 a second: seconds of
// network programming latency.
//
// The slice event that is only the echo of our own write (the cache now
// shows the slice at the resourceVersion our write returned, or gone
// after our delete) queues nothing, unless a sync of that Service is
// waiting for the cache: the sync that wrote it knew everything the
// event says, and re-syncing on it doubled the controller's syncs.
// The trigger time tracker (triggertime.go) is consulted once per sync
// that gets as far as planning, after the stale-cache check (a sync that
// must wait does not consume the changes it saw), and forgets a Service
// when the Service is gone.
//
// Events cost per event, not per cluster (index.go): a pod event finds
// the Services that select it through an index of their selectors, and
// queues nothing when it changed nothing an endpoint shows; a sync reads
// its pods from an index of pods by label; a Node event queues only the
// Services of the pods on that node.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/kube"
)

// Controller writes EndpointSlices for Services with a selector.
type Controller struct {
	client      kubernetes.Interface
	services    corelisters.ServiceLister
	nodes       corelisters.NodeLister
	sliceIndex  cache.Indexer // slices, with slicesByService
	synced      []cache.InformerSynced
	queue       workqueue.TypedRateLimitingInterface[string]
	maxPerSlice int
	triggers    *TriggerTimeTracker
	podStore    cache.Indexer // the pod informer's store, without indexes
	pods        *podIndex     // pods by label pair, node, namespace (podindex.go)
	index       *serviceIndex // Services by selector (index.go)

	mu      sync.Mutex                        // protects pending, waiting
	pending map[string]map[string]expectation // service key -> slice name -> our last write, not yet in the cache
	waiting map[string]bool                   // service keys whose last sync found the cache behind
}

// expectation is a write of ours the slice cache must show before the
// Service is synced again.
type expectation struct {
	kind            writeKind
	generation      int64  // updated: the generation the API gave our write
	resourceVersion string // created, updated: the resourceVersion it gave
	at              time.Time
}

type writeKind int

const (
	wroteCreate writeKind = iota
	wroteUpdate
	wroteDelete
)

// staleRecheck is when a sync that found the cache behind its writes
// looks again if no slice event has queued it sooner; pendingTimeout is
// when an expectation the cache never showed is given up (a watch that
// relisted past a slice created and deleted again), so that a missed
// event cannot hold a Service for good.
const (
	staleRecheck   = time.Second
	pendingTimeout = time.Minute
)

// New returns a controller over factory's informers; start the factory
// afterwards. It sets Transform on the Pod and EndpointSlice informers,
// which only it reads. Services and Nodes may be shared with other
// controllers: the factory's own transform (informers.WithTransform)
// decides what they keep, which must be at least what Transform keeps.
// maxPerSlice < 1 means 100.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, maxPerSlice int) (*Controller, error) {
	if maxPerSlice < 1 {
		maxPerSlice = DefaultMaxEndpointsPerSlice
	}
	if maxPerSlice > 1000 {
		return nil, fmt.Errorf("max endpoints per slice %d: the API allows at most 1000", maxPerSlice)
	}
	svcInf := factory.Core().V1().Services()
	// The pod informer without the namespace index the factory's own
	// carries: podIndex has the indexes this controller reads.
	podInf := factory.InformerFor(&corev1.Pod{}, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewPodInformer(client, metav1.NamespaceAll, resync, cache.Indexers{})
	})
	nodeInf := factory.Core().V1().Nodes()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	if err := podInf.SetTransform(Transform); err != nil {
		return nil, fmt.Errorf("endpointslice: setting the pod informer's transform (start the factory after New): %w", err)
	}
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{slicesByService: sliceServiceIndex}); err != nil {
		return nil, fmt.Errorf("endpointslice: adding the slice index (start the factory after New): %w", err)
	}
	c := &Controller{
		client:      client,
		services:    svcInf.Lister(),
		nodes:       nodeInf.Lister(),
		sliceIndex:  sliceInf.Informer().GetIndexer(),
		queue:       workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "endpointslice"}),
		maxPerSlice: maxPerSlice,
		triggers:    NewTriggerTimeTracker(),
		pending:     map[string]map[string]expectation{},
		waiting:     map[string]bool{},
		podStore:    podInf.GetIndexer(),
		pods:        newPodIndex(),
		index:       newServiceIndex(),
	}
	if err := sliceInf.Informer().SetTransform(c.transformSlice); err != nil {
		return nil, fmt.Errorf("endpointslice: setting the slice informer's transform (start the factory after New): %w", err)
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{svcInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.onServiceAdd,
			UpdateFunc: func(_, n any) { c.onServiceAdd(n) },
			DeleteFunc: c.onServiceDelete,
		}},
		{podInf, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.onPodAdd,
			UpdateFunc: c.onPodUpdate,
			DeleteFunc: c.onPodDelete,
		}},
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.onNodeAddOrDelete,
			UpdateFunc: c.onNodeUpdate,
			DeleteFunc: c.onNodeAddOrDelete,
		}},
		{sliceInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.sliceChanged(o, false) },
			UpdateFunc: func(_, n any) { c.sliceChanged(n, false) },
			DeleteFunc: func(o any) { c.sliceChanged(o, true) },
		}},
	}
	for _, h := range handlers {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return nil, fmt.Errorf("endpointslice: adding event handler: %w", err)
		}
		// Synced once the handler has seen the initial list, not only
		// the store: the pod handler fills podIndex.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// transformSlice is Transform, and then sharePodStrings.
func (c *Controller) transformSlice(obj any) (any, error) {
	out, err := Transform(obj)
	if s, ok := out.(*discovery.EndpointSlice); ok && err == nil {
		c.sharePodStrings(s)
	}
	return out, err
}

// sharePodStrings points each endpoint's targetRef name and uid at the
// cached pod's own strings, where the pod is cached with that uid: the
// decoded copies are 80 bytes an endpoint, 8 MB at 100,000 endpoints. An
// endpoint whose pod is not cached yet (at start the slices may be listed
// first) keeps its copies.
func (c *Controller) sharePodStrings(s *discovery.EndpointSlice) {
	for i := range s.Endpoints {
		r := s.Endpoints[i].TargetRef
		if r == nil || r.Kind != "Pod" {
			continue
		}
		obj, ok, err := c.podStore.GetByKey(r.Namespace + "/" + r.Name)
		if err != nil || !ok {
			continue
		}
		if p, ok := obj.(*Pod); ok && p.UID == r.UID {
			r.Name, r.UID = p.Name, p.UID
		}
	}
}

func (c *Controller) enqueueObj(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// onServiceAdd (and update) indexes the Service's selector and queues it.
func (c *Controller) onServiceAdd(obj any) {
	if svc, ok := obj.(*corev1.Service); ok {
		c.index.set(svc)
	}
	c.enqueueObj(obj)
}

func (c *Controller) onServiceDelete(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
		c.index.delete(ns, name)
	}
	c.queue.Add(key)
}

// podFrom is the pod of an event's object (a tombstone's too); nil if none.
func podFrom(obj any) *Pod {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, _ := obj.(*Pod)
	return pod
}

// enqueueSelecting queues the Services of namespace that select labels.
func (c *Controller) enqueueSelecting(namespace string, labels map[string]string) {
	c.index.matching(namespace, labels, c.queue.Add)
}

// onPodAdd queues the Services that select a new pod, when it can be an
// endpoint: a pod is created without an address (its sync would be a
// no-op; the update that gives it one queues them).
func (c *Controller) onPodAdd(obj any) {
	pod := podFrom(obj)
	if pod == nil {
		return
	}
	c.pods.update(nil, pod)
	if pod.wanted() {
		c.enqueueSelecting(pod.Namespace, pod.Labels)
	}
}

// onPodDelete queues the Services that selected the pod and, if it had
// an address (an endpoint), tells the trigger time tracker when it went.
func (c *Controller) onPodDelete(obj any) {
	pod := podFrom(obj)
	if pod == nil {
		return
	}
	c.pods.update(pod, nil)
	if !pod.wanted() {
		c.enqueueSelecting(pod.Namespace, pod.Labels)
		return
	}
	now := time.Now()
	c.index.matching(pod.Namespace, pod.Labels, func(key string) {
		c.triggers.PodDeleted(key, pod.Name, now)
		c.queue.Add(key)
	})
}

// onPodUpdate queues nothing for a change no endpoint can show (most
// status updates: container statuses, other conditions); the Services
// selecting the pod before or after for an endpoint change; and for a
// change of labels alone, the Services it joined or left.
func (c *Controller) onPodUpdate(old, cur any) {
	o, n := podFrom(old), podFrom(cur)
	if o == nil || n == nil {
		return
	}
	c.pods.update(o, n)
	relabelled := !maps.Equal(o.Labels, n.Labels)
	changed := o.endpointsChanged(n)
	switch {
	case changed && !relabelled:
		c.enqueueSelecting(n.Namespace, n.Labels)
	case changed:
		c.enqueueSelecting(o.Namespace, o.Labels)
		c.enqueueSelecting(n.Namespace, n.Labels)
	case relabelled:
		before := map[string]bool{}
		c.index.matching(o.Namespace, o.Labels, func(k string) { before[k] = true })
		c.index.matching(n.Namespace, n.Labels, func(k string) {
			if !before[k] {
				c.queue.Add(k) // joined
			}
			delete(before, k)
		})
		for k := range before {
			c.queue.Add(k) // left
		}
	}
}

// onNodeAddOrDelete queues the Services of the pods on the node: only
// their endpoints read it (its zone; a pod on an unknown node is left
// out).
func (c *Controller) onNodeAddOrDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		c.enqueueForNode(n.Name)
	}
}

// onNodeUpdate: of a Node, endpoints show only the zone label.
func (c *Controller) onNodeUpdate(old, cur any) {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 || o.Labels[corev1.LabelTopologyZone] == n.Labels[corev1.LabelTopologyZone] {
		return
	}
	c.enqueueForNode(n.Name)
}

func (c *Controller) enqueueForNode(name string) {
	for _, pod := range c.pods.onNode(name) {
		c.enqueueSelecting(pod.Namespace, pod.Labels)
	}
}

// sliceChanged queues the Service of one of our slices (someone else
// editing or deleting it gets it rewritten), unless the event is the echo
// of our own write.
func (c *Controller) sliceChanged(obj any, deleted bool) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		t, ok := obj.(cache.DeletedFinalStateUnknown)
		if !ok {
			return
		}
		if s, ok = t.Obj.(*discovery.EndpointSlice); !ok {
			return
		}
	}
	name := s.Labels[discovery.LabelServiceName]
	if name == "" || s.Labels[discovery.LabelManagedBy] != ManagedBy {
		return
	}
	key := s.Namespace + "/" + name
	if c.echo(key, s, deleted) {
		return
	}
	c.queue.Add(key)
}

// Run syncs until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("endpointslice")
	ctx = klog.NewContext(ctx, logger)
	if ok, err := kube.WaitForCaches(ctx, "endpointslice", c.synced...); !ok {
		return err
	}
	logger.Info("Started", "maxEndpointsPerSlice", c.maxPerSlice)
	kube.RunWorkers(ctx, c.queue, workers, c.syncOrWait, func(ctx context.Context, key string, err error) {
		klog.FromContext(ctx).Error(err, "Sync failed, will retry", "service", key)
	})
	return nil
}

// errStale says the slice cache has not seen our last writes yet.
var errStale = errors.New("endpointslice cache is behind our own writes")

// syncOrWait is Sync for the workers: a stale cache waits for the slice
// informer (see the top of the file), not for the rate limiter.
func (c *Controller) syncOrWait(ctx context.Context, key string) error {
	err := c.Sync(ctx, key)
	stale := errors.Is(err, errStale)
	c.mu.Lock()
	if stale {
		c.waiting[key] = true
	} else {
		delete(c.waiting, key)
	}
	c.mu.Unlock()
	if stale {
		c.queue.AddAfter(key, staleRecheck)
		return nil
	}
	return err
}

// Sync makes the slices of Service key ("ns/name") match its pods.
func (c *Controller) Sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	existing, err := c.servicesSlices(key)
	if err != nil {
		return err
	}
	if !c.cacheCaughtUp(key, existing) {
		return fmt.Errorf("service %s: %w", key, errStale)
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.triggers.DeleteService(ns, name)
		return c.apply(ctx, key, Plan{Delete: existing})
	}
	if err != nil {
		return err
	}
	if svc.Spec.Selector == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		// Endpoints of selector-less Services are the user's; ours go.
		// An ExternalName Service is a DNS alias and has no endpoints
		// even with a selector (upstream skips it too).
		return c.apply(ctx, key, Plan{Delete: existing})
	}
	pods := c.pods.selected(ns, svc.Spec.Selector)
	// Computed even when the plan turns out empty, so that the tracker
	// keeps up with what this sync saw, as upstream does.
	triggerTime := c.triggers.ComputeEndpointLastChangeTriggerTime(ns, svc, pods)
	plan, planErr := Reconcile(svc, pods, c.getNode, existing, c.maxPerSlice, triggerTime)
	return errors.Join(c.apply(ctx, key, plan), planErr)
}

// servicesSlices are our slices of Service key, from the index.
func (c *Controller) servicesSlices(key string) ([]*discovery.EndpointSlice, error) {
	objs, err := c.sliceIndex.ByIndex(slicesByService, key)
	if err != nil {
		return nil, err
	}
	out := make([]*discovery.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discovery.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *Controller) getNode(name string) (*corev1.Node, bool) {
	n, err := c.nodes.Get(name)
	return n, err == nil
}

// cacheCaughtUp reports whether the cache shows every write of ours for
// key: the slices we created, none we deleted, the ones we updated at
// their new generation or later (or gone: someone deleted them since).
// It forgets what the cache has shown, and what it has not shown for
// pendingTimeout.
func (c *Controller) cacheCaughtUp(key string, existing []*discovery.EndpointSlice) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending[key]
	if len(p) == 0 {
		return true
	}
	seen := map[string]*discovery.EndpointSlice{}
	for _, s := range existing {
		seen[s.Name] = s
	}
	now := time.Now()
	for n, e := range p {
		s := seen[n]
		var shown bool
		switch e.kind {
		case wroteCreate:
			shown = s != nil
		case wroteDelete:
			shown = s == nil
		case wroteUpdate:
			shown = s == nil || s.Generation >= e.generation
		}
		if shown || now.Sub(e.at) > pendingTimeout {
			delete(p, n)
		}
	}
	if len(p) == 0 {
		delete(c.pending, key)
		return true
	}
	return false
}

func (c *Controller) expect(key, name string, e expectation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[key] == nil {
		c.pending[key] = map[string]expectation{}
	}
	e.at = time.Now()
	c.pending[key][name] = e
}

// echo reports whether a slice event only shows our own last write of
// that slice (see the top of the file), forgetting that write if so; it
// is never an echo while a sync of the Service waits for the cache.
func (c *Controller) echo(key string, s *discovery.EndpointSlice, deleted bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.pending[key][s.Name]
	if !ok || c.waiting[key] {
		return false
	}
	switch {
	case deleted && e.kind == wroteDelete:
	case !deleted && e.kind != wroteDelete && e.resourceVersion != "" && e.resourceVersion == s.ResourceVersion:
	default:
		return false
	}
	delete(c.pending[key], s.Name)
	if len(c.pending[key]) == 0 {
		delete(c.pending, key)
	}
	return true
}

// apply writes plan: every item is tried; the errors are joined.
func (c *Controller) apply(ctx context.Context, key string, plan Plan) error {
	var errs []error
	for _, s := range plan.Create {
		s = s.DeepCopy()
		s.Name = s.GenerateName + utilrand.String(5)
		got, err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				continue
			}
			errs = append(errs, fmt.Errorf("creating EndpointSlice for %s: %w", key, err))
			continue
		}
		c.expect(key, s.Name, expectation{kind: wroteCreate, resourceVersion: got.ResourceVersion})
	}
	stale := false
	for _, s := range plan.Update {
		got, err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			// Our copy is older than the API's: the informer brings the
			// newer one, and its event queues the Service again.
			stale = true
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("updating EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		c.expect(key, s.Name, expectation{kind: wroteUpdate, generation: got.Generation, resourceVersion: got.ResourceVersion})
	}
	for _, s := range plan.Delete {
		err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		c.expect(key, s.Name, expectation{kind: wroteDelete})
	}
	if stale && len(errs) == 0 {
		return fmt.Errorf("service %s: an update was refused as a conflict: %w", key, errStale)
	}
	return errors.Join(errs...)
}
