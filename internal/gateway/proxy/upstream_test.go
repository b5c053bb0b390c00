package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// serveOne puts a single-backend route on a new port and returns it.
func serveOne(t *testing.T, s *Server, ep string) int32 {
	t.Helper()
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{
		rule("/", forward("HTTPRoute/ns/up", &table.Backend{Name: "ns/up:80", Weight: 1, Endpoints: []string{ep}})),
	}})))
	return bind
}

// countConns counts the connections a test server accepted.
func countConns(srv *httptest.Server) *atomic.Int64 {
	var n atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			n.Add(1)
		}
	}
	return &n
}

func TestUpstreamKeepAlive(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	conns := countConns(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	s := newTestServer(t, Options{})
	bind := serveOne(t, s, srv.Listener.Addr().String())
	for range 20 {
		if resp, body := get(t, bind, "a", "/"); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("20 sequential GETs opened %d backend connections, want 1", n)
	}
}

// TestUpstreamStaleConnection: a backend that closes a keep-alive
// connection while it sits in the pool costs the client nothing: the
// GET is sent again on a new connection.
func TestUpstreamStaleConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				req.Body.Close()
				// Answers keep-alive, then closes at once, as a backend
				// whose idle timeout just ran out does.
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				time.Sleep(20 * time.Millisecond)
			}()
		}
	}()
	s := newTestServer(t, Options{})
	bind := serveOne(t, s, ln.Addr().String())
	for i := range 5 {
		if resp, body := get(t, bind, "a", "/"); resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("request %d: got %d %q", i, resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond) // the backend has closed the pooled connection
	}
	if n := accepted.Load(); n < 5 {
		t.Errorf("backend accepted %d connections for 5 requests on connections it closed", n)
	}
}

func TestUpstreamClientGoneReleasesBackend(t *testing.T) {
	canceled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // headers sent; the body never comes
		<-r.Context().Done()
		close(canceled)
	}))
	t.Cleanup(srv.Close)
	canceled2 := make(chan struct{})
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // no answer at all
		close(canceled2)
	}))
	t.Cleanup(srv2.Close)
	s := newTestServer(t, Options{})
	for _, c := range []struct {
		name string
		srv  *httptest.Server
		done <-chan struct{}
	}{{"mid-body", srv, canceled}, {"before headers", srv2, canceled2}} {
		t.Run(c.name, func(t *testing.T) {
			bind := serveOne(t, s, c.srv.Listener.Addr().String())
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", bind), nil)
			resp, err := testClient.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Fatal("the request finished; want the client to give up")
			}
			select {
			case <-c.done:
			case <-time.After(5 * time.Second):
				t.Fatal("the backend request outlived its client by 5 s")
			}
		})
	}
}

func TestUpstreamAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/trailer":
			w.Header().Set("Trailer", "X-Sum")
			io.WriteString(w, "chunk one,")
			w.(http.Flusher).Flush()
			io.WriteString(w, "chunk two")
			w.Header().Set("X-Sum", "42")
		case "/early-hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "after hints")
		case "/head":
			w.Header().Set("Content-Length", "100")
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "closing")
		case "/large":
			io.WriteString(w, strings.Repeat("x", 1<<20))
		}
	}))
	t.Cleanup(srv.Close)
	s := newTestServer(t, Options{})
	bind := serveOne(t, s, srv.Listener.Addr().String())

	resp, body := get(t, bind, "a", "/trailer")
	if string(body) != "chunk one,chunk two" || resp.Trailer.Get("X-Sum") != "42" {
		t.Errorf("trailer: got %q, trailers %v", body, resp.Trailer)
	}
	if resp, body = get(t, bind, "a", "/early-hints"); resp.StatusCode != 200 || string(body) != "after hints" {
		t.Errorf("early hints: got %d %q", resp.StatusCode, body)
	}
	req, _ := http.NewRequest("HEAD", fmt.Sprintf("http://127.0.0.1:%d/head", bind), nil)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 100 {
		t.Errorf("HEAD: got %d length %d", resp.StatusCode, resp.ContentLength)
	}
	for range 3 {
		if resp, body = get(t, bind, "a", "/close"); string(body) != "closing" {
			t.Errorf("Connection: close answer: %d %q", resp.StatusCode, body)
		}
	}
	if _, body = get(t, bind, "a", "/large"); len(body) != 1<<20 {
		t.Errorf("large body: %d bytes", len(body))
	}
}

func TestEndpointPoolIdle(t *testing.T) {
	var p endpointPool
	now := time.Now()
	var aClosed, bClosed bool
	a, b := &upConn{nc: closeConn{&aClosed}}, &upConn{nc: closeConn{&bClosed}}
	p.put(a)
	p.put(b)
	a.idleSince = now.Add(-time.Minute)
	if p.closeIdle(now.Add(-time.Second)) {
		t.Error("a pool with an idle connection left reported empty")
	}
	if len(p.idle) != 1 || p.idle[0] != b || !aClosed || bClosed {
		t.Errorf("closeIdle kept %v, want only the recent connection", p.idle)
	}
	if got := p.get(); got != b {
		t.Errorf("get returned %v", got)
	}
	if p.get() != nil {
		t.Error("get from an empty pool returned a connection")
	}
	if !p.closeIdle(time.Now().Add(time.Second)) {
		t.Error("an empty pool unused since the cutoff did not report empty")
	}
	// Dropped from the map, the pool keeps nothing a late request returns.
	closed := false
	p.put(&upConn{nc: closeConn{&closed}})
	if len(p.idle) != 0 || !closed {
		t.Errorf("a dead pool kept a connection (closed %v)", closed)
	}
}

type closeConn struct{ closed *bool }

func (c closeConn) Close() error { *c.closed = true; return nil }

func (closeConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (closeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (closeConn) LocalAddr() net.Addr              { return nil }
func (closeConn) RemoteAddr() net.Addr             { return nil }
func (closeConn) SetDeadline(time.Time) error      { return nil }
func (closeConn) SetReadDeadline(time.Time) error  { return nil }
func (closeConn) SetWriteDeadline(time.Time) error { return nil }

// TestWriteRequest: what writeRequest writes reads back as the request it
// was, and a value with line breaks (a filter's) cannot add a header.
func TestWriteRequest(t *testing.T) {
	req, _ := http.NewRequest("GET", "http://10.0.0.1:8080/a%2Fb/c?x=1&y=%20", nil)
	req.Host = "front.example.com"
	req.Header = http.Header{
		"User-Agent": {""}, "Accept": {"text/plain", "*/*"},
		"X-Filter": {"value\r\nX-Injected: 1"}, "X-Spaces": {"  padded  "},
	}
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	writeRequest(w, req)
	w.Flush()
	got, err := http.ReadRequest(bufio.NewReader(&b))
	if err != nil {
		t.Fatalf("%q: %v", b.String(), err)
	}
	if got.Method != "GET" || got.RequestURI != "/a%2Fb/c?x=1&y=%20" || got.Host != "front.example.com" {
		t.Errorf("got %s %s Host %s", got.Method, got.RequestURI, got.Host)
	}
	want := http.Header{"Accept": {"text/plain", "*/*"}, "X-Filter": {"value  X-Injected: 1"}, "X-Spaces": {"padded"}}
	if diff := cmp.Diff(want, got.Header); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}
