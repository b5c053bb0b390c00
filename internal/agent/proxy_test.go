package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/proxier"
)

func TestProxyFlags(t *testing.T) {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	var o Options
	addProxyFlags(fs, &o)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.MetricsBindAddress != "127.0.0.1:10249" || o.HealthzBindAddress != "127.0.0.1:10256" ||
		o.ProxyMinSyncPeriod != 0 || o.ProxySyncPeriod != 30*time.Second || o.ProxyFullSyncPeriod != time.Hour {
		t.Errorf("defaults: %+v", o)
	}
	if err := fs.Parse([]string{"--metrics-bind-address=0.0.0.0:9100", "--healthz-bind-address="}); err != nil {
		t.Fatal(err)
	}
	if o.MetricsBindAddress != "0.0.0.0:9100" || o.HealthzBindAddress != "" {
		t.Errorf("parsed: %+v", o)
	}
}

func TestProxyServersConfig(t *testing.T) {
	for _, tt := range []struct {
		addr string
		ok   bool
	}{
		{"", true}, {"0", true}, {"127.0.0.1:10256", true}, {"[::]:10256", true}, {"0.0.0.0:1", true},
		{"localhost:10256", false}, {"127.0.0.1", false}, {"127.0.0.1:0", false}, {"127.0.0.1:65536", false}, {":10256", false},
	} {
		_, err := newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{MetricsBindAddress: tt.addr, SyncPeriod: time.Second})
		if (err == nil) != tt.ok {
			t.Errorf("--metrics-bind-address %q: err %v, want ok=%v", tt.addr, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--metrics-bind-address") {
			t.Errorf("error does not name the flag: %v", err)
		}
	}

	// The first proxier counts Service changes and runs the servers.
	s, err := newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{SyncPeriod: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	v4 := proxier.Config{Render: nftables.Config{Family: knftables.IPv4Family}}
	v6 := proxier.Config{Render: nftables.Config{Family: knftables.IPv6Family}}
	s.configure(&v4)
	s.configure(&v6)
	if v4.Serve == nil || v6.Serve != nil || v4.Metrics == nil || v6.Metrics == nil || v4.Health == nil || v6.Health == nil ||
		v4.ServiceHealth == nil || v6.ServiceHealth == nil {
		t.Errorf("configured: %+v / %+v", v4, v6)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// The servers answer on their addresses until ctx ends; a disabled one
// does not listen; a busy address is an error only with HardFail.
func TestProxyServersRun(t *testing.T) {
	metricsAddr, healthzAddr := freeAddr(t), freeAddr(t)
	s, err := newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{NodeName: "node-a", SyncPeriod: time.Second,
		MetricsBindAddress: metricsAddr, HealthzBindAddress: healthzAddr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	waitHTTP := func(url, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, body, err := httpGet(url)
			if err == nil && code == 200 && strings.Contains(body, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %d %q %v; want 200 with %q", url, code, body, err, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitHTTP("http://"+metricsAddr+"/metrics", "flatnet_sync_proxy_rules_service_changes_total")
	waitHTTP("http://"+healthzAddr+"/healthz", `"nodeName":"node-a"`)
	waitHTTP("http://"+healthzAddr+"/livez", `"currentTime"`)
	waitHTTP("http://"+metricsAddr+"/metrics", `flatnet_proxy_healthz_total{code="200"} 1`)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}

	// Disabled: nothing listens; a busy address fails with HardFail.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err = newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{SyncPeriod: time.Second, MetricsBindAddress: "0",
		HealthzBindAddress: busy.Addr().String(), HardFail: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(context.Background()); err == nil || !strings.Contains(err.Error(), "healthz") {
		t.Errorf("run with a busy healthz address and HardFail: %v", err)
	}
}

// Collectors given to the servers are served with the proxy's metrics
// (the lab runtime's CNI timings); one registered twice is refused.
func TestProxyServersCollectors(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "flatnet_test_more_total", Help: "a test counter"})
	c.Inc()
	s, err := newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{SyncPeriod: time.Second, Collectors: []prometheus.Collector{c}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, "flatnet_test_more_total 1") || !strings.Contains(body, "flatnet_sync_proxy_rules") {
		t.Errorf("/metrics lacks the added collector or the proxy's own:\n%s", body)
	}
	if _, err := newProxyServers(nil, ProxyModeNFTables, proxyServersConfig{SyncPeriod: time.Second, Collectors: []prometheus.Collector{c, c}}); err == nil {
		t.Error("a collector registered twice was accepted")
	}
}
