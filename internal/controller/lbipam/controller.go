// Package lbipam gives Services of type LoadBalancer an address from a
// configured pool, written to status.loadBalancer.ingress[].ip, as
// MetalLB's or a cloud's controller would: the agents' Service proxies
// then answer that address on every node, and whatever routes the pool to
// the nodes (a BGP router; in the lab, the external host's ECMP route)
// brings clients there.
//
// Design. The API server is the only store: a Service's status is its
// allocation. At start the controller waits for its caches, adopts every
// address the managed Services' statuses hold (oldest Service first, so
// when two claim one address the older keeps it and the other is given a
// new one), and only then starts allocating; so a restart hands out
// nothing twice and loses nothing, and no finalizer is needed (a Service
// deleted while the controller was down simply holds nothing at the next
// start). A sync plans under the lock (plan: which addresses the Service
// keeps, gets and gives back, reserved in the allocator at once) and then
// applies the plan with at most one UpdateStatus of a copy (the cached
// object is never written); held remembers what each Service holds or was
// just given, so a sync that runs before the cache has seen our own write
// reuses the same address instead of taking another.
//
// Which Services: type LoadBalancer with spec.loadBalancerClass unset or
// Class. One address per family of spec.ipFamilies, lowest free first;
// the deprecated spec.loadBalancerIP asks for one address of its family,
// given only when it is in the pool and free (no annotations are read).
// A Service that leaves type LoadBalancer gives its addresses back and
// its status is cleared; a deleted one gives them back.
//
// Pool changes (the ConfigMap is watched): a Service keeps an address that
// falls outside a shrunk pool until it releases it (deletion or type
// change): moving a live load-balancer address would break its clients
// silently, and whoever shrank the pool can recreate the Service. Such an
// address is never handed to another Service meanwhile. An invalid
// ConfigMap keeps the last valid pool (Warning event on the ConfigMap).
//
// Exhaustion: a Warning event AllocationFailed on the Service (once per
// distinct reason) and a log line naming the pool; the Service is retried
// when any address is released or the pool changes.
package lbipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/kube"
)

// Class is the spec.loadBalancerClass flatnet answers to, besides none.
const Class = "flatnet.io/lb"

// PoolKey is the ConfigMap key holding the pool text.
const PoolKey = "pool"

// Event reasons.
const (
	ReasonAllocated        = "IPAllocated"
	ReasonAllocationFailed = "AllocationFailed"
	ReasonReleased         = "IPReleased"
	ReasonInvalidPool      = "InvalidPool"
)

// poolKey is the queue key of a pool reload; no Service key (ns/name) has
// a leading colon.
const poolKey = ":pool"

// Config configures the controller.
type Config struct {
	// Pool is the pool given on the command line (may be empty).
	Pool Pool
	// ConfigMap names a ConfigMap ("namespace/name") whose PoolKey adds
	// to Pool; empty for none. The caller passes its informer to New.
	ConfigMap string
}

// Controller assigns load-balancer addresses.
type Controller struct {
	client     kubernetes.Interface
	services   corelisters.ServiceLister
	configMaps corelisters.ConfigMapLister // nil without Config.ConfigMap
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
	recorder   record.EventRecorder
	cfg        Config
	cmNS       string
	cmName     string

	mu      sync.Mutex // protects everything below
	alloc   *Allocator
	held    map[string]holding // service key -> what it holds or was just given
	waiting map[string]string  // service key -> why it lacks an address (the last event's message)
	cmText  *string            // the ConfigMap's pool text last read (nil: none)
	cmPool  Pool               // the last valid pool read from the ConfigMap
}

// holding is what one Service holds: addresses in the order of its
// families, and its UID (a Service recreated under the same name starts
// afresh).
type holding struct {
	uid   types.UID
	addrs []netip.Addr
}

// New returns a controller over the Service informer and, when
// cfg.ConfigMap is set, an informer over that ConfigMap (a factory
// limited to its namespace and name). recorder receives events (may be a
// record.FakeRecorder in tests).
func New(client kubernetes.Interface, services coreinformers.ServiceInformer, configMaps coreinformers.ConfigMapInformer,
	cfg Config, recorder record.EventRecorder) (*Controller, error) {
	c := &Controller{
		client:   client,
		services: services.Lister(),
		recorder: recorder,
		cfg:      cfg,
		alloc:    NewAllocator(cfg.Pool),
		held:     map[string]holding{},
		waiting:  map[string]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "lbipam"}),
	}
	reg, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, cur any) { c.enqueue(cur) },
		DeleteFunc: c.enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("lbipam: watching services: %w", err)
	}
	c.synced = append(c.synced, reg.HasSynced)
	if cfg.ConfigMap != "" {
		ns, name, err := ParseConfigMapName(cfg.ConfigMap)
		if err != nil {
			return nil, err
		}
		if configMaps == nil {
			return nil, errors.New("lbipam: a pool ConfigMap without a ConfigMap informer")
		}
		c.cmNS, c.cmName = ns, name
		c.configMaps = configMaps.Lister()
		onCM := func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil && key == ns+"/"+name {
				c.queue.Add(poolKey)
			}
		}
		reg, err := configMaps.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onCM,
			UpdateFunc: func(_, cur any) { onCM(cur) },
			DeleteFunc: onCM,
		})
		if err != nil {
			return nil, fmt.Errorf("lbipam: watching ConfigMap %s: %w", cfg.ConfigMap, err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// ParseConfigMapName reads "namespace/name".
func ParseConfigMapName(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("ConfigMap %q: want namespace/name", s)
	}
	return ns, name, nil
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Run reads the pool, adopts the addresses existing Services hold, then
// allocates with workers goroutines until ctx ends. The informers must be
// started.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("lbipam")
	ctx = klog.NewContext(ctx, logger)
	if ok, err := kube.WaitForCaches(ctx, "lbipam", c.synced...); !ok {
		return err
	}
	c.reloadPool(ctx)
	if err := c.rebuild(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	pool := c.alloc.Pool()
	logger.Info("Started", "pool", pool.String(), "class", Class, "configMap", c.cfg.ConfigMap,
		"ipv4", pool.Size(corev1.IPv4Protocol), "ipv6", pool.Size(corev1.IPv6Protocol),
		"inUse", c.alloc.Used(corev1.IPv4Protocol)+c.alloc.Used(corev1.IPv6Protocol))
	c.mu.Unlock()
	kube.RunWorkers(ctx, c.queue, workers, c.Sync, func(ctx context.Context, key string, err error) {
		klog.FromContext(ctx).Error(err, "Load-balancer IP sync failed; will retry", "service", key)
	})
	return nil
}

// rebuild adopts the addresses in the statuses of the managed Services,
// oldest first, before any allocation.
func (c *Controller) rebuild(ctx context.Context) error {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing services: %w", err)
	}
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, svc := range svcs {
		if Managed(svc) {
			c.adoptLocked(ctx, svc.Namespace+"/"+svc.Name, svc)
		}
	}
	return nil
}

// Managed reports whether flatnet assigns svc's load-balancer addresses.
func Managed(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer &&
		(svc.Spec.LoadBalancerClass == nil || *svc.Spec.LoadBalancerClass == Class)
}

// Sync brings one Service (key "ns/name") in line, or reloads the pool.
func (c *Controller) Sync(ctx context.Context, key string) error {
	if key == poolKey {
		c.reloadPool(ctx)
		return nil
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.release(ctx, key, "deleted")
		return nil
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	p := c.planLocked(ctx, key, svc)
	c.mu.Unlock()
	return c.apply(ctx, key, svc, p)
}

// plan is the outcome of one sync, decided under the lock; the allocator
// already reflects it.
type plan struct {
	// want are the addresses the Service holds after the sync, in the
	// order of its families; with managed, written to its status when
	// they differ from it.
	want    []netip.Addr
	managed bool
	// clear: the Service is no longer ours but its status still shows a
	// load-balancer address: write an empty status.
	clear     bool
	allocated []netip.Addr
	released  []netip.Addr
	// wait says why the Service lacks an address for some family;
	// newWait: it is a new reason (an event is due).
	wait    string
	newWait bool
}

// families are svc's IP families: spec.ipFamilies, else those of its
// cluster IPs, else IPv4.
func families(svc *corev1.Service) []corev1.IPFamily {
	if len(svc.Spec.IPFamilies) > 0 {
		return svc.Spec.IPFamilies
	}
	var out []corev1.IPFamily
	for _, s := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, familyOf(a)) {
			out = append(out, familyOf(a))
		}
	}
	if len(out) == 0 {
		out = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return out
}

// statusIPs are the addresses in svc's status.loadBalancer.ingress.
func statusIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(ing.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// statusIs reports whether svc's status shows exactly addrs (ipMode and
// nothing else: a hostname or ports make it differ).
func statusIs(svc *corev1.Service, addrs []netip.Addr) bool {
	ing := svc.Status.LoadBalancer.Ingress
	if len(ing) != len(addrs) {
		return false
	}
	for i, a := range addrs {
		if ing[i].IP != a.String() || ing[i].Hostname != "" || len(ing[i].Ports) != 0 {
			return false
		}
	}
	return true
}

// adoptLocked records the addresses svc's status shows, at most one per
// family of svc, when it holds nothing yet. c.mu must be held.
func (c *Controller) adoptLocked(ctx context.Context, key string, svc *corev1.Service) {
	if _, ok := c.held[key]; ok {
		return
	}
	logger := klog.FromContext(ctx)
	fams := families(svc)
	var addrs []netip.Addr
	for _, a := range statusIPs(svc) {
		if !slices.Contains(fams, familyOf(a)) || slices.ContainsFunc(addrs, func(b netip.Addr) bool { return familyOf(b) == familyOf(a) }) {
			continue
		}
		inPool, err := c.alloc.Occupy(a)
		if err != nil {
			logger.Info("Load-balancer IP in the Service's status is held by another Service; this one gets another",
				"service", key, "ip", a, "heldBy", c.holderLocked(a))
			continue
		}
		if !inPool {
			logger.Info("Service holds a load-balancer IP outside the pool; it keeps it until it releases it",
				"service", key, "ip", a, "pool", c.alloc.Pool().String())
		}
		addrs = append(addrs, a)
	}
	c.held[key] = holding{uid: svc.UID, addrs: addrs}
}

func (c *Controller) holderLocked(a netip.Addr) string {
	for k, h := range c.held {
		if slices.Contains(h.addrs, a) {
			return k
		}
	}
	return ""
}

// planLocked decides what svc holds after this sync and reserves or frees
// addresses in the allocator accordingly. c.mu must be held.
func (c *Controller) planLocked(ctx context.Context, key string, svc *corev1.Service) plan {
	if h, ok := c.held[key]; ok && h.uid != svc.UID {
		// Deleted and created again between two syncs.
		c.releaseLocked(key)
	}
	if !Managed(svc) {
		p := plan{released: c.releaseLocked(key)}
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			pool := c.alloc.Pool()
			for _, a := range statusIPs(svc) {
				if pool.Contains(a) || slices.Contains(p.released, a) {
					p.clear = true
				}
			}
		}
		return p
	}

	c.adoptLocked(ctx, key, svc)
	have := c.held[key].addrs
	pool := c.alloc.Pool()
	p := plan{managed: true}
	var requested netip.Addr
	var problems []string
	if s := svc.Spec.LoadBalancerIP; s != "" {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("spec.loadBalancerIP %q is not an IP address", s))
		case !slices.Contains(families(svc), familyOf(a.Unmap())):
			problems = append(problems, fmt.Sprintf("spec.loadBalancerIP %s is not of the Service's IP families %v", s, families(svc)))
		default:
			requested = a.Unmap()
		}
	}
	for _, f := range families(svc) {
		var cur netip.Addr
		for _, a := range have {
			if familyOf(a) == f {
				cur = a
				break
			}
		}
		req := netip.Addr{}
		if requested.IsValid() && familyOf(requested) == f {
			req = requested
		}
		if cur.IsValid() && (!req.IsValid() || cur == req) {
			p.want = append(p.want, cur)
			continue
		}
		switch {
		case req.IsValid() && !pool.Contains(req):
			problems = append(problems, fmt.Sprintf("spec.loadBalancerIP %s is outside the load-balancer pool %s", req, pool))
		case req.IsValid() && c.alloc.InUse(req):
			problems = append(problems, fmt.Sprintf("spec.loadBalancerIP %s is in use by Service %s", req, c.holderLocked(req)))
		case req.IsValid():
			_, _ = c.alloc.Occupy(req)
			p.want = append(p.want, req)
			p.allocated = append(p.allocated, req)
		default:
			a, err := c.alloc.Allocate(f)
			if err != nil {
				problems = append(problems, fmt.Sprintf("no %s load-balancer IP for the Service: %v", f, err))
				continue
			}
			p.want = append(p.want, a)
			p.allocated = append(p.allocated, a)
		}
	}
	// Give back what the Service no longer holds (another address asked
	// for, a family dropped).
	for _, a := range have {
		if !slices.Contains(p.want, a) {
			c.alloc.Release(a)
			p.released = append(p.released, a)
		}
	}
	c.held[key] = holding{uid: svc.UID, addrs: p.want}
	if len(problems) > 0 {
		p.wait = strings.Join(problems, "; ")
		p.newWait = c.waiting[key] != p.wait
		c.waiting[key] = p.wait
	} else {
		delete(c.waiting, key)
	}
	if len(p.released) > 0 {
		c.wakeLocked(key)
	}
	return p
}

// apply writes p: at most one UpdateStatus of a copy of svc, then events.
func (c *Controller) apply(ctx context.Context, key string, svc *corev1.Service, p plan) error {
	logger := klog.FromContext(ctx)
	var write *corev1.Service
	switch {
	case p.managed && !statusIs(svc, p.want):
		write = svc.DeepCopy()
		write.Status.LoadBalancer.Ingress = nil
		for _, a := range p.want {
			write.Status.LoadBalancer.Ingress = append(write.Status.LoadBalancer.Ingress,
				corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptr(corev1.LoadBalancerIPModeVIP)})
		}
	case p.clear:
		write = svc.DeepCopy()
		write.Status.LoadBalancer = corev1.LoadBalancerStatus{}
	}
	if write != nil {
		_, err := c.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, write, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			c.release(ctx, key, "deleted")
			return nil
		}
		if err != nil {
			// Keep the reservations: the retry writes the same addresses.
			return fmt.Errorf("writing status.loadBalancer of service %s: %w", key, err)
		}
	}
	pool := c.poolString()
	for _, a := range p.allocated {
		logger.Info("Assigned load-balancer IP", "service", key, "ip", a, "pool", pool)
		c.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonAllocated, "Assigned load-balancer IP %s from pool %s", a, pool)
	}
	for _, a := range p.released {
		why := "no longer type LoadBalancer of class " + Class + " or none"
		if p.managed {
			why = "it asks for another address or family"
		}
		logger.Info("Released load-balancer IP", "service", key, "ip", a, "why", why)
		c.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonReleased, "Released load-balancer IP %s: %s", a, why)
	}
	if p.newWait {
		logger.Info("Service waits for a load-balancer IP; it is retried when an address is released or the pool changes",
			"service", key, "pool", pool, "reason", p.wait)
		c.recorder.Event(svc, corev1.EventTypeWarning, ReasonAllocationFailed, p.wait+" (retried when an address is released or the pool changes)")
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func (c *Controller) poolString() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Pool().String()
}

// release gives back what a deleted Service held.
func (c *Controller) release(ctx context.Context, key, why string) {
	c.mu.Lock()
	released := c.releaseLocked(key)
	c.mu.Unlock()
	if len(released) > 0 {
		klog.FromContext(ctx).Info("Released load-balancer IPs", "service", key, "ips", released, "why", why)
	}
}

// releaseLocked frees everything key holds and wakes the waiting
// Services. c.mu must be held.
func (c *Controller) releaseLocked(key string) []netip.Addr {
	h, ok := c.held[key]
	delete(c.held, key)
	delete(c.waiting, key)
	if !ok {
		return nil
	}
	for _, a := range h.addrs {
		c.alloc.Release(a)
	}
	if len(h.addrs) > 0 {
		c.wakeLocked(key)
	}
	return h.addrs
}

// wakeLocked queues every waiting Service but except.
func (c *Controller) wakeLocked(except string) {
	for k := range c.waiting {
		if k != except {
			c.queue.Add(k)
		}
	}
}

// reloadPool reads the ConfigMap's pool (if any) and, when it changed,
// sets the allocator's pool to the flag's and the ConfigMap's together
// and wakes the waiting Services. An invalid ConfigMap keeps the last
// valid pool.
func (c *Controller) reloadPool(ctx context.Context) {
	if c.configMaps == nil {
		return
	}
	logger := klog.FromContext(ctx)
	src := fmt.Sprintf("ConfigMap %s/%s key %q", c.cmNS, c.cmName, PoolKey)
	var text *string
	cm, err := c.configMaps.ConfigMaps(c.cmNS).Get(c.cmName)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		utilruntime.HandleError(fmt.Errorf("reading %s: %w", src, err))
		return
	default:
		if v, ok := cm.Data[PoolKey]; ok {
			text = &v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if (text == nil) == (c.cmText == nil) && (text == nil || *text == *c.cmText) {
		return
	}
	c.cmText = text
	var p Pool
	if text != nil {
		if p, err = ParsePool(*text); err != nil {
			logger.Error(err, "Ignoring the pool in the ConfigMap; keeping the last valid one", "source", src, "pool", c.alloc.Pool().String())
			c.recorder.Eventf(cm, corev1.EventTypeWarning, ReasonInvalidPool, "%s: %v; keeping the pool %s", src, err, c.alloc.Pool())
			return
		}
	} else {
		logger.Info("No pool in the ConfigMap (missing, or no key); using the command line's only", "source", src, "pool", c.cfg.Pool.String())
	}
	old := c.alloc.Pool()
	c.cmPool = p
	c.alloc.SetPool(Union(c.cfg.Pool, p))
	if old.String() == c.alloc.Pool().String() {
		return
	}
	logger.Info("Load-balancer pool changed", "source", src, "old", old.String(), "pool", c.alloc.Pool().String())
	for k, h := range c.held {
		for _, a := range h.addrs {
			if !c.alloc.Pool().Contains(a) {
				logger.Info("Service holds a load-balancer IP outside the new pool; it keeps it until it releases it", "service", k, "ip", a)
			}
		}
	}
	c.wakeLocked("")
}
