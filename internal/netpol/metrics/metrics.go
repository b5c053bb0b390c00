// Package metrics is the network policy's Prometheus metrics: syncs,
// the gate, cut flows, and the packets each policy's rules dropped.
//
// Design. Dropped packets are counted by the kernel, in the policy
// table's named counters (one per Deny rule of a ClusterNetworkPolicy
// tier, one per pod the NetworkPolicy tier isolates: internal/netpol/
// nftables). The collector reads them at scrape time (one `nft list`) and
// sums them per policy, using what the last sync said each counter counts.
// A packet dropped for a pod that two NetworkPolicies isolate counts for
// both. Kernel counters restart from zero when the table is rebuilt (a full
// sync) or a pod goes away, so the collector keeps what it saw and adds
// on; the totals it serves only grow, as Prometheus counters must.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/httpserver"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
)

const namespace = "flatnet_networkpolicy"

// CounterReader reads the policy table's named counters (nft.Runner).
type CounterReader interface {
	ListCounters(ctx context.Context) ([]*knftables.Counter, error)
}

// Metrics are the policy's metrics in their own registry.
type Metrics struct {
	registry *prometheus.Registry

	SyncDuration *prometheus.HistogramVec // by "full": true/false
	SyncFailures prometheus.Counter
	// GateDuration: from a CNI plugin's request to the answer.
	GateDuration prometheus.Histogram
	CutFlows     prometheus.Counter
	// Recompiled counts pods compiled again (a sync recompiles only the
	// pods a change can touch).
	Recompiled prometheus.Counter
	Pods       prometheus.Gauge
	Elements   prometheus.Gauge

	denied *denied
}

// New registers the metrics, with Go and process metrics, reading dropped
// packets through counters.
func New(counters CounterReader) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15) // 1 ms to 16 s
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		SyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "sync_duration_seconds",
			Help: "Time to compile, render and commit the node's policy rules", Buckets: buckets}, []string{"full"}),
		SyncFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "sync_failures_total",
			Help: "Policy rule syncs that failed (retried as a full sync)"}),
		GateDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "gate_duration_seconds",
			Help: "Time from a new pod's CNI request to its policy committed", Buckets: buckets}),
		CutFlows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "cut_flows_total",
			Help: "Established flows deleted from conntrack because a policy change denies them"}),
		Recompiled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "pods_recompiled_total",
			Help: "This node's pods whose rules were compiled again (only those a change can touch are)"}),
		Pods: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "pods",
			Help: "This node's pods that some policy selects"}),
		Elements: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "set_elements",
			Help: "Elements in the policy table's sets"}),
		denied: newDenied(counters),
	}
	m.registry.MustRegister(m.SyncDuration, m.SyncFailures, m.GateDuration, m.CutFlows, m.Recompiled, m.Pods, m.Elements, m.denied,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the metrics' registry (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// SetCounters records what each named counter of the table now counts;
// call it after every committed sync.
func (m *Metrics) SetCounters(c map[string]nftables.Counter) { m.denied.set(c) }

// Serve serves /metrics on addr until ctx ends.
func (m *Metrics) Serve(ctx context.Context, addr string) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	return httpserver.Serve(ctx, addr, mux)
}

var deniedDesc = prometheus.NewDesc(namespace+"_denied_packets_total",
	"Packets dropped by network policy, by direction, tier (admin, networkpolicy, baseline) and policy "+
		"(namespace/name of a NetworkPolicy isolating the pod, or a ClusterNetworkPolicy with a Deny rule)",
	[]string{"direction", "tier", "policy"}, nil)

type labelKey struct{ direction, tier, policy string }

// denied is the collector of dropped packets.
type denied struct {
	counters CounterReader

	mu      sync.Mutex
	meta    map[string]nftables.Counter
	last    map[string]uint64   // the kernel's value at the last read
	base    map[string]uint64   // what the counter had before resets
	retired map[labelKey]uint64 // totals of counters that are gone
}

func newDenied(c CounterReader) *denied {
	return &denied{counters: c, meta: map[string]nftables.Counter{}, last: map[string]uint64{},
		base: map[string]uint64{}, retired: map[labelKey]uint64{}}
}

func labelsOf(c nftables.Counter) []labelKey {
	out := make([]labelKey, 0, len(c.Policies))
	for _, p := range c.Policies {
		out = append(out, labelKey{c.Direction.String(), c.Tier, p})
	}
	return out
}

// set replaces the counters' meaning; a counter that is gone keeps its
// total under its old labels.
func (d *denied) set(meta map[string]nftables.Counter) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, old := range d.meta {
		if _, ok := meta[name]; ok {
			continue
		}
		total := d.base[name] + d.last[name]
		for _, k := range labelsOf(old) {
			d.retired[k] += total
		}
		delete(d.base, name)
		delete(d.last, name)
	}
	d.meta = meta
}

func (d *denied) Describe(ch chan<- *prometheus.Desc) { ch <- deniedDesc }

func (d *denied) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := d.counters.ListCounters(ctx)
	if err != nil {
		klog.ErrorS(err, "Reading the network policy's drop counters")
		ch <- prometheus.NewInvalidMetric(deniedDesc, err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	sums := map[labelKey]uint64{}
	for k, v := range d.retired {
		sums[k] = v
	}
	for _, c := range list {
		if c == nil || c.Packets == nil {
			continue
		}
		meta, ok := d.meta[c.Name]
		if !ok {
			continue
		}
		raw := *c.Packets
		if raw < d.last[c.Name] { // the kernel's counter started again
			d.base[c.Name] += d.last[c.Name]
		}
		d.last[c.Name] = raw
		for _, k := range labelsOf(meta) {
			sums[k] += d.base[c.Name] + raw
		}
	}
	// Every policy with a counter is served, at 0 until it drops.
	for _, meta := range d.meta {
		for _, k := range labelsOf(meta) {
			if _, ok := sums[k]; !ok {
				sums[k] = 0
			}
		}
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(deniedDesc, prometheus.CounterValue, float64(v), k.direction, k.tier, k.policy)
	}
}
