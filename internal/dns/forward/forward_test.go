package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// upstream is a real miekg/dns server on 127.0.0.1, UDP and TCP on one port.
type upstream struct {
	addr     string
	udp, tcp atomic.Int64
	mu       sync.Mutex
	last     *dns.Msg // last query received
}

// startUpstream serves answer(query, network) on a random port.
func startUpstream(t *testing.T, answer func(r *dns.Msg, network string) *dns.Msg) *upstream {
	t.Helper()
	u := &upstream{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		network := w.LocalAddr().Network()
		if network == "udp" {
			u.udp.Add(1)
		} else {
			u.tcp.Add(1)
		}
		u.mu.Lock()
		u.last = r.Copy()
		u.mu.Unlock()
		if m := answer(r, network); m != nil {
			_ = w.WriteMsg(m)
		}
	})
	var pc net.PacketConn
	var ln net.Listener
	for i := 0; ; i++ {
		var err error
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		if i == 20 {
			t.Fatalf("no port free for both UDP and TCP: %v", err)
		}
	}
	u.addr = pc.LocalAddr().String()
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go func() { _ = s.ActivateAndServe() }()
		t.Cleanup(func() { _ = s.Shutdown() })
	}
	return u
}

func (u *upstream) queries() int64 { return u.udp.Load() + u.tcp.Load() }

func (u *upstream) lastQuery() *dns.Msg {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

// silentUpstream accepts UDP queries and never answers.
func silentUpstream(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}

// closedUpstream is a port with nothing behind it (ICMP port unreachable).
func closedUpstream(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func mustRR(t testing.TB, s string) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// answerA answers every query with one A record of the given TTL.
func answerA(t *testing.T, ttl int) func(*dns.Msg, string) *dns.Msg {
	return func(r *dns.Msg, _ string) *dns.Msg {
		m := new(dns.Msg).SetReply(r)
		m.Answer = []dns.RR{mustRR(t, fmt.Sprintf("%s %d IN A 198.51.100.7", r.Question[0].Name, ttl))}
		m.SetEdns0(4096, false)
		return m
	}
}

// negative answers NXDOMAIN (or NODATA) with an SOA whose TTL is 300 and MINIMUM min.
func negative(t *testing.T, rcode int, min int) func(*dns.Msg, string) *dns.Msg {
	return func(r *dns.Msg, _ string) *dns.Msg {
		m := new(dns.Msg).SetRcode(r, rcode)
		m.Ns = []dns.RR{mustRR(t, fmt.Sprintf("example.com. 300 IN SOA ns.example.com. admin.example.com. 1 7200 900 1209600 %d", min))}
		return m
	}
}

func newForwarder(t *testing.T, cfg Config) *Forwarder {
	t.Helper()
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg).SetQuestion(name, qtype)
	m.Id = 4242
	return m
}

func ask(t *testing.T, f *Forwarder, name string, qtype uint16) *dns.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.Exchange(ctx, query(name, qtype))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return resp
}

func TestForwardsAnswer(t *testing.T) {
	u := startUpstream(t, answerA(t, 60))
	f := newForwarder(t, Config{Upstreams: []string{u.addr}})
	resp := ask(t, f, "WwW.Example.COM.", dns.TypeA)

	if resp.Id != 4242 {
		t.Errorf("ID = %d, want the client's 4242", resp.Id)
	}
	if resp.Question[0].Name != "WwW.Example.COM." {
		t.Errorf("question = %q, want the client's letter case", resp.Question[0].Name)
	}
	if len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "198.51.100.7" {
		t.Errorf("answer = %v", resp.Answer)
	}
	if resp.IsEdns0() != nil {
		t.Errorf("upstream's OPT handed to the client: %v", resp.Extra)
	}
	o := u.lastQuery().IsEdns0()
	if o == nil || o.UDPSize() != UpstreamUDPSize {
		t.Errorf("upstream saw OPT %v, want buffer %d", o, UpstreamUDPSize)
	}
	if u.udp.Load() != 1 || u.tcp.Load() != 0 {
		t.Errorf("upstream saw %d UDP and %d TCP queries, want 1 and 0", u.udp.Load(), u.tcp.Load())
	}
}

func TestTruncatedAnswerRetriedOverTCP(t *testing.T) {
	u := startUpstream(t, func(r *dns.Msg, network string) *dns.Msg {
		m := new(dns.Msg).SetReply(r)
		if network == "udp" {
			m.Truncated = true
			return m
		}
		for i := range 100 {
			m.Answer = append(m.Answer, mustRR(t, fmt.Sprintf("%s 60 IN A 198.51.100.%d", r.Question[0].Name, i)))
		}
		return m
	})
	f := newForwarder(t, Config{Upstreams: []string{u.addr}})
	resp := ask(t, f, "big.example.com.", dns.TypeA)
	if resp.Truncated || len(resp.Answer) != 100 {
		t.Errorf("got TC=%v with %d answers, want the full 100 from TCP", resp.Truncated, len(resp.Answer))
	}
	if u.udp.Load() != 1 || u.tcp.Load() != 1 {
		t.Errorf("upstream saw %d UDP and %d TCP queries, want 1 and 1", u.udp.Load(), u.tcp.Load())
	}
}

func TestNextUpstreamOnFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(t *testing.T) string
	}{
		{"silent", silentUpstream},
		{"closed port", closedUpstream},
		{"SERVFAIL", func(t *testing.T) string {
			return startUpstream(t, func(r *dns.Msg, _ string) *dns.Msg { return new(dns.Msg).SetRcode(r, dns.RcodeServerFailure) }).addr
		}},
		{"REFUSED", func(t *testing.T) string {
			return startUpstream(t, func(r *dns.Msg, _ string) *dns.Msg { return new(dns.Msg).SetRcode(r, dns.RcodeRefused) }).addr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			second := startUpstream(t, answerA(t, 60))
			f := newForwarder(t, Config{Upstreams: []string{tc.first(t), second.addr}, TryTimeout: 300 * time.Millisecond})
			start := time.Now()
			resp := ask(t, f, "www.example.com.", dns.TypeA)
			t.Logf("answered in %v", time.Since(start))
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Errorf("got %s with %d answers, want the second upstream's answer", dns.RcodeToString[resp.Rcode], len(resp.Answer))
			}
			if s := f.Stats(); s.ForwardErrors != 1 || s.Forwards != 2 {
				t.Errorf("stats %+v, want 2 forwards and 1 error", s)
			}
		})
	}
}

func TestEveryUpstreamFailing(t *testing.T) {
	t.Run("network errors give an error", func(t *testing.T) {
		f := newForwarder(t, Config{Upstreams: []string{closedUpstream(t), silentUpstream(t)}, TryTimeout: 200 * time.Millisecond})
		_, err := f.Exchange(context.Background(), query("www.example.com.", dns.TypeA))
		if err == nil || !strings.Contains(err.Error(), "no upstream answered") {
			t.Fatalf("err = %v, want no upstream answered", err)
		}
		if s := f.Stats(); s.ForwardErrors != 2 {
			t.Errorf("stats %+v, want 2 forward errors", s)
		}
	})
	t.Run("SERVFAIL is returned and not cached", func(t *testing.T) {
		u := startUpstream(t, func(r *dns.Msg, _ string) *dns.Msg { return new(dns.Msg).SetRcode(r, dns.RcodeServerFailure) })
		f := newForwarder(t, Config{Upstreams: []string{u.addr}})
		for range 2 {
			if resp := ask(t, f, "www.example.com.", dns.TypeA); resp.Rcode != dns.RcodeServerFailure || resp.Id != 4242 {
				t.Fatalf("got %s ID %d, want SERVFAIL with the client's ID", dns.RcodeToString[resp.Rcode], resp.Id)
			}
		}
		if u.queries() != 2 {
			t.Errorf("upstream saw %d queries, want 2 (SERVFAIL is not cached)", u.queries())
		}
	})
}

func TestCacheHitTTLDecrementAndExpiry(t *testing.T) {
	u := startUpstream(t, answerA(t, 30))
	clk := newClock()
	f := newForwarder(t, Config{Upstreams: []string{u.addr}, Now: clk.Now})

	ask(t, f, "www.example.com.", dns.TypeA)
	clk.Advance(10 * time.Second)
	resp := ask(t, f, "WWW.EXAMPLE.COM.", dns.TypeA)
	if u.queries() != 1 {
		t.Fatalf("upstream saw %d queries, want 1 (second answered from cache, case-insensitively)", u.queries())
	}
	if ttl := resp.Answer[0].Header().Ttl; ttl != 20 {
		t.Errorf("TTL after 10 s = %d, want 20", ttl)
	}
	if resp.Question[0].Name != "WWW.EXAMPLE.COM." || resp.Id != 4242 {
		t.Errorf("cached answer has question %q ID %d, want the client's", resp.Question[0].Name, resp.Id)
	}
	ask(t, f, "www.example.com.", dns.TypeAAAA)
	if u.queries() != 2 {
		t.Errorf("AAAA answered from the A entry: upstream saw %d queries, want 2", u.queries())
	}
	clk.Advance(19 * time.Second)
	if resp := ask(t, f, "www.example.com.", dns.TypeA); resp.Answer[0].Header().Ttl != 1 || u.queries() != 2 {
		t.Errorf("at 29 s: TTL %d, %d upstream queries; want 1 and 2", resp.Answer[0].Header().Ttl, u.queries())
	}
	clk.Advance(time.Second)
	ask(t, f, "www.example.com.", dns.TypeA)
	if u.queries() != 3 {
		t.Errorf("at 30 s the entry should have expired: upstream saw %d queries, want 3", u.queries())
	}
	if s := f.Stats(); s.CacheHits != 2 || s.CacheMisses != 3 {
		t.Errorf("stats %+v, want 2 hits and 3 misses", s)
	}
}

func TestPositiveTTLCapped(t *testing.T) {
	u := startUpstream(t, answerA(t, 86400))
	clk := newClock()
	f := newForwarder(t, Config{Upstreams: []string{u.addr}, Now: clk.Now})
	ask(t, f, "www.example.com.", dns.TypeA)
	if ttl := ask(t, f, "www.example.com.", dns.TypeA).Answer[0].Header().Ttl; ttl > uint32(MaxPositiveTTL/time.Second) {
		t.Errorf("served TTL %d, want at most the cap %v", ttl, MaxPositiveTTL)
	}
	clk.Advance(MaxPositiveTTL)
	ask(t, f, "www.example.com.", dns.TypeA)
	if u.queries() != 2 {
		t.Errorf("upstream saw %d queries, want 2 (entry expired at the cap)", u.queries())
	}
}

func TestNegativeCacheUsesSOAMinimum(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rcode int
	}{{"NXDOMAIN", dns.RcodeNameError}, {"NODATA", dns.RcodeSuccess}} {
		t.Run(tc.name, func(t *testing.T) {
			u := startUpstream(t, negative(t, tc.rcode, 60))
			clk := newClock()
			f := newForwarder(t, Config{Upstreams: []string{u.addr}, Now: clk.Now})
			ask(t, f, "nope.example.com.", dns.TypeA)
			clk.Advance(59 * time.Second)
			resp := ask(t, f, "nope.example.com.", dns.TypeA)
			if u.queries() != 1 || resp.Rcode != tc.rcode {
				t.Fatalf("at 59 s: %d upstream queries, rcode %s; want 1 and %s from cache",
					u.queries(), dns.RcodeToString[resp.Rcode], tc.name)
			}
			if ttl := resp.Ns[0].Header().Ttl; ttl != 1 {
				t.Errorf("SOA TTL at 59 s = %d, want 1 (MINIMUM 60 minus age)", ttl)
			}
			clk.Advance(time.Second)
			ask(t, f, "nope.example.com.", dns.TypeA)
			if u.queries() != 2 {
				t.Errorf("at 60 s (the SOA minimum) the entry should have expired: %d upstream queries, want 2", u.queries())
			}
		})
	}
	t.Run("without SOA not cached", func(t *testing.T) {
		u := startUpstream(t, func(r *dns.Msg, _ string) *dns.Msg { return new(dns.Msg).SetRcode(r, dns.RcodeNameError) })
		f := newForwarder(t, Config{Upstreams: []string{u.addr}})
		ask(t, f, "nope.example.com.", dns.TypeA)
		ask(t, f, "nope.example.com.", dns.TypeA)
		if u.queries() != 2 {
			t.Errorf("upstream saw %d queries, want 2", u.queries())
		}
	})
	t.Run("capped", func(t *testing.T) {
		u := startUpstream(t, func(r *dns.Msg, _ string) *dns.Msg {
			m := new(dns.Msg).SetRcode(r, dns.RcodeNameError)
			m.Ns = []dns.RR{mustRR(t, "example.com. 86400 IN SOA ns.example.com. admin.example.com. 1 7200 900 1209600 86400")}
			return m
		})
		clk := newClock()
		f := newForwarder(t, Config{Upstreams: []string{u.addr}, Now: clk.Now})
		ask(t, f, "nope.example.com.", dns.TypeA)
		clk.Advance(MaxNegativeTTL)
		ask(t, f, "nope.example.com.", dns.TypeA)
		if u.queries() != 2 {
			t.Errorf("upstream saw %d queries, want 2 (negative entry expired at the cap)", u.queries())
		}
	})
}

func TestCacheBoundInEntries(t *testing.T) {
	u := startUpstream(t, answerA(t, 300))
	f := newForwarder(t, Config{Upstreams: []string{u.addr}, CacheEntries: 3})
	for i := range 5 {
		ask(t, f, fmt.Sprintf("n%d.example.com.", i), dns.TypeA)
	}
	if n := f.cache.Len(); n != 3 {
		t.Errorf("cache holds %d entries, want the bound 3", n)
	}
	ask(t, f, "n4.example.com.", dns.TypeA) // newest: still cached
	if u.queries() != 5 {
		t.Errorf("newest entry evicted: %d upstream queries, want 5", u.queries())
	}
	ask(t, f, "n0.example.com.", dns.TypeA) // oldest: evicted
	if u.queries() != 6 {
		t.Errorf("oldest entry kept: %d upstream queries, want 6", u.queries())
	}
	if s := f.Stats(); s.CacheEvictions != 3 {
		t.Errorf("stats %+v, want 3 evictions", s)
	}
}

func TestContextBoundsTime(t *testing.T) {
	f := newForwarder(t, Config{Upstreams: []string{silentUpstream(t), silentUpstream(t)}, TryTimeout: 2 * time.Second})
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := f.Exchange(ctx, query("www.example.com.", dns.TypeA))
			took := time.Since(start)
			t.Logf("returned after %v with %v", took, err)
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if took > 1500*time.Millisecond {
				t.Errorf("took %v with the context ending at 300 ms (per-try timeout 2 s)", took)
			}
		})
	}
}

func TestExchangeRejectsBadQueries(t *testing.T) {
	f := newForwarder(t, Config{Upstreams: []string{"127.0.0.1:53"}})
	if _, err := f.Exchange(context.Background(), new(dns.Msg)); err == nil {
		t.Error("a query without a question was accepted")
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "no upstream") {
		t.Errorf("New without upstreams: %v", err)
	}
	if _, err := New(Config{Upstreams: []string{"10.0.0.1"}}); err == nil || !strings.Contains(err.Error(), "addr:port") {
		t.Errorf("New with a port-less upstream: %v", err)
	}
}

// TestConcurrentExchange runs many queries over a small cache at once; run
// it with -race.
func TestConcurrentExchange(t *testing.T) {
	u := startUpstream(t, answerA(t, 300))
	f := newForwarder(t, Config{Upstreams: []string{u.addr}, CacheEntries: 4})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				name := fmt.Sprintf("n%d.example.com.", (g+i)%10)
				resp, err := f.Exchange(context.Background(), query(name, dns.TypeA))
				if err != nil || len(resp.Answer) != 1 || !strings.EqualFold(resp.Answer[0].Header().Name, name) {
					t.Errorf("%s: %v %v", name, resp, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	s := f.Stats()
	t.Logf("stats %+v, upstream queries %d", s, u.queries())
	if s.CacheHits+s.CacheMisses != 400 || f.cache.Len() > 4 {
		t.Errorf("stats %+v, cache len %d: want 400 lookups and at most 4 entries", s, f.cache.Len())
	}
}
