package controller

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/util/workqueue"

	"github.com/flatnet/flatnet/internal/httpserver"
)

// DefaultMetricsBindAddress is where the controller serves /metrics,
// /healthz and, with --profiling, /debug/pprof/: loopback, as the agent's
// and the gateway's servers, which have no authentication either; between
// the agent's policy metrics (9080) and the gateway's (9082), clear of
// kube-controller-manager's 10257.
const DefaultMetricsBindAddress = "127.0.0.1:9081"

// queueMetrics are client-go's workqueue metrics of the controllers'
// queues (label name: nodeipam, binder, endpointslice, lbipam) under the
// names kube-controller-manager serves them, unprefixed, so that its
// dashboards and alerts read them as they are.
type queueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

// workqueues is the process's one provider: client-go keeps the first it
// is given (workqueue.SetProvider), for every queue made after.
var workqueues = newQueueMetrics()

func newQueueMetrics() *queueMetrics {
	byName := []string{"name"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: name, Help: help}, byName)
	}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: name, Help: help}, byName)
	}
	// 10 ns to 1,000 s, kube-controller-manager's buckets.
	seconds := prometheus.ExponentialBuckets(1e-8, 10, 12)
	histogram := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: name, Help: help, Buckets: seconds}, byName)
	}
	return &queueMetrics{
		depth: gauge("depth", "Items waiting in the workqueue."),
		unfinished: gauge("unfinished_work_seconds",
			"Seconds of work in progress that work_duration has not observed yet; a value that keeps growing means stuck workers."),
		longest: gauge("longest_running_processor_seconds", "Seconds the longest-running worker of the workqueue has been at its item."),
		adds:    counter("adds_total", "Items added to the workqueue."),
		retries: counter("retries_total", "Items added back to the workqueue with its rate limit: a failed sync's retries."),
		latency: histogram("queue_duration_seconds", "Seconds an item waits in the workqueue before a worker takes it."),
		work:    histogram("work_duration_seconds", "Seconds a worker takes to process an item from the workqueue."),
	}
}

func (m *queueMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.depth, m.unfinished, m.longest, m.adds, m.retries, m.latency, m.work}
}

// The workqueue.MetricsProvider methods: one series per queue name.

func (m *queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}

func (m *queueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}

func (m *queueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}

func (m *queueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.work.WithLabelValues(name)
}

func (m *queueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}

func (m *queueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longest.WithLabelValues(name)
}

func (m *queueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}

// newMux is the metrics server's: /metrics (Go runtime, process and
// workqueue metrics), /healthz and, with profiling, /debug/pprof/. It
// makes the workqueues created from now on report to /metrics.
func newMux(profiling bool) *http.ServeMux {
	workqueue.SetProvider(workqueues)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(workqueues.collectors()...)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// Alive while the process is: a controller that fails ends it.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	if profiling {
		httpserver.AddProfiling(mux)
	}
	return mux
}

// withServer runs f, serving newMux(profiling) on ln while it runs (ln
// nil: no server). The mux is made first, so that the queues f creates
// report to it.
func withServer(ctx context.Context, ln net.Listener, profiling bool, f func(context.Context) error) error {
	if ln == nil {
		return f(ctx)
	}
	mux := newMux(profiling)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		err := httpserver.ServeListener(ctx, ln, mux)
		if err != nil {
			cancel() // the controllers stop too: let the process restart whole
		}
		served <- err
	}()
	err := f(ctx)
	cancel()
	return errors.Join(err, <-served)
}
