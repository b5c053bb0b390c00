// Package metrics holds the Service proxy's Prometheus metrics: kube-proxy's
// names and meanings (k8s.io/kubernetes pkg/proxy/metrics, subsystem
// "kubeproxy") under the "flatnet" prefix, in a registry of their own, so
// dashboards and alerts written for kube-proxy need only the prefix
// changed.
//
// A node runs one proxier per IP family; per-family metrics carry the
// ip_family label ("IPv4", "IPv6") as kube-proxy's do. The change counters
// have no label in kube-proxy: here each Service event is counted once
// (by the proxier made with CountServiceChanges) and each EndpointSlice
// event by the proxier of its address type, so a dual-stack node does not
// count everything twice.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flatnet/flatnet/internal/httpserver"
)

const namespace = "flatnet"

// IP family label values, as kube-proxy's.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Metrics is the registry and every proxy metric. Create it with New.
type Metrics struct {
	registry *prometheus.Registry
	// ProxyMode is what /proxyMode answers, as kube-proxy's metrics
	// server does ("nftables"); empty: no /proxyMode.
	ProxyMode string
	// Profiling adds Go's /debug/pprof/ handlers (kube-proxy's
	// enableProfiling): heap and CPU profiles of a running proxy.
	Profiling bool

	syncDuration        *prometheus.HistogramVec
	syncFullDuration    *prometheus.HistogramVec
	syncPartialDuration *prometheus.HistogramVec
	networkProgramming  *prometheus.HistogramVec
	lastSynced          *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	endpointChanges     prometheus.Counter
	endpointPending     prometheus.Gauge
	serviceChanges      prometheus.Counter
	servicePending      prometheus.Gauge
	noLocalEndpoints    *prometheus.GaugeVec
	syncFailures        *prometheus.CounterVec
	conntrackDeleted    *prometheus.CounterVec
	healthz             *prometheus.CounterVec
	livez               *prometheus.CounterVec

	mu      sync.Mutex // protects pending
	pending map[string][2]int
}

// New returns the metrics registered in a new registry, with Go runtime
// and process metrics, as kube-proxy serves them.
func New() *Metrics {
	byFamily := []string{"ip_family"}
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, byFamily)
	}
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15) // 1 ms to 16 s, as kube-proxy
	m := &Metrics{
		registry:            prometheus.NewRegistry(),
		syncDuration:        histogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets),
		syncFullDuration:    histogram("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets),
		syncPartialDuration: histogram("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets),
		// From the EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time
		// (set by the controller when a pod or service changed) to the
		// rules in place; the control plane's clock against the node's.
		networkProgramming: histogram("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", programmingBuckets()),
		lastSynced: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}, byFamily),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued"}, byFamily),
		endpointChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}),
		endpointPending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes"}),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes"}),
		servicePending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes"}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"ip_family", "traffic_policy"}),
		// kube-proxy's iptables mode calls this
		// sync_proxy_rules_iptables_restore_failures_total; its nftables
		// mode, like flatnet, sync_proxy_rules_nftables_sync_failures_total:
		// a transaction the kernel refused.
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "sync_proxy_rules_nftables_sync_failures_total",
			Help: "Cumulative proxy nftables sync failures"}, byFamily),
		conntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "conntrack_reconciler_deleted_entries_total",
			Help: "Cumulative conntrack flows deleted by conntrack reconciler"}, byFamily),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status"}, []string{"code"}),
		pending: map[string][2]int{},
	}
	m.registry.MustRegister(m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.networkProgramming,
		m.lastSynced, m.lastQueued, m.endpointChanges, m.endpointPending, m.serviceChanges, m.servicePending,
		m.noLocalEndpoints, m.syncFailures, m.conntrackDeleted, m.healthz, m.livez,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// programmingBuckets are kube-proxy's: 0.25 s and 0.5 s, every second to
// a minute, every 5 s to 2 minutes, every 30 s to 5 minutes.
func programmingBuckets() []float64 {
	out := []float64{0.25, 0.5}
	out = append(out, prometheus.LinearBuckets(1, 1, 59)...)
	out = append(out, prometheus.LinearBuckets(60, 5, 12)...)
	return append(out, prometheus.LinearBuckets(120, 30, 7)...)
}

// Registry is the metrics' registry (for tests, or to add more).
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// Serve serves /metrics (and /proxyMode) on addr (host:port) until ctx
// ends. It returns the listen error at once, nil when ctx ends.
func (m *Metrics) Serve(ctx context.Context, addr string) error {
	return httpserver.Serve(ctx, addr, m.Mux())
}

// Mux is what Serve serves: /metrics, and /proxyMode as kube-proxy's
// metrics port has it (tools and the e2e suite read the mode there), and
// with Profiling Go's /debug/pprof/ as kube-proxy's enableProfiling adds.
func (m *Metrics) Mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	if m.Profiling {
		httpserver.AddProfiling(mux)
	}
	if m.ProxyMode != "" {
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte(m.ProxyMode))
		})
	}
	return mux
}

// Served counts a /healthz or /livez answer (the health server's hook).
func (m *Metrics) Served(path string, code int) {
	if m == nil {
		return
	}
	switch path {
	case "/healthz":
		m.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
	case "/livez":
		m.livez.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// Proxier returns the recorder of one family's proxier (IPv4 or IPv6).
// countServiceChanges: this proxier counts Service events (give it to
// exactly one of a node's proxiers; every one sees every Service).
func (m *Metrics) Proxier(family string, countServiceChanges bool) *Proxier {
	// Counters show from the start, at 0, rather than at their first
	// increment, so a rate() or an alert has a series to work on.
	m.syncFailures.WithLabelValues(family)
	m.conntrackDeleted.WithLabelValues(family)
	return &Proxier{m: m, family: family, countServices: countServiceChanges}
}

func (m *Metrics) setPending(family string, services, endpoints int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending[family] = [2]int{services, endpoints}
	var s, e int
	for _, p := range m.pending {
		s, e = s+p[0], e+p[1]
	}
	m.servicePending.Set(float64(s))
	m.endpointPending.Set(float64(e))
}

// Proxier records one proxier's metrics. A nil *Proxier records nothing.
type Proxier struct {
	m             *Metrics
	family        string
	countServices bool
}

// ServiceChanged counts a Service event.
func (p *Proxier) ServiceChanged() {
	if p != nil && p.countServices {
		p.m.serviceChanges.Inc()
	}
}

// EndpointsChanged counts an EndpointSlice event of the proxier's family.
func (p *Proxier) EndpointsChanged() {
	if p != nil {
		p.m.endpointChanges.Inc()
	}
}

// SetPending sets how many Service changes (services) and EndpointSlice
// changes wait for the next sync.
func (p *Proxier) SetPending(services, endpoints int) {
	if p == nil {
		return
	}
	if !p.countServices {
		services = 0
	}
	p.m.setPending(p.family, services, endpoints)
}

// Queued records that a sync was asked for now.
func (p *Proxier) Queued(now time.Time) {
	if p != nil {
		p.m.lastQueued.WithLabelValues(p.family).Set(seconds(now))
	}
}

// SyncDone records one sync's duration, successful or not.
func (p *Proxier) SyncDone(full bool, took time.Duration) {
	if p == nil {
		return
	}
	p.m.syncDuration.WithLabelValues(p.family).Observe(took.Seconds())
	if full {
		p.m.syncFullDuration.WithLabelValues(p.family).Observe(took.Seconds())
	} else {
		p.m.syncPartialDuration.WithLabelValues(p.family).Observe(took.Seconds())
	}
}

// Synced records a successful sync at now.
func (p *Proxier) Synced(now time.Time) {
	if p != nil {
		p.m.lastSynced.WithLabelValues(p.family).Set(seconds(now))
	}
}

// SyncFailed counts a transaction the kernel refused.
func (p *Proxier) SyncFailed() {
	if p != nil {
		p.m.syncFailures.WithLabelValues(p.family).Inc()
	}
}

// ProgrammingLatency records the time from a change's trigger (the
// EndpointSlice's last-change-trigger-time) to its rules being in place.
func (p *Proxier) ProgrammingLatency(d time.Duration) {
	if p != nil {
		p.m.networkProgramming.WithLabelValues(p.family).Observe(d.Seconds())
	}
}

// NoLocalEndpoints sets how many service ports with traffic policy Local
// (internal, external) have endpoints but none on this node.
func (p *Proxier) NoLocalEndpoints(internal, external int) {
	if p == nil {
		return
	}
	p.m.noLocalEndpoints.WithLabelValues(p.family, "internal").Set(float64(internal))
	p.m.noLocalEndpoints.WithLabelValues(p.family, "external").Set(float64(external))
}

// ConntrackDeleted counts deleted conntrack entries.
func (p *Proxier) ConntrackDeleted(n int) {
	if p != nil && n > 0 {
		p.m.conntrackDeleted.WithLabelValues(p.family).Add(float64(n))
	}
}

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
