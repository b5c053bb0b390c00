package netexec

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/websocket"
)

func start(t *testing.T) *Server {
	t.Helper()
	s, err := Start(Config{Addr: "127.0.0.1", HTTPPort: 0, UDPPort: 0, TCPPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- s.Wait(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.HTTPAddr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestHTTPEndpoints(t *testing.T) {
	s := start(t)
	host, _ := os.Hostname()
	for _, tc := range []struct {
		path     string
		wantCode int
		want     string // exact body; "" with check below
	}{
		{"/hostname", 200, host},
		{"/hostName", 200, host},
		{"/echo?msg=hello%20world", 200, "hello world"},
		{"/echo?msg=gone&code=404", 404, "gone"},
		{"/echo?code=abc", 400, ""},
		{"/healthz", 200, ""},
		{"/nothing-here", 404, ""},
	} {
		code, body := get(t, s, tc.path)
		if code != tc.wantCode {
			t.Errorf("%s: status %d, want %d (%q)", tc.path, code, tc.wantCode, body)
		}
		if tc.want != "" && body != tc.want {
			t.Errorf("%s: body %q, want %q", tc.path, body, tc.want)
		}
	}
	if _, body := get(t, s, "/"); !strings.HasPrefix(body, "NOW: ") {
		t.Errorf("/: %q", body)
	}
}

func TestClientIPIsPeerAddress(t *testing.T) {
	s := start(t)
	// Dial from a known local port so the answer can be checked exactly.
	var local string
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			local = c.LocalAddr().String()
		}
		return c, err
	}}
	resp, err := (&http.Client{Transport: tr}).Get("http://" + s.HTTPAddr() + "/clientip")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != local {
		t.Fatalf("/clientip = %q, want the client's IP:port %q", b, local)
	}
}

func udpAsk(t *testing.T, addr, msg string) string {
	t.Helper()
	return udpAskWithin(t, addr, msg, 2*time.Second)
}

func udpAskWithin(t *testing.T, addr, msg string, d time.Duration) string {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return "ERR: " + err.Error()
	}
	return string(buf[:n])
}

func TestUDPCommands(t *testing.T) {
	s := start(t)
	host, _ := os.Hostname()
	if got := udpAsk(t, s.UDPAddr(), "hostname"); got != host {
		t.Errorf("hostname: %q, want %q", got, host)
	}
	if got := udpAsk(t, s.UDPAddr(), "HostName\n"); got != host {
		t.Errorf("HostName: %q, want %q", got, host)
	}
	if got := udpAsk(t, s.UDPAddr(), "echo Hello There"); got != "Hello There" {
		t.Errorf("echo: %q", got)
	}
	if got := udpAsk(t, s.UDPAddr(), "clientip"); !strings.HasPrefix(got, "127.0.0.1:") {
		t.Errorf("clientip: %q", got)
	}
	if got := udpAskWithin(t, s.UDPAddr(), "bogus", 300*time.Millisecond); !strings.HasPrefix(got, "ERR: ") {
		t.Errorf("unknown command answered: %q", got)
	}
}

func TestTCPEcho(t *testing.T) {
	s := start(t)
	c, err := net.Dial("tcp", s.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	host, _ := os.Hostname()
	for _, tc := range []struct{ send, want string }{
		{"plain text line", "plain text line"},
		{"echo Abc", "Abc"},
		{"hostname", host},
		{"clientip", c.LocalAddr().String()},
	} {
		fmt.Fprintf(c, "%s\n", tc.send)
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSuffix(line, "\n"); got != tc.want {
			t.Errorf("send %q: got %q, want %q", tc.send, got, tc.want)
		}
	}
}

func dial(t *testing.T, s *Server, q url.Values) (int, DialResult) {
	t.Helper()
	code, body := get(t, s, "/dial?"+q.Encode())
	var res DialResult
	if code == 200 {
		if err := json.Unmarshal([]byte(body), &res); err != nil {
			t.Fatalf("/dial answer %q: %v", body, err)
		}
	}
	return code, res
}

func TestDial(t *testing.T) {
	a, b := start(t), start(t)
	host, _ := os.Hostname()
	hp := func(addr string) (string, string) {
		h, p, _ := net.SplitHostPort(addr)
		return h, p
	}
	bh, bHTTP := hp(b.HTTPAddr())
	_, bUDP := hp(b.UDPAddr())
	_, bTCP := hp(b.TCPAddr())
	for _, tc := range []struct {
		name  string
		q     url.Values
		want  []string
		nerrs int
	}{
		{"http", url.Values{"host": {bh}, "port": {bHTTP}, "request": {"hostname"}, "tries": {"3"}}, []string{host, host, host}, 0},
		{"http slash", url.Values{"host": {bh}, "port": {bHTTP}, "protocol": {"http"}, "request": {"/echo?msg=x"}}, []string{"x"}, 0},
		{"udp", url.Values{"host": {bh}, "port": {bUDP}, "protocol": {"udp"}, "request": {"echo hi"}, "tries": {"2"}}, []string{"hi", "hi"}, 0},
		{"tcp", url.Values{"host": {bh}, "port": {bTCP}, "protocol": {"tcp"}, "request": {"hostname"}}, []string{host}, 0},
		{"refused", url.Values{"host": {bh}, "port": {"1"}, "request": {"hostname"}, "tries": {"2"}}, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, res := dial(t, a, tc.q)
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			if strings.Join(res.Responses, "|") != strings.Join(tc.want, "|") || len(res.Errors) != tc.nerrs {
				t.Fatalf("got %+v, want responses %q and %d errors", res, tc.want, tc.nerrs)
			}
		})
	}
	for _, bad := range []url.Values{
		{"host": {bh}, "port": {bHTTP}},                                             // no request
		{"host": {bh}, "port": {"x"}, "request": {"hostname"}},                      // bad port
		{"host": {bh}, "port": {bHTTP}, "request": {"hostname"}, "tries": {"0"}},    // bad tries
		{"host": {bh}, "port": {bHTTP}, "request": {"hostname"}, "protocol": {"x"}}, // bad protocol
	} {
		if code, _ := dial(t, a, bad); code != 400 {
			t.Errorf("/dial?%s: status %d, want 400", bad.Encode(), code)
		}
	}
}

func TestExit(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1", HTTPPort: 0, UDPPort: -1, TCPPort: -1})
	if err != nil {
		t.Fatal(err)
	}
	if s.UDPAddr() != "" || s.TCPAddr() != "" {
		t.Fatalf("disabled servers listen: %q %q", s.UDPAddr(), s.TCPAddr())
	}
	done := make(chan int)
	go func() { done <- s.Wait(context.Background()) }()
	if code, _ := get(t, s, "/exit?code=300"); code != 400 {
		t.Fatalf("/exit?code=300: status %d, want 400", code)
	}
	get(t, s, "/exit?code=7")
	select {
	case code := <-done:
		if code != 7 {
			t.Fatalf("exit code %d, want 7", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server did not stop after /exit")
	}
	if _, err := net.Dial("tcp", s.HTTPAddr()); err == nil {
		t.Fatal("HTTP port still open after /exit")
	}
}

func TestPortInUse(t *testing.T) {
	s := start(t)
	_, port, _ := net.SplitHostPort(s.UDPAddr())
	var p int
	fmt.Sscan(port, &p)
	if _, err := Start(Config{Addr: "127.0.0.1", HTTPPort: 0, UDPPort: p, TCPPort: -1}); err == nil || !strings.Contains(err.Error(), "UDP port") {
		t.Fatalf("second server on the same UDP port: %v", err)
	}
}

func TestDNS(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1", HTTPPort: -1, UDPPort: -1, TCPPort: -1, DNSPort: 0, DNSZone: "external.test", DNSAnswer: "10.250.9.250"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- s.Wait(ctx) }()
	defer func() { cancel(); <-done }()
	for _, c := range []struct {
		name, network string
		qtype         uint16
		rcode, n      int
	}{
		{"external.test.", "udp", dns.TypeA, dns.RcodeSuccess, 1},
		{"www.External.Test.", "tcp", dns.TypeA, dns.RcodeSuccess, 1},
		{"external.test.", "udp", dns.TypeAAAA, dns.RcodeSuccess, 0},
		{"example.com.", "udp", dns.TypeA, dns.RcodeRefused, 0},
	} {
		m := new(dns.Msg)
		m.SetQuestion(c.name, c.qtype)
		r, _, err := (&dns.Client{Net: c.network, Timeout: 5 * time.Second}).Exchange(m, s.DNSAddr())
		if err != nil {
			t.Fatalf("%s over %s: %v", c.name, c.network, err)
		}
		if r.Rcode != c.rcode || len(r.Answer) != c.n || (c.n == 1 && !strings.Contains(r.Answer[0].String(), "10.250.9.250")) {
			t.Errorf("%s %s: %s %v, want %s with %d answers", c.name, dns.TypeToString[c.qtype], dns.RcodeToString[r.Rcode], r.Answer, dns.RcodeToString[c.rcode], c.n)
		}
	}
}

// /request tells the proto, host, path, query and headers it got, over
// HTTP/1.1 and over HTTP/2 with prior knowledge (h2c) on the same port.
func TestRequestInfoHTTP1AndH2C(t *testing.T) {
	s := start(t)
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		if proto == "HTTP/2.0" {
			tr.Protocols.SetUnencryptedHTTP2(true)
		} else {
			tr.Protocols.SetHTTP1(true)
		}
		req, _ := http.NewRequest("GET", "http://"+s.HTTPAddr()+"/request/a/b?x=1", nil)
		req.Host = "app.example"
		req.Header.Set("X-Test", "yes")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		var got RequestInfo
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		tr.CloseIdleConnections()
		if err != nil {
			t.Fatalf("%s: decoding: %v", proto, err)
		}
		host, _ := os.Hostname()
		if got.Proto != proto || got.Method != "GET" || got.Host != "app.example" || got.Path != "/request/a/b" ||
			got.Query != "x=1" || got.Headers.Get("X-Test") != "yes" || got.Hostname != host || got.Remote == "" {
			t.Errorf("%s: %+v", proto, got)
		}
	}
}

// /ws echoes each message whole, and takes a client without an Origin
// header (as a proxy may forward).
func TestWebSocketEcho(t *testing.T) {
	s := start(t)
	c, err := websocket.Dial("ws://"+s.HTTPAddr()+"/ws", "", "http://test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, msg := range []string{"one", "two", strings.Repeat("x", 70000)} {
		if err := websocket.Message.Send(c, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(c, &got); err != nil || got != msg {
			t.Errorf("sent %d bytes, got %d: %v", len(msg), len(got), err)
		}
	}
	bin := wsMessage{Data: []byte{0, 1, 2}, Type: websocket.BinaryFrame}
	if err := wsCodec.Send(c, bin); err != nil {
		t.Fatal(err)
	}
	var got wsMessage
	if err := wsCodec.Receive(c, &got); err != nil || string(got.Data) != string(bin.Data) || got.Type != bin.Type {
		t.Errorf("binary %v: got %v, %v", bin, got, err)
	}

	raw, err := net.Dial("tcp", s.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	fmt.Fprintf(raw, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("handshake without Origin: %v, %v", resp, err)
	}
}
