// Package proxier is flatnet's Service proxy loop for one address family:
// informers on Services and EndpointSlices feed a change tracker
// (proxy/tracker), and a bounded-frequency runner (proxy/runner) turns what
// changed into one nftables transaction (proxy/nftables) run by the nft
// runner.
//
// Design. The first sync, every periodic one (MaxSyncInterval) and the one
// after a failed transaction are full syncs: they read the table's chains
// and sets first and reconcile against them, so a restarted agent neither
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
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/runner"
	"github.com/flatnet/flatnet/internal/proxy/tracker"
)

// watchSelector leaves out Services and EndpointSlices the proxy must not
// serve, with the labels kube-proxy honours.
const watchSelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// NFT is what the proxier needs from nftables: nft.Runner and nft.Fake
// (bound to the renderer's family and table) implement it.
type NFT interface {
	NewTransaction() *knftables.Transaction
	Run(ctx context.Context, tx *knftables.Transaction) error
	// ListAll names the table's objects by type ("chain", "set", ...) in
	// one read; a missing table is nil or a not-found error.
	ListAll(ctx context.Context) (map[string][]string, error)
}

// Config configures a Proxier.
type Config struct {
	Client kubernetes.Interface
	NFT    NFT
	Render nftables.Config
	// MinSyncInterval bounds how often syncs start; MaxSyncInterval is the
	// period of full resyncs.
	MinSyncInterval time.Duration
	MaxSyncInterval time.Duration
	Clock           runner.Clock // the system clock when nil
	// Conntrack, when set, is where stale UDP and SCTP entries are
	// deleted after each sync (conntrack.Netlink{} on a node).
	Conntrack conntrack.Interface
}

// Proxier keeps one family's Service rules in sync with the API.
type Proxier struct {
	cfg      Config
	renderer *nftables.Renderer
	tracker  *tracker.Tracker
	runner   *runner.Runner

	ipv6 bool

	// Only the runner's goroutine touches the fields below.

	// state is what the last successful sync wrote; nil forces a full sync.
	state *nftables.State
	// ctPrevious holds, for each service changed since the last
	// successful sync, its model as that sync programmed it.
	ctPrevious map[string]*proxy.Service
	// ctReconcile asks the next cleanup to list the conntrack table
	// rather than trust ctPrevious (at start, after a failed cleanup).
	ctReconcile bool
}

// New returns a proxier; Run starts it.
func New(cfg Config) *Proxier {
	if cfg.MaxSyncInterval <= 0 {
		cfg.MaxSyncInterval = time.Hour
	}
	p := &Proxier{cfg: cfg, renderer: nftables.New(cfg.Render), ctPrevious: map[string]*proxy.Service{}, ctReconcile: true}
	p.ipv6 = p.renderer.Config().Family == knftables.IPv6Family
	p.tracker = tracker.New(p.ipv6)
	p.runner = runner.New(p.syncAndLog, runner.Config{
		MinInterval: cfg.MinSyncInterval, MaxInterval: cfg.MaxSyncInterval, Clock: cfg.Clock,
	})
	return p
}

// Run watches the API and syncs until ctx ends.
func (p *Proxier) Run(ctx context.Context) error {
	// As kube-proxy: objects another proxy serves (service-proxy-name) and
	// headless services' slices (left to DNS) are not even watched.
	factory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = watchSelector }))
	svcReg, err := factory.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onService(obj, false) },
		UpdateFunc: func(_, obj any) { p.onService(obj, false) },
		DeleteFunc: func(obj any) { p.onService(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watching services: %w", err)
	}
	epReg, err := factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onSlice(obj, false) },
		UpdateFunc: func(_, obj any) { p.onSlice(obj, false) },
		DeleteFunc: func(obj any) { p.onSlice(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("watching endpointslices: %w", err)
	}
	factory.StartWithContext(ctx)
	defer factory.Shutdown()
	// Syncing before the caches are full would delete the rules of every
	// service not yet seen.
	if !cache.WaitForNamedCacheSyncWithContext(ctx, svcReg.HasSynced, epReg.HasSynced) {
		return nil
	}
	p.runner.Loop(ctx)
	return nil
}

func unwrap(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

func (p *Proxier) onService(obj any, deleted bool) {
	svc, ok := unwrap(obj).(*v1.Service)
	if !ok {
		return
	}
	if deleted {
		p.tracker.OnServiceDelete(svc)
	} else {
		p.tracker.OnService(svc)
	}
	if p.tracker.Pending() {
		p.runner.Run()
	}
}

func (p *Proxier) onSlice(obj any, deleted bool) {
	slice, ok := unwrap(obj).(*discovery.EndpointSlice)
	if !ok {
		return
	}
	if deleted {
		p.tracker.OnEndpointSliceDelete(slice)
	} else {
		p.tracker.OnEndpointSlice(slice)
	}
	if p.tracker.Pending() {
		p.runner.Run()
	}
}

// syncAndLog is the runner's function: the runner retries a failed sync
// and this says why.
func (p *Proxier) syncAndLog(ctx context.Context, periodic bool) error {
	err := p.sync(ctx, periodic)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Service rules not synced; retrying with a full sync")
	}
	return err
}

// sync is one transaction, full or partial.
func (p *Proxier) sync(ctx context.Context, periodic bool) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	round := p.tracker.Take()
	services, changed := round.Services, round.Changed
	for key, prev := range round.Previous {
		if _, ok := p.ctPrevious[key]; !ok {
			p.ctPrevious[key] = prev
		}
	}
	full := periodic || p.state == nil
	tx := p.cfg.NFT.NewTransaction()
	var next *nftables.State
	if full {
		existing, err := p.existing(ctx)
		if err != nil {
			p.state = nil
			return err
		}
		next = p.renderer.Full(tx, services, p.state, existing)
	} else {
		next = p.renderer.Partial(tx, services, p.state, changed)
	}
	if err := p.cfg.NFT.Run(ctx, tx); err != nil {
		// Partial updated the state in place; it no longer matches the
		// kernel, so the retry is a full sync from a fresh listing.
		p.state = nil
		return fmt.Errorf("syncing service rules (%d operations): %w", tx.NumOperations(), err)
	}
	p.state = next
	for _, c := range next.Conflicts {
		logger.Error(c, "Service left out in part")
	}
	logger.V(2).Info("Synced service rules", "full", full, "services", len(services), "changed", len(changed),
		"operations", tx.NumOperations(), "took", time.Since(start))
	p.cleanupConntrack(ctx, services)
	return nil
}

// cleanupConntrack deletes the conntrack entries the changes since the
// last successful sync made stale. A failure is logged, not returned: the
// rules are in place, and the next sync reconciles the whole table.
func (p *Proxier) cleanupConntrack(ctx context.Context, services []*proxy.Service) {
	previous := p.ctPrevious
	p.ctPrevious = map[string]*proxy.Service{}
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
		current := make(map[string]*proxy.Service, len(previous))
		for _, svc := range services {
			if _, ok := previous[svc.Key()]; ok {
				current[svc.Key()] = svc
			}
		}
		for key, prev := range previous {
			filters = append(filters, conntrack.Stale(prev, current[key])...)
		}
	}
	if len(filters) == 0 {
		return
	}
	n, err := p.cfg.Conntrack.Delete(p.ipv6, filters)
	if err != nil {
		p.ctReconcile = true
		logger.Error(err, "Deleting stale conntrack entries failed; the next sync reconciles the table", "filters", len(filters), "deleted", n)
		return
	}
	logger.V(2).Info("Deleted stale conntrack entries", "filters", len(filters), "deleted", n)
}

// existing lists the table's chains and sets; nil when the table is absent.
func (p *Proxier) existing(ctx context.Context) (*nftables.Existing, error) {
	all, err := p.cfg.NFT.ListAll(ctx)
	if nft.IsNotFound(err) || (err == nil && all == nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing table: %w", err)
	}
	return &nftables.Existing{Chains: all["chain"], Sets: all["set"]}, nil
}
