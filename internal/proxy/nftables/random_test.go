package nftables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy"
)

// randomService is service i in one of many shapes: every type, one to
// three ports of each protocol, affinity, both traffic policies, external
// and load-balancer IPs (some shared, so services conflict), source
// ranges, endpoints ready, terminating, on this node or others, IPv6 ones
// mixed in, a few ports with tens of them.
func randomService(rng *rand.Rand, i int, conflicts bool) *proxy.Service {
	// Without conflicts every address:port and NodePort is the service's own.
	shared := func(n int) byte {
		if conflicts {
			return byte(rng.IntN(n))
		}
		return byte(i)
	}
	s := &proxy.Service{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i), Type: proxy.ClusterIP,
		ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})}
	switch rng.IntN(4) {
	case 1:
		s.Type = proxy.NodePort
	case 2:
		s.Type = proxy.LoadBalancer
		s.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 250, 0, shared(20)})}
		if rng.IntN(3) == 0 {
			s.Firewall = true
			if rng.IntN(2) == 0 {
				s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}
			}
		}
	}
	if rng.IntN(5) == 0 {
		s.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{172, 29, 0, shared(10)})}
	}
	if rng.IntN(4) == 0 {
		s.AffinityTimeout = time.Duration(60+rng.IntN(2)*60) * time.Second
	}
	s.ExternalLocal, s.InternalLocal = rng.IntN(3) == 0, rng.IntN(5) == 0
	protos := []proxy.Protocol{proxy.TCP, proxy.UDP, proxy.SCTP}
	for p := range 1 + rng.IntN(3) {
		sp := proxy.ServicePort{Name: fmt.Sprintf("p%d", p), Protocol: protos[rng.IntN(3)], Port: uint16(80 + p)}
		if s.Type != proxy.ClusterIP {
			sp.NodePort = uint16(30000 + 3*i + p)
			if conflicts {
				sp.NodePort = uint16(30000 + rng.IntN(200))
			}
		}
		neps := rng.IntN(5)
		if rng.IntN(8) == 0 {
			neps = rng.IntN(60)
		}
		for e := range neps {
			ip := netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(4)), byte(1 + rng.IntN(200))})
			if rng.IntN(15) == 0 {
				ip = netip.MustParseAddr(fmt.Sprintf("fd00::%d", 1+e))
			}
			ep := proxy.Endpoint{IP: ip, Port: uint16(8080 + rng.IntN(2)), Ready: rng.IntN(5) != 0, NodeName: []string{node, "node-b", "node-c"}[rng.IntN(3)]}
			if !ep.Ready {
				ep.Terminating, ep.Serving = true, rng.IntN(2) == 0
			} else {
				ep.Serving = true
			}
			if !slices.ContainsFunc(sp.Endpoints, func(x proxy.Endpoint) bool { return x.IP == ep.IP && x.Port == ep.Port }) {
				sp.Endpoints = append(sp.Endpoints, ep)
			}
		}
		s.Ports = append(s.Ports, sp)
	}
	return s
}

// churnEndpoints is s with one to three endpoints of one port removed,
// added anywhere in the list, or flipped between ready and terminating.
func churnEndpoints(rng *rand.Rand, s *proxy.Service) *proxy.Service {
	c := *s
	c.Ports = slices.Clone(s.Ports)
	sp := &c.Ports[rng.IntN(len(c.Ports))]
	eps := slices.Clone(sp.Endpoints)
	for range 1 + rng.IntN(3) {
		switch k := rng.IntN(3); {
		case k == 0 && len(eps) > 0:
			j := rng.IntN(len(eps))
			eps = slices.Delete(eps, j, j+1)
		case k == 1 && len(eps) > 0:
			e := &eps[rng.IntN(len(eps))]
			e.Ready = !e.Ready
			e.Serving, e.Terminating = true, !e.Ready
		default:
			e := proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 245, byte(rng.IntN(4)), byte(1 + rng.IntN(200))}), Port: 8080,
				Ready: true, Serving: true, NodeName: []string{node, "node-b"}[rng.IntN(2)]}
			if !slices.ContainsFunc(eps, func(x proxy.Endpoint) bool { return x.IP == e.IP && x.Port == e.Port }) {
				eps = slices.Insert(eps, rng.IntN(len(eps)+1), e)
			}
		}
	}
	sp.Endpoints = eps
	return &c
}

// requirePicksInTable fails t unless every pick st remembers is in fake
// as it says: keys off..off+N-1 of its map hold values of its sums, in
// that order, the rest of its range is empty, and its chain's numgen
// reads "mod N offset off" of that map.
// requireFewCopies fails when a held pick gives an endpoint more than
// twice its share: a key beyond the endpoint's own and one copy.
func requireFewCopies(t *testing.T, st *State) {
	t.Helper()
	for key, o := range st.services {
		for _, c := range o.chains {
			keys := map[uint64]int{}
			for _, s := range c.sums {
				if keys[s]++; keys[s] > 2 {
					t.Fatalf("%s: chain %s holds a value in %d of its %d keys", key, c.name, keys[s], len(c.sums))
				}
			}
		}
	}
}

func requirePicksInTable(t *testing.T, fake *knftables.Fake, st *State) {
	t.Helper()
	maps := map[string]map[string]string{}
	for key, o := range st.services {
		for _, c := range o.chains {
			if c.m == "" {
				continue
			}
			if maps[c.m] == nil {
				elems, err := fake.ListElements(context.Background(), "map", c.m)
				if err != nil {
					t.Fatal(err)
				}
				maps[c.m] = map[string]string{}
				for _, e := range elems {
					maps[c.m][strings.Join(e.Key, " . ")] = strings.Join(e.Value, " . ")
				}
			}
			for i := range c.keys.size {
				k := c.keys.off + i
				v, ok := maps[c.m][fmt.Sprint(k)]
				switch {
				case int(i) < len(c.sums) && (!ok || valueSum(v) != c.sums[i]):
					t.Fatalf("%s: %s key %d is %q, not the value the state has", key, c.m, k, v)
				case int(i) >= len(c.sums) && ok:
					t.Fatalf("%s: %s key %d beyond its %d endpoints is %q", key, c.m, k, len(c.sums), v)
				}
			}
			numgen := fmt.Sprintf("numgen random mod %d offset %d ", len(c.sums), c.keys.off)
			ch := fake.Table.Chains[c.name]
			if ch == nil || !slices.ContainsFunc(ch.Rules, func(r *knftables.Rule) bool {
				return strings.Contains(r.Rule, numgen) && strings.HasSuffix(r.Rule, "@"+c.m)
			}) {
				t.Fatalf("%s: chain %s does not pick with %q@%s", key, c.name, numgen, c.m)
			}
		}
	}
}

// TestRandomSyncs runs many random partial syncs, with a full sync now
// and then, on knftables' fake: every transaction applies, and after each
// the table equals a full sync of the same services from scratch (unless
// services conflict: then a partial sync leaves a key with its first
// owner, as documented, and only the transactions are checked).
// FLATNET_TX_DUMP=FILE writes every transaction (to compare renderers).
func TestRandomSyncs(t *testing.T) {
	var dump strings.Builder
	for _, conflicts := range []bool{false, true} {
		t.Run(fmt.Sprintf("conflicts=%v", conflicts), func(t *testing.T) { randomSyncs(t, conflicts, false, &dump) })
	}
	// With ModulusHold the table equals a full sync's up to the copies a
	// held modulus adds (each dispatch's distinct endpoints compared).
	t.Run("modulusHold", func(t *testing.T) { randomSyncs(t, false, true, &dump) })
	if p := os.Getenv("FLATNET_TX_DUMP"); p != "" {
		if err := os.WriteFile(p, []byte(dump.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func randomSyncs(t *testing.T, conflicts, hold bool, dump *strings.Builder) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 60
	services := make([]*proxy.Service, n)
	for i := range services {
		services[i] = randomService(rng, i, conflicts)
	}
	cfg := testConfig()
	now := time.Unix(1_800_000_000, 0)
	if hold {
		// A step is a second: holds come due every few steps.
		cfg.ModulusHold, cfg.Now = 5*time.Second, func() time.Time { return now }
	}
	same := func(s string) string { return s }
	if hold {
		same = distinct
	}
	r := New(cfg)
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	run := func(step int, tx *knftables.Transaction) {
		t.Helper()
		dump.WriteString(tx.String())
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatalf("step %d: %v\n%s", step, err, tx)
		}
	}
	tx := fake.NewTransaction()
	st := r.Full(tx, services, nil, nil)
	run(0, tx)
	heldSteps := 0
	defer func() {
		if hold && heldSteps == 0 {
			t.Errorf("no step held a modulus")
		}
		if hold {
			t.Logf("%d of 200 steps left a modulus held", heldSteps)
		}
	}()
	for step := 1; step <= 200; step++ {
		now = now.Add(time.Second)
		changed := map[string]bool{}
		for range 1 + rng.IntN(4) {
			i := rng.IntN(n)
			changed[fmt.Sprintf("ns/svc-%d", i)] = true
			switch rng.IntN(6) {
			case 0:
				services[i] = nil // deleted
			case 1:
				if services[i] != nil {
					services[i] = churnEndpoints(rng, services[i])
				}
			case 2:
				if services[i] != nil {
					s := *services[i]
					s.Ports = slices.Clone(s.Ports)
					s.Ports[0].Endpoints = slices.Clone(s.Ports[0].Endpoints)
					if len(s.Ports[0].Endpoints) > 0 {
						s.Ports[0].Endpoints = s.Ports[0].Endpoints[1:]
					}
					services[i] = &s
				}
			default:
				services[i] = randomService(rng, i, conflicts)
			}
		}
		var current []*proxy.Service
		for _, s := range services {
			if s != nil {
				current = append(current, s)
			}
		}
		tx := fake.NewTransaction()
		if step%25 == 0 {
			prev := st
			if step%50 == 0 {
				prev = nil // a restart
			}
			chains, _ := fake.List(context.Background(), "chains")
			sets, _ := fake.List(context.Background(), "sets")
			maps, _ := fake.List(context.Background(), "maps")
			st = r.Full(tx, current, prev, &Existing{Chains: chains, Sets: sets, Maps: maps})
		} else {
			st = r.partial(tx, st, st.WithHoldsDue(current, proxy.ChangesOf(current, changed), cfg.ModulusHold, now))
		}
		run(step, tx)
		if len(st.held) > 0 {
			heldSteps++
		}
		if hold {
			requireFewCopies(t, st)
		}
		requirePicksInTable(t, fake, st)
		if conflicts {
			continue
		}
		want := knftables.NewFake(knftables.IPv4Family, DefaultTable)
		wtx := want.NewTransaction()
		New(testConfig()).Full(wtx, current, nil, nil)
		if err := want.Run(context.Background(), wtx); err != nil {
			t.Fatalf("step %d: full sync from scratch: %v", step, err)
		}
		if diff := cmp.Diff(same(sortedDump(want)), same(sortedDump(fake))); diff != "" {
			t.Fatalf("step %d: table differs from a full sync (-full +synced):\n%s", step, diff)
		}
	}
}
