package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// scrape returns the /metrics text of m.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func requireLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, "\n"+l+"\n") {
			t.Errorf("missing line %q in:\n%s", l, grep(text, "flatnet_"))
		}
	}
}

func grep(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestMetrics(t *testing.T) {
	m := New()
	v4, v6 := m.Proxier(IPv4, true), m.Proxier(IPv6, false)
	at := time.Unix(1700000000, 500000000)

	// Every Service event counted once on a dual-stack node; slices by
	// the proxier of their family.
	v4.ServiceChanged()
	v6.ServiceChanged()
	v4.EndpointsChanged()
	v6.EndpointsChanged()
	v4.SetPending(3, 2)
	v6.SetPending(3, 1)
	v4.Queued(at)
	v4.SyncDone(true, 20*time.Millisecond)
	v4.SyncDone(false, 3*time.Millisecond)
	v4.Synced(at)
	v6.SyncFailed()
	v4.ProgrammingLatency(1500 * time.Millisecond)
	v4.NoLocalEndpoints(1, 2)
	v4.ConntrackDeleted(4)
	m.Served("/healthz", 200)
	m.Served("/livez", 503)

	text := scrape(t, m)
	requireLines(t, text,
		"flatnet_sync_proxy_rules_service_changes_total 1",
		"flatnet_sync_proxy_rules_endpoint_changes_total 2",
		"flatnet_sync_proxy_rules_service_changes_pending 3",
		"flatnet_sync_proxy_rules_endpoint_changes_pending 3",
		`flatnet_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7000000005e+09`,
		`flatnet_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7000000005e+09`,
		`flatnet_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2`,
		`flatnet_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`flatnet_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`flatnet_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.032"} 1`,
		`flatnet_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1`,
		`flatnet_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
		`flatnet_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 0`,
		`flatnet_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 0`,
		`flatnet_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"} 1`,
		`flatnet_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`flatnet_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 2`,
		`flatnet_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 4`,
		`flatnet_proxy_healthz_total{code="200"} 1`,
		`flatnet_proxy_livez_total{code="503"} 1`,
	)
	if !strings.Contains(text, "\ngo_goroutines ") || !strings.Contains(text, "\nprocess_start_time_seconds ") {
		t.Errorf("no Go runtime or process metrics")
	}

	// After a sync the pending gauges drop to what is left per family.
	v4.SetPending(0, 0)
	requireLines(t, scrape(t, m), "flatnet_sync_proxy_rules_service_changes_pending 0", "flatnet_sync_proxy_rules_endpoint_changes_pending 1")

	// A nil recorder records nothing and does not panic.
	var none *Proxier
	none.ServiceChanged()
	none.SyncDone(true, time.Second)
	none.SetPending(1, 1)
}

func TestServe(t *testing.T) {
	m := New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, addr) }()
	var body string
	for i := 0; i < 500; i++ { // 10 s: generous on a loaded machine
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, "flatnet_sync_proxy_rules_service_changes_total 0") {
		t.Errorf("/metrics over HTTP: %q", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve after cancel: %v", err)
	}
	// The address is taken: an error at once.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if err := m.Serve(context.Background(), busy.Addr().String()); err == nil {
		t.Error("Serve on a busy address succeeded")
	}
}

// /proxyMode answers the mode, as kube-proxy's metrics port does (the
// e2e suite's "should check kube-proxy urls" wants 200 there); without a
// mode there is no such path.
func TestProxyMode(t *testing.T) {
	m := New()
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		m.Mux().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/proxyMode", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get(); code != http.StatusNotFound {
		t.Errorf("/proxyMode without a mode: %d", code)
	}
	m.ProxyMode = "nftables"
	if code, body := get(); code != http.StatusOK || body != "nftables" {
		t.Errorf("/proxyMode: %d %q", code, body)
	}
}

// /debug/pprof/ is served only with Profiling.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		m := New()
		m.Profiling = on
		rec := httptest.NewRecorder()
		m.Mux().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap", nil))
		if got := rec.Code == 200 && rec.Body.Len() > 0; got != on {
			t.Errorf("Profiling %v: /debug/pprof/heap answered %d (%d bytes)", on, rec.Code, rec.Body.Len())
		}
	}
}
