package proxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// testCA issues leaf certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	n    int64
}

func newCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, n: 1}
}

// issue returns a certificate for names; its serial number tells
// certificates apart.
func (ca *testCA) issue(t testing.TB, names ...string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func serial(c *tls.Certificate) int64 {
	x, _ := x509.ParseCertificate(c.Certificate[0])
	return x.SerialNumber.Int64()
}

// handshake connects to the port with SNI name and returns the serial of
// the certificate served.
func handshake(t testing.TB, ca *testCA, bind int32, name string) int64 {
	t.Helper()
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", bind), &tls.Config{ServerName: name, RootCAs: ca.pool})
	if err != nil {
		t.Fatalf("handshake for %s: %v", name, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

func TestTLSTermination(t *testing.T) {
	v1 := newBackend(t, "v1")
	ca := newCA(t)
	exact, wild, other := ca.issue(t, "a.example.com"), ca.issue(t, "*.example.com"), ca.issue(t, "b.example.com")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	build := func(certs ...table.Cert) *table.Table {
		p := port(bind, table.HTTPS, hosted{"", []*table.Rule{rule("/", forward("HTTPRoute/ns/tls", backendOf("ns/v1:80", 1, v1)))}})
		p.Listen = 443
		p.Certs = certs
		return tableOf(p)
	}
	mustUpdate(t, s, build(table.Cert{Hostname: "a.example.com", Cert: exact}, table.Cert{Hostname: "*.example.com", Cert: wild}))

	if got := handshake(t, ca, bind, "a.example.com"); got != serial(exact) {
		t.Errorf("a.example.com got certificate %d, want the exact one %d", got, serial(exact))
	}
	if got := handshake(t, ca, bind, "b.example.com"); got != serial(wild) {
		t.Errorf("b.example.com got certificate %d, want the wildcard %d", got, serial(wild))
	}

	// HTTP/2 by ALPN, answered through the table, X-Forwarded-Proto https.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}, ForceAttemptHTTP2: true}}
	// a.example.com does not resolve here: dial loopback, keep the name.
	client.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", bind))
	}
	resp, err := client.Get("https://a.example.com/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Proto != "HTTP/2.0" {
		t.Errorf("client got %s, want HTTP/2.0 by ALPN", resp.Proto)
	}
	e := echoed(t, resp, body)
	if e.Headers.Get("X-Forwarded-Proto") != "https" || e.Host != "a.example.com" {
		t.Errorf("backend got host %q X-Forwarded-Proto %q", e.Host, e.Headers.Get("X-Forwarded-Proto"))
	}

	// A rotated certificate is served from the next handshake on, with no
	// restart: the listener is the same one.
	ln := s.listeners[bind].ln
	mustUpdate(t, s, build(table.Cert{Hostname: "a.example.com", Cert: other}, table.Cert{Hostname: "*.example.com", Cert: wild}))
	if s.listeners[bind].ln != ln {
		t.Error("the listener was replaced for a certificate change")
	}
	// other is issued for b.example.com: check the serial without
	// verifying the name.
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", bind), &tls.Config{ServerName: "a.example.com", InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); got != serial(other) {
		t.Errorf("after the update a.example.com got certificate %d, want %d", got, serial(other))
	}
	c.Close()
}

// wsBackend answers an Upgrade: websocket with 101 and then echoes lines
// (the framing is the client's business; the proxy only pipes bytes).
func wsBackend(t testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			brw.WriteString("echo " + line)
			brw.Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestWebSocketSurvivesUpdates(t *testing.T) {
	for _, proto := range []table.AppProtocol{table.HTTP1, table.WS} {
		t.Run(fmt.Sprintf("appProtocol=%q", proto), func(t *testing.T) {
			ws := wsBackend(t)
			s := newTestServer(t, Options{})
			bind := freePort(t)
			build := func(i int) *table.Table {
				b := &table.Backend{Name: "ns/ws:80", Weight: 1, Protocol: proto, Endpoints: []string{ws.Listener.Addr().String()}}
				rules := []*table.Rule{rule("/ws", forward("HTTPRoute/ns/ws", b))}
				for j := range i % 7 {
					rules = append(rules, rule(fmt.Sprintf("/r%d", j), forward("HTTPRoute/ns/other", b)))
				}
				return tableOf(port(bind, table.HTTP, hosted{"ws.example.com", rules}))
			}
			mustUpdate(t, s, build(0))

			conn, br := sendRaw(t, bind, "GET /ws HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 {
				t.Fatalf("upgrade answered %d", resp.StatusCode)
			}
			for i := 1; i <= 100; i++ {
				mustUpdate(t, s, build(i))
				fmt.Fprintf(conn, "message %d\n", i)
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("after %d updates: %v", i, err)
				}
				if want := fmt.Sprintf("echo message %d\n", i); line != want {
					t.Fatalf("got %q, want %q", line, want)
				}
			}
		})
	}
}

// h2cServer is a backend that speaks only HTTP/2 with prior knowledge.
func h2cServer(t testing.TB, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestH2CBackend(t *testing.T) {
	b := &testBackend{name: "h2c", got: make(chan echo, 16)}
	srv := h2cServer(t, http.HandlerFunc(b.serve))
	s := newTestServer(t, Options{})
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/", forward("HTTPRoute/ns/h2c",
		&table.Backend{Name: "ns/h2c:80", Weight: 1, Protocol: table.H2C, Endpoints: []string{srv.Listener.Addr().String()}}))}})))
	e := getEcho(t, bind, "h2c.example.com", "/x")
	if e.Proto != "HTTP/2.0" || e.Backend != "h2c" {
		t.Errorf("backend got %s from the proxy, want HTTP/2.0", e.Proto)
	}
}

// TestGRPCStream sends a gRPC-shaped bidirectional stream over h2c through
// the proxy to an h2c backend: every message comes back before the next is
// sent, and the backend's grpc-status trailer reaches the client.
func TestGRPCStream(t *testing.T) {
	srv := h2cServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Content-Type") != "application/grpc" {
			http.Error(w, "want gRPC over HTTP/2", 400)
			return
		}
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(200)
		rc := http.NewResponseController(w)
		rc.Flush() // headers first: the client waits for them before it sends
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				rc.Flush()
			}
			if err != nil {
				break
			}
		}
		w.Header().Set("Grpc-Status", "0")
	}))
	ca := newCA(t)
	cert := ca.issue(t, "grpc.example.com")
	s := newTestServer(t, Options{})
	a := forward("GRPCRoute/ns/g", &table.Backend{Name: "ns/grpc:80", Weight: 1, Endpoints: []string{srv.Listener.Addr().String()}})
	a.GRPC = true
	clearBind, tlsBind := freePort(t), freePort(t)
	secure := port(tlsBind, table.HTTPS, hosted{"", []*table.Rule{rule("/echo.Echo/", a)}})
	secure.Certs = []table.Cert{{Cert: cert}}
	mustUpdate(t, s, tableOf(port(clearBind, table.HTTP, hosted{"", []*table.Rule{rule("/echo.Echo/", a)}}), secure))

	// h2c with prior knowledge on the clear text port.
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	defer h2c.CloseIdleConnections()
	t.Run("h2c", func(t *testing.T) { grpcEcho(t, h2c, fmt.Sprintf("http://127.0.0.1:%d", clearBind)) })
	// h2 by ALPN on the TLS port.
	h2 := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: ca.pool, ServerName: "grpc.example.com"}}
	defer h2.CloseIdleConnections()
	t.Run("h2", func(t *testing.T) { grpcEcho(t, h2, fmt.Sprintf("https://127.0.0.1:%d", tlsBind)) })
}

// grpcEcho streams five messages through base's /echo.Echo/Stream, each
// echoed before the next is sent, and checks the grpc-status trailer.
func grpcEcho(t *testing.T, tr http.RoundTripper, base string) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/echo.Echo/Stream", pr)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || resp.Header.Get("Content-Type") != "application/grpc" {
		t.Fatalf("got %d over %s", resp.StatusCode, resp.Proto)
	}
	buf := make([]byte, 64)
	for i := range 5 {
		msg := fmt.Sprintf("message-%d", i)
		done := make(chan error, 1)
		go func() { _, err := io.WriteString(pw, msg); done <- err }()
		if _, err := io.ReadFull(resp.Body, buf[:len(msg)]); err != nil || string(buf[:len(msg)]) != msg {
			t.Fatalf("message %d: got %q, %v", i, buf[:len(msg)], err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	pw.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
		t.Errorf("grpc-status trailer %q, want 0 (trailers %v)", got, resp.Trailer)
	}
}

// TestPortProtocolChange: a bind port that turns from HTTP to HTTPS (and
// back) gets a new listener of the right kind on the same port.
func TestPortProtocolChange(t *testing.T) {
	v1 := newBackend(t, "v1")
	ca := newCA(t)
	cert := ca.issue(t, "a.example.com")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	rules := []*table.Rule{rule("/", forward("HTTPRoute/ns/a", backendOf("ns/v1:80", 1, v1)))}
	plain := func() *table.Table { return tableOf(port(bind, table.HTTP, hosted{"", rules})) }
	mustUpdate(t, s, plain())
	getEcho(t, bind, "a.example.com", "/")

	p := port(bind, table.HTTPS, hosted{"", rules})
	p.Certs = []table.Cert{{Cert: cert}}
	mustUpdate(t, s, tableOf(p))
	if got := handshake(t, ca, bind, "a.example.com"); got != serial(cert) {
		t.Errorf("served certificate %d, want %d", got, serial(cert))
	}
	mustUpdate(t, s, plain())
	getEcho(t, bind, "a.example.com", "/")
}

// TestMisdirectedRequests runs the cases of the suite's
// HTTPRouteHTTPSListenerDetectMisdirectedRequests: a request whose Host
// another HTTPS listener serves than the one its TLS server name picked
// is answered 421.
func TestMisdirectedRequests(t *testing.T) {
	v1, v2, v3 := newBackend(t, "v1"), newBackend(t, "v2"), newBackend(t, "v3")
	ca := newCA(t)
	cert := ca.issue(t, "example.org", "second-example.org", "*.wildcard.org")
	s := newTestServer(t, Options{})
	bind := freePort(t)
	route := func(name string, b *testBackend) []*table.Rule {
		return []*table.Rule{rule("/detect-misdirected-requests", forward("HTTPRoute/ns/"+name, backendOf("ns/"+b.name+":8080", 1, b)))}
	}
	p := port(bind, table.HTTPS,
		hosted{"example.org", route("test-1", v1)},
		hosted{"second-example.org", route("test-2", v2)},
		hosted{"*.wildcard.org", route("test-3", v3)},
		hosted{"fourth-example.wildcard.org", route("test-4", v1)},
	)
	p.Certs = []table.Cert{{Cert: cert}, {Hostname: "second-example.org", Cert: cert},
		{Hostname: "*.wildcard.org", Cert: cert}, {Hostname: "fourth-example.wildcard.org", Cert: cert}}
	mustUpdate(t, s, tableOf(p))

	for _, c := range []struct {
		sni, host string
		want      int
		backend   string
	}{
		{"example.org", "example.org", 200, "v1"},
		{"example.org", "second-example.org", 421, ""},
		{"example.org", "unknown-example.org", 404, ""},
		{"second-example.org", "second-example.org", 200, "v2"},
		{"second-example.org", "example.org", 421, ""},
		{"second-example.org", "unknown-example.org", 421, ""},
		{"third-example.wildcard.org", "third-example.wildcard.org", 200, "v3"},
		{"third-example.wildcard.org", "fith-example.wildcard.org", 200, "v3"},
		{"third-example.wildcard.org", "fourth-example.wildcard.org", 421, ""},
		{"third-example.wildcard.org", "second-example.org", 421, ""},
		{"third-example.wildcard.org", "unknown-example.org", 421, ""},
		{"fourth-example.wildcard.org", "fourth-example.wildcard.org", 200, "v1"},
		{"fourth-example.wildcard.org", "fith-example.wildcard.org", 421, ""},
		{"unknown-example.org", "example.org", 200, "v1"},
		{"unknown-example.org", "unknown-example.org", 404, ""},
	} {
		tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{ServerName: c.sni, InsecureSkipVerify: true}}
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/detect-misdirected-requests", bind), nil)
		req.Host = c.host
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("SNI %s Host %s: %v", c.sni, c.host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		got := resp.StatusCode
		if got != c.want || (c.backend != "" && echoed(t, resp, body).Backend != c.backend) {
			t.Errorf("SNI %s Host %s: got %d %s, want %d %s", c.sni, c.host, got, body, c.want, c.backend)
		}
	}
}
