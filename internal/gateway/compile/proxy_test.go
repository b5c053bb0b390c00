package compile

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/flatnet/flatnet/internal/gateway/proxy"
)

// The tests in this file serve the suite's manifests for real: Compile's
// table goes into the proxy, listening on loopback, in front of one echo
// server per Service (answering like echo-basic: who it is, the path, host
// and headers it got). They check the contract between the two packages
// (what a field of the table means) on the suite's own expectations.

// echoReply is what an echo backend answers.
type echoReply struct {
	Pod       string      `json:"pod"`
	Namespace string      `json:"namespace"`
	Path      string      `json:"path"`
	Host      string      `json:"host"`
	Headers   http.Header `json:"headers"`
}

// served is the suite's manifests compiled and served.
type served struct {
	in     *Input
	client *http.Client
}

func serve(t *testing.T, files ...string) *served {
	t.Helper()
	in := loadConformance(t, files...)
	// One echo server per Service with a selector: its EndpointSlice points
	// there, every port of the slice to the server's port.
	for _, es := range in.EndpointSlices {
		if !strings.HasSuffix(es.Name, "-auto") {
			continue
		}
		svc, ns := es.Labels[discoveryv1.LabelServiceName], es.Namespace
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(echoReply{Pod: svc + "-pod", Namespace: ns, Path: r.URL.Path, Host: r.Host, Headers: r.Header})
		}))
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		var p int32
		fmt.Sscan(port, &p)
		es.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}}}
		for i := range es.Ports {
			es.Ports[i].Port = ptrTo(p)
		}
	}
	for k := range in.Binds {
		in.Binds[k] = freePort(t)
	}
	out := Compile(in)
	s := proxy.New(proxy.Options{BindAddress: "127.0.0.1"})
	t.Cleanup(func() { s.Close(t.Context()) })
	if err := s.Update(out.Table); err != nil {
		t.Fatal(err)
	}
	return &served{in: in, client: &http.Client{
		Timeout:       5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}}
}

func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// do sends a request to a Gateway's listener port and returns the answer
// and, when a backend answered, its echo.
func (s *served) do(t *testing.T, gw string, port int32, scheme, host, path string, hdr map[string]string) (*http.Response, *echoReply) {
	t.Helper()
	bind := s.in.Binds[BindKey{Gateway: gwKey(gw), Port: port}]
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, bind, path), nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if scheme == "https" {
		tr := s.client.Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.ServerName = host
		req = req.WithContext(t.Context())
		resp, err := (&http.Client{Transport: tr, Timeout: s.client.Timeout}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", host, path, err)
		}
		return resp, readEcho(t, resp)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", host, path, err)
	}
	return resp, readEcho(t, resp)
}

func readEcho(t *testing.T, resp *http.Response) *echoReply {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var e echoReply
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return nil
	}
	return &e
}

func TestServedCore(t *testing.T) {
	s := serve(t, "httproute-simple-same-namespace.yaml", "httproute-partially-invalid-via-invalid-reference-grant.yaml",
		"httproute-request-header-modifier.yaml", "httproute-https-listener.yaml")
	for _, tc := range []struct {
		path, want string
		status     int
	}{
		{"/", infra + "/infra-backend-v1", 200},
		{"/v2", "", 500}, // the backend no ReferenceGrant allows
	} {
		resp, e := s.do(t, "same-namespace", 80, "http", "", tc.path, nil)
		if resp.StatusCode != tc.status || e != nil && e.Namespace+"/"+strings.TrimSuffix(e.Pod, "-pod") != tc.want {
			t.Errorf("%s: %d %+v, want %d from %s", tc.path, resp.StatusCode, e, tc.status, tc.want)
		}
	}

	// RequestHeaderModifier: set overwrites, add appends, remove removes.
	_, e := s.do(t, "same-namespace", 80, "http", "", "/set", map[string]string{"X-Header-Set": "some-other-value"})
	if e == nil || e.Headers.Get("X-Header-Set") != "set-overwrites-values" {
		t.Errorf("/set: %+v", e)
	}
	_, e = s.do(t, "same-namespace", 80, "http", "", "/add", map[string]string{"X-Header-Add": "some-other-value"})
	if e == nil || strings.Join(e.Headers.Values("X-Header-Add"), ",") != "some-other-value,add-appends-values" {
		t.Errorf("/add: %+v", e)
	}
	_, e = s.do(t, "same-namespace", 80, "http", "", "/remove", map[string]string{"X-Header-Remove": "val"})
	if e == nil || e.Headers.Get("X-Header-Remove") != "" {
		t.Errorf("/remove: %+v", e)
	}

	// HTTPS with SNI: the route with hostname example.org, and the one on
	// the listener for second-example.org.
	for host, want := range map[string]string{"example.org": "infra-backend-v1", "second-example.org": "infra-backend-v2"} {
		resp, e := s.do(t, "same-namespace-with-https-listener", 443, "https", host, "/", nil)
		if resp.StatusCode != 200 || e == nil || e.Pod != want+"-pod" {
			t.Errorf("https %s: %d %+v, want %s", host, resp.StatusCode, e, want)
		}
	}
}

func TestServedRewriteAndRedirect(t *testing.T) {
	s := serve(t, "httproute-rewrite-path.yaml", "httproute-redirect-path.yaml")
	for path, want := range map[string]string{
		"/prefix/one/two":     "/one/two",
		"/strip-prefix/three": "/three",
		"/strip-prefix":       "/",
		"/full/one/two":       "/one",
		"/full/rewrite-path-and-modify-headers/test":  "/test",
		"/prefix/rewrite-path-and-modify-headers/one": "/prefix/one",
	} {
		resp, e := s.do(t, "same-namespace", 80, "http", "", path, nil)
		if resp.StatusCode != 200 || e == nil || e.Path != want || e.Pod != "infra-backend-v1-pod" {
			t.Errorf("rewrite %s: %d %+v, want %s", path, resp.StatusCode, e, want)
		}
	}
	for _, tc := range []struct {
		path   string
		status int
		host   string
		want   string
	}{
		{"/original-prefix/lemon", 302, "", "/replacement-prefix/lemon"},
		{"/full/path/original", 302, "", "/full-path-replacement"},
		{"/path-and-host", 302, "example.org", "/replacement-prefix"},
		{"/path-and-status", 301, "", "/replacement-prefix"},
		{"/full-path-and-host", 302, "example.org", "/replacement-full"},
		{"/full-path-and-status", 301, "", "/replacement-full"},
	} {
		resp, _ := s.do(t, "same-namespace", 80, "http", "", tc.path, nil)
		loc, err := resp.Location()
		if resp.StatusCode != tc.status || err != nil || loc.Path != tc.want || tc.host != "" && loc.Hostname() != tc.host {
			t.Errorf("redirect %s: %d %v, want %d to %s%s", tc.path, resp.StatusCode, loc, tc.status, tc.host, tc.want)
		}
	}
}

// TestServedWeight: HTTPRouteWeight's 70/30/0 over 100 sequential
// requests is exact (smooth weighted round robin).
func TestServedWeight(t *testing.T) {
	s := serve(t, "httproute-weight.yaml")
	counts := map[string]int{}
	for range 100 {
		if _, e := s.do(t, "same-namespace", 80, "http", "", "/", nil); e != nil {
			counts[e.Pod]++
		}
	}
	if counts["infra-backend-v1-pod"] != 70 || counts["infra-backend-v2-pod"] != 30 || len(counts) != 2 {
		t.Errorf("100 requests: %v, want 70/30/0", counts)
	}
}
