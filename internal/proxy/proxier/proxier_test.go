package proxier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfttrace"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/conntrack"
	"github.com/flatnet/flatnet/internal/proxy/healthcheck"
	"github.com/flatnet/flatnet/internal/proxy/metrics"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/runner/runnertest"
)

func ptr[T any](v T) *T { return &v }

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

func service(name, clusterIP string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")}},
		},
	}
}

func slice(svc string, ips ...string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-abc", Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr("node-b")})
	}
	return s
}

// eventually polls cond until it holds or fails the test after a while.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened; last: %s", what, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProxier(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)

	// A chain left by an earlier run for a service deleted while the agent
	// was down: the first (full) sync removes it without flushing the table.
	tx := nf.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "svc-AAAAAAAA-ns/gone/tcp/http"})
	if err := nf.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}

	p := New(Config{
		Client: client, NFT: nf,
		Render:          nftables.Config{Family: knftables.IPv4Family, NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		MaxSyncInterval: time.Hour,
	})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	tr := nfttrace.New(nf.Fake, a("10.0.0.1"))
	trace := func(dst string) (nfttrace.Result, string) {
		res, err := tr.Trace(nfttrace.Packet{Src: a("10.244.1.5"), Dst: a(dst), Proto: "tcp", DPort: 80})
		if err != nil {
			return res, "trace error: " + err.Error()
		}
		return res, res.String()
	}
	chains := func() []string {
		nf.RLock()
		defer nf.RUnlock()
		var out []string
		if nf.Table != nil {
			for name := range nf.Table.Chains {
				out = append(out, name)
			}
		}
		return out
	}
	hasChainOf := func(svc string) bool {
		for _, c := range chains() {
			if strings.Contains(c, "-ns/"+svc+"/") {
				return true
			}
		}
		return false
	}

	create := func(obj any) {
		t.Helper()
		var err error
		switch o := obj.(type) {
		case *v1.Service:
			_, err = client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discovery.EndpointSlice:
			_, err = client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	// A Service and its slice appear: the ClusterIP reaches the endpoint.
	create(service("web", "10.96.0.10"))
	create(service("other", "10.96.0.20"))
	create(slice("web", "10.244.2.7"))
	create(slice("other", "10.244.3.7"))
	eventually(t, "ClusterIP reaches the endpoint", func() (bool, string) {
		res, s := trace("10.96.0.10")
		return res.DNAT && res.Endpoint() == "10.244.2.7:8080", s
	})
	eventually(t, "the other service reaches its endpoint", func() (bool, string) {
		res, s := trace("10.96.0.20")
		return res.DNAT && res.Endpoint() == "10.244.3.7:8080", s
	})
	if hasChainOf("gone") {
		t.Errorf("stale chain of a service deleted while down survived the first sync: %v", chains())
	}

	// The slice changes: a partial sync touches only that service.
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice("web", "10.244.2.8"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ClusterIP reaches the new endpoint", func() (bool, string) {
		res, s := trace("10.96.0.10")
		return res.DNAT && res.Endpoint() == "10.244.2.8:8080", s
	})
	nf.RLock()
	last := nf.LastTransaction.String()
	nf.RUnlock()
	if !strings.Contains(last, "ns/web/") || strings.Contains(last, "ns/other/") || strings.Contains(last, "flush chain ip flatnet-proxy services") {
		t.Errorf("the slice update's transaction is not limited to ns/web:\n%s", last)
	}
	if res, s := trace("10.96.0.20"); !res.DNAT || res.Endpoint() != "10.244.3.7:8080" {
		t.Errorf("the other service broke: %s", s)
	}

	// No endpoints left: an immediate reject, not a drop.
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice("web"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a service without endpoints rejects", func() (bool, string) {
		res, s := trace("10.96.0.10")
		return res.Verdict == nfttrace.Reject && res.RejectWith == "tcp reset", s
	})

	// The Service goes: its chains go.
	if err := client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted service's chains go", func() (bool, string) {
		res, s := trace("10.96.0.10")
		return !hasChainOf("web") && res.Verdict == nfttrace.Accept && !res.DNAT, s
	})
	if !hasChainOf("other") {
		t.Errorf("deleting ns/web removed ns/other's chains: %v", chains())
	}
}

// failingNFT fails the first n transactions.
type failingNFT struct {
	*nft.Fake
	n int
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.n > 0 {
		f.n--
		return &nft.Error{Msg: "nft: injected failure"}
	}
	return f.Fake.Run(ctx, tx)
}

// A failed partial sync is followed by a full one that repairs the table.
func TestFailedSyncResyncsFully(t *testing.T) {
	ctx := context.Background()
	nf := &failingNFT{Fake: nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)}
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family}})
	p.tracker.OnService(service("web", "10.96.0.10"))
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.7"))
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.8"))
	nf.n = 1
	if err := p.sync(ctx, false); err == nil {
		t.Fatal("sync with a failing nft succeeded")
	}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nf.LastTransaction.String(), "flush chain ip flatnet-proxy services") {
		t.Errorf("the sync after a failure was not full:\n%s", nf.LastTransaction)
	}
	res, err := nfttrace.New(nf.Fake.Fake).Trace(nfttrace.Packet{Src: a("10.244.1.5"), Dst: a("10.96.0.10"), Proto: "tcp", DPort: 80})
	if err != nil || !res.DNAT || res.Endpoint() != "10.244.2.8:8080" {
		t.Errorf("after the resync: %v %v", res, err)
	}
}

// FirstSynced stays open through a failed first sync and closes with the
// first that succeeds.
func TestFirstSynced(t *testing.T) {
	ctx := context.Background()
	nf := &failingNFT{Fake: nft.NewFake(knftables.IPv4Family, nftables.DefaultTable), n: 1}
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family}})
	p.tracker.OnService(service("web", "10.96.0.10"))
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.7"))
	closed := func() bool {
		select {
		case <-p.FirstSynced():
			return true
		default:
			return false
		}
	}
	if err := p.sync(ctx, true); err == nil || closed() {
		t.Fatalf("failed first sync: err %v, FirstSynced closed %v", err, closed())
	}
	if err := p.sync(ctx, true); err != nil || !closed() {
		t.Fatalf("second sync: err %v, FirstSynced closed %v", err, closed())
	}
	if err := p.sync(ctx, false); err != nil { // closing twice would panic
		t.Fatal(err)
	}
}

// Services another proxy serves (service.kubernetes.io/service-proxy-name)
// are left alone, as kube-proxy does.
func TestServiceProxyNameIsLeftOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := service("other", "10.96.0.20")
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	client := fake.NewClientset(service("web", "10.96.0.10"), slice("web", "10.244.2.7"), other, slice("other", "10.244.3.7"))
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	p := New(Config{Client: client, NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family}})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	tr := nfttrace.New(nf.Fake)
	trace := func(dst string) (nfttrace.Result, string) {
		res, err := tr.Trace(nfttrace.Packet{Src: a("10.244.1.5"), Dst: a(dst), Proto: "tcp", DPort: 80})
		if err != nil {
			return res, err.Error()
		}
		return res, res.String()
	}
	eventually(t, "web is served", func() (bool, string) {
		res, s := trace("10.96.0.10")
		return res.DNAT, s
	})
	if res, s := trace("10.96.0.20"); res.DNAT || res.Verdict != nfttrace.Accept {
		t.Errorf("a service of another proxy was served: %s", s)
	}
}

// Two full syncs of the same objects give the same ruleset.
func TestFullSyncIsIdempotent(t *testing.T) {
	ctx := context.Background()
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family}})
	p.tracker.OnService(service("web", "10.96.0.10"))
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.7", "10.244.2.8"))
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	first := nf.Dump()
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	if second := nf.Dump(); second != first {
		t.Errorf("second full sync changed the ruleset:\n%s\nthen:\n%s", first, second)
	}
	if !strings.Contains(first, "10.244.2.8 . 8080") {
		t.Errorf("endpoint missing from the ruleset:\n%s", first)
	}
}

func udpService(name, clusterIP string) *v1.Service {
	s := service(name, clusterIP)
	s.Spec.Type = v1.ServiceTypeNodePort
	s.Spec.Ports = []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053}}
	return s
}

func udpSlice(svc string, ips ...string) *discovery.EndpointSlice {
	s := slice(svc, ips...)
	s.Ports = []discovery.EndpointPort{{Name: ptr("dns"), Protocol: ptr(v1.ProtocolUDP), Port: ptr(int32(5353))}}
	return s
}

// Conntrack cleanup after syncs: the first reconciles the listed table
// (live flows kept), later ones delete what each change made stale, and a
// change whose sync failed is cleaned after the sync that succeeds.
func TestConntrackCleanup(t *testing.T) {
	ctx := context.Background()
	nf := &failingNFT{Fake: nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)}
	ct := conntrack.NewFake()
	udp := func(dst, src string) conntrack.Entry {
		return conntrack.Entry{Protocol: proxy.UDP, OrigDst: netip.MustParseAddrPort(dst), ReplySrc: netip.MustParseAddrPort(src)}
	}
	live := udp("10.96.0.53:53", "10.244.2.7:5353")
	ct.Add(false, live, udp("10.96.0.53:53", "10.244.2.9:5353"), udp("10.96.0.53:53", "10.96.0.53:53"))
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family}, Conntrack: ct})
	p.tracker.OnService(udpService("dns", "10.96.0.53"))
	p.tracker.OnEndpointSlice(udpSlice("dns", "10.244.2.7"))
	p.tracker.OnService(service("web", "10.96.0.10")) // TCP: never cleaned
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.7"))
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"udp orig-dst 10.96.0.53:53 reply-src 10.244.2.9:5353",
		"udp orig-dst 10.96.0.53:53 reply-src 10.96.0.53:53",
	}
	if diff := cmp.Diff(want, ct.Filters()); diff != "" {
		t.Errorf("first sync's cleanup (-want +got):\n%s", diff)
	}
	if got, _ := ct.List(false); len(got) != 1 || got[0] != live {
		t.Errorf("after the first sync the table holds %v; want only the live flow %v", got, live)
	}

	// The endpoint is replaced: entries DNATed to it go.
	ct.Deleted = nil
	p.tracker.OnEndpointSlice(udpSlice("dns", "10.244.2.8"))
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"udp orig-dst *:30053 reply-src 10.244.2.7:5353",
		"udp orig-dst 10.96.0.53:53 reply-src 10.244.2.7:5353",
	}
	if diff := cmp.Diff(want, ct.Filters()); diff != "" {
		t.Errorf("cleanup after a replaced endpoint (-want +got):\n%s", diff)
	}
	if got, _ := ct.List(false); len(got) != 0 {
		t.Errorf("the flow to the removed endpoint survived: %v", got)
	}

	// No endpoints, then the sync of the next change fails: nothing is
	// deleted until a sync succeeds, and then the whole change counts
	// (from 10.244.2.8 to 10.244.2.10, through no endpoints).
	ct.Deleted = nil
	p.tracker.OnEndpointSlice(udpSlice("dns"))
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	ct.Deleted = nil
	p.tracker.OnEndpointSlice(udpSlice("dns", "10.244.2.10"))
	nf.n = 1
	if err := p.sync(ctx, false); err == nil {
		t.Fatal("sync with a failing nft succeeded")
	}
	if len(ct.Deleted) != 0 {
		t.Errorf("conntrack cleaned after a failed sync: %v", ct.Filters())
	}
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"udp orig-dst *:30053 reply-src *",
		"udp orig-dst 10.96.0.53:53 reply-src *",
	}
	if diff := cmp.Diff(want, ct.Filters()); diff != "" {
		t.Errorf("cleanup when endpoints come back (-want +got):\n%s", diff)
	}

	// A failed cleanup makes the next one a reconcile of the table.
	ct.Deleted = nil
	ct.Err = errors.New("injected")
	p.tracker.OnEndpointSlice(udpSlice("dns", "10.244.2.11"))
	if err := p.sync(ctx, false); err != nil {
		t.Fatalf("a conntrack failure failed the sync: %v", err)
	}
	ct.Err = nil
	ct.Add(false, udp("10.96.0.53:53", "10.244.2.10:5353"), udp("10.96.0.53:53", "10.244.2.11:5353"))
	p.tracker.OnService(service("other", "10.96.0.20"))
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	want = []string{"udp orig-dst 10.96.0.53:53 reply-src 10.244.2.10:5353"}
	if diff := cmp.Diff(want, ct.Filters()); diff != "" {
		t.Errorf("reconcile after a failed cleanup (-want +got):\n%s", diff)
	}
}

// gather returns the value of metric name{labels} ("" for none) from m,
// counting a histogram by its sample count.
func gather(t *testing.T, m *metrics.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metric
				}
			}
			switch {
			case mt.Counter != nil:
				return mt.Counter.GetValue()
			case mt.Gauge != nil:
				return mt.Gauge.GetValue()
			case mt.Histogram != nil:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

// The proxier feeds its metrics and health: changes counted and pending
// until a sync, durations and timestamps per sync, the network programming
// latency from the slices' trigger times, failures, and /healthz turning
// 503 when a change waits past the timeout because syncs fail.
func TestProxierMetricsAndHealth(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{t: time.Now()}
	nf := &failingNFT{Fake: nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)}
	m := metrics.New()
	h := healthcheck.NewProxierHealth(healthcheck.ProxierHealthConfig{NodeName: "node-a", Timeout: time.Minute, Now: clock.Now})
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family, NodeName: "node-a"}, Clock: clock,
		Metrics: m.Proxier(metrics.IPv4, true), Health: h.Family(metrics.IPv4)})
	v4 := map[string]string{"ip_family": "IPv4"}

	triggered := slice("web", "10.244.2.7")
	triggered.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(time.Millisecond).Format(time.RFC3339Nano)}
	p.onService(service("web", "10.96.0.10"), false)
	p.onSlice(triggered, false)
	v6 := slice("web", "fd00::7")
	v6.Name, v6.AddressType = "web-v6", discovery.AddressTypeIPv6
	p.onSlice(v6, false) // the IPv6 proxier's to count
	local := service("local", "10.96.0.30")
	local.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
	p.onService(local, false)
	p.onSlice(slice("local", "10.244.3.3"), false) // on node-b only
	for name, want := range map[string]float64{
		"flatnet_sync_proxy_rules_service_changes_total":    2,
		"flatnet_sync_proxy_rules_endpoint_changes_total":   2,
		"flatnet_sync_proxy_rules_service_changes_pending":  2,
		"flatnet_sync_proxy_rules_endpoint_changes_pending": 2,
	} {
		if got := gather(t, m, name, nil); got != want {
			t.Errorf("before the sync: %s = %v, want %v", name, got, want)
		}
	}
	if got := gather(t, m, "flatnet_sync_proxy_rules_last_queued_timestamp_seconds", v4); got == 0 {
		t.Error("no last queued timestamp")
	}

	clock.step(time.Second)
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"flatnet_sync_proxy_rules_service_changes_pending":  0,
		"flatnet_sync_proxy_rules_endpoint_changes_pending": 0,
	} {
		if got := gather(t, m, name, nil); got != want {
			t.Errorf("after the sync: %s = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]float64{
		"flatnet_sync_proxy_rules_duration_seconds":         1,
		"flatnet_sync_full_proxy_rules_duration_seconds":    1,
		"flatnet_sync_partial_proxy_rules_duration_seconds": 0,
		"flatnet_network_programming_duration_seconds":      1,
		"flatnet_sync_proxy_rules_last_timestamp_seconds":   float64(clock.Now().UnixNano()) / 1e9,
	} {
		if got := gather(t, m, name, v4); got != want {
			t.Errorf("after the sync: %s = %v, want %v", name, got, want)
		}
	}
	if got := gather(t, m, "flatnet_sync_proxy_rules_no_local_endpoints_total", map[string]string{"ip_family": "IPv4", "traffic_policy": "internal"}); got != 1 {
		t.Errorf("no local endpoints (internal) = %v, want 1", got)
	}

	// Syncs fail while a change waits: unhealthy after the timeout.
	p.onSlice(slice("web", "10.244.2.8"), false)
	nf.n = 100
	for range 3 {
		clock.step(30 * time.Second)
		if err := p.sync(ctx, false); err == nil {
			t.Fatal("sync with a failing nft succeeded")
		}
	}
	if got := gather(t, m, "flatnet_sync_proxy_rules_nftables_sync_failures_total", v4); got != 3 {
		t.Errorf("sync failures = %v, want 3", got)
	}
	if got := gather(t, m, "flatnet_sync_proxy_rules_duration_seconds", v4); got != 4 {
		t.Errorf("failed syncs' durations not observed: count %v, want 4", got)
	}
	if h.IsHealthy() {
		t.Error("healthy although the change has waited 90s with a 60s timeout")
	}
	nf.n = 0
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if !h.IsHealthy() {
		t.Error("unhealthy after a successful sync")
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fakeClock) After(time.Duration) <-chan time.Time { return make(chan time.Time) }

// A LoadBalancer with externalTrafficPolicy Local gets its
// healthCheckNodePort served with the node's ready local endpoints, and
// the ruleset leaves that port alone (no DNAT, no reject) while its
// NodePort is served.
func TestHealthCheckNodePort(t *testing.T) {
	ctx := context.Background()
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	var asked []string
	sh := healthcheck.NewServiceHealth(healthcheck.ServiceHealthConfig{Listen: func(addr string) (net.Listener, error) {
		asked = append(asked, addr)
		return net.Listen("tcp", "127.0.0.1:0")
	}})
	defer sh.Close()
	p := New(Config{NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family, NodeName: "node-a"}, ServiceHealth: sh.Family(metrics.IPv4)})
	lb := service("lb", "10.96.0.40")
	lb.Spec.Type = v1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = 32100
	lb.Spec.Ports[0].NodePort = 30080
	sl := slice("lb", "10.244.1.2", "10.244.1.3", "10.244.2.2")
	sl.Endpoints[0].NodeName = ptr("node-a")
	sl.Endpoints[1].NodeName = ptr("node-a")
	sl.Endpoints[1].Conditions = discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	p.tracker.OnService(lb)
	p.tracker.OnEndpointSlice(sl)
	p.tracker.OnService(service("web", "10.96.0.10")) // no health check
	if err := p.sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	lbName := types.NamespacedName{Namespace: "ns", Name: "lb"}
	if diff := cmp.Diff(map[types.NamespacedName]uint16{lbName: 32100}, sh.Ports()); diff != "" {
		t.Errorf("health check ports (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"0.0.0.0:32100"}, asked); diff != "" {
		t.Errorf("listened on (-want +got):\n%s", diff)
	}
	want := map[types.NamespacedName]healthcheck.Service{lbName: {Port: 32100, LocalEndpoints: 1}}
	if diff := cmp.Diff(want, healthChecks(p.tracker.Take().Services, "node-a")); diff != "" {
		t.Errorf("health checks (-want +got):\n%s", diff)
	}

	tr := nfttrace.New(nf.Fake, a("10.0.0.1"))
	for _, tt := range []struct {
		port uint16
		dnat bool
	}{{32100, false}, {30080, true}} {
		res, err := tr.Trace(nfttrace.Packet{Src: a("192.168.5.5"), Dst: a("10.0.0.1"), Proto: "tcp", DPort: tt.port})
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != nfttrace.Accept || res.DNAT != tt.dnat {
			t.Errorf("node:%d: %s; want accepted, DNAT %v", tt.port, res, tt.dnat)
		}
	}

	// The service goes: its listener closes.
	p.tracker.OnServiceDelete(lb)
	if err := p.sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := sh.Ports(); len(got) != 0 {
		t.Errorf("health check ports after the delete: %v", got)
	}
}

// Config.Serve runs alongside the proxier: its failure ends Run with the
// error; the end of Run stops it.
func TestServeRunsAlongside(t *testing.T) {
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	p := New(Config{Client: fake.NewClientset(), NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family},
		Serve: func(context.Context) error { return errors.New("address in use") }})
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "address in use") {
		t.Errorf("Run with a failing Serve: %v", err)
	}

	stopped := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	p = New(Config{Client: fake.NewClientset(), NFT: nf, Render: nftables.Config{Family: knftables.IPv4Family},
		Serve: func(ctx context.Context) error { <-ctx.Done(); close(stopped); return nil }})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("Run returned before Serve stopped")
	}
}

// clockedNFT reports each transaction to the fake clock as a sync (full
// when it rewrites the services chain), so a test sees syncs and the
// runner's timers in the loop's order.
type clockedNFT struct {
	NFT
	clock *runnertest.Clock
}

func (n clockedNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	full := false
	for _, l := range strings.Split(tx.String(), "\n") {
		full = full || (strings.HasPrefix(l, "flush chain ") && strings.HasSuffix(l, " services"))
	}
	n.clock.Synced(full)
	return n.NFT.Run(ctx, tx)
}

// churnTable is what driveChurn needs of the table under test.
type churnTable struct {
	// breakWeb edits the table as someone else would: web no longer
	// reaches its endpoint.
	breakWeb func()
	// webOK reports whether web's ClusterIP reaches its endpoint.
	webOK func() bool
	// busyAt returns where busy's ClusterIP leads ("" if nowhere); nil
	// when the table cannot tell.
	busyAt func() string
}

const churnPeriod = 30 * time.Second

// startChurn returns a proxier serving web and busy on nf, driven by a
// fake clock; its loop runs until the test ends.
func startChurn(t *testing.T, nf NFT, table string) (*Proxier, *runnertest.Clock) {
	t.Helper()
	clock := runnertest.New()
	p := New(Config{NFT: clockedNFT{NFT: nf, clock: clock}, Render: nftables.Config{Family: knftables.IPv4Family, Table: table},
		MinSyncInterval: time.Second, MaxSyncInterval: churnPeriod, Clock: clock})
	p.tracker.OnService(service("web", "10.96.0.10"))
	p.tracker.OnEndpointSlice(slice("web", "10.244.2.7"))
	p.tracker.OnService(service("busy", "10.96.0.20"))
	p.tracker.OnEndpointSlice(slice("busy", "10.244.3.0"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.runner.Loop(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p, clock
}

// driveChurn runs four periods of fake time after p's first sync: busy's
// endpoint moves every half period (each change programmed by a partial
// sync at once), and the table, broken by someone else right after the
// first sync and again at 40s, must be repaired within one period each
// time, by the full resync the runner forces.
func driveChurn(t *testing.T, p *Proxier, clock *runnertest.Clock, tbl churnTable) {
	t.Helper()
	t0 := clock.Now()
	var log strings.Builder
	record := func(syncs []runnertest.Event) {
		for _, s := range syncs {
			fmt.Fprintf(&log, " %v/full=%v", s.At.Sub(t0), s.Full)
		}
	}
	record(clock.Idle(t))
	if !tbl.webOK() {
		t.Fatal("web not served after the first sync")
	}
	edit := func() {
		t.Helper()
		tbl.breakWeb()
		if tbl.webOK() {
			t.Fatal("web still served after the foreign edit")
		}
	}
	edit()
	editedAt, repairedAt := t0, time.Time{}
	const step = 5 * time.Second
	for now := step; now <= 4*churnPeriod; now += step {
		record(clock.Step(t, step))
		if (now-step)%(churnPeriod/2) == 0 {
			ep := fmt.Sprintf("10.244.3.%d", now/step)
			p.onSlice(slice("busy", ep), false)
			record(clock.Idle(t))
			if tbl.busyAt != nil {
				if got := tbl.busyAt(); got != ep+":8080" {
					t.Fatalf("at %v busy leads to %q, want its new endpoint %s", now, got, ep)
				}
			}
		}
		switch {
		case tbl.webOK():
			if repairedAt.IsZero() {
				repairedAt = clock.Now()
				t.Logf("foreign edit at %v repaired at %v", editedAt.Sub(t0), repairedAt.Sub(t0))
			}
		case !repairedAt.IsZero():
			t.Fatalf("at %v web broke again after its repair", now)
		case clock.Now().Sub(editedAt) >= churnPeriod:
			t.Fatalf("foreign edit at %v not repaired at %v (period %v); syncs:%s", editedAt.Sub(t0), now, churnPeriod, log.String())
		}
		if now == 40*time.Second {
			edit()
			editedAt, repairedAt = clock.Now(), time.Time{}
		}
	}
	t.Logf("syncs:%s", log.String())
}

// EndpointSlice changes every half period keep partial syncs coming, and a
// foreign edit of the table (web's map element deleted, its service chain
// flushed) is still repaired within one period. Minutes of fake time, no
// real waiting.
func TestDriftRepairedUnderChurn(t *testing.T) {
	ctx := context.Background()
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	p, clock := startChurn(t, nf, "")
	tr := nfttrace.New(nf.Fake)
	endpoint := func(dst string) string {
		res, err := tr.Trace(nfttrace.Packet{Src: a("10.244.1.5"), Dst: a(dst), Proto: "tcp", DPort: 80})
		if err != nil || !res.DNAT {
			return ""
		}
		return res.Endpoint()
	}
	driveChurn(t, p, clock, churnTable{
		breakWeb: func() {
			chains, err := nf.List(ctx, "chain")
			if err != nil {
				t.Fatal(err)
			}
			tx := nf.NewTransaction()
			tx.Delete(&knftables.Element{Map: "service-ips", Key: []string{"10.96.0.10", "tcp", "80"}})
			for _, c := range chains {
				if strings.Contains(c, "ns/web/") {
					tx.Flush(&knftables.Chain{Name: c})
				}
			}
			if err := nf.Fake.Run(ctx, tx); err != nil {
				t.Fatal(err)
			}
		},
		webOK:  func() bool { return endpoint("10.96.0.10") == "10.244.2.7:8080" },
		busyAt: func() string { return endpoint("10.96.0.20") },
	})
}

// BenchmarkNoLocalEndpoints is the metric's count after every sync at
// 5,000 nodes: the gateway's frontend (a LoadBalancer with
// externalTrafficPolicy Local, one endpoint per node, this node's last)
// among 1,000 Services of internalTrafficPolicy Local with 10 endpoints
// each, half of them with one on this node.
func BenchmarkNoLocalEndpoints(b *testing.B) {
	endpoints := func(n int, prefix byte, local bool) []proxy.Endpoint {
		eps := make([]proxy.Endpoint, n)
		for i := range eps {
			eps[i] = proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, prefix, byte(i / 250), byte(i%250 + 1)}), Port: 8080,
				Ready: true, Serving: true, NodeName: fmt.Sprintf("node-%d", i)}
		}
		if local {
			eps[n-1].NodeName = "node-a"
		}
		return eps
	}
	services := []*proxy.Service{{Namespace: "ns", Name: "frontend", Type: proxy.LoadBalancer, ExternalLocal: true,
		LoadBalancerIPs: []netip.Addr{a("172.29.1.60")},
		Ports:           []proxy.ServicePort{{Protocol: proxy.TCP, Port: 443, NodePort: 30443, Endpoints: endpoints(5000, 244, true)}}}}
	for i := range 1000 {
		services = append(services, &proxy.Service{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), Type: proxy.ClusterIP, InternalLocal: true,
			Ports: []proxy.ServicePort{{Protocol: proxy.TCP, Port: 80, Endpoints: endpoints(10, 245, i%2 == 0)}}})
	}
	b.ReportAllocs()
	for b.Loop() {
		if internal, external := noLocalEndpoints(services, "node-a"); internal != 500 || external != 0 {
			b.Fatalf("noLocalEndpoints = %d, %d; want 500, 0", internal, external)
		}
	}
}

// A held modulus (nftables.Config.ModulusHold) ends without any further
// change from the API: the backend asks for a sync when the hold is due
// (SyncResult.ResyncAfter) and the proxier runs one.
func TestHeldModulusEndsWithoutAChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	nf := nft.NewFake(knftables.IPv4Family, nftables.DefaultTable)
	p := New(Config{
		Client: client, NFT: nf,
		Render: nftables.Config{Family: knftables.IPv4Family, NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
			ModulusHold: 300 * time.Millisecond},
		MaxSyncInterval: time.Hour,
	})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	dispatch := func() string {
		nf.RLock()
		defer nf.RUnlock()
		if nf.Table == nil {
			return ""
		}
		for name, c := range nf.Table.Chains {
			if strings.HasPrefix(name, "svc-") && strings.Contains(name, "-ns/web/") && len(c.Rules) > 0 {
				return c.Rules[0].Rule
			}
		}
		return ""
	}
	if _, err := client.CoreV1().Services("ns").Create(ctx, service("web", "10.96.0.10"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sl := slice("web", "10.244.2.1", "10.244.2.2", "10.244.2.3")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "three endpoints", func() (bool, string) { r := dispatch(); return strings.Contains(r, "mod 3 "), r })
	sl.Endpoints = sl.Endpoints[:2]
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	// Held: the rule stays "mod 3" while the endpoint's key holds a copy
	// (seen by the element count, which the fake keeps per map)...
	eventually(t, "the endpoint gone from the map", func() (bool, string) {
		nf.RLock()
		defer nf.RUnlock()
		for _, m := range nf.Table.Maps {
			for _, e := range m.Elements {
				if strings.Join(e.Value, "") == "10.244.2.3 . 8080" {
					return false, "10.244.2.3 still in " + m.Name
				}
			}
		}
		return true, ""
	})
	if r := dispatch(); !strings.Contains(r, "mod 3 ") && time.Since(removed) < 300*time.Millisecond {
		t.Errorf("the modulus was not held: %s", r)
	}
	// ... and "mod 2" once the hold is due, with nothing else changed.
	eventually(t, "the exact count after the hold", func() (bool, string) { r := dispatch(); return strings.Contains(r, "mod 2 "), r })
}
