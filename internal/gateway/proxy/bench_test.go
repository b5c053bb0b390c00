package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// BenchmarkProxy measures requests/s through the proxy to a loopback
// backend over keep-alive connections (client, proxy and backend share
// the process, so the figure is a floor; the nginx comparison is make
// bench-gateway's). The table has 1,000 other routes on the port.
//
//	go test -run '^$' -bench Proxy -benchmem -cpu 1,2 ./internal/gateway/proxy
func BenchmarkProxy(b *testing.B) {
	body := []byte("hello from the backend\n")
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(body)
	}))
	defer backend.Close()

	s := newTestServer(b, Options{})
	bind := freePort(b)
	be := &table.Backend{Name: "ns/bench:80", Weight: 1, Endpoints: []string{backend.Listener.Addr().String()}}
	rules := []*table.Rule{rule("/bench", forward("HTTPRoute/ns/bench", be))}
	for i := range 1000 {
		rules = append(rules, rule(fmt.Sprintf("/other-%d", i), forward(fmt.Sprintf("HTTPRoute/ns/o%d", i), be)))
	}
	mustUpdate(b, s, tableOf(port(bind, table.HTTP, hosted{"bench.example.com", rules})))

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
	url := fmt.Sprintf("http://127.0.0.1:%d/bench", bind)
	b.ResetTimer()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Host = "bench.example.com"
		for pb.Next() {
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
