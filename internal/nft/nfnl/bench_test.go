package nfnl_test

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
)

// BenchmarkSync times the proxy's syncs committed by nft (one `nft -f -`)
// and over netlink, in test namespaces: full syncs of 1,000 and 10,000
// Services (the table already holds them: the periodic resync, a restart),
// the first sync into a missing table (cold: a node's first start) at
// 1,000, 5,000 and 10,000, and a partial sync of one changed endpoint
// among 10,000. The Services are hack/bench-proxy.sh's: ClusterIP, one TCP
// port, three endpoints; "10000x10" has ten each, as make bench-scale's
// full size. Render time is included in both (the same for each).
//
//	sudo go test -run '^$' -bench Sync -benchtime 3x -timeout 60m ./internal/nft/nfnl/
func BenchmarkSync(b *testing.B) {
	requireNFT(b)
	ctx := context.Background()
	backends := func(b *testing.B) map[string]*nftables.Backend {
		p := newPair(b, knftables.IPv4Family)
		p.exec.Timeout = 30 * time.Minute // the kernel's commit grows faster than N
		cfg := nftables.Config{Family: knftables.IPv4Family, Table: p.table, NodeName: testNode,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
		return map[string]*nftables.Backend{"nft": nftables.NewBackend(p.exec, cfg), "netlink": nftables.NewBackend(p.nl, cfg)}
	}
	for _, size := range []struct{ n, k int }{{1000, 3}, {10000, 3}, {10000, 10}} {
		svcs, name := benchServicesOf(size.n, size.k), sizeName(size.n, size.k)
		for _, kind := range []string{"nft", "netlink"} {
			b.Run(fmt.Sprintf("full/%s/%s", name, kind), func(b *testing.B) {
				be := backends(b)[kind]
				res, err := be.Sync(ctx, svcs, nil, true)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(res.Operations), "ops/sync")
				b.ResetTimer()
				for range b.N {
					if _, err := be.Sync(ctx, svcs, nil, true); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	// cold: the first sync into a table that does not exist yet (a node's
	// first start), each iteration in fresh namespaces.
	for _, size := range []struct{ n, k int }{{1000, 3}, {5000, 3}, {10000, 3}, {10000, 10}} {
		svcs, name := benchServicesOf(size.n, size.k), sizeName(size.n, size.k)
		for _, kind := range []string{"nft", "netlink"} {
			b.Run(fmt.Sprintf("cold/%s/%s", name, kind), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					be := backends(b)[kind]
					b.StartTimer()
					if _, err := be.Sync(ctx, svcs, nil, true); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	const n = 10000
	svcs := benchServices(n)
	for _, kind := range []string{"nft", "netlink"} {
		b.Run(fmt.Sprintf("partial/%d/%s", n, kind), func(b *testing.B) {
			be := backends(b)[kind]
			if _, err := be.Sync(ctx, svcs, nil, true); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				// One endpoint of one Service moves.
				s := *svcs[i%n]
				s.Ports = append([]proxy.ServicePort(nil), s.Ports...)
				eps := append([]proxy.Endpoint(nil), s.Ports[0].Endpoints...)
				if len(eps) > 0 {
					eps[0].Port += uint16(1 + i)
				}
				s.Ports[0].Endpoints = eps
				svcs[i%n] = &s
				if _, err := be.Sync(ctx, svcs, proxy.Changes{s.Key(): &s}, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChurnSync is one partial sync of make bench-scale's churn
// phase at its full size: 10,000 Services of ten endpoints, and in each
// sync 20 pods replaced (20 pods/s, one sync a second), each its
// Service's endpoint at a new address.
//
//	sudo go test -run '^$' -bench ChurnSync -benchtime 20x ./internal/nft/nfnl/
func BenchmarkChurnSync(b *testing.B) {
	requireNFT(b)
	ctx := context.Background()
	const n, k, perSync = 10000, 10, 20
	svcs, be := churnBackend(b, n, k)
	b.ResetTimer()
	for i := range b.N {
		changed := proxy.Changes{}
		for j := range perSync {
			x := (i*perSync + j) * 7919 % n // spread over the Services
			s := *svcs[x]
			s.Ports = append([]proxy.ServicePort(nil), s.Ports...)
			eps := append([]proxy.Endpoint(nil), s.Ports[0].Endpoints...)
			// The oldest endpoint goes, a new one (a new address in
			// 10.247/16, out of the other Services' way) comes last.
			seq := i*perSync + j
			eps = append(eps[1:], proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 247, byte(seq >> 8), byte(seq)}),
				Port: 8080, Ready: true, Serving: true, NodeName: "node-b"})
			s.Ports[0].Endpoints = eps
			svcs[x] = &s
			changed[s.Key()] = &s
		}
		if _, err := be.Sync(ctx, svcs, changed, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChurnSyncReplaced is that churn as bench-scale's pods really
// make it: a pod's endpoint leaves in one sync and its replacement joins
// in a later one, so every changed Service's endpoint count moves (10 ->
// 9 -> 10) and its dispatch rule ("numgen random mod N") is rewritten. A
// new rule with a dnat, meta or lookup expression makes the kernel
// validate the whole table at commit (nf_tables_validate: every base
// chain, every element of the service-ips verdict map, every Service
// chain), so the sync costs O(all Services), not O(changes), however few
// rules it touches. 20 Services change per sync: ten lose an endpoint,
// ten get one back. With hold=10s (the agent's --proxy-modulus-hold) the
// dispatch rules keep their modulus through the replacement, so the
// transactions change map elements only.
//
//	sudo go test -run '^$' -bench ChurnSyncReplaced -benchtime 200x ./internal/nft/nfnl/
func BenchmarkChurnSyncReplaced(b *testing.B) {
	requireNFT(b)
	for _, n := range []int{1000, 10000} {
		for _, hold := range []time.Duration{0, nftables.DefaultModulusHold} {
			b.Run(fmt.Sprintf("%s/hold=%s", sizeName(n, 10), hold), func(b *testing.B) { benchmarkChurnReplaced(b, n, hold) })
		}
	}
}

func benchmarkChurnReplaced(b *testing.B, n int, hold time.Duration) {
	ctx := context.Background()
	const k, perSync = 10, 20
	svcs, be := churnBackendHeld(b, n, k, hold)
	var short []int // the Services that lost an endpoint, oldest first
	next, ops := 0, 0
	b.ResetTimer()
	for i := range b.N {
		changed := proxy.Changes{}
		back := len(short) // only those that lost one in an earlier sync
		for j := range perSync {
			seq := i*perSync + j
			var x int
			if j%2 == 1 && back > 0 {
				x, short, back = short[0], short[1:], back-1
			} else {
				x = next * 7919 % n // spread over the Services
				next++
			}
			s := *svcs[x]
			s.Ports = append([]proxy.ServicePort(nil), s.Ports...)
			eps := s.Ports[0].Endpoints
			if len(eps) == k {
				eps = append([]proxy.Endpoint(nil), eps[1:]...)
				short = append(short, x)
			} else {
				// The replacement, at a new address in 10.247/16.
				eps = append(append([]proxy.Endpoint(nil), eps...), proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 247, byte(seq >> 8), byte(seq)}),
					Port: 8080, Ready: true, Serving: true, NodeName: "node-b"})
			}
			s.Ports[0].Endpoints = eps
			svcs[x] = &s
			changed[s.Key()] = &s
		}
		res, err := be.Sync(ctx, svcs, changed, false)
		if err != nil {
			b.Fatal(err)
		}
		ops += res.Operations
	}
	b.ReportMetric(float64(ops)/float64(b.N), "ops/sync")
}

// churnBackend is a netlink backend in a test namespace that has synced
// n Services of k endpoints each, and those Services.
func churnBackend(b *testing.B, n, k int) ([]*proxy.Service, *nftables.Backend) {
	return churnBackendHeld(b, n, k, 0)
}

// churnBackendHeld is churnBackend with the renderer's ModulusHold.
func churnBackendHeld(b *testing.B, n, k int, hold time.Duration) ([]*proxy.Service, *nftables.Backend) {
	svcs := benchServicesOf(n, k)
	p := newPair(b, knftables.IPv4Family)
	cfg := nftables.Config{Family: knftables.IPv4Family, Table: p.table, NodeName: testNode,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, ModulusHold: hold}
	be := nftables.NewBackend(p.nl, cfg)
	if _, err := be.Sync(context.Background(), svcs, nil, true); err != nil {
		b.Fatal(err)
	}
	return svcs, be
}

// benchServices are n ClusterIP Services of one TCP port with three
// endpoints each, as hack/bench-proxy.sh creates them.
func benchServices(n int) []*proxy.Service { return benchServicesOf(n, 3) }

// sizeName is n, or NxK when the Services have other than three endpoints.
func sizeName(n, k int) string {
	if k == 3 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%dx%d", n, k)
}

// benchServicesOf are n such Services with k endpoints each (k ≤ 16).
func benchServicesOf(n, k int) []*proxy.Service {
	out := make([]*proxy.Service, n)
	for i := range out {
		var eps []proxy.Endpoint
		for j := range k {
			eps = append(eps, proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, byte(244 + i>>12), byte(i >> 4), byte(i&15<<4 | j)}),
				Port: 8080, Ready: true, Serving: true, NodeName: "node-b"})
		}
		out[i] = &proxy.Service{Namespace: "bench", Name: fmt.Sprintf("svc%d", i), Type: proxy.ClusterIP,
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Ports:     []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, Endpoints: eps}}}
	}
	return out
}

// BenchmarkProbe times a STATUS probe of nftables in a test namespace:
// nft.Runner's (`nft --version`, then an `nft --check` transaction, which
// the kernel aborts) against the netlink runner's (open the socket, one
// GETGEN), as a CNI plugin process does each one once.
//
//	sudo go test -run '^$' -bench Probe ./internal/nft/nfnl/
func BenchmarkProbe(b *testing.B) {
	requireNFT(b)
	ctx := context.Background()
	p := newPair(b, knftables.InetFamily)
	b.Run("nft", func(b *testing.B) {
		for range b.N {
			if err := netns.Do(p.nsExec, func() error { return p.exec.Runner.Probe(ctx) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("netlink", func(b *testing.B) {
		for range b.N {
			r := nfnl.New(knftables.InetFamily, p.table, nfnl.Options{NetNS: p.nsNL})
			if err := r.Probe(ctx); err != nil {
				b.Fatal(err)
			}
			_ = r.Close()
		}
	})
}
