package userspace

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// pool is one service port's picking state, kept across syncs: the
// targets snapshot, the round-robin counter and the ClientIP affinity
// table. A sync swaps the snapshot in place, so listeners and established
// connections never notice an endpoint change.
type pool struct {
	t   atomic.Pointer[targets]
	rr  atomic.Uint64
	now func() time.Time

	mu  sync.Mutex // protects aff
	aff map[netip.Addr]sticky
}

// sticky is one client's affinity: its endpoint and when it last used it.
type sticky struct {
	ep   netip.AddrPort
	last time.Time
}

func newPool(t *targets, now func() time.Time) *pool {
	p := &pool{now: now, aff: map[netip.Addr]sticky{}}
	p.t.Store(t)
	return p
}

// candidates returns, in the order to try them, at most max endpoints for
// a new connection (or UDP session) of client on a frontend of kind k;
// nil means the client is refused: the load-balancer firewall, or no
// endpoint for its kind of traffic. The first is the client's affinity
// endpoint while that is fresh and usable, else the next in round robin;
// the rest follow in round-robin order, for fail-over.
func (p *pool) candidates(client netip.Addr, k kind, clusterCIDRs []netip.Prefix, max int) []netip.AddrPort {
	t := p.t.Load()
	eps := t.Internal
	if k != kindClusterIP {
		if k == kindLoadBalancer && t.Firewall && !inAny(t.SourceRanges, client) {
			return nil
		}
		// Pods keep the internal endpoints on an external address with
		// policy Local, as the kernel modes short-circuit them.
		if !t.ExternalLocal || len(t.Internal) == 0 || !inAny(clusterCIDRs, client) {
			eps = t.External
		}
	}
	n := len(eps)
	if n == 0 {
		return nil
	}
	start := -1
	if t.Affinity > 0 {
		p.mu.Lock()
		s, ok := p.aff[client]
		p.mu.Unlock()
		if ok && p.now().Sub(s.last) < t.Affinity {
			start = slices.Index(eps, s.ep)
		}
	}
	if start < 0 {
		start = int((p.rr.Add(1) - 1) % uint64(n))
	}
	max = min(max, n)
	out := make([]netip.AddrPort, max)
	for i := range out {
		out[i] = eps[(start+i)%n]
	}
	return out
}

// connected records that client reached ep, for session affinity.
func (p *pool) connected(client netip.Addr, ep netip.AddrPort) {
	if p.t.Load().Affinity <= 0 {
		return
	}
	p.mu.Lock()
	p.aff[client] = sticky{ep: ep, last: p.now()}
	p.mu.Unlock()
}

// sweep forgets expired affinities (and all of them once affinity is off).
func (p *pool) sweep() {
	timeout := p.t.Load().Affinity
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, s := range p.aff {
		if now.Sub(s.last) >= timeout {
			delete(p.aff, c)
		}
	}
}

// has reports whether ep is still one of the pool's endpoints.
func (p *pool) has(ep netip.AddrPort) bool {
	t := p.t.Load()
	return slices.Contains(t.Internal, ep) || slices.Contains(t.External, ep)
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
