package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/healthcheck"
	"github.com/flatnet/flatnet/internal/proxy/metrics"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/proxier"
)

// Defaults of the proxy's servers. kube-proxy serves metrics on
// 127.0.0.1:10249 too, but health on 0.0.0.0:10256; flatnet keeps both on
// loopback unless asked, so pods cannot reach them.
const (
	DefaultMetricsBindAddress = "127.0.0.1:10249"
	DefaultHealthzBindAddress = "127.0.0.1:10256"
)

// addProxyFlags registers the Service proxy's tuning and server flags.
func addProxyFlags(fs *pflag.FlagSet, o *Options) {
	fs.StringVar(&o.ProxyMode, "proxy-mode", ProxyModeAuto, "--proxy, --proxy-only: how Services are served: nftables, iptables, userspace (Go proxies on the service addresses), or auto (the first of those that works here; the choice is logged). The other modes' rules are removed at start")
	fs.DurationVar(&o.ProxyMinSyncPeriod, "proxy-min-sync-period", 0, "--proxy: the least time between two rule syncs (bursts of changes are coalesced). Apart from it a sync after a partial one that took d waits 10 d, so syncs take at most a tenth of the time; kube-proxy's fixed 1s made every change under steady churn wait up to a second (docs/proxy.md)")
	fs.DurationVar(&o.ProxySyncPeriod, "proxy-sync-period", 30*time.Second, "--proxy: kube-proxy's syncPeriod: /healthz fails when a change waits more than twice it, and a failed sync is retried at least this often")
	fs.DurationVar(&o.ProxyFullSyncPeriod, "proxy-full-sync-period", time.Hour, "--proxy, --proxy-only: how often the Service rules are listed and rewritten in full (kube-proxy's fixed full-sync period, an hour), repairing drift such as a foreign edit of the table; every other sync writes only what changed; 0: every --proxy-sync-period")
	fs.DurationVar(&o.ProxyModulusHold, "proxy-modulus-hold", nftables.DefaultModulusHold, "--proxy, --proxy-only, nftables mode: when a Service loses an endpoint, its dispatch rule keeps its endpoint count this long, the leaver's slot taking a second copy of another endpoint (at most one per four endpoints, so none gets more than twice its share), so that a replacement joining within it changes map elements only: a rule change makes the kernel validate the whole table (~10 ms a sync at 10,000 Services, docs/proxy.md); 0: the exact count at once, as kube-proxy")
	fs.BoolVar(&o.ProxyProfiling, "profiling", false, "--proxy: also serve Go's /debug/pprof/ (heap, CPU, goroutine profiles) on --metrics-bind-address, as kube-proxy's --profiling does")
	fs.BoolVar(&o.ProxyNFTablesExec, "proxy-nftables-exec", false, "--proxy: the nftables mode pipes each sync to an nft process instead of committing it over netlink in process (the old path, for debugging)")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", DefaultMetricsBindAddress,
		"--proxy: IP:port of the proxy's Prometheus metrics (/metrics, kube-proxy's metrics named flatnet_*); \"\" or \"0\" disables. "+
			"Loopback by default (as kube-proxy's), so pods cannot read it; 0.0.0.0:10249 for a scraper on another host")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", DefaultHealthzBindAddress,
		"--proxy: IP:port of the proxy's /healthz and /livez (200 while rule syncs keep up with the API, else 503); \"\" or \"0\" disables. "+
			"Loopback by default, unlike kube-proxy's 0.0.0.0:10256, so pods cannot reach it; set 0.0.0.0:10256 when a load balancer or a probe from off the node checks it")
}

// proxyServersConfig configures the servers of a node's proxiers.
type proxyServersConfig struct {
	NodeName string
	// SyncPeriod: /healthz fails when a change waits more than twice it.
	SyncPeriod time.Duration
	// MetricsBindAddress, HealthzBindAddress: IP:port; "" or "0" disables.
	MetricsBindAddress string
	HealthzBindAddress string
	// HardFail makes a server that cannot listen an error that stops the
	// proxy (kube-proxy's bindAddressHardFail); otherwise it is logged and
	// retried every 5 s, as kube-proxy does.
	HardFail bool
	// NFTablesExec: the nftables mode runs nft instead of netlink.
	NFTablesExec bool
	// Profiling serves /debug/pprof/ on the metrics server.
	Profiling bool
	// Collectors are served on the metrics server beside the proxy's
	// (the lab runtime's CNI timings).
	Collectors []prometheus.Collector
}

// proxyServers are what a node's proxiers (one per IP family) share: the
// metrics, /healthz and /livez (healthy when every family is), and the
// healthCheckNodePort listeners of LoadBalancer Services with
// externalTrafficPolicy Local (opened and closed by the proxiers' syncs,
// closed when the servers stop). Both
// --proxy and --proxy-only build them with newProxyServers, give every
// proxier's config to configure, and let the first proxier run them.
type proxyServers struct {
	cfg      proxyServersConfig
	client   kubernetes.Interface
	metrics  *metrics.Metrics
	health   *healthcheck.ProxierHealth
	services *healthcheck.ServiceHealth
	// configured counts the proxiers configured so far.
	configured int
}

// newProxyServers validates the addresses and builds the servers; client
// (nil in tests) is used to follow the Node's eligibility for /healthz.
func newProxyServers(client kubernetes.Interface, mode string, cfg proxyServersConfig) (*proxyServers, error) {
	var errs []error
	for _, a := range []struct{ flag, value string }{
		{"--metrics-bind-address", cfg.MetricsBindAddress}, {"--healthz-bind-address", cfg.HealthzBindAddress},
	} {
		if err := checkBindAddress(a.value); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.value, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m := metrics.New()
	for _, c := range cfg.Collectors {
		if err := m.Registry().Register(c); err != nil {
			return nil, fmt.Errorf("serving more metrics on %s: %w", cfg.MetricsBindAddress, err)
		}
	}
	// kube-proxy answers its own mode here.
	m.ProxyMode = mode
	m.Profiling = cfg.Profiling
	health := healthcheck.NewProxierHealth(healthcheck.ProxierHealthConfig{
		NodeName: cfg.NodeName,
		// kube-proxy's healthzTimeout.
		Timeout: 2 * cfg.SyncPeriod,
		Served:  m.Served,
	})
	return &proxyServers{
		cfg:      cfg,
		client:   client,
		metrics:  m,
		health:   health,
		services: healthcheck.NewServiceHealth(healthcheck.ServiceHealthConfig{ProxyHealthy: health.IsHealthy}),
	}, nil
}

// bindDisabled reports whether a bind address turns its server off.
func bindDisabled(addr string) bool { return addr == "" || addr == "0" }

// checkBindAddress accepts IP:port, or "" and "0" (disabled).
func checkBindAddress(addr string) error {
	if bindDisabled(addr) {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w (want IP:port, e.g. 127.0.0.1:10256, or \"\" to disable)", err)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q is not an IP address (want IP:port)", host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// configure gives cfg (one family's proxier) its metrics and health
// handles; the first proxier configured counts Service changes (every
// proxier sees every Service) and runs the servers.
func (s *proxyServers) configure(cfg *proxier.Config) {
	family := metrics.IPv4
	if cfg.IPv6 {
		family = metrics.IPv6
	}
	first := s.configured == 0
	s.configured++
	cfg.Metrics = s.metrics.Proxier(family, first)
	cfg.Health = s.health.Family(family)
	cfg.ServiceHealth = s.services.Family(family)
	if first {
		cfg.Serve = s.run
	}
}

// run serves until ctx ends.
func (s *proxyServers) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	start := func(name, addr string, serve func(context.Context, string) error) {
		if bindDisabled(addr) {
			return
		}
		wg.Go(func() {
			if err := serveRetrying(ctx, logger, name, addr, serve, s.cfg.HardFail); err != nil {
				cancel(err)
			}
		})
	}
	start("metrics", s.cfg.MetricsBindAddress, s.metrics.Serve)
	start("healthz", s.cfg.HealthzBindAddress, s.health.Serve)
	if s.client != nil && s.cfg.NodeName != "" {
		wg.Go(func() {
			if err := s.health.WatchNode(ctx, s.client); err != nil {
				cancel(err)
			}
		})
	}
	<-ctx.Done()
	s.services.Close()
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// serveRetrying runs serve until ctx ends. A failure (the address in use,
// say) is returned with hardFail, else logged and retried after 5 s.
func serveRetrying(ctx context.Context, logger klog.Logger, name, addr string, serve func(context.Context, string) error, hardFail bool) error {
	for {
		err := serve(ctx, addr)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("stopped")
		}
		if hardFail {
			return fmt.Errorf("%s server: %w", name, err)
		}
		logger.Error(err, "Proxy server failed; retrying", "server", name, "address", addr, "in", "5s")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
}

// newProxiers returns one Service proxier per family of the cluster CIDRs
// (--proxy), each on its own nftables table; the first also runs the
// metrics (with more, the collectors) and health servers.
func newProxiers(ctx context.Context, client kubernetes.Interface, o Options, cidrs []netip.Prefix, more ...prometheus.Collector) ([]*proxier.Proxier, error) {
	var renders []nftables.Config
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		var famCIDRs []netip.Prefix
		for _, c := range cidrs {
			if c.Addr().Is6() == (fam == knftables.IPv6Family) {
				famCIDRs = append(famCIDRs, c)
			}
		}
		if len(famCIDRs) > 0 {
			renders = append(renders, nftables.Config{Family: fam, Table: nftables.DefaultTable, NodeName: o.NodeName, ClusterCIDRs: famCIDRs,
				ModulusHold: o.ProxyModulusHold})
		}
	}
	return buildProxiers(ctx, client, o.ProxyMode, proxyServersConfig{
		NodeName:           o.NodeName,
		SyncPeriod:         o.ProxySyncPeriod,
		MetricsBindAddress: o.MetricsBindAddress,
		HealthzBindAddress: o.HealthzBindAddress,
		Profiling:          o.ProxyProfiling,
		NFTablesExec:       o.ProxyNFTablesExec,
		Collectors:         more,
	}, renders, syncPeriods{o.ProxyMinSyncPeriod, o.ProxySyncPeriod, o.ProxyFullSyncPeriod}, "--proxy")
}

// syncPeriods are the proxier's runner intervals (proxier.Config).
type syncPeriods struct{ min, max, full time.Duration }

// buildProxiers picks the proxy mode (mode may be auto) and returns one
// proxier per render config (a family; the nftables mode's table), with
// the shared metrics and health servers (run by the first). flag names the
// agent's mode in errors.
func buildProxiers(ctx context.Context, client kubernetes.Interface, mode string, sc proxyServersConfig, renders []nftables.Config, periods syncPeriods, flag string) ([]*proxier.Proxier, error) {
	kits := proxyModeKits()
	if !sc.NFTablesExec {
		kits[ProxyModeNFTables] = overNetlink(kits[ProxyModeNFTables])
	}
	mode, err := pickProxyMode(ctx, mode, kits)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	servers, err := newProxyServers(client, mode, sc)
	if err != nil {
		return nil, err
	}
	var out []*proxier.Proxier
	for _, r := range renders {
		b, err := kits[mode].backend(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		cfg := proxier.Config{
			Client:   client,
			Backend:  b,
			IPv6:     r.Family == knftables.IPv6Family,
			NodeName: r.NodeName,
			// --proxy-only: kube-proxy's defaults, minSyncPeriod 1s,
			// syncPeriod 30s, a full sync hourly; --proxy: no fixed
			// minimum (spaced by the syncs' own duration), 30s, hourly.
			MinSyncInterval:  periods.min,
			MaxSyncInterval:  periods.max,
			FullSyncInterval: periods.full,
		}
		// Stale UDP/SCTP flows are deleted in the agent's netns; the
		// userspace mode NATs nothing, so it leaves no stale entry.
		if mode != ProxyModeUserspace {
			cfg.Conntrack = conntrack.Netlink{}
		}
		servers.configure(&cfg)
		out = append(out, proxier.New(cfg))
	}
	return out, nil
}

// runProxier runs p until ctx ends; an early stop is an error.
func runProxier(ctx context.Context, p *proxier.Proxier) error {
	if err := p.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return fmt.Errorf("stopped")
	}
	return nil
}
