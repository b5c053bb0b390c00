package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// echo is what the test backends answer: who answered and what they got.
type echo struct {
	Backend string
	Method  string
	Path    string
	Query   string
	Host    string
	Proto   string
	Headers http.Header
}

// testBackend is an HTTP/1.1 backend on loopback that answers an echo.
type testBackend struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64
	got  chan echo // every request, when not nil (buffered; dropped when full)
}

func newBackend(t testing.TB, name string) *testBackend {
	t.Helper()
	b := &testBackend{name: name, got: make(chan echo, 1024)}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *testBackend) serve(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	io.Copy(io.Discard, r.Body)
	e := echo{Backend: b.name, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host, Proto: r.Proto, Headers: r.Header}
	select {
	case b.got <- e:
	default:
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Backend", b.name)
	json.NewEncoder(w).Encode(e)
}

func (b *testBackend) ep() string { return b.srv.Listener.Addr().String() }

// freePort returns a loopback port nothing listens on (for the moment).
func freePort(t testing.TB) int32 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

func newTestServer(t testing.TB, o Options) *Server {
	t.Helper()
	o.BindAddress = "127.0.0.1"
	// FLATNET_PROXY_NO_FAST=1 runs the tests on net/http alone.
	o.DisableFastPath = o.DisableFastPath || os.Getenv("FLATNET_PROXY_NO_FAST") != ""
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	s := New(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

// backendOf builds a table Backend over test backends' endpoints.
func backendOf(name string, weight int32, bs ...*testBackend) *table.Backend {
	b := &table.Backend{Name: name, Weight: weight}
	for _, x := range bs {
		b.Endpoints = append(b.Endpoints, x.ep())
	}
	return b
}

// forward is an Action sending to backends by their weights.
func forward(route string, backends ...*table.Backend) *table.Action {
	a := &table.Action{Route: route, Backends: backends}
	ws := make([]int32, len(backends))
	for i, b := range backends {
		ws[i] = b.Weight
	}
	a.Balancer = table.NewWRR(ws)
	return a
}

// rule is a Rule matching a path prefix (and optional headers).
func rule(prefix string, a *table.Action, headers ...table.ValueMatch) *table.Rule {
	return &table.Rule{Match: table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: prefix}, Headers: headers}, Action: a}
}

// hosted is one hostname's rules for port().
type hosted struct {
	host  string
	rules []*table.Rule
}

func port(bind int32, proto table.Protocol, hs ...hosted) *table.Port {
	p := table.NewPort(bind, 80, proto)
	for _, h := range hs {
		for _, r := range h.rules {
			p.Add(h.host, r)
		}
	}
	p.Finish()
	return p
}

var tableGen atomic.Uint64

func tableOf(ps ...*table.Port) *table.Table {
	t := &table.Table{Ports: map[int32]*table.Port{}, Generation: tableGen.Add(1)}
	for _, p := range ps {
		t.Ports[p.Bind] = p
	}
	return t
}

func mustUpdate(t testing.TB, s *Server, tb *table.Table) {
	t.Helper()
	if err := s.Update(tb); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

var testClient = &http.Client{
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
	Timeout: 10 * time.Second,
}

// get sends a request to the proxy's port with host as Host.
func get(t testing.TB, bind int32, host, path string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	resp, body, err := tryGet(bind, host, path, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func tryGet(bind int32, host, path string, hdr ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest("GET", "http://127.0.0.1:"+strconv.Itoa(int(bind))+path, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Host = host
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// echoed decodes a backend's echo, failing the test when the answer is
// not one.
func echoed(t testing.TB, resp *http.Response, body []byte) echo {
	t.Helper()
	var e echo
	if resp.StatusCode != 200 || json.Unmarshal(body, &e) != nil {
		t.Fatalf("want an echo, got %d %q", resp.StatusCode, body)
	}
	return e
}

// getEcho is get then echoed.
func getEcho(t testing.TB, bind int32, host, path string, hdr ...string) echo {
	t.Helper()
	resp, body := get(t, bind, host, path, hdr...)
	return echoed(t, resp, body)
}

// sendRaw connects to the proxy's port, writes raw as it is and returns
// a reader of the answers (the connection closes with the test).
func sendRaw(t testing.TB, bind int32, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", bind))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}
