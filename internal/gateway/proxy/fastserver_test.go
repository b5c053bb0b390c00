package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/gateway/table"
	"github.com/flatnet/flatnet/internal/testutil"
)

// dateless is a backend whose answers have no Date header: the fast loop
// passes that on, net/http's server adds one, so a test can tell which
// path answered.
func dateless(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Date"] = nil
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestFastLoopHandsOver pipelines, on one connection, requests the loop
// serves and one it hands to net/http (a body), which then serves the
// rest of the connection: every answer arrives, in order.
func TestFastLoopHandsOver(t *testing.T) {
	srv := dateless(t)
	s := newTestServer(t, Options{})
	if s.o.DisableFastPath {
		testutil.Skip(t, "fast path disabled (FLATNET_PROXY_NO_FAST): unset it to test the fast loop")
	}
	bind := serveOne(t, s, srv.Listener.Addr().String())
	_, br := sendRaw(t, bind, "GET /one HTTP/1.1\r\nHost: a\r\n\r\n"+
		"GET /two HTTP/1.1\r\nHost: a\r\n\r\n"+
		"POST /three HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody"+
		"GET /four HTTP/1.1\r\nHost: a\r\n\r\n")
	for _, want := range []struct {
		body string
		fast bool
	}{{"GET /one ", true}, {"GET /two ", true}, {"POST /three body", false}, {"GET /four ", false}} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", want.body, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fast := resp.Header.Get("Date") == ""
		if resp.StatusCode != 200 || string(body) != want.body || fast != want.fast {
			t.Errorf("got %d %q (fast loop: %v), want %q (fast loop: %v)", resp.StatusCode, body, fast, want.body, want.fast)
		}
	}
}

// TestFastLoopLeavesRequests: what the loop does not serve reaches
// net/http with every byte the loop had read.
func TestFastLoopLeavesRequests(t *testing.T) {
	srv := dateless(t)
	s := newTestServer(t, Options{})
	if s.o.DisableFastPath {
		testutil.Skip(t, "fast path disabled (FLATNET_PROXY_NO_FAST): unset it to test the fast loop")
	}
	bind := freePort(t)
	ep := srv.Listener.Addr().String()
	retry := forward("HTTPRoute/ns/retry", &table.Backend{Name: "ns/b:80", Weight: 1, Endpoints: []string{ep}})
	retry.Retry = &table.Retry{Codes: []int{503}, Attempts: 1}
	h2c := forward("HTTPRoute/ns/h2c", &table.Backend{Name: "ns/b:80", Weight: 1, Endpoints: []string{ep}, Protocol: table.H2C})
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{
		rule("/", forward("HTTPRoute/ns/plain", &table.Backend{Name: "ns/b:80", Weight: 1, Endpoints: []string{ep}})),
		rule("/retry", retry), rule("/h2c", h2c),
	}})))
	for _, c := range []struct {
		name, raw, want string
		fast            bool
	}{
		{"plain GET", "GET /x HTTP/1.1\r\nHost: a\r\n\r\n", "GET /x ", true},
		{"HEAD", "HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n", "", true},
		{"route with a retry", "GET /retry HTTP/1.1\r\nHost: a\r\n\r\n", "GET /retry ", false},
		{"HTTP/1.0", "GET /x HTTP/1.0\r\nHost: a\r\n\r\n", "GET /x ", false},
		{"header block over the buffer", "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + strings.Repeat("b", 2*fastBufSize) + "\r\n\r\n", "GET /x ", false},
		{"query with ';'", "GET /x?a=1;b=2 HTTP/1.1\r\nHost: a\r\n\r\n", "GET /x ", false},
		{"bare LF lines", "GET /x HTTP/1.1\nHost: a\n\n", "GET /x ", false},
		{"missing Host", "GET /x HTTP/1.1\r\n\r\n", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, br := sendRaw(t, bind, c.raw)
			resp, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(c.raw)[0]})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fast := resp.Header.Get("Date") == ""
			if c.name == "missing Host" {
				if resp.StatusCode != 400 {
					t.Errorf("got %d, want net/http's 400", resp.StatusCode)
				}
				return
			}
			if resp.StatusCode != 200 || string(body) != c.want || fast != c.fast {
				t.Errorf("got %d %q (fast loop: %v), want %q (fast loop: %v)", resp.StatusCode, body, fast, c.want, c.fast)
			}
		})
	}
}
