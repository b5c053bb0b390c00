package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/proxy"
)

// The tests run on loopback: every 127/8 address is local on Linux, so a
// ClusterIP like 127.77.x.y needs no address added (the fake Addrs only
// records what the backend asks for) and endpoint servers listen on other
// 127.x addresses. Each test takes its own random 127.77.x.0/24.

// fakeAddrs is Addrs in memory.
type fakeAddrs struct {
	mu    sync.Mutex
	held  map[netip.Addr]bool
	other []netip.Addr
	ops   []string
}

func newFakeAddrs(other ...string) *fakeAddrs {
	f := &fakeAddrs{held: map[netip.Addr]bool{}}
	for _, a := range other {
		f.other = append(f.other, netip.MustParseAddr(a))
	}
	return f
}

func (f *fakeAddrs) List() (held, other []netip.Addr, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.SortedFunc(maps.Keys(f.held), netip.Addr.Compare), slices.Clone(f.other), nil
}

func (f *fakeAddrs) Add(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[a] = true
	f.ops = append(f.ops, "add "+a.String())
	return nil
}

func (f *fakeAddrs) Del(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, a)
	f.ops = append(f.ops, "del "+a.String())
	return nil
}

func (f *fakeAddrs) takeOps() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.ops
	f.ops = nil
	return ops
}

// subnet returns a random 127.77.x. prefix for one test's addresses.
func subnet() string { return fmt.Sprintf("127.77.%d.", rand.IntN(250)+1) }

// tcpEndpoint serves "<name>\n" for every line on each connection, until
// the test ends.
func tcpEndpoint(t *testing.T, ip, name string) proxy.Endpoint {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	ap := serveTCP(t, ln, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			if _, err := fmt.Fprintln(c, name); err != nil {
				return
			}
		}
	})
	return proxy.Endpoint{IP: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true}
}

// serveTCP runs handle on each connection to ln (then closes it) until
// the test ends.
func serveTCP(t testing.TB, ln net.Listener, handle func(net.Conn)) netip.AddrPort {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// udpEndpoint answers every datagram with its name.
func udpEndpoint(t *testing.T, ip, name string) proxy.Endpoint {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	ap := serveUDP(t, pc, name)
	return proxy.Endpoint{IP: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true}
}

// serveUDP answers every datagram on pc with name until the test ends.
func serveUDP(t *testing.T, pc net.PacketConn, name string) netip.AddrPort {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name), from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// deadEndpoint is an address:port nothing listens on (connect: refused).
func deadEndpoint(t *testing.T, ip string) proxy.Endpoint {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return proxy.Endpoint{IP: ap.Addr(), Port: ap.Port(), Ready: true, Serving: true}
}

func service(name, clusterIP string, proto proxy.Protocol, port uint16, eps ...proxy.Endpoint) *proxy.Service {
	return &proxy.Service{
		Namespace: "ns", Name: name, Type: proxy.ClusterIP,
		ClusterIP: netip.MustParseAddr(clusterIP),
		Ports:     []proxy.ServicePort{{Name: "p", Protocol: proto, Port: port, Endpoints: eps}},
	}
}

func newBackend(t *testing.T, cfg Config) (*Backend, *fakeAddrs) {
	t.Helper()
	f, _ := cfg.Addrs.(*fakeAddrs)
	if f == nil {
		f = newFakeAddrs()
		cfg.Addrs = f
	}
	if len(cfg.DialTimeouts) == 0 {
		cfg.DialTimeouts = []time.Duration{time.Second, time.Second, time.Second}
	}
	b := New(cfg)
	t.Cleanup(b.Close)
	return b, f
}

func mustSync(t *testing.T, b *Backend, svcs []*proxy.Service, changed map[string]bool, full bool) proxy.SyncResult {
	t.Helper()
	res, err := b.Sync(context.Background(), svcs, proxy.ChangesOf(svcs, changed), full)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	for _, c := range res.Conflicts {
		t.Logf("conflict: %v", c)
	}
	return res
}

// conn is a client connection that asks line by line.
type conn struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, from, to string) (*conn, error) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", to)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &conn{Conn: c, r: bufio.NewReader(c)}, nil
}

func (c *conn) ask() (string, error) {
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// askNew opens a connection from from to to and returns the one answer.
func askNew(t *testing.T, from, to string) (string, error) {
	t.Helper()
	c, err := dial(t, from, to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ask()
}

func mustAsk(t *testing.T, from, to string) string {
	t.Helper()
	got, err := askNew(t, from, to)
	if err != nil {
		t.Fatalf("asking %s from %q: %v", to, from, err)
	}
	return got
}

func TestRoundRobin(t *testing.T) {
	n := subnet()
	eps := []proxy.Endpoint{tcpEndpoint(t, n+"1", "a"), tcpEndpoint(t, n+"2", "b"), tcpEndpoint(t, n+"3", "c")}
	b, addrs := newBackend(t, Config{})
	res := mustSync(t, b, []*proxy.Service{service("web", n+"10", proxy.TCP, 8080, eps...)}, nil, true)
	if len(res.Conflicts) != 0 {
		t.Fatalf("conflicts: %v", res.Conflicts)
	}
	if ops := addrs.takeOps(); !slices.Equal(ops, []string{"add " + n + "10"}) {
		t.Errorf("address operations: %q, want the ClusterIP added", ops)
	}
	var got []string
	for range 6 {
		got = append(got, mustAsk(t, "", n+"10:8080"))
	}
	if want := []string{"a", "b", "c", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("answers %q, want round robin %q", got, want)
	}
	// A port the service does not have is refused, as the kernel modes do.
	if _, err := dial(t, "", n+"10:8081"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("another port of the ClusterIP: %v, want connection refused", err)
	}
}

func TestFailOverDeadEndpoint(t *testing.T) {
	n := subnet()
	dead := deadEndpoint(t, n+"1")
	live := tcpEndpoint(t, n+"2", "live")
	b, _ := newBackend(t, Config{})
	mustSync(t, b, []*proxy.Service{service("web", n+"10", proxy.TCP, 8080, dead, live)}, nil, true)
	for i := range 4 {
		start := time.Now()
		if got := mustAsk(t, "", n+"10:8080"); got != "live" {
			t.Fatalf("connection %d answered by %q", i, got)
		}
		t.Logf("connection %d: %v", i, time.Since(start))
	}
	// All dead: the client gets a reset, not a hang.
	mustSync(t, b, []*proxy.Service{service("web", n+"10", proxy.TCP, 8080, dead)}, map[string]bool{"ns/web": true}, false)
	if got, err := askNew(t, "", n+"10:8080"); err == nil {
		t.Fatalf("a service whose only endpoint is dead answered %q", got)
	} else {
		t.Logf("all endpoints dead: %v", err)
	}
}

func TestAffinity(t *testing.T) {
	n := subnet()
	eps := []proxy.Endpoint{tcpEndpoint(t, n+"1", "a"), tcpEndpoint(t, n+"2", "b"), tcpEndpoint(t, n+"3", "c")}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b, _ := newBackend(t, Config{Now: clock})
	svc := service("web", n+"10", proxy.TCP, 8080, eps...)
	svc.AffinityTimeout = 10 * time.Second
	mustSync(t, b, []*proxy.Service{svc}, nil, true)
	to := n + "10:8080"
	first := mustAsk(t, n+"101", to)
	for range 4 {
		if got := mustAsk(t, n+"101", to); got != first {
			t.Fatalf("client 101 went to %q after %q, want affinity", got, first)
		}
	}
	// Another client starts where round robin is.
	if other := mustAsk(t, n+"102", to); other == first {
		t.Errorf("client 102 went to %q too; round robin should have moved on", other)
	}
	// Affinity lasts while used; after the timeout without a new
	// connection, round robin picks again.
	mu.Lock()
	now = now.Add(9 * time.Second)
	mu.Unlock()
	if got := mustAsk(t, n+"101", to); got != first {
		t.Errorf("within the timeout, client 101 went to %q, want %q", got, first)
	}
	mu.Lock()
	now = now.Add(11 * time.Second)
	mu.Unlock()
	if got := mustAsk(t, n+"101", to); got == first {
		t.Errorf("after the timeout, client 101 still went to %q", got)
	}
	// An affinity endpoint that goes away is replaced.
	sticky := mustAsk(t, n+"103", to)
	var rest []proxy.Endpoint
	for i, name := range []string{"a", "b", "c"} {
		if name != sticky {
			rest = append(rest, eps[i])
		}
	}
	svc.Ports[0].Endpoints = rest
	mustSync(t, b, []*proxy.Service{svc}, map[string]bool{"ns/web": true}, false)
	if got := mustAsk(t, n+"103", to); got == sticky {
		t.Errorf("client 103 still went to removed endpoint %q", got)
	}
}

func TestNoEndpointsFailFast(t *testing.T) {
	n := subnet()
	b, _ := newBackend(t, Config{})
	tcp := service("tcp", n+"10", proxy.TCP, 8080)
	udp := service("udp", n+"10", proxy.UDP, 5353)
	mustSync(t, b, []*proxy.Service{tcp, udp}, nil, true)
	if _, err := dial(t, "", n+"10:8080"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP to a service without endpoints: %v, want connection refused", err)
	}
	if _, err := udpAsk(t, n+"10:5353"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a service without endpoints: %v, want connection refused (ICMP port unreachable)", err)
	}
	// Endpoints arrive: the same addresses answer.
	tcp.Ports[0].Endpoints = []proxy.Endpoint{tcpEndpoint(t, n+"1", "a")}
	udp.Ports[0].Endpoints = []proxy.Endpoint{udpEndpoint(t, n+"2", "u")}
	mustSync(t, b, []*proxy.Service{tcp, udp}, map[string]bool{"ns/tcp": true, "ns/udp": true}, false)
	if got := mustAsk(t, "", n+"10:8080"); got != "a" {
		t.Errorf("TCP answered %q", got)
	}
	if got, err := udpAsk(t, n+"10:5353"); err != nil || got != "u" {
		t.Errorf("UDP answered %q, %v", got, err)
	}
}

// udpAsk sends one datagram from a new socket and reads one answer.
func udpAsk(t *testing.T, to string) (string, error) {
	t.Helper()
	c, err := net.Dial("udp", to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return udpRoundTrip(c)
}

func udpRoundTrip(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("q")); err != nil {
		return "", err
	}
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func TestUDPSessions(t *testing.T) {
	n := subnet()
	eps := []proxy.Endpoint{udpEndpoint(t, n+"1", "a"), udpEndpoint(t, n+"2", "b")}
	b, _ := newBackend(t, Config{UDPIdleTimeout: 300 * time.Millisecond})
	svc := service("dns", n+"10", proxy.UDP, 5353, eps...)
	mustSync(t, b, []*proxy.Service{svc}, nil, true)

	// A connected socket only accepts replies from the address it sent
	// to: the answers come from the service address and port.
	c1, err := net.Dial("udp", n+"10:5353")
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	first, err := udpRoundTrip(c1)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got, err := udpRoundTrip(c1); err != nil || got != first {
			t.Fatalf("same client, same session: %q, %v; want %q", got, err, first)
		}
	}
	// A second client gets the next endpoint.
	if got, err := udpAsk(t, n+"10:5353"); err != nil || got == first {
		t.Errorf("second client: %q, %v; want the other endpoint", got, err)
	}
	// The session idles out; the client's next datagram opens a new one,
	// which round robin sends to the endpoint after the second client's.
	time.Sleep(600 * time.Millisecond)
	if got, err := udpRoundTrip(c1); err != nil || got != first {
		t.Errorf("after idling: %q, %v; want %q (round robin after two sessions)", got, err, first)
	}
	// Its endpoint is removed: the session moves at once, without idling
	// out (no stale UDP flow).
	var other proxy.Endpoint
	for i, name := range []string{"a", "b"} {
		if name != first {
			other = eps[i]
		}
	}
	svc.Ports[0].Endpoints = []proxy.Endpoint{other}
	mustSync(t, b, []*proxy.Service{svc}, map[string]bool{"ns/dns": true}, false)
	if got, err := udpRoundTrip(c1); err != nil || got == first {
		t.Errorf("after its endpoint went: %q, %v; want the remaining endpoint", got, err)
	}
}

// TestPartialSyncKeepsConnections: endpoint changes update the pick list
// in place: the listener is not reopened, and an established connection
// to a removed endpoint continues.
func TestPartialSyncKeepsConnections(t *testing.T) {
	n := subnet()
	a, bb := tcpEndpoint(t, n+"1", "a"), tcpEndpoint(t, n+"2", "b")
	b, _ := newBackend(t, Config{})
	svc := service("web", n+"10", proxy.TCP, 8080, a)
	mustSync(t, b, []*proxy.Service{svc}, nil, true)
	c, err := dial(t, "", n+"10:8080")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.ask(); err != nil || got != "a" {
		t.Fatalf("first answer %q, %v", got, err)
	}
	l := b.listeners[frontendKey{proxy.TCP, netip.MustParseAddrPort(n + "10:8080")}]
	svc.Ports[0].Endpoints = []proxy.Endpoint{bb}
	res := mustSync(t, b, []*proxy.Service{svc}, map[string]bool{"ns/web": true}, false)
	if res.Operations != 0 {
		t.Errorf("an endpoint change cost %d operations, want 0 (the pool changes in place)", res.Operations)
	}
	if b.listeners[frontendKey{proxy.TCP, netip.MustParseAddrPort(n + "10:8080")}] != l {
		t.Errorf("the listener was replaced")
	}
	if got, err := c.ask(); err != nil || got != "a" {
		t.Errorf("the established connection after the change: %q, %v; want a", got, err)
	}
	if got := mustAsk(t, "", n+"10:8080"); got != "b" {
		t.Errorf("a new connection went to %q, want b", got)
	}
	// A full sync changes nothing either.
	if res := mustSync(t, b, []*proxy.Service{svc}, nil, true); res.Operations != 0 {
		t.Errorf("a full sync of the same state cost %d operations", res.Operations)
	}
	if got, err := c.ask(); err != nil || got != "a" {
		t.Errorf("the established connection after a full sync: %q, %v", got, err)
	}
}

func TestConflicts(t *testing.T) {
	n := subnet()
	ep := tcpEndpoint(t, n+"1", "a")
	// A port someone else holds: a conflict, not an error.
	taken, err := net.Listen("tcp", n+"20:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	b, _ := newBackend(t, Config{})
	first := service("first", n+"10", proxy.TCP, 8080, ep)
	second := service("second", n+"10", proxy.TCP, 8080, ep)
	busy := service("busy", n+"20", proxy.TCP, 8080, ep)
	res := mustSync(t, b, []*proxy.Service{first, second, busy}, nil, true)
	var got []string
	for _, c := range res.Conflicts {
		var ce *ConflictError
		if !errors.As(c, &ce) {
			t.Fatalf("conflict of type %T: %v", c, c)
		}
		got = append(got, ce.Service)
	}
	if want := []string{"ns/second", "ns/busy"}; !slices.Equal(got, want) {
		t.Errorf("conflicts of %q, want %q", got, want)
	}
	if got := mustAsk(t, "", n+"10:8080"); got != "a" {
		t.Errorf("the first claimant answered %q", got)
	}
	// The owner goes: the next full sync gives the address to the other.
	res = mustSync(t, b, []*proxy.Service{second, busy}, map[string]bool{"ns/first": true}, false)
	res = mustSync(t, b, []*proxy.Service{second, busy}, nil, true)
	if len(res.Conflicts) != 1 {
		t.Errorf("conflicts after the owner went: %v", res.Conflicts)
	}
	if got := mustAsk(t, "", n+"10:8080"); got != "a" {
		t.Errorf("the second claimant answered %q", got)
	}
}

// TestAddresses: a full sync adds the wanted service addresses, removes
// leftovers (a restarted agent), leaves the node's own alone, and is
// idempotent; a deleted service's address goes in a partial sync.
func TestAddresses(t *testing.T) {
	n := subnet()
	ep := tcpEndpoint(t, n+"1", "a")
	f := newFakeAddrs(n + "30")
	f.held[netip.MustParseAddr(n+"99")] = true // left by a previous agent
	b, _ := newBackend(t, Config{Addrs: f})
	web := service("web", n+"10", proxy.TCP, 8080, ep)
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr(n + "30"), netip.MustParseAddr(n + "31")} // .30 is the node's
	web.Type = proxy.LoadBalancer
	web.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(n + "32")}
	empty := service("empty", n+"11", proxy.TCP, 8080)
	mustSync(t, b, []*proxy.Service{web, empty}, nil, true)
	want := []string{"add " + n + "10", "add " + n + "11", "add " + n + "31", "add " + n + "32", "del " + n + "99"}
	if ops := f.takeOps(); !slices.Equal(ops, want) {
		t.Errorf("first full sync: %q, want %q", ops, want)
	}
	for _, to := range []string{n + "10:8080", n + "30:8080", n + "31:8080", n + "32:8080"} {
		if got := mustAsk(t, "", to); got != "a" {
			t.Errorf("%s answered %q", to, got)
		}
	}
	if res := mustSync(t, b, []*proxy.Service{web, empty}, nil, true); res.Operations != 0 || len(f.takeOps()) != 0 {
		t.Errorf("second full sync: %d operations, want none", res.Operations)
	}
	mustSync(t, b, []*proxy.Service{empty}, map[string]bool{"ns/web": true}, false)
	want = []string{"del " + n + "10", "del " + n + "31", "del " + n + "32"}
	if ops := f.takeOps(); !slices.Equal(ops, want) {
		t.Errorf("deleting web: %q, want %q", ops, want)
	}
	if _, err := dial(t, "", n+"31:8080"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a deleted service's externalIP: %v, want refused", err)
	}
}

// TestLoadBalancerSourceRanges: the load-balancer IP takes clients in
// loadBalancerSourceRanges only; the ClusterIP and externalIPs are not
// filtered, as in the kernel modes.
func TestLoadBalancerSourceRanges(t *testing.T) {
	n := subnet()
	ep := tcpEndpoint(t, n+"1", "a")
	b, _ := newBackend(t, Config{})
	svc := service("lb", n+"10", proxy.TCP, 8080, ep)
	svc.Type = proxy.LoadBalancer
	svc.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(n + "40")}
	svc.ExternalIPs = []netip.Addr{netip.MustParseAddr(n + "41")}
	svc.Firewall = true
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix(n + "100/31")} // .100, .101
	mustSync(t, b, []*proxy.Service{svc}, nil, true)
	for _, tc := range []struct {
		from, to string
		ok       bool
	}{
		{n + "100", n + "40:8080", true},
		{n + "101", n + "40:8080", true},
		{n + "102", n + "40:8080", false},
		{n + "102", n + "41:8080", true},
		{n + "102", n + "10:8080", true},
	} {
		got, err := askNew(t, tc.from, tc.to)
		if ok := err == nil && got == "a"; ok != tc.ok {
			t.Errorf("%s -> %s: %q, %v; want served %v", tc.from, tc.to, got, err, tc.ok)
		}
	}
}

// TestNodePort: NodePorts listen on the node's addresses (loopback ones
// only when NodePortAddresses names them, as here), an externalIP that is
// a node IP included, not on the ClusterIP; with no usable endpoint they
// are refused.
func TestNodePort(t *testing.T) {
	n := subnet()
	ep := tcpEndpoint(t, n+"1", "a")
	f := newFakeAddrs(n+"50", n+"51", "10.0.0.1")
	b, _ := newBackend(t, Config{Addrs: f, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix(n + "0/24")}})
	svc := service("np", n+"10", proxy.TCP, 8080, ep)
	svc.Type = proxy.NodePort
	svc.Ports[0].NodePort = 30080 + uint16(rand.IntN(1000))
	svc.ExternalIPs = []netip.Addr{netip.MustParseAddr(n + "51")} // a node IP
	mustSync(t, b, []*proxy.Service{svc}, nil, true)
	np := fmt.Sprint(svc.Ports[0].NodePort)
	for _, to := range []string{n + "50:" + np, n + "51:" + np} {
		if got := mustAsk(t, "", to); got != "a" {
			t.Errorf("%s answered %q", to, got)
		}
	}
	if _, err := dial(t, "", n+"10:"+np); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the NodePort on the ClusterIP: %v, want refused", err)
	}
	svc.Ports[0].Endpoints = nil
	mustSync(t, b, []*proxy.Service{svc}, map[string]bool{"ns/np": true}, false)
	if _, err := dial(t, "", n+"50:"+np); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the NodePort without endpoints: %v, want refused", err)
	}
}

// TestPoolPolicies checks the choice of endpoints per kind of frontend and
// client, without sockets.
func TestPoolPolicies(t *testing.T) {
	ap := netip.MustParseAddrPort
	local, remote := proxy.Endpoint{IP: netip.MustParseAddr("10.1.0.2"), Port: 80, Ready: true, NodeName: "me"},
		proxy.Endpoint{IP: netip.MustParseAddr("10.1.1.2"), Port: 80, Ready: true, NodeName: "other"}
	terminating := proxy.Endpoint{IP: netip.MustParseAddr("10.1.1.3"), Port: 80, Serving: true, Terminating: true, NodeName: "other"}
	pod, outside := netip.MustParseAddr("10.1.5.5"), netip.MustParseAddr("192.168.9.9")
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	svc := func(mod func(*proxy.Service), eps ...proxy.Endpoint) *proxy.Service {
		s := service("s", "10.96.0.1", proxy.TCP, 80, eps...)
		s.Type = proxy.NodePort
		s.Ports[0].NodePort = 30000
		if mod != nil {
			mod(s)
		}
		return s
	}
	extLocal := func(s *proxy.Service) { s.ExternalLocal = true }
	intLocal := func(s *proxy.Service) { s.InternalLocal = true }
	for _, tc := range []struct {
		name   string
		svc    *proxy.Service
		kind   kind
		client netip.Addr
		want   []netip.AddrPort
	}{
		{"cluster", svc(nil, local, remote), kindClusterIP, pod, []netip.AddrPort{ap("10.1.0.2:80"), ap("10.1.1.2:80")}},
		{"terminating only when none is ready", svc(nil, terminating), kindClusterIP, pod, []netip.AddrPort{ap("10.1.1.3:80")}},
		{"ready before terminating", svc(nil, remote, terminating), kindClusterIP, pod, []netip.AddrPort{ap("10.1.1.2:80")}},
		{"internal Local", svc(intLocal, local, remote), kindClusterIP, pod, []netip.AddrPort{ap("10.1.0.2:80")}},
		{"internal Local, none here", svc(intLocal, remote), kindClusterIP, pod, nil},
		{"external Local from outside", svc(extLocal, local, remote), kindNodePort, outside, []netip.AddrPort{ap("10.1.0.2:80")}},
		{"external Local, a pod keeps all", svc(extLocal, local, remote), kindNodePort, pod, []netip.AddrPort{ap("10.1.0.2:80"), ap("10.1.1.2:80")}},
		{"external Local, none here, outside", svc(extLocal, remote), kindNodePort, outside, nil},
		{"external Local, none here, pod", svc(extLocal, remote), kindNodePort, pod, []netip.AddrPort{ap("10.1.1.2:80")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &planner{nodeName: "me"}
			pl := p.plan(tc.svc, []netip.Addr{netip.MustParseAddr("192.168.1.1")})
			pool := newPool(pl.ports["ns/s/tcp/p"], time.Now)
			got := pool.candidates(tc.client, tc.kind, cidrs, 10)
			slices.SortFunc(got, netip.AddrPort.Compare)
			if !slices.Equal(got, tc.want) {
				t.Errorf("candidates %v, want %v", got, tc.want)
			}
		})
	}
}

// TestIPv6 serves an IPv6 ClusterIP on ::1 and leaves IPv4 services out.
func TestIPv6(t *testing.T) {
	ep := tcpEndpoint(t, "[::1]", "six")
	f := newFakeAddrs()
	f.held[netip.MustParseAddr("127.0.0.9")] = true // the IPv4 backend's
	b, _ := newBackend(t, Config{IPv6: true, Addrs: f})
	port := 20000 + uint16(rand.IntN(10000))
	v6 := service("v6", "::1", proxy.TCP, port, ep)
	v4 := service("v4", "127.0.0.1", proxy.TCP, port, ep)
	mustSync(t, b, []*proxy.Service{v6, v4}, nil, true)
	if got := mustAsk(t, "", fmt.Sprintf("[::1]:%d", port)); got != "six" {
		t.Errorf("answered %q", got)
	}
	if _, err := dial(t, "", fmt.Sprintf("127.0.0.1:%d", port)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("an IPv4 service on the IPv6 backend: %v, want refused", err)
	}
	if ops := f.takeOps(); !slices.Equal(ops, []string{"add ::1"}) {
		t.Errorf("address operations %q, want ::1 added and the IPv4 backend's address left alone", ops)
	}
}

// TestCloseEndsEverything: Close ends every listener, connection and UDP
// session goroutine, and Sync refuses afterwards.
func TestCloseEndsEverything(t *testing.T) {
	n := subnet()
	tcpEP, udpEP := tcpEndpoint(t, n+"1", "a"), udpEndpoint(t, n+"2", "u")
	before := goroutines()
	b := New(Config{Addrs: newFakeAddrs()})
	mustSync(t, b, []*proxy.Service{service("tcp", n+"10", proxy.TCP, 8080, tcpEP), service("udp", n+"11", proxy.UDP, 5353, udpEP)}, nil, true)
	c, err := dial(t, "", n+"10:8080")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.ask(); err != nil || got != "a" {
		t.Fatalf("TCP: %q, %v", got, err)
	}
	if got, err := udpAsk(t, n+"11:5353"); err != nil || got != "u" {
		t.Fatalf("UDP: %q, %v", got, err)
	}
	b.Close()
	if _, err := c.ask(); err == nil {
		t.Errorf("a proxied connection still answers after Close")
	}
	if _, err := b.Sync(context.Background(), nil, nil, true); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Close: %v, want ErrClosed", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for goroutines() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if after := goroutines(); after > before {
		t.Errorf("%d goroutines before the backend, %d after Close", before, after)
	}
}

// goroutines counts the goroutines of this package's code.
func goroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "proxy/userspace.(*")
}
