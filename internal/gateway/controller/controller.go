// Package controller is `flatnet gateway`: on every node, a control loop
// that watches Gateway API objects, Ingresses and what they refer to,
// compiles them into one routing table (internal/gateway/compile) and
// hands it to the HTTP data plane (internal/gateway/proxy), which swaps it
// in atomically. One instance, elected with a Lease, also writes the
// objects' statuses and keeps each Gateway's frontend Service
// (frontends.go).
//
// Design. A change to anything but routes triggers one full compile from
// the informers' caches: a full compile cannot miss a dependency (a
// Secret a listener uses, a ReferenceGrant a backend needs). When only
// HTTPRoutes and GRPCRoutes changed since the last compile, the event
// handlers have recorded their keys (changes) and sync recompiles just
// those (compile.Incremental): at 10,000 routes a full compile costs tens
// of milliseconds, a one-route change under two. The first sync, a burst
// of more than maxIncremental route changes, and anything else go the
// full way. Triggers coalesce: a burst of events costs one compile after
// the one running. Statuses and frontends are written by a second loop
// that always works on the newest result, so thousands of status writes
// at start never hold up the data plane.
//
// Nodes are read by the frontends alone (every Ready node's InternalIP in
// their EndpointSlices), never by compile, so a Node change wakes only
// the second loop, and at most once per frontendMinInterval: a frontend
// pass reads every Node, and at 5,000 nodes a pass per Node event kept a
// CPU busy while nodes came and went (docs/scale.md).
package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/compile"
	"github.com/flatnet/flatnet/internal/gateway/proxy"
	"github.com/flatnet/flatnet/internal/gateway/table"
	"github.com/flatnet/flatnet/internal/kube"
)

// ControllerName is the GatewayClass controllerName flatnet answers to.
const ControllerName = compile.ControllerName

type desiredStatus = compile.Output

// Options configure the controller.
type Options struct {
	NodeName string
	// Namespace holds the leader Lease and the Ingress frontend Service.
	Namespace string
	Range     PortRange
	// Ingress serves Ingresses of class flatnet on these bind ports.
	Ingress                   bool
	IngressHTTP, IngressHTTPS int32
	// LeaderElect off makes this instance write statuses unconditionally
	// (a single instance).
	LeaderElect bool
}

// Controller is one gateway instance's control loop.
type Controller struct {
	opts  Options
	kube  kubernetes.Interface
	gw    gwclient.Interface
	proxy Updater
	log   klog.Logger

	listers listers
	synced  []cache.InformerSynced
	start   func(stop <-chan struct{})

	trigger    chan struct{}
	changes    changes
	inc        compile.Incremental // sync's goroutine only, but for Uses
	fronts     atomic.Int32        // frontend Services at the last full compile
	generation uint64              // of the tables handed over (sync's goroutine only)
	leader     atomic.Bool
	// latest is the newest compile result for the status loop.
	latest  atomic.Pointer[desiredStatus]
	written chan struct{}
	// frontends asks the status loop for a frontend pass without a
	// compile (a Node changed).
	frontends chan struct{}
	// routeMemo (HTTPRoutes) and grpcMemo: statusLoop's goroutine only.
	routeMemo, grpcMemo statusMemo

	mu       sync.Mutex
	lastGen  uint64
	lastSync time.Time
}

// Updater is the data plane (proxy.Server); tests swap a fake.
type Updater interface {
	Update(t *table.Table) error
}

var _ Updater = (*proxy.Server)(nil)

type listers struct {
	gatewayClasses gwlisters.GatewayClassLister
	gateways       gwlisters.GatewayLister
	httpRoutes     gwlisters.HTTPRouteLister
	grpcRoutes     gwlisters.GRPCRouteLister
	grants         gwlisters.ReferenceGrantLister
	namespaces     corelisters.NamespaceLister
	services       corelisters.ServiceLister
	slices         discoverylisters.EndpointSliceLister
	secrets        corelisters.SecretLister
	nodes          corelisters.NodeLister
	ingresses      networkinglisters.IngressLister
	ingressClasses networkinglisters.IngressClassLister
}

// New wires the informers; Run starts them.
func New(kc kubernetes.Interface, gc gwclient.Interface, up Updater, opts Options, log klog.Logger) *Controller {
	c := &Controller{opts: opts, kube: kc, gw: gc, proxy: up, log: log, trigger: make(chan struct{}, 1), written: make(chan struct{}, 1), frontends: make(chan struct{}, 1), routeMemo: statusMemo{},
		changes: changes{full: true}}
	kf := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithTransform(slim))
	// Only TLS Secrets: a listener or an Ingress can use no other kind,
	// and a cluster's other Secrets would only cost memory here.
	sf := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithTransform(slim), informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "type=" + string(corev1.SecretTypeTLS)
	}))
	gf := gwinformers.NewSharedInformerFactoryWithOptions(gc, 0, gwinformers.WithTransform(slim))
	full := func(any) { c.changes.all(); c.Trigger() }
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    full,
		UpdateFunc: func(_, n any) { full(n) },
		DeleteFunc: full,
	}
	// Objects whose status this controller writes: a status-only update
	// (same generation, labels and annotations) changes nothing compile
	// reads, and reacting to it would make every status write cost a
	// compile (at 10,000 routes, a feedback loop that starves the data
	// plane's updates).
	specOnly := func(changed func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc: changed,
			UpdateFunc: func(o, n any) {
				if specChanged(o, n) {
					changed(n)
				}
			},
			DeleteFunc: changed,
		}
	}
	// Routes: only their keys are recorded, for an incremental compile.
	routeChanged := func(kind gwv1.Kind) func(any) {
		return func(o any) { c.changes.route(kind, o); c.Trigger() }
	}
	add := func(i cache.SharedIndexInformer, h cache.ResourceEventHandler) {
		_, _ = i.AddEventHandler(h)
		c.synced = append(c.synced, i.HasSynced)
	}
	v1 := gf.Gateway().V1()
	c.listers = listers{
		gatewayClasses: v1.GatewayClasses().Lister(),
		gateways:       v1.Gateways().Lister(),
		httpRoutes:     v1.HTTPRoutes().Lister(),
		grpcRoutes:     v1.GRPCRoutes().Lister(),
		grants:         v1.ReferenceGrants().Lister(),
		namespaces:     kf.Core().V1().Namespaces().Lister(),
		services:       kf.Core().V1().Services().Lister(),
		slices:         kf.Discovery().V1().EndpointSlices().Lister(),
		secrets:        sf.Core().V1().Secrets().Lister(),
		nodes:          kf.Core().V1().Nodes().Lister(),
		ingresses:      kf.Networking().V1().Ingresses().Lister(),
		ingressClasses: kf.Networking().V1().IngressClasses().Lister(),
	}
	add(v1.HTTPRoutes().Informer(), specOnly(routeChanged("HTTPRoute")))
	add(v1.GRPCRoutes().Informer(), specOnly(routeChanged("GRPCRoute")))
	for _, i := range []cache.SharedIndexInformer{
		v1.GatewayClasses().Informer(), v1.Gateways().Informer(), kf.Networking().V1().Ingresses().Informer(),
	} {
		add(i, specOnly(full))
	}
	for _, i := range []cache.SharedIndexInformer{
		v1.ReferenceGrants().Informer(),
		kf.Core().V1().Namespaces().Informer(),
		sf.Core().V1().Secrets().Informer(),
		kf.Networking().V1().IngressClasses().Informer(),
	} {
		add(i, h)
	}
	// Services and EndpointSlices: only those a backend names or that
	// front a Gateway matter; in a cluster of 10,000 Services, reacting to
	// the others made every pod start cost a full compile on every node.
	serviceChanged := func(o any) {
		switch k, ev := relevantService(o, c.inc.Uses); ev {
		case eventCompile:
			full(o)
		case eventFrontend:
			c.pokeFrontends()
		default:
			c.changes.skip(k, false)
		}
	}
	for _, i := range []cache.SharedIndexInformer{kf.Core().V1().Services().Informer(), kf.Discovery().V1().EndpointSlices().Informer()} {
		add(i, cache.ResourceEventHandlerFuncs{
			AddFunc:    serviceChanged,
			UpdateFunc: func(_, n any) { serviceChanged(n) },
			DeleteFunc: serviceChanged,
		})
	}
	// Nodes matter only to the frontends' EndpointSlices (Ready,
	// InternalIP), so only while there are frontends, and not to compile.
	nodeChanged := func(o any) {
		if c.fronts.Load() > 0 {
			c.pokeFrontends()
		} else {
			c.changes.skip(types.NamespacedName{}, true)
		}
	}
	nodes := kf.Core().V1().Nodes().Informer()
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: nodeChanged,
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || kube.NodeReady(on) != kube.NodeReady(nn) || !equality.Semantic.DeepEqual(on.Status.Addresses, nn.Status.Addresses) {
				nodeChanged(n)
			}
		},
		DeleteFunc: nodeChanged,
	})
	c.synced = append(c.synced, nodes.HasSynced)
	c.start = func(stop <-chan struct{}) {
		kf.Start(stop)
		sf.Start(stop)
		gf.Start(stop)
	}
	return c
}

// slim drops from cached objects what compile never reads and what can be
// most of their size: managedFields, and kubectl's last-applied copy of
// the whole object (kept on Services and EndpointSlices, the objects this
// controller updates whole). At 10,000 routes this is most of the cache.
func slim(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return slimNode(n), nil
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil
	}
	m.SetManagedFields(nil)
	switch obj.(type) {
	case *corev1.Service, *discoveryv1.EndpointSlice:
	default:
		if a := m.GetAnnotations(); a[corev1.LastAppliedConfigAnnotation] != "" {
			a = maps.Clone(a)
			delete(a, corev1.LastAppliedConfigAnnotation)
			m.SetAnnotations(a)
		}
	}
	return obj, nil
}

// slimNode keeps of a Node what the frontends read (its name, InternalIPs
// and Ready condition): a kubelet's Node carries its images, capacity and
// every condition besides, and a cluster's Nodes are the largest cache a
// gateway keeps that is not its routes'.
func slimNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out.Status.Addresses = append(out.Status.Addresses, a)
		}
	}
	for _, cd := range n.Status.Conditions {
		if cd.Type == corev1.NodeReady {
			out.Status.Conditions = []corev1.NodeCondition{{Type: cd.Type, Status: cd.Status}}
		}
	}
	return out
}

// serviceEvent is what a Service or EndpointSlice event asks for.
type serviceEvent int

const (
	eventNone     serviceEvent = iota // nothing compile or the frontends read
	eventCompile                      // a full compile
	eventFrontend                     // a frontend pass only
)

// relevantService says what a Service or EndpointSlice event (an object
// or a deletion tombstone) asks for: a compile when it can change the
// compile's output (its Service is named by a backend of the last
// compile, uses: compile.Incremental's Uses, every Service before the
// first; or it is a frontend Service of ours); a frontend pass for a
// frontend slice of ours no route names (compile reads none: the pass
// repairs it, or sees our own write); otherwise nothing, and k is the
// Service, for changes.skip.
func relevantService(o any, uses func(namespace, name string) bool) (k types.NamespacedName, ev serviceEvent) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	m, ok := o.(metav1.Object)
	if !ok {
		return k, eventCompile
	}
	lbl := m.GetLabels()
	k = types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}
	if _, slice := o.(*discoveryv1.EndpointSlice); slice {
		if lbl[discoveryv1.LabelManagedBy] == SliceManagedBy {
			if uses(k.Namespace, lbl[discoveryv1.LabelServiceName]) {
				return k, eventCompile
			}
			return k, eventFrontend
		}
		k.Name = lbl[discoveryv1.LabelServiceName]
		if k.Name == "" {
			return k, eventNone // no Service: nothing reads it
		}
	} else if isFrontend(lbl) {
		return k, eventCompile
	}
	if uses(k.Namespace, k.Name) {
		return k, eventCompile
	}
	return k, eventNone
}

// specChanged reports whether an update changed more than an object's
// status: its generation (spec), labels or annotations.
func specChanged(o, n any) bool {
	om, ok1 := o.(metav1.Object)
	nm, ok2 := n.(metav1.Object)
	if !ok1 || !ok2 {
		return true
	}
	return om.GetGeneration() != nm.GetGeneration() || om.GetGeneration() == 0 ||
		!maps.Equal(om.GetLabels(), nm.GetLabels()) || !maps.Equal(om.GetAnnotations(), nm.GetAnnotations()) ||
		om.GetDeletionTimestamp().IsZero() != nm.GetDeletionTimestamp().IsZero()
}

// Trigger asks for a sync; many triggers before it runs make one.
func (c *Controller) Trigger() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// Run starts the informers and leader election and syncs on every
// trigger until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.start(ctx.Done())
	if err := c.lead(ctx); err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("gateway: caches did not sync: %w", ctx.Err())
	}
	c.log.Info("Caches synced; serving")
	go c.statusLoop(ctx)
	c.Trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.trigger:
			c.sync(ctx)
		}
	}
}

// sync compiles the caches into a table and hands it to the data plane.
func (c *Controller) sync(ctx context.Context) {
	t0 := time.Now()
	full, routes := c.changes.take()
	var out *compile.Output
	if full || !c.inc.Ready() {
		in, err := c.input()
		if err != nil {
			c.changes.all()
			c.log.Error(err, "Reading the caches")
			return
		}
		out = c.inc.Compile(in)
	} else {
		out = c.inc.Routes(routes, c.route)
	}
	if c.changes.recheck(c.inc.Uses, c.fronts.Load() > 0) {
		c.Trigger()
	}
	c.generation++
	out.Table.Generation = c.generation
	if err := c.proxy.Update(out.Table); err != nil {
		// A port that cannot be bound: the others serve; say which.
		c.log.Error(err, "Data plane update left some ports unserved")
	}
	c.mu.Lock()
	c.lastGen, c.lastSync = out.Table.Generation, time.Now()
	c.mu.Unlock()
	c.latest.Store(out)
	c.pokeStatus()
	c.log.V(2).Info("Synced", "generation", out.Table.Generation, "ports", len(out.Table.Ports), "full", full, "routes", len(routes), "took", time.Since(t0))
}

// route reads a changed route from the cache for compile.Incremental:
// nil when it is gone.
func (c *Controller) route(k compile.RouteKey) any {
	var o any
	var err error
	if k.Kind == "GRPCRoute" {
		o, err = c.listers.grpcRoutes.GRPCRoutes(k.Namespace).Get(k.Name)
	} else {
		o, err = c.listers.httpRoutes.HTTPRoutes(k.Namespace).Get(k.Name)
	}
	if err != nil {
		return nil
	}
	return o
}

// statusLoop writes statuses and frontends from the newest compile while
// this instance leads: at once after a compile; after a Node change no
// sooner than frontendMinInterval after the previous pass (Node changes
// meanwhile coalesce into one pass).
func (c *Controller) statusLoop(ctx context.Context) {
	var last time.Time
	var held <-chan time.Time // a Node-triggered pass waiting its turn
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.written:
		case <-c.frontends:
			if wait := frontendMinInterval - time.Since(last); wait > 0 {
				if held == nil {
					held = time.After(wait)
				}
				continue
			}
		case <-held:
		}
		held = nil
		if !c.leader.Load() {
			continue
		}
		out := c.latest.Load()
		if out == nil {
			continue
		}
		last = time.Now()
		ferr := c.reconcileFrontends(ctx)
		if ferr != nil {
			c.log.Error(ferr, "Frontend Services")
		}
		serr := c.writeStatuses(ctx, out)
		if serr != nil && !onlyRetry(serr) {
			c.log.Error(serr, "Statuses")
		}
		if ferr != nil || serr != nil {
			// A failed or conflicting write gets another pass: our own
			// status writes trigger none.
			time.AfterFunc(statusRetry, c.pokeStatus)
		}
	}
}

// statusRetry is how soon a status pass that failed runs again.
const statusRetry = 500 * time.Millisecond

func (c *Controller) pokeStatus() {
	select {
	case c.written <- struct{}{}:
	default:
	}
}

// frontendMinInterval spaces the frontend passes Node changes ask for,
// as kube-proxy's --iptables-min-sync-period spaces its syncs: a node
// joining or leaving reaches the frontends within it.
const frontendMinInterval = time.Second

func (c *Controller) pokeFrontends() {
	select {
	case c.frontends <- struct{}{}:
	default:
	}
}

// onlyRetry reports whether err holds nothing but errRetry.
func onlyRetry(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !errors.Is(e, errRetry) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, errRetry)
}

// input reads everything compile needs from the caches.
func (c *Controller) input() (*compile.Input, error) {
	l := c.listers
	in := &compile.Input{IngressHTTPBind: c.opts.IngressHTTP, IngressHTTPSBind: c.opts.IngressHTTPS}
	var errs []error
	var err error
	in.GatewayClasses, err = l.gatewayClasses.List(labels.Everything())
	errs = append(errs, err)
	in.Gateways, err = l.gateways.List(labels.Everything())
	errs = append(errs, err)
	in.HTTPRoutes, err = l.httpRoutes.List(labels.Everything())
	errs = append(errs, err)
	in.GRPCRoutes, err = l.grpcRoutes.List(labels.Everything())
	errs = append(errs, err)
	in.ReferenceGrants, err = l.grants.List(labels.Everything())
	errs = append(errs, err)
	in.Namespaces, err = l.namespaces.List(labels.Everything())
	errs = append(errs, err)
	in.Services, err = l.services.List(labels.Everything())
	errs = append(errs, err)
	in.EndpointSlices, err = l.slices.List(labels.Everything())
	errs = append(errs, err)
	in.Secrets, err = l.secrets.List(labels.Everything())
	errs = append(errs, err)
	if c.opts.Ingress {
		in.Ingresses, err = l.ingresses.List(labels.Everything())
		errs = append(errs, err)
		in.IngressClasses, err = l.ingressClasses.List(labels.Everything())
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	fronts := frontendServices(in.Services)
	c.fronts.Store(int32(len(fronts)))
	in.Binds = map[compile.BindKey]int32{}
	for k, b := range bindsOf(fronts) {
		in.Binds[compile.BindKey{Gateway: k.Gateway, Port: k.Port}] = b
	}
	in.Addresses = addressesOf(fronts)
	for _, s := range fronts {
		if s.Labels[LabelIngress] == "true" && s.Namespace == c.opts.Namespace && s.Name == IngressService {
			in.IngressAddresses = lbIPs(s)
		}
	}
	return in, nil
}

// frontendServices are the Services this controller keeps.
func frontendServices(all []*corev1.Service) []*corev1.Service {
	var out []*corev1.Service
	for _, s := range all {
		if isFrontend(s.Labels) {
			out = append(out, s)
		}
	}
	return out
}

// isFrontend reports whether a Service's labels make it one of ours.
func isFrontend(labels map[string]string) bool {
	_, gateway := labels[LabelGateway]
	return gateway || labels[LabelIngress] == "true"
}

// reconcileFrontends plans and applies the frontend Services.
func (c *Controller) reconcileFrontends(ctx context.Context) error {
	services, err := c.listers.services.List(labels.Everything())
	if err != nil {
		return err
	}
	fronts := frontendServices(services)
	gws, err := c.ourGateways()
	if err != nil {
		return err
	}
	nodes, err := c.listers.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	slices := map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice{}
	for _, s := range fronts {
		slices[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}], err = c.frontendSlicesOf(s)
		if err != nil {
			return err
		}
	}
	p, errs := plan(planInput{
		Gateways: gws, Existing: fronts, ExistingSlices: slices, Nodes: nodes, Range: c.opts.Range,
		Ingress: c.opts.Ingress, Namespace: c.opts.Namespace, IngressHTTP: c.opts.IngressHTTP, IngressHTTPS: c.opts.IngressHTTPS,
	})
	errs = append(errs, applyFrontends(ctx, c.kube, p, fronts, slices))
	return errors.Join(errs...)
}

// frontendSlicesOf are frontend Service s's EndpointSlices in the cache,
// by name: the one named as the Service (whatever its labels: an update
// puts ours on it) and those labelled as ours for it.
func (c *Controller) frontendSlicesOf(s *corev1.Service) (map[string]*discoveryv1.EndpointSlice, error) {
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name, discoveryv1.LabelManagedBy: SliceManagedBy})
	list, err := c.listers.slices.EndpointSlices(s.Namespace).List(sel)
	if err != nil {
		return nil, err
	}
	out := map[string]*discoveryv1.EndpointSlice{}
	for _, es := range list {
		out[es.Name] = es
	}
	if es, err := c.listers.slices.EndpointSlices(s.Namespace).Get(s.Name); err == nil {
		out[es.Name] = es
	}
	return out, nil
}

// ourGateways are the Gateways whose class names our controller.
func (c *Controller) ourGateways() ([]*gwv1.Gateway, error) {
	all, err := c.listers.gateways.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var out []*gwv1.Gateway
	for _, g := range all {
		gc, err := c.listers.gatewayClasses.Get(string(g.Spec.GatewayClassName))
		if err == nil && gc.Spec.ControllerName == ControllerName && g.DeletionTimestamp == nil {
			out = append(out, g)
		}
	}
	return out, nil
}

// lead runs leader election until ctx ends; without it this instance leads.
func (c *Controller) lead(ctx context.Context) error {
	if !c.opts.LeaderElect {
		c.leader.Store(true)
		return nil
	}
	id := c.opts.NodeName
	if id == "" {
		id, _ = os.Hostname()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.opts.Namespace, Name: "flatnet-gateway"},
		Client:     c.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Name:            "flatnet-gateway",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				c.log.Info("Leading: writing statuses and frontend Services", "identity", id)
				c.leader.Store(true)
				c.pokeStatus()
			},
			OnStoppedLeading: func() {
				c.log.Info("No longer leading", "identity", id)
				c.leader.Store(false)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	go func() {
		for ctx.Err() == nil {
			le.Run(ctx)
		}
	}()
	return nil
}

// Healthz answers 200 once a table has been applied, with its generation
// and age.
func (c *Controller) Healthz(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	gen, at := c.lastGen, c.lastSync
	c.mu.Unlock()
	if at.IsZero() {
		http.Error(w, "no routing table yet", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "ok generation=%d synced=%s leader=%t\n", gen, at.UTC().Format(time.RFC3339Nano), c.leader.Load())
}

// ParsePortRange reads "FIRST-LAST".
func ParsePortRange(s string) (PortRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(a, 10, 16)
	last, err2 := strconv.ParseUint(b, 10, 16)
	if !ok || err1 != nil || err2 != nil || first == 0 || first > last {
		return PortRange{}, fmt.Errorf("--bind-port-range %q: want FIRST-LAST, two ports 1-65535 with FIRST <= LAST, e.g. 20000-29999", s)
	}
	return PortRange{int32(first), int32(last)}, nil
}

// jsonConfig is cfg speaking JSON: the Gateway API types have no protobuf.
func jsonConfig(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType, c.AcceptContentTypes = "application/json", "application/json"
	return c
}
