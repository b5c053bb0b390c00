package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

func TestRouting(t *testing.T) {
	v1, v2, v3 := newBackend(t, "v1"), newBackend(t, "v2"), newBackend(t, "v3")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP,
		hosted{"a.example.com", []*table.Rule{
			rule("/", forward("HTTPRoute/ns/a", backendOf("ns/v1:80", 1, v1))),
			rule("/two", forward("HTTPRoute/ns/a2", backendOf("ns/v2:80", 1, v2))),
			rule("/", forward("HTTPRoute/ns/hdr", backendOf("ns/v3:80", 1, v3)),
				table.ValueMatch{Name: "X-Version", Value: "three"}),
		}},
		hosted{"*.wild.example.com", []*table.Rule{rule("/", forward("HTTPRoute/ns/w", backendOf("ns/v2:80", 1, v2)))}},
	)))

	for _, c := range []struct {
		host, path string
		hdr        []string
		want       string // backend, or a status
	}{
		{"a.example.com", "/", nil, "v1"},
		{"A.Example.Com:8080", "/x", nil, "v1"},
		{"a.example.com", "/two/x", nil, "v2"},
		{"a.example.com", "/twofold", nil, "v1"},
		{"a.example.com", "/", []string{"X-Version", "three"}, "v3"},
		{"x.wild.example.com", "/", nil, "v2"},
		{"wild.example.com", "/", nil, "404"},
		{"b.example.com", "/", nil, "404"},
	} {
		resp, body := get(t, bind, c.host, c.path, c.hdr...)
		if c.want == "404" {
			if resp.StatusCode != 404 {
				t.Errorf("%s%s: got %d, want 404", c.host, c.path, resp.StatusCode)
			}
			continue
		}
		e := echoed(t, resp, body)
		if e.Backend != c.want || e.Host != c.host || e.Path != c.path {
			t.Errorf("%s%s %v: got %s host %q path %q, want %s", c.host, c.path, c.hdr, e.Backend, e.Host, e.Path, c.want)
		}
		if got := e.Headers.Get("X-Forwarded-For"); got != "127.0.0.1" {
			t.Errorf("X-Forwarded-For %q", got)
		}
		if got := e.Headers.Get("X-Forwarded-Host"); got != c.host {
			t.Errorf("X-Forwarded-Host %q, want %q", got, c.host)
		}
		if got := e.Headers.Get("X-Forwarded-Proto"); got != "http" {
			t.Errorf("X-Forwarded-Proto %q", got)
		}
	}
}

func TestHealthz(t *testing.T) {
	s := newTestServer(t, Options{})
	check := func(want int) {
		t.Helper()
		w := httptest.NewRecorder()
		s.HealthHandler().ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
		if w.Code != want {
			t.Errorf("healthz %d, want %d", w.Code, want)
		}
	}
	check(503)
	mustUpdate(t, s, tableOf())
	check(200)
}

func TestRedirect(t *testing.T) {
	s := newTestServer(t, Options{})
	bind := freePort(t)
	redir := func(prefix string, rd table.Redirect) *table.Rule {
		return rule(prefix, &table.Action{Route: "HTTPRoute/ns/r", Redirect: &rd})
	}
	p := port(bind, table.HTTP, hosted{"", []*table.Rule{
		redir("/scheme-nil-and-port-nil", table.Redirect{Hostname: "example.org"}),
		redir("/scheme-nil-and-port-8080", table.Redirect{Hostname: "example.org", Port: 8080}),
		redir("/scheme-https-and-port-nil", table.Redirect{Scheme: "https", Hostname: "example.org"}),
		redir("/scheme-https-and-port-443", table.Redirect{Scheme: "https", Hostname: "example.org", Port: 443}),
		redir("/scheme-https-and-port-8443", table.Redirect{Scheme: "https", Hostname: "example.org", Port: 8443}),
		redir("/scheme-http", table.Redirect{Scheme: "http"}),
		redir("/original-prefix", table.Redirect{StatusCode: 301,
			Path: &table.PathModifier{ReplacePrefix: "/replacement-prefix", Prefix: "/original-prefix"}}),
		redir("/full/path", table.Redirect{StatusCode: 308, Path: &table.PathModifier{Full: "/full-path-replacement", FullSet: true}}),
		redir("/strip", table.Redirect{Path: &table.PathModifier{ReplacePrefix: "/", Prefix: "/strip"}}),
	}})
	p.Listen = 8080 // a listener on 8080: kept unless the scheme is set
	mustUpdate(t, s, tableOf(p))

	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/scheme-nil-and-port-nil", 302, "http://example.org:8080/scheme-nil-and-port-nil"},
		{"/scheme-nil-and-port-8080", 302, "http://example.org:8080/scheme-nil-and-port-8080"},
		{"/scheme-https-and-port-nil", 302, "https://example.org/scheme-https-and-port-nil"},
		{"/scheme-https-and-port-443", 302, "https://example.org/scheme-https-and-port-443"},
		{"/scheme-https-and-port-8443", 302, "https://example.org:8443/scheme-https-and-port-8443"},
		{"/scheme-http?q=1", 302, "http://gw.example.com/scheme-http?q=1"},
		{"/original-prefix/lemon", 301, "http://gw.example.com:8080/replacement-prefix/lemon"},
		{"/full/path/original", 308, "http://gw.example.com:8080/full-path-replacement"},
		{"/strip", 302, "http://gw.example.com:8080/"},
		{"/strip/x/y", 302, "http://gw.example.com:8080/x/y"},
	} {
		resp, _ := get(t, bind, "gw.example.com:9999", c.path)
		if resp.StatusCode != c.code || resp.Header.Get("Location") != c.want {
			t.Errorf("%s: got %d %q, want %d %q", c.path, resp.StatusCode, resp.Header.Get("Location"), c.code, c.want)
		}
	}
}

func TestModifyPath(t *testing.T) {
	for _, c := range []struct {
		path, prefix, repl, want string
	}{
		{"/prefix/one/two", "/prefix/one", "/one", "/one/two"},
		{"/strip-prefix/three", "/strip-prefix", "/", "/three"},
		{"/strip-prefix", "/strip-prefix", "/", "/"},
		{"/strip-prefix/", "/strip-prefix", "/", "/"},
		{"/foo", "/foo/", "/bar", "/bar"},
		{"/foo/x", "/foo/", "/bar/", "/bar/x"},
		{"/x", "/", "/bar", "/bar/x"},
		{"/prefix/rewrite-path-and-modify-headers/one", "/prefix/rewrite-path-and-modify-headers", "/prefix", "/prefix/one"},
	} {
		got := modifyPath(c.path, &table.PathModifier{Prefix: c.prefix, ReplacePrefix: c.repl})
		if got != c.want {
			t.Errorf("%s with %s -> %s: got %s, want %s", c.path, c.prefix, c.repl, got, c.want)
		}
	}
}

func TestRewriteAndHeaderFilters(t *testing.T) {
	v1 := newBackend(t, "v1")
	s := newTestServer(t, Options{})
	bind := freePort(t)

	rewrite := forward("HTTPRoute/ns/rw", backendOf("ns/v1:80", 1, v1))
	rewrite.Rewrite = &table.Rewrite{Hostname: "internal.example", Path: &table.PathModifier{Prefix: "/prefix/one", ReplacePrefix: "/one"}}
	full := forward("HTTPRoute/ns/full", backendOf("ns/v1:80", 1, v1))
	full.Rewrite = &table.Rewrite{Path: &table.PathModifier{Full: "/one", FullSet: true}}
	hdrs := forward("HTTPRoute/ns/hdr", backendOf("ns/v1:80", 1, v1))
	hdrs.RequestHeaders = table.HeaderFilter{
		Set:    []table.Header{{Name: "X-Header-Set", Value: "set-overwrites-values"}},
		Add:    []table.Header{{Name: "X-Header-Add", Value: "add-appends-values"}},
		Remove: []string{"X-Header-Remove"},
	}
	hdrs.ResponseHeaders = table.HeaderFilter{Set: []table.Header{{Name: "X-Resp", Value: "route"}}, Remove: []string{"X-Backend"}}
	hdrs.Backends[0].RequestHeaders = table.HeaderFilter{Add: []table.Header{{Name: "X-Backend-Level", Value: "yes"}}}
	hdrs.Backends[0].ResponseHeaders = table.HeaderFilter{Add: []table.Header{{Name: "X-Resp-Backend", Value: "yes"}}}

	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{
		rule("/prefix/one", rewrite), rule("/full", full), rule("/hdr", hdrs),
	}})))

	e := getEcho(t, bind, "gw.example.com", "/prefix/one/two?x=1")
	if e.Host != "internal.example" || e.Path != "/one/two" || e.Query != "x=1" {
		t.Errorf("rewrite: got host %q path %q query %q", e.Host, e.Path, e.Query)
	}
	if got := e.Headers.Get("X-Forwarded-Host"); got != "gw.example.com" {
		t.Errorf("rewrite: X-Forwarded-Host %q, want the client's host", got)
	}
	e = getEcho(t, bind, "gw.example.com", "/full/a/b")
	if e.Path != "/one" || e.Host != "gw.example.com" {
		t.Errorf("full rewrite: got host %q path %q", e.Host, e.Path)
	}
	resp, body := get(t, bind, "gw.example.com", "/hdr", "X-Header-Set", "old", "X-Header-Add", "first", "X-Header-Remove", "gone")
	e = echoed(t, resp, body)
	if got := e.Headers.Values("X-Header-Set"); len(got) != 1 || got[0] != "set-overwrites-values" {
		t.Errorf("set: %q", got)
	}
	if got := e.Headers.Values("X-Header-Add"); strings.Join(got, ",") != "first,add-appends-values" {
		t.Errorf("add: %q", got)
	}
	if got := e.Headers.Values("X-Header-Remove"); len(got) != 0 {
		t.Errorf("remove: %q", got)
	}
	if e.Headers.Get("X-Backend-Level") != "yes" {
		t.Errorf("backend-level request filter not applied: %v", e.Headers)
	}
	if resp.Header.Get("X-Resp") != "route" || resp.Header.Get("X-Resp-Backend") != "yes" || resp.Header.Get("X-Backend") != "" {
		t.Errorf("response filters: %v", resp.Header)
	}
}

func TestMirror(t *testing.T) {
	v1, mirror, never := newBackend(t, "v1"), newBackend(t, "mirror"), newBackend(t, "never")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	a := forward("HTTPRoute/ns/m", backendOf("ns/v1:80", 1, v1))
	a.RequestHeaders = table.HeaderFilter{Set: []table.Header{{Name: "X-Filtered", Value: "1"}}}
	a.Mirrors = []*table.Mirror{
		{Backend: backendOf("ns/mirror:80", 1, mirror), Percent: 100},
		{Backend: backendOf("ns/never:80", 1, never), Percent: 0},
	}
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/", a)}})))

	if e := getEcho(t, bind, "m.example.com", "/mirrored"); e.Backend != "v1" {
		t.Fatalf("answered by %s", e.Backend)
	}
	select {
	case e := <-mirror.got:
		if e.Path != "/mirrored" || e.Host != "m.example.com" || e.Headers.Get("X-Filtered") != "1" {
			t.Errorf("mirror got %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror got no copy")
	}
	// A body is copied to the mirror too.
	resp, err := testClient.Post(fmt.Sprintf("http://127.0.0.1:%d/post", bind), "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case e := <-mirror.got:
		if e.Method != "POST" {
			t.Errorf("mirror got %+v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror got no copy of the POST")
	}
	if n := never.hits.Load(); n != 0 {
		t.Errorf("a 0 %% mirror got %d requests", n)
	}
}

func TestWeights(t *testing.T) {
	v1, v2, v3 := newBackend(t, "v1"), newBackend(t, "v2"), newBackend(t, "v3")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/",
		forward("HTTPRoute/ns/w", backendOf("ns/v1:80", 70, v1), backendOf("ns/v2:80", 30, v2), backendOf("ns/v3:80", 0, v3)))}})))
	counts := map[string]int{}
	for range 200 {
		counts[getEcho(t, bind, "w", "/").Backend]++
	}
	if counts["v1"] != 140 || counts["v2"] != 60 || counts["v3"] != 0 {
		t.Errorf("200 requests at 70/30/0 went %v", counts)
	}
}

func TestEndpointRoundRobin(t *testing.T) {
	e1, e2 := newBackend(t, "e1"), newBackend(t, "e2")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/",
		forward("HTTPRoute/ns/rr", backendOf("ns/svc:80", 1, e1, e2)))}})))
	counts := map[string]int{}
	for range 10 {
		counts[getEcho(t, bind, "rr", "/").Backend]++
	}
	if counts["e1"] != 5 || counts["e2"] != 5 {
		t.Errorf("10 requests over 2 endpoints went %v", counts)
	}
}

func TestErrorAnswers(t *testing.T) {
	s := newTestServer(t, Options{})
	bind := freePort(t)
	invalid := backendOf("ns/missing:80", 1)
	invalid.Invalid = true
	down := freePort(t) // nothing listens there
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{
		rule("/invalid", forward("HTTPRoute/ns/invalid", invalid)),
		rule("/noendpoints", forward("HTTPRoute/ns/noep", backendOf("ns/empty:80", 1))),
		rule("/nobalancer", &table.Action{Route: "HTTPRoute/ns/nobal", Backends: []*table.Backend{backendOf("ns/x:80", 0)}}),
		rule("/direct", &table.Action{Route: "HTTPRoute/ns/direct", Direct: 500}),
		rule("/down", forward("HTTPRoute/ns/down", &table.Backend{Name: "ns/down:80", Weight: 1, Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", down)}})),
	}})))
	for path, want := range map[string]int{"/invalid": 500, "/noendpoints": 503, "/nobalancer": 500, "/direct": 500, "/down": 502} {
		if resp, _ := get(t, bind, "e", path); resp.StatusCode != want {
			t.Errorf("%s: got %d, want %d", path, resp.StatusCode, want)
		}
	}
}

func TestGRPCErrorsAreStatuses(t *testing.T) {
	s := newTestServer(t, Options{})
	bind := freePort(t)
	a := forward("GRPCRoute/ns/g", backendOf("ns/empty:80", 1))
	a.GRPC = true
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/svc.Echo/", a)}})))
	for path, want := range map[string]string{"/svc.Echo/Call": "14", "/other.Svc/Call": "12"} {
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d%s", bind, path), strings.NewReader(""))
		req.Header.Set("Content-Type", "application/grpc")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Grpc-Status") != want || resp.Header.Get("Content-Type") != "application/grpc" {
			t.Errorf("%s: got %d grpc-status %q, want 200 grpc-status %s", path, resp.StatusCode, resp.Header.Get("Grpc-Status"), want)
		}
	}
}

func TestTimeoutsAndRetries(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	var calls atomic.Int64
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Fails the first two tries of every three.
		if calls.Add(1)%3 != 0 {
			w.WriteHeader(503)
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(flaky.Close)

	s := newTestServer(t, Options{})
	bind := freePort(t)
	to := forward("HTTPRoute/ns/to", &table.Backend{Name: "ns/slow:80", Weight: 1, Endpoints: []string{slow.Listener.Addr().String()}})
	to.Timeout = 100 * time.Millisecond
	bto := forward("HTTPRoute/ns/bto", &table.Backend{Name: "ns/slow:80", Weight: 1, Endpoints: []string{slow.Listener.Addr().String()}})
	bto.BackendTimeout = 100 * time.Millisecond
	retry := forward("HTTPRoute/ns/retry", &table.Backend{Name: "ns/flaky:80", Weight: 1, Endpoints: []string{flaky.Listener.Addr().String()}})
	retry.Retry = &table.Retry{Codes: []int{503}, Attempts: 2, Backoff: time.Millisecond}
	noRetry := forward("HTTPRoute/ns/noretry", &table.Backend{Name: "ns/flaky:80", Weight: 1, Endpoints: []string{flaky.Listener.Addr().String()}})
	noRetry.Retry = &table.Retry{Codes: []int{503}, Attempts: 1}
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{
		rule("/timeout", to), rule("/backend-timeout", bto), rule("/retry", retry), rule("/no-retry", noRetry),
	}})))

	for _, path := range []string{"/timeout", "/backend-timeout"} {
		start := time.Now()
		resp, _ := get(t, bind, "t", path)
		if resp.StatusCode != 504 || time.Since(start) > 1500*time.Millisecond {
			t.Errorf("%s: got %d after %v, want 504 after about 100ms", path, resp.StatusCode, time.Since(start))
		}
	}
	calls.Store(0)
	if resp, body := get(t, bind, "t", "/retry"); resp.StatusCode != 200 || string(body) != "ok" || calls.Load() != 3 {
		t.Errorf("retry: got %d %q after %d calls, want 200 after 3", resp.StatusCode, body, calls.Load())
	}
	calls.Store(0)
	if resp, _ := get(t, bind, "t", "/no-retry"); resp.StatusCode != 503 || calls.Load() != 2 {
		t.Errorf("1 attempt: got %d after %d calls, want 503 after 2", resp.StatusCode, calls.Load())
	}
	// A body that cannot be replayed is not retried.
	calls.Store(0)
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d/retry", bind), strings.NewReader("body"))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || calls.Load() != 1 {
		t.Errorf("POST with a body: got %d after %d calls, want 503 after 1", resp.StatusCode, calls.Load())
	}
}

func TestListenersFollowPorts(t *testing.T) {
	v1 := newBackend(t, "v1")
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Write([]byte("finished"))
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	s := newTestServer(t, Options{})
	p1, p2 := freePort(t), freePort(t)
	rules := []*table.Rule{
		rule("/slow", forward("HTTPRoute/ns/slow", &table.Backend{Name: "ns/slow:80", Weight: 1, Endpoints: []string{slow.Listener.Addr().String()}})),
		rule("/", forward("HTTPRoute/ns/a", backendOf("ns/v1:80", 1, v1))),
	}
	mustUpdate(t, s, tableOf(port(p1, table.HTTP, hosted{"", rules})))
	getEcho(t, p1, "a", "/")
	if _, _, err := tryGet(p2, "a", "/"); err == nil {
		t.Fatalf("port %d answers before it is in the table", p2)
	}

	mustUpdate(t, s, tableOf(port(p1, table.HTTP, hosted{"", rules}), port(p2, table.HTTP, hosted{"", rules})))
	getEcho(t, p2, "a", "/")

	// A request in flight on p1 finishes after p1 leaves the table.
	done := make(chan string, 1)
	go func() {
		_, body, err := tryGet(p1, "a", "/slow")
		if err != nil {
			done <- err.Error()
			return
		}
		done <- string(body)
	}()
	waitFor(t, func() bool { return len(s.listeners) == 2 }) // (trivially true; the request needs a moment)
	time.Sleep(100 * time.Millisecond)
	mustUpdate(t, s, tableOf(port(p2, table.HTTP, hosted{"", rules})))
	c := &http.Client{Transport: &http.Transport{}} // fresh connections: p1 must refuse them
	if _, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", p1)); err == nil {
		t.Errorf("port %d still accepts after it left the table", p1)
	}
	getEcho(t, p2, "a", "/")
	close(release)
	if got := <-done; got != "finished" {
		t.Errorf("the in-flight request on the removed port got %q", got)
	}

	// The port can come back at once.
	mustUpdate(t, s, tableOf(port(p1, table.HTTP, hosted{"", rules}), port(p2, table.HTTP, hosted{"", rules})))
	getEcho(t, p1, "a", "/")
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("timed out")
		}
	}
}

func TestUnbindablePort(t *testing.T) {
	v1 := newBackend(t, "v1")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := int32(busy.Addr().(*net.TCPAddr).Port)
	s := newTestServer(t, Options{})
	ok := freePort(t)
	rules := []*table.Rule{rule("/", forward("HTTPRoute/ns/a", backendOf("ns/v1:80", 1, v1)))}
	err = s.Update(tableOf(port(ok, table.HTTP, hosted{"", rules}), port(taken, table.HTTP, hosted{"", rules})))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("port %d", taken)) {
		t.Fatalf("Update with port %d taken: got %v, want an error naming it", taken, err)
	}
	t.Logf("error: %v", err)
	getEcho(t, ok, "a", "/")
	// Once the port is free, the next Update binds it.
	busy.Close()
	mustUpdate(t, s, tableOf(port(ok, table.HTTP, hosted{"", rules}), port(taken, table.HTTP, hosted{"", rules})))
	getEcho(t, taken, "a", "/")
}

// TestUpdatesDuringRequestLoop is the bar: 1,000 table changes
// while clients loop on a route that every table keeps, with no failed
// request.
func TestUpdatesDuringRequestLoop(t *testing.T) {
	v1, v2 := newBackend(t, "v1"), newBackend(t, "v2")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	build := func(i int) *table.Table {
		rules := []*table.Rule{rule("/", forward("HTTPRoute/ns/main", backendOf("ns/v1:80", int32(1+i%3), v1), backendOf("ns/v2:80", 1, v2)))}
		for j := range i % 20 { // a changing set of other routes
			rules = append(rules, rule(fmt.Sprintf("/other-%d", j), forward(fmt.Sprintf("HTTPRoute/ns/o%d", j), backendOf("ns/v2:80", 1, v2))))
		}
		return tableOf(port(bind, table.HTTP, hosted{"loop.example.com", rules}))
	}
	mustUpdate(t, s, build(0))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, body, err := tryGet(bind, "loop.example.com", "/x")
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		}()
	}
	for i := 1; i <= 1000; i++ {
		mustUpdate(t, s, build(i))
		// At least one request completes per table, so every swap happens
		// with requests in flight.
		before := ok.Load() + failed.Load()
		waitFor(t, func() bool { return ok.Load()+failed.Load() > before })
	}
	close(stop)
	wg.Wait()
	t.Logf("%d requests during 1000 updates, %d failed", ok.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d requests failed, first: %v", failed.Load(), firstErr.Load())
	}
	if ok.Load() == 0 {
		t.Error("no request went through")
	}
}

func TestMetricsAndAccessLog(t *testing.T) {
	v1 := newBackend(t, "v1")
	reg := prometheus.NewRegistry()
	var log syncBuffer
	s := newTestServer(t, Options{Registry: reg, AccessLog: &log})
	bind := freePort(t)
	tb := tableOf(port(bind, table.HTTP, hosted{"m.example.com", []*table.Rule{rule("/", forward("HTTPRoute/ns/m", backendOf("ns/v1:80", 1, v1)))}}))
	mustUpdate(t, s, tb)
	for range 3 {
		getEcho(t, bind, "m.example.com", "/a\"b")
	}
	get(t, bind, "nope.example.com", "/")

	if got := testutil.ToFloat64(s.m.requests.WithLabelValues("HTTPRoute/ns/m", "ns/v1:80", "200")); got != 3 {
		t.Errorf("requests_total{route=m,backend=v1,code=200} = %v, want 3", got)
	}
	if got := testutil.ToFloat64(s.m.requests.WithLabelValues("", "", "404")); got != 1 {
		t.Errorf("requests_total{code=404} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.generation); got != float64(tb.Generation) {
		t.Errorf("table_generation = %v, want %d", got, tb.Generation)
	}
	if got := testutil.ToFloat64(s.m.updates); got != 1 {
		t.Errorf("table_updates_total = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "flatnet_gateway_request_duration_seconds"); err != nil || n != 2 {
		t.Errorf("request_duration_seconds series: %d, %v; want 2", n, err)
	}

	// Series of a route the table lost are dropped by prune; the others stay.
	v2 := newBackend(t, "v2")
	tb2 := tableOf(port(bind, table.HTTP, hosted{"m.example.com", []*table.Rule{rule("/", forward("HTTPRoute/ns/n", backendOf("ns/v2:80", 1, v2)))}}))
	mustUpdate(t, s, tb2)
	getEcho(t, bind, "m.example.com", "/")
	s.m.prune(tb2)
	if n := testutil.CollectAndCount(s.m.requests); n != 2 { // n's 200 and the 404
		t.Errorf("requests_total has %d series after prune, want 2", n)
	}
	if n := testutil.CollectAndCount(s.m.duration); n != 2 { // n and ""
		t.Errorf("request_duration_seconds has %d series after prune, want 2", n)
	}

	s.alog.flush() // (also every 100 ms)
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("access log has %d lines, want 5:\n%s", len(lines), log.String())
	}
	var entry struct {
		Time, Method, Host, Path, Route, Backend, Endpoint, Client string
		Status                                                     int
		Bytes                                                      int64
		Duration                                                   float64
	}
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatalf("access log line %q: %v", lines[0], err)
	}
	if entry.Method != "GET" || entry.Host != "m.example.com" || entry.Path != "/a\"b" || entry.Status != 200 || entry.Bytes == 0 ||
		entry.Route != "HTTPRoute/ns/m" || entry.Backend != "ns/v1:80" || entry.Endpoint != v1.ep() || !strings.HasPrefix(entry.Client, "127.0.0.1:") {
		t.Errorf("access log entry %+v", entry)
	}
	if _, err := time.Parse(time.RFC3339Nano, entry.Time); err != nil {
		t.Errorf("time %q: %v", entry.Time, err)
	}
}

func TestAppendJSON(t *testing.T) {
	for _, s := range []string{"plain", "quote\" back\\slash", "ctl\x00\x1f\n", "utf8 ünï", "bad \xff\xfe"} {
		var got string
		if err := json.Unmarshal(appendJSON(nil, s), &got); err != nil {
			t.Errorf("%q: %s is not JSON: %v", s, appendJSON(nil, s), err)
			continue
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); got != want && !strings.Contains(s, "\xff") {
			t.Errorf("%q round-tripped to %q", s, got)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the handler goroutines' writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestCloseStopsListening(t *testing.T) {
	s := New(Options{BindAddress: "127.0.0.1"})
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP)))
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tryGet(bind, "a", "/"); err == nil {
		t.Error("still listening after Close")
	}
	if err := s.Update(tableOf()); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close: %v", err)
	}
}

// An endpoint that refuses connections, or resets them before it answers
// (a pod that just stopped, before its EndpointSlice change reached the
// gateway), costs no idempotent request: the next endpoint gets it, with
// no Retry on the route; on the fast path and on net/http's.
func TestRefusedEndpointSkipped(t *testing.T) {
	e1 := newBackend(t, "e1")
	resets, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer resets.Close()
	go func() {
		for {
			c, err := resets.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0) // RST, not FIN
			c.Close()
		}
	}()
	down := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
	// silent's connections time out (the dialer's timeout, shortened
	// here): an address nothing answers any more, as a deleted pod's.
	silent := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for _, noFast := range []bool{false, true} {
		for _, bad := range []string{down, resets.Addr().String(), silent} {
			s := newTestServer(t, Options{DisableFastPath: noFast})
			s.fast.dialer.Timeout = 100 * time.Millisecond
			s.fast.dialer.ControlContext = func(ctx context.Context, _, addr string, _ syscall.RawConn) error {
				if addr == silent {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}
			bind := freePort(t)
			b := &table.Backend{Name: "ns/svc:80", Weight: 1, Endpoints: []string{bad, e1.ep()}}
			mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/", forward("HTTPRoute/ns/r", b))}})))
			for i := range 6 {
				if resp, body := get(t, bind, "r", "/"); resp.StatusCode != 200 {
					t.Errorf("DisableFastPath %v, endpoint %s, request %d: %d %q, want 200 from the endpoint that answers", noFast, bad, i, resp.StatusCode, body)
				}
			}
		}
	}
}
