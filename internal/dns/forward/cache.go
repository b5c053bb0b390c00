package forward

import (
	"container/list"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Cache bounds and TTL caps.
const (
	DefaultCacheEntries = 10000
	// MaxPositiveTTL caps how long an answer is kept (CoreDNS's cache uses 3600 s too).
	MaxPositiveTTL = 3600 * time.Second
	// MaxNegativeTTL caps NXDOMAIN/NODATA, RFC 2308 section 5 suggests 1-3 hours;
	// CoreDNS's cache uses 1800 s.
	MaxNegativeTTL = 1800 * time.Second
)

// cacheKey is what makes two questions share an answer. The DO and CD bits
// change what an upstream returns (signatures, unvalidated data), so they are
// part of the key.
type cacheKey struct {
	name          string // lowercased
	qtype, qclass uint16
	do, cd        bool
}

func keyOf(m *dns.Msg) (cacheKey, bool) {
	if len(m.Question) != 1 {
		return cacheKey{}, false
	}
	q := m.Question[0]
	k := cacheKey{name: strings.ToLower(dns.Fqdn(q.Name)), qtype: q.Qtype, qclass: q.Qclass, cd: m.CheckingDisabled}
	if o := m.IsEdns0(); o != nil {
		k.do = o.Do()
	}
	return k, true
}

type cacheEntry struct {
	key    cacheKey
	msg    *dns.Msg // stored without OPT; never handed out, only copies
	stored time.Time
	expiry time.Time
}

// Cache is a positive and negative answer cache bounded in entries, evicting
// the least recently used entry. An LRU (one mutex, a list and a map) rather
// than CoreDNS's sharded random-eviction cache: simpler to reason about and
// test, and the lock is held only for a map lookup and a list move; shard it if
// profiles ever show contention.
type Cache struct {
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[cacheKey]*list.Element
	lru     *list.List // front = most recently used

	hits, misses, evictions atomic.Uint64
}

// NewCache returns a cache holding at most maxEntries answers (0 means
// DefaultCacheEntries). now is the clock; nil means time.Now.
func NewCache(maxEntries int, now func() time.Time) *Cache {
	if maxEntries <= 0 {
		maxEntries = DefaultCacheEntries
	}
	if now == nil {
		now = time.Now
	}
	return &Cache{max: maxEntries, now: now, entries: map[cacheKey]*list.Element{}, lru: list.New()}
}

// Len is the number of entries held, expired ones included until touched.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Get returns a copy of the cached answer to req with the client's ID and
// question, and every TTL lowered by the entry's age (and never above what is
// left of the entry's lifetime), or nil.
func (c *Cache) Get(req *dns.Msg) *dns.Msg {
	k, ok := keyOf(req)
	if !ok {
		return nil
	}
	now := c.now()
	c.mu.Lock()
	el, ok := c.entries[k]
	if ok && !now.Before(el.Value.(*cacheEntry).expiry) {
		c.removeLocked(el)
		ok = false
	}
	if !ok {
		c.mu.Unlock()
		c.misses.Add(1)
		return nil
	}
	c.lru.MoveToFront(el)
	e := el.Value.(*cacheEntry)
	c.mu.Unlock()
	c.hits.Add(1)

	age := uint32(now.Sub(e.stored) / time.Second)
	left := uint32((e.expiry.Sub(now) + time.Second - 1) / time.Second) // round up: an unexpired entry never serves 0
	m := e.msg.Copy()
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			ttl := uint32(0)
			if h.Ttl > age {
				ttl = h.Ttl - age
			}
			h.Ttl = min(ttl, left)
		}
	}
	m.Id = req.Id
	m.Question = append([]dns.Question(nil), req.Question...)
	return m
}

// Set stores resp as the answer to req if it is cacheable: NOERROR with
// answers for min(RR TTL) capped at MaxPositiveTTL; NXDOMAIN or NODATA with an
// SOA in the authority section for min(SOA TTL, SOA MINIMUM) capped at
// MaxNegativeTTL (RFC 2308 section 5). Not cached: SERVFAIL (an upstream
// hiccup must not stick for minutes; the next query retries), REFUSED and
// other errors, truncated answers, negative answers without an SOA (RFC 2308
// says they SHOULD NOT be), and anything with a TTL of 0.
func (c *Cache) Set(req, resp *dns.Msg) bool {
	k, ok := keyOf(req)
	if !ok || resp == nil || resp.Truncated {
		return false
	}
	ttl, ok := cacheTTL(resp)
	if !ok || ttl <= 0 {
		return false
	}
	m := resp.Copy()
	stripOPT(m)
	now := c.now()
	e := &cacheEntry{key: k, msg: m, stored: now, expiry: now.Add(ttl)}

	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		el.Value = e
		c.lru.MoveToFront(el)
		return true
	}
	c.entries[k] = c.lru.PushFront(e)
	for c.lru.Len() > c.max {
		c.removeLocked(c.lru.Back())
		c.evictions.Add(1)
	}
	return true
}

func (c *Cache) removeLocked(el *list.Element) {
	c.lru.Remove(el)
	delete(c.entries, el.Value.(*cacheEntry).key)
}

// cacheTTL is how long resp may be cached, and whether it may be at all.
func cacheTTL(resp *dns.Msg) (time.Duration, bool) {
	switch {
	case resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0:
		ttl := uint32(MaxPositiveTTL / time.Second)
		for _, sec := range [][]dns.RR{resp.Answer, resp.Ns, resp.Extra} {
			for _, rr := range sec {
				if rr.Header().Rrtype == dns.TypeOPT {
					continue
				}
				ttl = min(ttl, rr.Header().Ttl)
			}
		}
		return time.Duration(ttl) * time.Second, true
	case resp.Rcode == dns.RcodeNameError || resp.Rcode == dns.RcodeSuccess:
		for _, rr := range resp.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl := min(soa.Hdr.Ttl, soa.Minttl, uint32(MaxNegativeTTL/time.Second))
				return time.Duration(ttl) * time.Second, true
			}
		}
		return 0, false
	default:
		return 0, false
	}
}

// stripOPT removes OPT records from every section of m: EDNS0 towards the
// client is the server's job, and an OPT misplaced in the answer or authority
// section by a broken upstream would otherwise get its flags "decremented"
// as a TTL (found by FuzzCache).
func stripOPT(m *dns.Msg) {
	m.Answer, m.Ns, m.Extra = withoutOPT(m.Answer), withoutOPT(m.Ns), withoutOPT(m.Extra)
}

func withoutOPT(rrs []dns.RR) []dns.RR {
	out := rrs[:0]
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}
