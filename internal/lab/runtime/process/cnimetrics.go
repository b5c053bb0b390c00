package process

// The runtime's own CNI timings: the wall time of every CNI ADD and DEL it
// makes (libcni's AddNetworkList / DelNetworkList, so every plugin of the
// chain, each started as a process), as a Prometheus histogram shaped like
// containerd's CRI network_plugin_operations_duration_seconds. The agent
// serves it on its existing metrics endpoint (--metrics-bind-address, the
// Service proxy's server), where a kubelet or containerd user would look
// for it; `make bench-pods` reads it from there to say how much of a pod's
// start and stop is the network's.

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CNI verbs, the operation_type label's values.
const (
	cniAdd = "ADD"
	cniDel = "DEL"
)

// CNIMetrics is the CNI operations histogram and error counter. Create it
// with NewCNIMetrics; a nil *CNIMetrics records nothing.
type CNIMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// The metrics' full names.
const (
	CNIDurationMetric = "flatnet_runtime_network_plugin_operations_duration_seconds"
	CNIErrorsMetric   = "flatnet_runtime_network_plugin_operations_errors_total"
)

// NewCNIMetrics returns unregistered metrics (Collectors lists them).
func NewCNIMetrics() *CNIMetrics {
	op := []string{"operation_type"}
	m := &CNIMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: CNIDurationMetric,
			Help: "Wall time of the lab runtime's CNI operations (the whole conflist: ADD or DEL through libcni), by verb, failed ones included.",
			// 1 ms to ~28 s in steps of 25%: fine enough that a quantile
			// read from the buckets is within a few percent, wide enough
			// for a chain of plugins on a loaded machine.
			Buckets: prometheus.ExponentialBuckets(0.001, 1.25, 47),
		}, op),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: CNIErrorsMetric,
			Help: "CNI operations of the lab runtime that failed, by verb.",
		}, op),
	}
	// Both verbs are served from the start, at zero: a reader can tell
	// "none yet" from "not timed".
	for _, v := range []string{cniAdd, cniDel} {
		m.duration.WithLabelValues(v)
		m.errors.WithLabelValues(v)
	}
	return m
}

// Collectors are what to register to serve the metrics.
func (m *CNIMetrics) Collectors() []prometheus.Collector {
	if m == nil {
		return nil
	}
	return []prometheus.Collector{m.duration, m.errors}
}

// observe records one operation that took d and ended with err.
func (m *CNIMetrics) observe(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.errors.WithLabelValues(op).Inc()
	}
}
