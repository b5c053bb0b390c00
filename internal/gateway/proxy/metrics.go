package proxy

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

const namespace = "flatnet_gateway"

// metrics are the proxy's collectors. Label values come from the table
// (route and backend names) and from a bounded set (status codes,
// error reasons), so cardinality follows the configuration, not traffic.
type metrics struct {
	requests       *prometheus.CounterVec   // route, backend, code
	duration       *prometheus.HistogramVec // route
	upstreamErrors *prometheus.CounterVec   // backend, reason
	generation     prometheus.Gauge
	updates        prometheus.Counter

	mu     sync.Mutex // protects routes, backends
	routes map[string]bool
	// backends are the backend label values series were made for.
	backends map[string]bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "requests_total",
			Help: "Requests answered, by route (kind/namespace/name, \"\" when none matched), backend and status code."},
			[]string{"route", "backend", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "request_duration_seconds",
			Help:    "Time from a request's arrival to the end of its answer, by route.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}},
			[]string{"route"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "upstream_errors_total",
			Help: "Requests to a backend that got no answer, by backend and reason (connect, timeout, backend_timeout, reset, canceled)."},
			[]string{"backend", "reason"}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "table_generation",
			Help: "Generation of the routing table being served."}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "table_updates_total",
			Help: "Routing tables applied."}),
	}
	m.routes, m.backends = map[string]bool{}, map[string]bool{}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.upstreamErrors, m.generation, m.updates)
	}
	return m
}

// prune deletes the series of routes and backends t no longer has, so
// a gateway whose routes churn does not keep every name it ever served.
// It walks the whole table: callers run it off the request path, now and
// then.
func (m *metrics) prune(t *table.Table) {
	liveRoutes, liveBackends := map[string]bool{"": true}, map[string]bool{"": true}
	for _, p := range t.Ports {
		hosts := append(slices.Collect(maps.Values(p.Exact)), p.Wildcards...)
		if p.Any != nil {
			hosts = append(hosts, p.Any)
		}
		for _, h := range hosts {
			for _, r := range h.Rules {
				a := r.Action
				if a == nil {
					continue
				}
				liveRoutes[a.Route] = true
				for _, b := range a.Backends {
					liveBackends[b.Name] = true
				}
				for _, mr := range a.Mirrors {
					if mr.Backend != nil {
						liveBackends[mr.Backend.Name] = true
					}
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for r := range m.routes {
		if !liveRoutes[r] {
			m.requests.DeletePartialMatch(prometheus.Labels{"route": r})
			m.duration.DeletePartialMatch(prometheus.Labels{"route": r})
			delete(m.routes, r)
		}
	}
	for b := range m.backends {
		if !liveBackends[b] {
			m.requests.DeletePartialMatch(prometheus.Labels{"backend": b})
			m.upstreamErrors.DeletePartialMatch(prometheus.Labels{"backend": b})
			delete(m.backends, b)
		}
	}
}

// seen records label values series are made for (see prune).
func (m *metrics) seen(route, backend string) {
	m.mu.Lock()
	if route != "" {
		m.routes[route] = true
	}
	if backend != "" {
		m.backends[backend] = true
	}
	m.mu.Unlock()
}

// routeStats caches one Action's metric children for one table, so the hot
// path reaches them through atomics instead of the vectors' locked maps.
type routeStats struct {
	route string
	dur   prometheus.Observer
	// byBackend is parallel to Action.Backends, with one more entry at the
	// end for answers no backend gave (redirects, direct and error answers).
	byBackend []codeCounters
}

func newRouteStats(m *metrics, a *table.Action) *routeStats {
	route := ""
	var backends []*table.Backend
	if a != nil {
		route = a.Route
		backends = a.Backends
	}
	rs := &routeStats{route: route, dur: m.duration.WithLabelValues(route), byBackend: make([]codeCounters, len(backends)+1)}
	m.seen(route, "")
	for i, b := range backends {
		rs.byBackend[i].backend = b.Name
		m.seen("", b.Name)
	}
	return rs
}

// stats returns a's cached metric children in g, creating them on a's
// first request in this table.
func (g *generation) routeStats(m *metrics, a *table.Action) *routeStats {
	if v, ok := g.stats.Load(a); ok {
		return v.(*routeStats)
	}
	v, _ := g.stats.LoadOrStore(a, newRouteStats(m, a))
	return v.(*routeStats)
}

// codeCounters holds a route-backend pair's requests_total children for
// the few status codes it answers with, filled as they first occur; a
// code beyond the slots goes through the vector.
type codeCounters struct {
	backend string
	slots   [4]codeSlot
}

type codeSlot struct {
	code atomic.Int32
	c    atomic.Pointer[counterRef]
}

type counterRef struct{ c prometheus.Counter }

func (cc *codeCounters) inc(m *metrics, route string, code int) {
	for i := range cc.slots {
		s := &cc.slots[i]
		if s.code.Load() == int32(code) {
			if r := s.c.Load(); r != nil {
				r.c.Inc()
				return
			}
		}
	}
	c := m.requests.WithLabelValues(route, cc.backend, codeString(code))
	c.Inc()
	for i := range cc.slots {
		s := &cc.slots[i]
		if s.code.CompareAndSwap(0, int32(code)) {
			s.c.Store(&counterRef{c})
			return
		}
		if s.code.Load() == int32(code) {
			return // another request is filling this one
		}
	}
}

// codeStrings are the status codes as label values, made once.
var codeStrings = func() (s [600]string) {
	for i := 100; i < len(s); i++ {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func codeString(code int) string {
	if code >= 100 && code < len(codeStrings) {
		return codeStrings[code]
	}
	return strconv.Itoa(code)
}
