package endpointslice

// The controller: informers for Services, Pods, Nodes and EndpointSlices
// feed a queue of Service keys; a sync computes Reconcile's plan from the
// listers and applies it through the clientset. Slices are created with a
// client-side name (GenerateName plus a random suffix) so the tracker
// below knows their names before the informer does: a sync that runs
// before the cache has caught up with our own writes would otherwise
// create the same slices twice. Slices of a deleted Service are deleted
// here (the lab runs no garbage collector to follow the ownerReference).
// The trigger time tracker (triggertime.go) is consulted once per sync
// that gets as far as planning, after the stale-cache check (a sync that
// must wait does not consume the changes it saw), and forgets a Service
// when the Service is gone.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/kube"
)

// Controller writes EndpointSlices for Services with a selector.
type Controller struct {
	client      kubernetes.Interface
	services    corelisters.ServiceLister
	pods        corelisters.PodLister
	nodes       corelisters.NodeLister
	slices      discoverylisters.EndpointSliceLister
	synced      []cache.InformerSynced
	queue       workqueue.TypedRateLimitingInterface[string]
	maxPerSlice int
	triggers    *TriggerTimeTracker

	mu      sync.Mutex                 // protects pending
	pending map[string]map[string]bool // service key -> slice name -> true: created, false: deleted; not yet in the cache
}

// New returns a controller over factory's informers (it registers them;
// start the factory afterwards). maxPerSlice < 1 means 100.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, maxPerSlice int) (*Controller, error) {
	if maxPerSlice < 1 {
		maxPerSlice = DefaultMaxEndpointsPerSlice
	}
	if maxPerSlice > 1000 {
		return nil, fmt.Errorf("max endpoints per slice %d: the API allows at most 1000", maxPerSlice)
	}
	svcInf := factory.Core().V1().Services()
	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	c := &Controller{
		client:      client,
		services:    svcInf.Lister(),
		pods:        podInf.Lister(),
		nodes:       nodeInf.Lister(),
		slices:      sliceInf.Lister(),
		queue:       workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "endpointslice"}),
		maxPerSlice: maxPerSlice,
		triggers:    NewTriggerTimeTracker(),
		pending:     map[string]map[string]bool{},
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{svcInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.enqueueObj,
			UpdateFunc: func(_, n any) { c.enqueueObj(n) },
			DeleteFunc: c.enqueueObj,
		}},
		{podInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.podChanged,
			UpdateFunc: func(o, n any) { c.podChanged(o); c.podChanged(n) },
			DeleteFunc: c.podChanged,
		}},
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { c.enqueueAll() },
			UpdateFunc: func(o, n any) {
				on, ok1 := o.(*corev1.Node)
				nn, ok2 := n.(*corev1.Node)
				if ok1 && ok2 && on.Labels[corev1.LabelTopologyZone] == nn.Labels[corev1.LabelTopologyZone] {
					return
				}
				c.enqueueAll()
			},
			DeleteFunc: func(any) { c.enqueueAll() },
		}},
		{sliceInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.sliceChanged,
			UpdateFunc: func(_, n any) { c.sliceChanged(n) },
			DeleteFunc: c.sliceChanged,
		}},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("endpointslice: adding event handler: %w", err)
		}
		c.synced = append(c.synced, h.inf.HasSynced)
	}
	return c, nil
}

func (c *Controller) enqueueObj(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

func (c *Controller) enqueueAll() {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, s := range svcs {
		c.enqueueObj(s)
	}
}

// podChanged queues the Services whose selector matches the pod.
func (c *Controller) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		t, ok := obj.(cache.DeletedFinalStateUnknown)
		if !ok {
			return
		}
		if pod, ok = t.Obj.(*corev1.Pod); !ok {
			return
		}
	}
	svcs, err := c.services.Services(pod.Namespace).List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, s := range svcs {
		if s.Spec.Selector != nil && labels.SelectorFromValidatedSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			c.enqueueObj(s)
		}
	}
}

// sliceChanged queues the Service of one of our slices (someone else
// editing or deleting it gets it rewritten).
func (c *Controller) sliceChanged(obj any) {
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
	c.queue.Add(s.Namespace + "/" + name)
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
	kube.RunWorkers(ctx, c.queue, workers, c.Sync, func(ctx context.Context, key string, err error) {
		klog.FromContext(ctx).Error(err, "Sync failed, will retry", "service", key)
	})
	return nil
}

// errStale says the slice cache has not seen our last writes yet.
var errStale = errors.New("endpointslice cache is behind our own writes")

// Sync makes the slices of Service key ("ns/name") match its pods.
func (c *Controller) Sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	sel := labels.SelectorFromSet(labels.Set{discovery.LabelServiceName: name, discovery.LabelManagedBy: ManagedBy})
	existing, err := c.slices.EndpointSlices(ns).List(sel)
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
	pods, err := c.pods.Pods(ns).List(labels.SelectorFromValidatedSet(svc.Spec.Selector))
	if err != nil {
		return err
	}
	// Computed even when the plan turns out empty, so that the tracker
	// keeps up with what this sync saw, as upstream does.
	triggerTime := c.triggers.ComputeEndpointLastChangeTriggerTime(ns, svc, pods)
	plan, planErr := Reconcile(svc, pods, c.getNode, existing, c.maxPerSlice, triggerTime)
	return errors.Join(c.apply(ctx, key, plan), planErr)
}

func (c *Controller) getNode(name string) (*corev1.Node, bool) {
	n, err := c.nodes.Get(name)
	return n, err == nil
}

// cacheCaughtUp reports whether the cache holds every slice we created
// for key and none we deleted; it forgets what the cache has shown.
func (c *Controller) cacheCaughtUp(key string, existing []*discovery.EndpointSlice) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending[key]
	if len(p) == 0 {
		return true
	}
	seen := map[string]bool{}
	for _, s := range existing {
		seen[s.Name] = true
	}
	for n, created := range p {
		if seen[n] == created {
			delete(p, n)
		}
	}
	if len(p) == 0 {
		delete(c.pending, key)
		return true
	}
	return false
}

func (c *Controller) expect(key, name string, created bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[key] == nil {
		c.pending[key] = map[string]bool{}
	}
	c.pending[key][name] = created
}

// apply writes plan: every item is tried; the errors are joined.
func (c *Controller) apply(ctx context.Context, key string, plan Plan) error {
	var errs []error
	for _, s := range plan.Create {
		s = s.DeepCopy()
		s.Name = s.GenerateName + utilrand.String(5)
		if _, err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				continue
			}
			errs = append(errs, fmt.Errorf("creating EndpointSlice for %s: %w", key, err))
			continue
		}
		c.expect(key, s.Name, true)
	}
	for _, s := range plan.Update {
		if _, err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("updating EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
		}
	}
	for _, s := range plan.Delete {
		err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		c.expect(key, s.Name, false)
	}
	return errors.Join(errs...)
}
