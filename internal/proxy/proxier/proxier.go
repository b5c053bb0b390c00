// Package proxier is flatnet's Service proxy loop for one address family:
// informers on Services and EndpointSlices feed a change tracker
// (proxy/tracker), and a bounded-frequency runner (proxy/runner) hands what
// changed to the proxy mode's backend (proxy.Backend: proxy/nftables,
// proxy/iptables, proxy/userspace), which programs it.
//
// Design. The runner (proxy/runner) decides which syncs are full: the
// first, the one after a failed sync, and one at least every
// FullSyncInterval (the agent's is an hour, as kube-proxy's) however many
// partial syncs ran meanwhile, so drift (a foreign edit of the table, a
// bug in a partial sync) is repaired within that period even on a busy
// cluster. A full sync reads the table's chains
// and sets first and reconciles against them, so a restarted agent neither
// flushes its table (established flows keep their DNAT through the restart)
// nor leaves chains of services deleted while it was down. Every other sync
// is partial: only the services the tracker saw change, in a transaction
// whose size follows the change.
//
// After each successful sync, UDP and SCTP conntrack entries the change
// left stale are deleted (proxy/conntrack): from the services' models as
// the last sync programmed them and as they are now. The first sync after
// a start, and the one after a failed cleanup, cannot know what changed
// before, so they list the table instead and delete what points to no
// serving endpoint, leaving every live flow alone.
package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/healthcheck"
	"github.com/flatnet/flatnet/internal/proxy/metrics"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/runner"
	"github.com/flatnet/flatnet/internal/proxy/tracker"
)

// watchSelector leaves out Services and EndpointSlices the proxy must not
// serve, with the labels kube-proxy honours.
const watchSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// NFT is what the nftables mode needs from nftables (nftables.NFT).
type NFT = nftables.NFT

// Config configures a Proxier.
type Config struct {
	Client kubernetes.Interface
	// Backend programs the rules (one proxy mode, one family). When nil,
	// the nftables mode is built from NFT and Render.
	Backend proxy.Backend
	// IPv6 and NodeName say which family and node Backend serves; with
	// the nftables mode built here they come from Render.
	IPv6     bool
	NodeName string
	NFT      NFT
	Render   nftables.Config
	// MinSyncInterval bounds how often syncs start (and so does each
	// partial sync's duration: runner.PartialSyncSpacing); MaxSyncInterval
	// caps the backoff of retries; FullSyncInterval is the period of full
	// resyncs (MaxSyncInterval when 0).
	MinSyncInterval  time.Duration
	MaxSyncInterval  time.Duration
	FullSyncInterval time.Duration
	Clock            runner.Clock // the system clock when nil
	// Conntrack, when set, is where stale UDP and SCTP entries are
	// deleted after each sync (conntrack.Netlink{} on a node).
	Conntrack conntrack.Interface
	// Metrics, when set, records this proxier's metrics.
	Metrics *metrics.Proxier
	// Health, when set, is told of queued changes and successful syncs
	// (/healthz, /livez).
	Health *healthcheck.Family
	// ServiceHealth, when set, gets after each successful sync the
	// services with a healthCheckNodePort and their local endpoints.
	ServiceHealth *healthcheck.ServiceFamily
	// Serve, when set, runs for as long as Run does, from before the
	// caches sync: the node's metrics and health servers, which one of
	// its proxiers carries. An error from it ends Run.
	Serve func(ctx context.Context) error
}

// Proxier keeps one family's Service rules in sync with the API.
type Proxier struct {
	cfg     Config
	backend proxy.Backend
	tracker *tracker.Tracker
	runner  *runner.Runner

	ipv6 bool

	// firstSync is closed by the first successful sync.
	firstSync     chan struct{}
	firstSyncOnce sync.Once

	// Only the runner's goroutine touches the fields below.

	// synced says a sync succeeded since the start or the last failure;
	// until then every sync is full.
	synced bool
	// ctPrevious holds, for each service changed since the last
	// successful sync, its model as that sync programmed it.
	ctPrevious map[string]*proxy.Service
	// ctCurrent holds the same services' models now (nil: deleted).
	ctCurrent proxy.Changes
	// ctReconcile asks the next cleanup to list the conntrack table
	// rather than trust ctPrevious (at start, after a failed cleanup).
	ctReconcile bool
	// triggers are the EndpointSlice trigger times of the changes not
	// yet synced (kept across failed syncs).
	triggers []time.Time
	// resync runs a sync when the backend asked for one
	// (SyncResult.ResyncAfter) with nothing changed by then.
	resync *time.Timer
}

// New returns a proxier; Run starts it.
func New(cfg Config) *Proxier {
	if cfg.MaxSyncInterval <= 0 {
		cfg.MaxSyncInterval = time.Hour
	}
	if cfg.Backend == nil {
		b := nftables.NewBackend(cfg.NFT, cfg.Render)
		cfg.Backend = b
		cfg.IPv6 = b.Renderer().Config().Family == knftables.IPv6Family
		cfg.NodeName = b.Renderer().Config().NodeName
	}
	p := &Proxier{cfg: cfg, backend: cfg.Backend, ipv6: cfg.IPv6, ctPrevious: map[string]*proxy.Service{}, ctCurrent: proxy.Changes{}, ctReconcile: true,
		firstSync: make(chan struct{})}
	p.tracker = tracker.New(p.ipv6)
	p.runner = runner.New(p.syncAndLog, runner.Config{
		MinInterval: cfg.MinSyncInterval, MaxInterval: cfg.MaxSyncInterval, FullInterval: cfg.FullSyncInterval, Clock: cfg.Clock,
		PartialSpacing: runner.PartialSyncSpacing,
	})
	return p
}

// FirstSynced is closed once a sync has succeeded: every Service the API
// had when the caches synced is programmed.
func (p *Proxier) FirstSynced() <-chan struct{} { return p.firstSync }

// Run watches the API and syncs until ctx ends.
func (p *Proxier) Run(ctx context.Context) error {
	if p.cfg.Serve != nil {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		served := make(chan struct{})
		go func() {
			defer close(served)
			err := p.cfg.Serve(ctx)
			if err == nil && ctx.Err() == nil {
				err = errors.New("stopped")
			}
			cancel(err)
		}()
		err := p.run(ctx)
		cancel(nil)
		<-served
		if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("proxy servers: %w", cause)
		}
		return err
	}
	return p.run(ctx)
}

func (p *Proxier) run(ctx context.Context) error {
	// As kube-proxy: objects another proxy serves (service-proxy-name) and
	// headless services' slices (left to DNS) are not even watched.
	// The cache keeps only what the tracker reads (tracker.Slim).
	//
	// Plain informers, not shared ones: a shared informer hands each event
	// to its handlers through a buffer that grows to the initial list's
	// size and never shrinks (1.9 MB at 10,000 Services and slices), and
	// indexes its cache by namespace (1 MB), which nothing here reads. A
	// plain informer calls the handlers as it pops the events (the tracker
	// only records them) and keeps a plain store.
	services := p.cfg.Client.CoreV1().Services(metav1.NamespaceAll)
	endpointSlices := p.cfg.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	svcs := p.informer(&v1.Service{}, listWatch(services.List, services.Watch), p.onService)
	slices := p.informer(&discovery.EndpointSlice{}, listWatch(endpointSlices.List, endpointSlices.Watch), p.onSlice)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, c := range []cache.Controller{svcs, slices} {
		wg.Go(func() { c.RunWithContext(ctx) })
	}
	// Syncing before the caches are full would delete the rules of every
	// service not yet seen.
	if !cache.WaitForNamedCacheSyncWithContext(ctx, svcs.HasSynced, slices.HasSynced) {
		return nil
	}
	p.runner.Loop(ctx)
	return nil
}

// listWatch lists and watches with list and watchFn, with watchSelector.
func listWatch[L runtime.Object](list func(context.Context, metav1.ListOptions) (L, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = watchSelector
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = watchSelector
			return watchFn(ctx, o)
		},
	}
}

// informer returns a plain informer of objects like obj from lw, compacted
// by tracker.Slim, that calls on for each event (deleted: a deletion).
func (p *Proxier) informer(obj runtime.Object, lw *cache.ListWatch, on func(obj any, deleted bool)) cache.Controller {
	_, c := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, p.cfg.Client),
		ObjectType:    obj,
		Transform:     tracker.Slim,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { on(obj, false) },
			UpdateFunc: func(_, obj any) { on(obj, false) },
			DeleteFunc: func(obj any) { on(obj, true) },
		},
	})
	return c
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// cached is an informer's object as the tracker's compact type C, which
// the informers' transform (tracker.Slim) made; an API object of type A
// (from an informer without the transform) is compacted here.
func cached[C, A any](obj any, compact func(A) C) (C, bool) {
	switch o := unwrap(obj).(type) {
	case C:
		return o, true
	case A:
		return compact(o), true
	}
	var zero C
	return zero, false
}

func (p *Proxier) onService(obj any, deleted bool) {
	svc, ok := cached(obj, tracker.CompactService)
	if !ok {
		return
	}
	if deleted {
		p.tracker.OnSvcDelete(svc)
	} else {
		p.tracker.OnSvc(svc)
	}
	p.cfg.Metrics.ServiceChanged()
	p.queue()
}

func (p *Proxier) onSlice(obj any, deleted bool) {
	slice, ok := cached(obj, tracker.CompactSlice)
	if !ok {
		return
	}
	if deleted {
		p.tracker.OnSliceDelete(slice)
	} else {
		p.tracker.OnSlice(slice)
	}
	if slice.AddressType == p.addressType() && slice.Service != "" {
		p.cfg.Metrics.EndpointsChanged()
	}
	p.queue()
}

func (p *Proxier) addressType() discovery.AddressType {
	if p.ipv6 {
		return discovery.AddressTypeIPv6
	}
	return discovery.AddressTypeIPv4
}

// queue asks for a sync when the event left a change to program.
func (p *Proxier) queue() {
	p.cfg.Metrics.SetPending(p.tracker.PendingChanges())
	if !p.tracker.Pending() {
		return
	}
	p.cfg.Health.QueuedUpdate()
	p.cfg.Metrics.Queued(p.now())
	p.runner.Run()
}

func (p *Proxier) now() time.Time {
	if p.cfg.Clock != nil {
		return p.cfg.Clock.Now()
	}
	return time.Now()
}

// syncAndLog is the runner's function: the runner retries a failed sync
// (with backoff) and this says why.
func (p *Proxier) syncAndLog(ctx context.Context, full bool) error {
	err := p.sync(ctx, full)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Service rules not synced; retrying with a full sync")
	}
	return err
}

// releaseAfterOps is the size of a full sync after which the proxy returns
// its freed memory to the kernel at once.
const releaseAfterOps = 20000

// sync is one transaction, full when asked or when the state is unknown.
func (p *Proxier) sync(ctx context.Context, full bool) (err error) {
	logger := klog.FromContext(ctx)
	start := p.now()
	round := p.tracker.Take()
	p.cfg.Metrics.SetPending(p.tracker.PendingChanges())
	services, changed := round.Services, round.Changed
	for key, prev := range round.Previous {
		if _, ok := p.ctPrevious[key]; !ok {
			p.ctPrevious[key] = prev
		}
	}
	for key, svc := range changed {
		p.ctCurrent[key] = svc
	}
	for _, ts := range round.TriggerTimes {
		p.triggers = append(p.triggers, ts...)
	}
	full = full || !p.synced
	defer func() {
		p.cfg.Metrics.SyncDone(full, p.now().Sub(start))
		if err != nil {
			// The rules lag the API until a sync succeeds.
			p.cfg.Health.QueuedUpdate()
		}
	}()
	res, err := p.backend.Sync(ctx, services, changed, full)
	if err != nil {
		// The backend's memory of the last sync may no longer match
		// what is installed, so the retry is a full sync.
		p.synced = false
		p.cfg.Metrics.SyncFailed()
		return err
	}
	p.synced = true
	p.firstSyncOnce.Do(func() { close(p.firstSync) })
	done := p.now()
	if full && res.Operations >= releaseAfterOps {
		// A large full sync built its whole transaction in memory (at
		// 10,000 Services about 150,000 operations and 100 MB), which
		// the runtime would hand back to the kernel only over minutes:
		// give it back now, so the node sees the proxy's steady size.
		// One garbage collection, once per large full sync, off the sync
		// loop so that a change queued behind the sync does not wait for it.
		go debug.FreeOSMemory()
	}
	switch {
	case res.ResyncAfter > 0 && p.resync == nil:
		p.resync = time.AfterFunc(res.ResyncAfter, p.runner.Run)
	case res.ResyncAfter > 0:
		p.resync.Reset(res.ResyncAfter)
	case p.resync != nil:
		p.resync.Stop()
	}
	p.cfg.Health.Updated()
	p.cfg.Metrics.Synced(done)
	for _, t := range p.triggers {
		p.cfg.Metrics.ProgrammingLatency(done.Sub(t))
	}
	p.triggers = nil
	p.cfg.Metrics.NoLocalEndpoints(noLocalEndpoints(services, p.cfg.NodeName))
	if p.cfg.ServiceHealth != nil {
		if err := p.cfg.ServiceHealth.Sync(healthChecks(services, p.cfg.NodeName)); err != nil {
			logger.Error(err, "Health check node port not served")
		}
	}
	for _, c := range res.Conflicts {
		logger.Error(c, "Service left out in part")
	}
	logger.V(2).Info("Synced service rules", "full", full, "services", len(services), "changed", len(changed),
		"operations", res.Operations, "took", done.Sub(start))
	p.cleanupConntrack(ctx, services)
	return nil
}

// healthChecks returns the services with a healthCheckNodePort and the
// number of their ready, not terminating endpoints on node (distinct
// addresses over all ports), as kube-proxy reports them.
func healthChecks(services []*proxy.Service, node string) map[types.NamespacedName]healthcheck.Service {
	out := map[types.NamespacedName]healthcheck.Service{}
	for _, svc := range services {
		if svc.HealthCheckNodePort == 0 {
			continue
		}
		local := map[netip.Addr]bool{}
		for i := range svc.Ports {
			for _, ep := range svc.Ports[i].Endpoints {
				if ep.Ready && node != "" && ep.NodeName == node {
					local[ep.IP] = true
				}
			}
		}
		out[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = healthcheck.Service{Port: svc.HealthCheckNodePort, LocalEndpoints: len(local)}
	}
	return out
}

// noLocalEndpoints counts the service ports with traffic policy Local that
// have usable endpoints but none on node, for internal traffic (the
// ClusterIP) and external traffic (NodePort, external and load-balancer
// IPs), as kube-proxy's metric does. A port with no endpoint at all is
// rejected, which is another matter.
func noLocalEndpoints(services []*proxy.Service, node string) (internal, external int) {
	for _, svc := range services {
		if !svc.InternalLocal && !svc.ExternalLocal {
			continue
		}
		for i := range svc.Ports {
			sp := &svc.Ports[i]
			if !proxy.HasUsable(sp.Endpoints, "") || (node != "" && proxy.HasUsable(sp.Endpoints, node)) {
				continue
			}
			if svc.InternalLocal {
				internal++
			}
			reachable := sp.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
			if svc.ExternalLocal && reachable {
				external++
			}
		}
	}
	return internal, external
}

// cleanupConntrack deletes the conntrack entries the changes since the
// last successful sync made stale. A failure is logged, not returned: the
// rules are in place, and the next sync reconciles the whole table.
func (p *Proxier) cleanupConntrack(ctx context.Context, services []*proxy.Service) {
	previous, current := p.ctPrevious, p.ctCurrent
	p.ctPrevious, p.ctCurrent = map[string]*proxy.Service{}, proxy.Changes{}
	if p.cfg.Conntrack == nil {
		return
	}
	logger := klog.FromContext(ctx)
	var filters []conntrack.Filter
	if p.ctReconcile {
		entries, err := p.cfg.Conntrack.List(p.ipv6)
		if err != nil {
			logger.Error(err, "Listing conntrack entries failed; retrying after the next sync")
			return
		}
		p.ctReconcile = false
		filters = conntrack.Reconcile(services, entries)
	} else {
		for key, prev := range previous {
			filters = append(filters, conntrack.Stale(prev, current[key])...)
		}
	}
	if len(filters) == 0 {
		return
	}
	n, err := p.cfg.Conntrack.Delete(p.ipv6, filters)
	p.cfg.Metrics.ConntrackDeleted(n)
	if err != nil {
		p.ctReconcile = true
		logger.Error(err, "Deleting stale conntrack entries failed; the next sync reconciles the table", "filters", len(filters), "deleted", n)
		return
	}
	logger.V(2).Info("Deleted stale conntrack entries", "filters", len(filters), "deleted", n)
}
