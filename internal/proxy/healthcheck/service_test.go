package healthcheck

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// fakeListen opens real listeners on loopback, ephemeral ports, and
// remembers which address each was asked for.
type fakeListen struct {
	mu     sync.Mutex
	asked  []string
	byAddr map[string]net.Listener
	fail   map[string]bool
}

func (f *fakeListen) listen(addr string) (net.Listener, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, addr)
	if f.fail[addr] {
		return nil, errors.New("address already in use")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f.byAddr[addr] = ln
	return ln, nil
}

func (f *fakeListen) url(addr string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "http://" + f.byAddr[addr].Addr().String() + "/"
}

type check struct {
	code int
	body serviceStatus
	raw  string
}

func getCheck(t *testing.T, url string) (check, error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return check{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return check{}, err
	}
	c := check{code: resp.StatusCode, raw: string(b)}
	if err := json.Unmarshal(b, &c.body); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return c, nil
}

func TestServiceHealth(t *testing.T) {
	fl := &fakeListen{byAddr: map[string]net.Listener{}, fail: map[string]bool{}}
	proxyHealthy := true
	var mu sync.Mutex
	s := NewServiceHealth(ServiceHealthConfig{Listen: fl.listen, ProxyHealthy: func() bool {
		mu.Lock()
		defer mu.Unlock()
		return proxyHealthy
	}})
	defer s.Close()
	v4, v6 := s.Family("IPv4"), s.Family("IPv6")
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	empty := types.NamespacedName{Namespace: "ns", Name: "empty"}

	if err := v4.Sync(map[types.NamespacedName]Service{web: {Port: 32001, LocalEndpoints: 2}, empty: {Port: 32002}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[types.NamespacedName]uint16{web: 32001, empty: 32002}, s.Ports()); diff != "" {
		t.Errorf("open ports (-want +got):\n%s", diff)
	}
	got, err := getCheck(t, fl.url("0.0.0.0:32001"))
	if err != nil {
		t.Fatal(err)
	}
	if got.code != 200 || got.body.Service.Namespace != "ns" || got.body.Service.Name != "web" || got.body.LocalEndpoints != 2 || !got.body.ServiceProxyHealthy {
		t.Errorf("web: %d %s", got.code, got.raw)
	}
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if got.raw != want {
		t.Errorf("body %q, want kube-proxy's %q", got.raw, want)
	}
	if got, _ := getCheck(t, fl.url("0.0.0.0:32002")); got.code != 503 || got.body.LocalEndpoints != 0 {
		t.Errorf("no local endpoints: %d %s", got.code, got.raw)
	}

	// The proxy itself unhealthy: every check fails.
	mu.Lock()
	proxyHealthy = false
	mu.Unlock()
	if got, _ := getCheck(t, fl.url("0.0.0.0:32001")); got.code != 503 || got.body.ServiceProxyHealthy {
		t.Errorf("proxy unhealthy: %d %s", got.code, got.raw)
	}
	mu.Lock()
	proxyHealthy = true
	mu.Unlock()

	// The other family reports the same services; the larger count wins.
	if err := v6.Sync(map[types.NamespacedName]Service{web: {Port: 32001, LocalEndpoints: 1}, empty: {Port: 32002, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := getCheck(t, fl.url("0.0.0.0:32001")); got.body.LocalEndpoints != 2 {
		t.Errorf("web after the IPv6 sync: %s", got.raw)
	}
	if got, _ := getCheck(t, fl.url("0.0.0.0:32002")); got.code != 200 || got.body.LocalEndpoints != 1 {
		t.Errorf("empty after the IPv6 sync: %d %s", got.code, got.raw)
	}

	// A service gone from every family: its listener closes; a port
	// change reopens; a busy port is an error and retried next time.
	oldURL := fl.url("0.0.0.0:32002")
	fl.fail["0.0.0.0:32003"] = true
	err = v4.Sync(map[types.NamespacedName]Service{web: {Port: 32003, LocalEndpoints: 2}})
	if err == nil {
		t.Error("a busy port was not reported")
	}
	if err := v6.Sync(nil); err == nil {
		t.Error("the busy port, tried again, was not reported")
	}
	if diff := cmp.Diff(map[types.NamespacedName]uint16{}, s.Ports()); diff != "" {
		t.Errorf("open ports after removal and a failed listen (-want +got):\n%s", diff)
	}
	if _, err := http.Get(oldURL); err == nil {
		t.Error("the removed service's listener still answers")
	}
	delete(fl.fail, "0.0.0.0:32003")
	if err := v4.Sync(map[types.NamespacedName]Service{web: {Port: 32003, LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := getCheck(t, fl.url("0.0.0.0:32003")); got.code != 200 {
		t.Errorf("web on its new port: %d %s", got.code, got.raw)
	}
	if diff := cmp.Diff([]string{"0.0.0.0:32002", "0.0.0.0:32001", "0.0.0.0:32003", "0.0.0.0:32003", "0.0.0.0:32003"}, fl.asked); diff != "" {
		t.Errorf("listen calls (-want +got):\n%s", diff)
	}

	// Close: every listener goes, later syncs open none.
	url := fl.url("0.0.0.0:32003")
	s.Close()
	if _, err := http.Get(url); err == nil {
		t.Error("a listener answers after Close")
	}
	if err := v4.Sync(map[types.NamespacedName]Service{web: {Port: 32001}}); err != nil || len(s.Ports()) != 0 {
		t.Errorf("sync after Close: %v, ports %v", err, s.Ports())
	}
	var none *ServiceFamily
	if err := none.Sync(map[types.NamespacedName]Service{web: {Port: 1}}); err != nil {
		t.Error(err)
	}
}
