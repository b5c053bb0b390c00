package server

import (
	"context"
	"io"
	"net/http"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flatnet/flatnet/internal/dns/forward"
	"github.com/flatnet/flatnet/internal/httpserver"
)

// Metrics are CoreDNS's DNS metrics (plugin/metrics/vars, the cache and
// forward plugins) under the flatnet_dns_ prefix, with the labels that
// mean something here: there is one server, one zone and no views, so
// CoreDNS's server, zone and view labels are left out. The per-query
// counters are resolved to their label children once, up front: a query
// costs a few atomic adds.
type Metrics struct {
	registry *prometheus.Registry

	requests   [2][2][len(countedTypes) + 1]prometheus.Counter // proto, family, type
	duration   [len(countedTypes) + 1]prometheus.Observer
	responses  map[int]prometheus.Counter // by rcode; other rcodes share rcodeOther
	rcodeOther prometheus.Counter

	cacheHits, cacheMisses prometheus.Counter // the packed-reply cache
	autopath               prometheus.Counter
	drops                  prometheus.Counter
}

// countedTypes get a type label of their own, as CoreDNS's monitored
// types; every other type is counted as "other".
var countedTypes = [...]uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypePTR, dns.TypeTXT, dns.TypeCNAME, dns.TypeSOA, dns.TypeNS, dns.TypeMX, dns.TypeANY}

func typeIndex(t uint16) int {
	for i, c := range countedTypes {
		if c == t {
			return i
		}
	}
	return len(countedTypes)
}

func typeLabel(i int) string {
	if i == len(countedTypes) {
		return "other"
	}
	return dns.TypeToString[countedTypes[i]]
}

const (
	hitsHelp   = "The count of cache hits (cache: cluster for packed replies to cluster names, forward for forwarded names)."
	missesHelp = "The count of cache misses (cache: cluster or forward, as cache_hits_total)."
)

// NewMetrics registers the server's metrics, and the forwarder's counters
// when fwd is not nil, in a registry of their own.
func NewMetrics(fwd *forward.Forwarder) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	const ns, sub = "flatnet", "dns"
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "Counter of DNS requests made per protocol, family and type."}, []string{"proto", "family", "type"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
		Help:    "Histogram of the time (in seconds) each request took per type.",
		Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16)}, []string{"type"})
	responses := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "responses_total",
		Help: "Counter of response status codes."}, []string{"rcode"})
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_hits_total",
		Help: hitsHelp}, []string{"cache"})
	misses := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_misses_total",
		Help: missesHelp}, []string{"cache"})
	autopath := prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "autopath_success_total",
		Help: "Counter of requests answered in one round trip by autopath."})
	drops := prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dropped_requests_total",
		Help: "Counter of UDP requests dropped because MaxSlowQueries were being answered (mostly waiting on upstreams)."})
	reg.MustRegister(requests, duration, responses, hits, misses, autopath, drops)

	m := &Metrics{registry: reg, responses: map[int]prometheus.Counter{}, autopath: autopath, drops: drops,
		cacheHits: hits.WithLabelValues("cluster"), cacheMisses: misses.WithLabelValues("cluster")}
	for p, proto := range []string{"udp", "tcp"} {
		for f, fam := range []string{"1", "2"} {
			for t := range m.requests[p][f] {
				m.requests[p][f][t] = requests.WithLabelValues(proto, fam, typeLabel(t))
			}
		}
	}
	for t := range m.duration {
		m.duration[t] = duration.WithLabelValues(typeLabel(t))
	}
	for _, rc := range []int{dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure, dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeBadVers} {
		label := dns.RcodeToString[rc]
		if rc == dns.RcodeBadVers {
			label = "BADVERS" // 16 is also TSIG's BADSIG, the name miekg/dns prints
		}
		m.responses[rc] = responses.WithLabelValues(label)
	}
	m.rcodeOther = responses.WithLabelValues("other")

	if fwd != nil {
		stat := func(f func(forward.Stats) uint64) func() float64 {
			return func() float64 { return float64(f(fwd.Stats())) }
		}
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forward_requests_total",
				Help: "Counter of requests sent to upstream resolvers (one per try)."}, stat(func(s forward.Stats) uint64 { return s.Forwards })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forward_errors_total",
				Help: "Counter of upstream tries that failed (network error, timeout, SERVFAIL or REFUSED)."}, stat(func(s forward.Stats) uint64 { return s.ForwardErrors })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forward_cache_evictions_total",
				Help: "Counter of forwarded answers evicted from the bounded cache."}, stat(func(s forward.Stats) uint64 { return s.CacheEvictions })),
		)
		// The forward cache's hits and misses are exported under the
		// shared cache_*_total names with cache="forward".
		reg.MustRegister(forwardCacheCollector{fwd: fwd,
			hits:   prometheus.NewDesc(ns+"_"+sub+"_cache_hits_total", hitsHelp, []string{"cache"}, nil),
			misses: prometheus.NewDesc(ns+"_"+sub+"_cache_misses_total", missesHelp, []string{"cache"}, nil)})
	}
	return m
}

// forwardCacheCollector reads the forwarder's cache counters at scrape.
type forwardCacheCollector struct {
	fwd          *forward.Forwarder
	hits, misses *prometheus.Desc
}

func (c forwardCacheCollector) Describe(chan<- *prometheus.Desc) {} // unchecked: shares names with hits/misses

func (c forwardCacheCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.fwd.Stats()
	ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, float64(s.CacheHits), "forward")
	ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, float64(s.CacheMisses), "forward")
}

// Registry is where the metrics live (tests read it).
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Serve serves on addr until ctx ends: /metrics; /health, 200 while the
// process runs (CoreDNS's health plugin); /ready, 200 once ready says the
// server answers from synced records, 503 before (CoreDNS's ready plugin).
func (m *Metrics) Serve(ctx context.Context, addr string, ready func() bool) error {
	return httpserver.Serve(ctx, addr, m.mux(ready))
}

func (m *Metrics) mux(ready func() bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "OK") }) //nolint:errcheck
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "records not synced yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "OK") //nolint:errcheck
	})
	return mux
}

// observe counts one answered query.
func (m *Metrics) observe(tcp, v6 bool, qtype uint16, rcode int, seconds float64) {
	if m == nil {
		return
	}
	p, f := 0, 0
	if tcp {
		p = 1
	}
	if v6 {
		f = 1
	}
	t := typeIndex(qtype)
	m.requests[p][f][t].Inc()
	m.duration[t].Observe(seconds)
	if c, ok := m.responses[rcode]; ok {
		c.Inc()
	} else {
		m.rcodeOther.Inc()
	}
}

func (m *Metrics) hit(hit bool) {
	if m == nil {
		return
	}
	if hit {
		m.cacheHits.Inc()
	} else {
		m.cacheMisses.Inc()
	}
}

func (m *Metrics) dropped() {
	if m != nil {
		m.drops.Inc()
	}
}

func (m *Metrics) autopathed() {
	if m != nil {
		m.autopath.Inc()
	}
}
