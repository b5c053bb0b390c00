package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

const (
	// DefaultTryTimeout bounds one upstream try (UDP, plus TCP if truncated).
	DefaultTryTimeout = 2 * time.Second
	// UpstreamUDPSize is the EDNS0 buffer size advertised to upstreams.
	UpstreamUDPSize = 1232
)

// Config configures a Forwarder.
type Config struct {
	Upstreams    []string      // "addr:port"; see UpstreamsFromResolvConf and ParseUpstreams
	TryTimeout   time.Duration // per upstream try; 0 means DefaultTryTimeout
	CacheEntries int           // 0 means DefaultCacheEntries; negative disables the cache
	Now          func() time.Time
}

// Stats are the forwarder's counters.
type Stats struct {
	CacheHits, CacheMisses, CacheEvictions uint64
	Forwards                               uint64 // queries sent upstream (one per try, UDP and TCP counted once)
	ForwardErrors                          uint64 // tries that failed: network error, timeout, SERVFAIL or REFUSED
}

// Forwarder forwards queries to upstream resolvers through a cache.
type Forwarder struct {
	upstreams  []string
	tryTimeout time.Duration
	cache      *Cache // nil when disabled

	forwards, forwardErrors atomic.Uint64
}

// New returns a Forwarder, or an error naming what is wrong with cfg.
func New(cfg Config) (*Forwarder, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("dns forward: no upstream resolver: give some or a resolv.conf with nameserver lines")
	}
	for _, u := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return nil, fmt.Errorf("dns forward: upstream %q: %w (want addr:port)", u, err)
		}
	}
	f := &Forwarder{upstreams: append([]string(nil), cfg.Upstreams...), tryTimeout: cfg.TryTimeout}
	if f.tryTimeout <= 0 {
		f.tryTimeout = DefaultTryTimeout
	}
	if cfg.CacheEntries >= 0 {
		f.cache = NewCache(cfg.CacheEntries, cfg.Now)
	}
	return f, nil
}

// Stats returns a snapshot of the counters.
func (f *Forwarder) Stats() Stats {
	s := Stats{Forwards: f.forwards.Load(), ForwardErrors: f.forwardErrors.Load()}
	if f.cache != nil {
		s.CacheHits, s.CacheMisses, s.CacheEvictions = f.cache.hits.Load(), f.cache.misses.Load(), f.cache.evictions.Load()
	}
	return s
}

// Exchange answers req from the cache or the upstreams. req must hold exactly
// one question. The answer has req's ID and question and no OPT record.
func (f *Forwarder) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	if len(req.Question) != 1 {
		return nil, fmt.Errorf("dns forward: %d questions in the query, want exactly one", len(req.Question))
	}
	if f.cache != nil {
		if m := f.cache.Get(req); m != nil {
			return m, nil
		}
	}
	out := upstreamQuery(req)
	var lastBad *dns.Msg
	var errs []error
	for _, up := range f.upstreams {
		if ctx.Err() != nil {
			break
		}
		f.forwards.Add(1)
		resp, err := f.try(ctx, out, up)
		if err == nil && (resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused) {
			lastBad, err = resp, fmt.Errorf("%s: %s", up, dns.RcodeToString[resp.Rcode])
		}
		if err != nil {
			f.forwardErrors.Add(1)
			errs = append(errs, err)
			continue
		}
		resp = toClient(req, resp)
		if f.cache != nil {
			f.cache.Set(req, resp)
		}
		return resp, nil
	}
	if lastBad != nil {
		return toClient(req, lastBad), nil
	}
	err := errors.Join(errs...)
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = errors.Join(err, cerr) // upstreams left untried
	}
	return nil, fmt.Errorf("dns forward: %s %s: no upstream answered: %w",
		req.Question[0].Name, dns.TypeToString[req.Question[0].Qtype], err)
}

// upstreamQuery is req with a fresh ID (the client's is not ours to reuse
// towards another server) and an OPT advertising UpstreamUDPSize; the
// client's DO bit is kept.
func upstreamQuery(req *dns.Msg) *dns.Msg {
	out := req.Copy()
	out.Id = dns.Id()
	do := false
	if o := out.IsEdns0(); o != nil {
		do = o.Do()
	}
	out.Extra = withoutOPT(out.Extra)
	out.SetEdns0(UpstreamUDPSize, do)
	return out
}

func toClient(req, resp *dns.Msg) *dns.Msg {
	resp.Id = req.Id
	resp.Question = append([]dns.Question(nil), req.Question...)
	stripOPT(resp)
	return resp
}

// try asks one upstream over UDP, then over TCP if the answer was truncated.
func (f *Forwarder) try(ctx context.Context, q *dns.Msg, upstream string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, f.tryTimeout)
	defer cancel()
	resp, err := exchange(ctx, "udp", q, upstream)
	if err == nil && resp.Truncated {
		resp, err = exchange(ctx, "tcp", q, upstream)
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, q.Question[0].Name) ||
		resp.Question[0].Qtype != q.Question[0].Qtype {
		return nil, fmt.Errorf("%s: answer is for another question", upstream)
	}
	return resp, nil
}

// exchange is one query on one fresh connection. miekg/dns honours a
// context's deadline but not its cancellation, so the connection is closed
// when ctx ends.
func exchange(ctx context.Context, network string, q *dns.Msg, upstream string) (*dns.Msg, error) {
	// try always sets a deadline on ctx; Timeout only lifts the client's own
	// 2 s defaults out of its way.
	c := &dns.Client{Net: network, UDPSize: UpstreamUDPSize, Timeout: time.Hour}
	conn, err := c.DialContext(ctx, upstream)
	if err != nil {
		return nil, fmt.Errorf("%s over %s: %w", upstream, network, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, q, conn)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("%s over %s: %w", upstream, network, err)
	}
	return resp, nil
}
