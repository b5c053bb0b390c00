package nfnl_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/testutil"
)

// execNFT is nft.Runner bound to a test namespace (the exec'd nft
// inherits the locked thread's namespace).
type execNFT struct {
	*nft.Runner
	ns string
}

func (n execNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return netns.Do(n.ns, func() error { return n.Runner.Run(ctx, tx) })
}

func (n execNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.ListAll(ctx)
		return err
	})
	return out, err
}

func (n execNFT) ListTable(ctx context.Context) (out *nft.Table, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.ListTable(ctx)
		return err
	})
	return out, err
}

func (n execNFT) List(ctx context.Context, typ string) (out []string, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.List(ctx, typ)
		return err
	})
	return out, err
}

func (n execNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.ListRules(ctx, chain)
		return err
	})
	return out, err
}

func (n execNFT) ListElements(ctx context.Context, typ, name string) (out []*knftables.Element, err error) {
	err = netns.Do(n.ns, func() error {
		out, err = n.Runner.ListElements(ctx, typ, name)
		return err
	})
	return out, err
}

func requireNFT(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
}

// pair is one table programmed by nft in one namespace and by the netlink
// runner in another.
type pair struct {
	fam          knftables.Family
	table        string
	nsExec, nsNL string
	exec         execNFT
	nl           *nfnl.Runner
}

func newPair(t testing.TB, fam knftables.Family) *pair {
	p := &pair{fam: fam, table: testutil.Name("fntnl"), nsExec: testutil.NewNetNS(t), nsNL: testutil.NewNetNS(t)}
	r, err := nft.New(fam, p.table)
	if err != nil {
		t.Fatal(err)
	}
	p.exec = execNFT{Runner: r, ns: p.nsExec}
	p.nl = nfnl.New(fam, p.table, nfnl.Options{NetNS: p.nsNL})
	t.Cleanup(func() { _ = p.nl.Close() })
	return p
}

var handles = regexp.MustCompile(` # handle \d+`)

// list is `nft list table` in ns ("" when the table is missing).
func list(t testing.TB, ns string, fam knftables.Family, table string) string {
	t.Helper()
	out := testutil.RunIn(t, ns, "sh", "-c", "nft list table "+string(fam)+" "+table+" 2>/dev/null || true")
	return handles.ReplaceAllString(out, "")
}

func (p *pair) requireSame(t *testing.T, step string) {
	t.Helper()
	a, b := list(t, p.nsExec, p.fam, p.table), list(t, p.nsNL, p.fam, p.table)
	if a != b {
		t.Fatalf("%s: nft list differs (-nft +netlink):\n%s", step, cmp.Diff(strings.Split(a, "\n"), strings.Split(b, "\n")))
	}
	ctx := context.Background()
	la, err := p.exec.ListAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := p.nl.ListAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(la, lb, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("%s: ListAll differs (-nft +netlink):\n%s", step, d)
	}
	t.Logf("%s: %d lines, identical", step, strings.Count(a, "\n"))
}

// TestRootSameTable renders a few hundred Services of every feature with
// the proxy's renderer and has nft and the netlink runner commit the same
// transactions (a full sync, a partial sync, a full sync after a restart
// that deletes what is gone) in two namespaces: `nft list table` must be
// identical after each.
func TestRootSameTable(t *testing.T) {
	requireNFT(t)
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		t.Run(string(fam), func(t *testing.T) {
			p := newPair(t, fam)
			ctx := context.Background()
			v6 := fam == knftables.IPv6Family
			cfg := renderConfig(fam, p.table)
			bExec, bNL := nftables.NewBackend(p.exec, cfg), nftables.NewBackend(p.nl, cfg)
			sync := func(step string, b *nftables.Backend, svcs []*proxy.Service, changed map[string]bool, full bool) {
				t.Helper()
				if _, err := b.Sync(ctx, svcs, proxy.ChangesOf(svcs, changed), full); err != nil {
					t.Fatalf("%s: %v", step, err)
				}
			}
			all := services(300, v6, 0)
			for _, b := range []*nftables.Backend{bExec, bNL} {
				sync("full", b, all, nil, true)
			}
			p.requireSame(t, "full sync")

			// Partial: new endpoints for some, some deleted, some added,
			// affinity timeouts changed.
			next := services(320, v6, 1)
			changed := map[string]bool{}
			var kept []*proxy.Service
			for i, s := range next {
				switch {
				case i%10 == 0 || i >= 300:
					changed[s.Key()] = true
					kept = append(kept, s)
				case i%23 == 1:
					changed[s.Key()] = true // deleted
				default:
					kept = append(kept, all[i])
				}
			}
			for _, b := range []*nftables.Backend{bExec, bNL} {
				sync("partial", b, kept, changed, false)
			}
			p.requireSame(t, "partial sync")

			// A restart with fewer Services: the full sync finds stale
			// chains and sets in the table and deletes them.
			bExec, bNL = nftables.NewBackend(p.exec, cfg), nftables.NewBackend(p.nl, cfg)
			fewer := services(150, v6, 2)
			for _, b := range []*nftables.Backend{bExec, bNL} {
				sync("restart", b, fewer, nil, true)
			}
			p.requireSame(t, "full sync after restart")
		})
	}
}

// TestRootObjects covers what the proxy's renderer does not write:
// comments on tables, chains, rules, sets and elements, create vs add,
// chain policies and deletes of elements, sets, chains and the table.
func TestRootObjects(t *testing.T) {
	requireNFT(t)
	p := newPair(t, knftables.IPv4Family)
	ctx := context.Background()
	steps := []func(tx *knftables.Transaction){
		func(tx *knftables.Transaction) {
			tx.Add(&knftables.Table{Comment: knftables.PtrTo("a table")})
			tx.Add(&knftables.Chain{Name: "in", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.InputHook),
				Priority: knftables.PtrTo(knftables.FilterPriority), Policy: knftables.PtrTo(knftables.AcceptPolicy), Comment: knftables.PtrTo("base chain")})
			tx.Add(&knftables.Chain{Name: "c", Comment: knftables.PtrTo("regular chain")})
			tx.Create(&knftables.Chain{Name: "d"})
			tx.Add(&knftables.Set{Name: "s", Type: "ipv4_addr . inet_service", Comment: knftables.PtrTo("a set")})
			tx.Add(&knftables.Map{Name: "m", Type: "inet_proto . inet_service : verdict", Comment: knftables.PtrTo("a map")})
			tx.Add(&knftables.Element{Set: "s", Key: []string{"10.1.2.3", "80"}, Comment: knftables.PtrTo("an element")})
			tx.Add(&knftables.Element{Set: "s", Key: []string{"10.1.2.4", "443"}})
			tx.Add(&knftables.Element{Map: "m", Key: []string{"tcp", "80"}, Value: []string{"jump c"}, Comment: knftables.PtrTo("to c")})
			tx.Add(&knftables.Element{Map: "m", Key: []string{"udp", "53"}, Value: []string{"accept"}})
			tx.Add(&knftables.Rule{Chain: "in", Rule: "meta l4proto . th dport vmap @m", Comment: knftables.PtrTo("a rule")})
			tx.Add(&knftables.Rule{Chain: "in", Rule: "ip saddr . th dport @s counter drop"})
			tx.Add(&knftables.Rule{Chain: "c", Rule: "ip daddr 10.9.0.0/20 ip saddr != 10.0.0.1 mark set 0x10 return"})
			tx.Add(&knftables.Rule{Chain: "c", Rule: "ct state established,related accept"})
			tx.Add(&knftables.Rule{Chain: "c", Rule: "mark set mark and 0xff00 reject with icmp type host-unreachable"})
		},
		func(tx *knftables.Transaction) {
			tx.Add(&knftables.Table{Comment: knftables.PtrTo("a table")}) // idempotent add
			tx.Add(&knftables.Chain{Name: "c", Comment: knftables.PtrTo("regular chain")})
			tx.Delete(&knftables.Element{Set: "s", Key: []string{"10.1.2.4", "443"}})
			tx.Delete(&knftables.Element{Map: "m", Key: []string{"udp", "53"}})
			tx.Flush(&knftables.Chain{Name: "in"})
			tx.Delete(&knftables.Set{Name: "s"})
			tx.Delete(&knftables.Chain{Name: "d"})
		},
	}
	for i, step := range steps {
		for _, r := range []interface {
			NewTransaction() *knftables.Transaction
			Run(context.Context, *knftables.Transaction) error
		}{p.exec, p.nl} {
			tx := r.NewTransaction()
			step(tx)
			if err := r.Run(ctx, tx); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		p.requireSame(t, "step")
	}
	for _, r := range []interface {
		NewTransaction() *knftables.Transaction
		Run(context.Context, *knftables.Transaction) error
	}{p.exec, p.nl} {
		tx := r.NewTransaction()
		tx.Delete(&knftables.Table{})
		if err := r.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	p.requireSame(t, "table deleted")
	if all, err := p.nl.ListAll(ctx); all != nil || err != nil {
		t.Fatalf("ListAll of a missing table: %v, %v", all, err)
	}
}

// TestRootErrors: a batch the kernel refuses returns an error classified
// like nft's and changes nothing.
func TestRootErrors(t *testing.T) {
	requireNFT(t)
	p := newPair(t, knftables.IPv4Family)
	ctx := context.Background()
	setup := func(tx *knftables.Transaction) {
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Chain{Name: "c"})
		tx.Add(&knftables.Map{Name: "m", Type: "ipv4_addr : verdict"})
		tx.Add(&knftables.Element{Map: "m", Key: []string{"10.0.0.1"}, Value: []string{"goto c"}})
	}
	for _, r := range []nftables.NFT{p.exec, p.nl} {
		tx := r.NewTransaction()
		setup(tx)
		if err := r.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	before := list(t, p.nsNL, p.fam, p.table)
	for _, tc := range []struct {
		name     string
		build    func(tx *knftables.Transaction)
		notFound bool
	}{
		{"delete missing chain", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Chain{Name: "new"})
			tx.Add(&knftables.Rule{Chain: "c", Rule: "drop"})
			tx.Delete(&knftables.Chain{Name: "absent"})
		}, true},
		{"create existing chain", func(tx *knftables.Transaction) {
			tx.Flush(&knftables.Chain{Name: "c"})
			tx.Create(&knftables.Chain{Name: "c"})
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, r := range map[string]nftables.NFT{"nft": p.exec, "netlink": p.nl} {
				tx := r.NewTransaction()
				tc.build(tx)
				err := r.Run(ctx, tx)
				if err == nil {
					t.Fatalf("%s: no error", name)
				}
				if nft.IsNotFound(err) != tc.notFound || nft.IsExists(err) == tc.notFound {
					t.Errorf("%s: IsNotFound %t, IsExists %t: %v", name, nft.IsNotFound(err), nft.IsExists(err), err)
				}
				t.Logf("%s: %v", name, err)
			}
			if after := list(t, p.nsNL, p.fam, p.table); after != before {
				t.Errorf("table changed by a refused batch:\n%s", cmp.Diff(before, after))
			}
		})
	}
}

// TestRootEndpointMaps: the proxy's named endpoint maps (typeof numgen
// maps, one per protocol, as nft 1.0.6 needs; dnat and vmap through them
// with numgen offsets, offset 0 included), then element replacements
// (delete and add of one key in a transaction) and rules added to maps
// already in the kernel, then a flush: `nft list table` must be the same
// whether nft or the netlink runner committed them.
func TestRootEndpointMaps(t *testing.T) {
	requireNFT(t)
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		t.Run(string(fam), func(t *testing.T) {
			p := newPair(t, fam)
			ctx := context.Background()
			kw, a1, a2 := "ip", "10.0.0.1", "10.0.0.2"
			if fam == knftables.IPv6Family {
				kw, a1, a2 = "ip6", "fd00::1", "fd00::2"
			}
			dnat := func(proto, pick string) string {
				return "meta l4proto " + proto + " dnat " + kw + " addr . port to " + pick + " map @endpoints-" + proto
			}
			elem := func(proto, key, addr, port string) *knftables.Element {
				return &knftables.Element{Map: "endpoints-" + proto, Key: []string{key}, Value: []string{addr + " . " + port}}
			}
			steps := []func(tx *knftables.Transaction){
				func(tx *knftables.Transaction) {
					tx.Add(&knftables.Table{})
					tx.Add(&knftables.Chain{Name: "svc"})
					tx.Add(&knftables.Chain{Name: "ep-a"})
					tx.Add(&knftables.Chain{Name: "ep-b"})
					for _, proto := range []string{"tcp", "udp"} {
						tx.Add(&knftables.Map{Name: "endpoints-" + proto, TypeOf: "numgen random mod 1 : " + kw + " daddr . " + proto + " dport"})
					}
					tx.Add(&knftables.Map{Name: "endpoint-chains", TypeOf: "numgen random mod 1 : verdict", Comment: knftables.PtrTo("affinity")})
					tx.Add(&knftables.Rule{Chain: "svc", Rule: dnat("tcp", "numgen random mod 3 offset 5")})
					tx.Add(&knftables.Rule{Chain: "svc", Rule: dnat("udp", "numgen random mod 2 offset 0")})
					tx.Add(&knftables.Rule{Chain: "svc", Rule: "numgen random mod 2 offset 8 vmap @endpoint-chains"})
					for i, k := range []string{"5", "6", "7"} {
						tx.Add(elem("tcp", k, a1, strconv.Itoa(80+i)))
					}
					tx.Add(elem("udp", "0", a1, "53"))
					tx.Add(elem("udp", "1", a2, "53"))
					tx.Add(&knftables.Element{Map: "endpoint-chains", Key: []string{"8"}, Value: []string{"goto ep-a"}})
					tx.Add(&knftables.Element{Map: "endpoint-chains", Key: []string{"9"}, Value: []string{"goto ep-b"}})
				},
				func(tx *knftables.Transaction) {
					tx.Delete(&knftables.Element{Map: "endpoints-tcp", Key: []string{"6"}})
					tx.Add(elem("tcp", "6", a2, "8080"))
					tx.Delete(&knftables.Element{Map: "endpoint-chains", Key: []string{"9"}})
					tx.Add(&knftables.Element{Map: "endpoint-chains", Key: []string{"9"}, Value: []string{"goto ep-a"}})
					tx.Delete(&knftables.Element{Map: "endpoints-udp", Key: []string{"1"}})
					tx.Add(&knftables.Rule{Chain: "svc", Rule: dnat("udp", "numgen random mod 1 offset 0")})
					tx.Add(&knftables.Rule{Chain: "svc", Rule: dnat("tcp", "numgen random mod 2 offset 10")})
					tx.Add(elem("tcp", "10", a1, "443"))
					tx.Add(elem("tcp", "11", a2, "443"))
				},
				func(tx *knftables.Transaction) {
					tx.Flush(&knftables.Map{Name: "endpoints-tcp"})
					tx.Add(elem("tcp", "5", a2, "81"))
				},
				func(tx *knftables.Transaction) {
					tx.Flush(&knftables.Chain{Name: "svc"})
					tx.Flush(&knftables.Map{Name: "endpoint-chains"})
					tx.Delete(&knftables.Map{Name: "endpoints-udp"})
				},
			}
			for i, step := range steps {
				for _, r := range []nftables.NFT{p.exec, p.nl} {
					tx := r.NewTransaction()
					step(tx)
					if err := r.Run(ctx, tx); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
				p.requireSame(t, fmt.Sprintf("step %d", i))
			}
		})
	}
}

// TestRootReads: what the CNI plugins read (ListTable, ListRules,
// ListElements, List) is the same from the netlink runner as from nft's
// JSON, for tables of every family the plugins use; Check refuses what
// Run would and changes nothing; Probe answers.
func TestRootReads(t *testing.T) {
	requireNFT(t)
	ctx := context.Background()
	for _, tc := range []struct {
		fam   knftables.Family
		build func(tx *knftables.Transaction)
		maps  []string
	}{{
		fam: knftables.InetFamily, maps: []string{"m4", "m6", "svc"},
		build: func(tx *knftables.Transaction) {
			tx.Add(&knftables.Table{Comment: knftables.PtrTo("t")})
			tx.Add(&knftables.Map{Name: "m4", Type: "ipv4_addr : verdict"})
			tx.Add(&knftables.Map{Name: "m6", Type: "ipv6_addr : verdict"})
			tx.Add(&knftables.Map{Name: "svc", Type: "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service"})
			tx.Add(&knftables.Chain{Name: "post", Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(knftables.PostroutingHook),
				Priority: knftables.PtrTo(knftables.SNATPriority)})
			tx.Add(&knftables.Chain{Name: "a", Comment: knftables.PtrTo("net: x")})
			tx.Add(&knftables.Chain{Name: "empty"})
			tx.Add(&knftables.Rule{Chain: "post", Rule: "ip saddr vmap @m4"})
			tx.Add(&knftables.Rule{Chain: "post", Rule: "ip6 saddr vmap @m6", Comment: knftables.PtrTo("six")})
			tx.Add(&knftables.Rule{Chain: "a", Rule: "ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade", Comment: knftables.PtrTo("10.1.0.5; net: x")})
			tx.Add(&knftables.Element{Map: "m4", Key: []string{"10.1.0.5"}, Value: []string{"goto a"}})
			tx.Add(&knftables.Element{Map: "m4", Key: []string{"10.1.0.6"}, Value: []string{"jump a"}, Comment: knftables.PtrTo("c")})
			tx.Add(&knftables.Element{Map: "m6", Key: []string{"fd00:1::5"}, Value: []string{"goto a"}})
			tx.Add(&knftables.Element{Map: "svc", Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"10.1.0.5 . 8080"}})
		},
	}, {
		fam: knftables.BridgeFamily, maps: []string{"ports"},
		build: func(tx *knftables.Transaction) {
			tx.Add(&knftables.Table{})
			tx.Add(&knftables.Map{Name: "ports", Type: "ifname : verdict"})
			tx.Add(&knftables.Chain{Name: "pre", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.PreroutingHook),
				Priority: knftables.PtrTo(knftables.BaseChainPriority("-300"))})
			tx.Add(&knftables.Chain{Name: "s"})
			tx.Add(&knftables.Rule{Chain: "pre", Rule: "iifname vmap @ports"})
			tx.Add(&knftables.Rule{Chain: "s", Rule: "ether saddr 0a:58:0a:01:00:05 return", Comment: knftables.PtrTo("mac 0a:58:0a:01:00:05")})
			tx.Add(&knftables.Rule{Chain: "s", Rule: "drop"})
			tx.Add(&knftables.Element{Map: "ports", Key: []string{`"veth1234"`}, Value: []string{"goto s"}})
			tx.Add(&knftables.Element{Map: "ports", Key: []string{`"v"`}, Value: []string{"goto s"}})
		},
	}} {
		t.Run(string(tc.fam), func(t *testing.T) {
			p := newPair(t, tc.fam)
			// Before the table exists: the same "nothing" from both.
			compareReads(t, p, tc.maps)
			for _, r := range []nftables.NFT{p.exec, p.nl} {
				tx := r.NewTransaction()
				tc.build(tx)
				if err := r.Run(ctx, tx); err != nil {
					t.Fatal(err)
				}
			}
			p.requireSame(t, "built")
			compareReads(t, p, tc.maps)

			// Check: a good transaction passes and changes nothing; a bad
			// one fails as Run would.
			before := list(t, p.nsNL, p.fam, p.table)
			good := p.nl.NewTransaction()
			good.Add(&knftables.Chain{Name: "new"})
			good.Add(&knftables.Rule{Chain: "new", Rule: "drop"})
			if err := p.nl.Check(ctx, good); err != nil {
				t.Errorf("Check of a valid transaction: %v", err)
			}
			bad := p.nl.NewTransaction()
			bad.Add(&knftables.Chain{Name: "new"})
			bad.Delete(&knftables.Chain{Name: "absent"})
			if err := p.nl.Check(ctx, bad); !nft.IsNotFound(err) {
				t.Errorf("Check deleting a missing chain: %v, want not found", err)
			}
			if after := list(t, p.nsNL, p.fam, p.table); after != before {
				t.Errorf("Check changed the table:\n%s", cmp.Diff(before, after))
			}
			if err := p.nl.Probe(ctx); err != nil {
				t.Errorf("Probe: %v", err)
			}
		})
	}
}

// compareReads requires the same answers from nft and from netlink.
func compareReads(t *testing.T, p *pair, maps []string) {
	t.Helper()
	ctx := context.Background()
	ta, errA := p.exec.ListTable(ctx)
	tb, errB := p.nl.ListTable(ctx)
	if errA != nil || errB != nil {
		t.Fatalf("ListTable: nft %v, netlink %v", errA, errB)
	}
	if d := cmp.Diff(ta, tb); d != "" {
		t.Errorf("ListTable differs (-nft +netlink):\n%s", d)
	}
	chains := []string{"", "absent"}
	if ta != nil {
		chains = append(chains, ta.Chains...)
	}
	for _, c := range chains {
		ra, errA := p.exec.ListRules(ctx, c)
		rb, errB := p.nl.ListRules(ctx, c)
		if nft.IsNotFound(errA) != nft.IsNotFound(errB) || (errA == nil) != (errB == nil) {
			t.Errorf("ListRules(%q): nft %v, netlink %v", c, errA, errB)
		}
		if d := cmp.Diff(ra, rb, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("ListRules(%q) differs (-nft +netlink):\n%s", c, d)
		}
	}
	for _, m := range append(maps, "absent") {
		for _, typ := range []string{"map", "set"} {
			ea, errA := p.exec.ListElements(ctx, typ, m)
			eb, errB := p.nl.ListElements(ctx, typ, m)
			if nft.IsNotFound(errA) != nft.IsNotFound(errB) || (errA == nil) != (errB == nil) {
				t.Errorf("ListElements(%s %s): nft %v, netlink %v", typ, m, errA, errB)
			}
			sortElems := cmpopts.SortSlices(func(a, b *knftables.Element) bool { return strings.Join(a.Key, ".") < strings.Join(b.Key, ".") })
			if d := cmp.Diff(ea, eb, cmpopts.EquateEmpty(), sortElems); d != "" {
				t.Errorf("ListElements(%s %s) differs (-nft +netlink):\n%s", typ, m, d)
			}
		}
	}
	la, errA := p.exec.List(ctx, "chains")
	lb, errB := p.nl.List(ctx, "chains")
	if errA != nil || errB != nil {
		t.Fatalf("List: nft %v, netlink %v", errA, errB)
	}
	if d := cmp.Diff(la, lb, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("List(chains) differs (-nft +netlink):\n%s", d)
	}
}
