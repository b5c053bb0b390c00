package portmap

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

// nftA is the table after ADD of attachment A alone.
const nftA = `
add table inet flatnet-portmap { comment "flatnet portmap: hostPort DNAT for CNI attachments" ; }
add chain inet flatnet-portmap dnat-ujajvl-cbftli2xat
add chain inet flatnet-portmap hostports
add chain inet flatnet-portmap masquerade-bit13 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap output { type nat hook output priority -100 ; }
add chain inet flatnet-portmap prerouting { type nat hook prerouting priority -100 ; }
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } tcp dport 8080 meta mark set meta mark | 0x2000 comment "v4 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv4 tcp dport 8080 dnat ip to 10.1.0.2:80 comment "v4 tcp 8080->80 dnat to 10.1.0.2:80"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } ip daddr 10.0.0.1 udp dport 5353 meta mark set meta mark | 0x2000 comment "v4 udp 10.0.0.1:5353->53 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip daddr 10.0.0.1 udp dport 5353 dnat ip to 10.1.0.2:53 comment "v4 udp 10.0.0.1:5353->53 dnat to 10.1.0.2:53"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip6 saddr fd00::/64 tcp dport 8080 meta mark set meta mark | 0x2000 comment "v6 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00::2]:80 comment "v6 tcp 8080->80 dnat to [fd00::2]:80"
add rule inet flatnet-portmap hostports jump dnat-ujajvl-cbftli2xat comment "ujajvl-cbftli2xat mxvxjj net=net1 id=ctr1 if=eth0"
add rule inet flatnet-portmap masquerade-bit13 meta mark & 0x2000 == 0x2000 masquerade comment "flatnet-portmap: masquerade mark 0x2000"
add rule inet flatnet-portmap output fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
add rule inet flatnet-portmap prerouting fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
`

// nftABC is the table after ADD of A, B and C.
const nftABC = `
add table inet flatnet-portmap { comment "flatnet portmap: hostPort DNAT for CNI attachments" ; }
add chain inet flatnet-portmap dnat-ujajvl-cbftli2xat
add chain inet flatnet-portmap dnat-ujajvl-fty67ey7oh
add chain inet flatnet-portmap dnat-wqnkqj-efyokcjjcq
add chain inet flatnet-portmap hostports
add chain inet flatnet-portmap masquerade-bit13 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap masquerade-bit5 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap output { type nat hook output priority -100 ; }
add chain inet flatnet-portmap prerouting { type nat hook prerouting priority -100 ; }
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } tcp dport 8080 meta mark set meta mark | 0x2000 comment "v4 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv4 tcp dport 8080 dnat ip to 10.1.0.2:80 comment "v4 tcp 8080->80 dnat to 10.1.0.2:80"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } ip daddr 10.0.0.1 udp dport 5353 meta mark set meta mark | 0x2000 comment "v4 udp 10.0.0.1:5353->53 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip daddr 10.0.0.1 udp dport 5353 dnat ip to 10.1.0.2:53 comment "v4 udp 10.0.0.1:5353->53 dnat to 10.1.0.2:53"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip6 saddr fd00::/64 tcp dport 8080 meta mark set meta mark | 0x2000 comment "v6 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00::2]:80 comment "v6 tcp 8080->80 dnat to [fd00::2]:80"
add rule inet flatnet-portmap dnat-ujajvl-fty67ey7oh meta nfproto ipv4 udp dport 53 dnat ip to 10.1.0.3:5353 comment "v4 udp 53->5353 dnat to 10.1.0.3:5353"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 meta mark set meta mark | 0x20 comment "v4 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 dnat ip to 10.2.0.2:8443 comment "v4 tcp 443->8443 dnat to 10.2.0.2:8443"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 meta mark set meta mark | 0x20 comment "v6 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 dnat ip6 to [fd00:2::2]:8443 comment "v6 tcp 443->8443 dnat to [fd00:2::2]:8443"
add rule inet flatnet-portmap hostports jump dnat-ujajvl-cbftli2xat comment "ujajvl-cbftli2xat mxvxjj net=net1 id=ctr1 if=eth0"
add rule inet flatnet-portmap hostports jump dnat-ujajvl-fty67ey7oh comment "ujajvl-fty67ey7oh vilm2x net=net1 id=ctr2 if=eth0"
add rule inet flatnet-portmap hostports meta nfproto ipv4 ip saddr 10.0.0.0/8 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq gs3wj7 net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap hostports meta nfproto ipv6 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq 5causd net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap masquerade-bit13 meta mark & 0x2000 == 0x2000 masquerade comment "flatnet-portmap: masquerade mark 0x2000"
add rule inet flatnet-portmap masquerade-bit5 meta mark & 0x20 == 0x20 masquerade comment "flatnet-portmap: masquerade mark 0x20"
add rule inet flatnet-portmap output fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
add rule inet flatnet-portmap prerouting fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
`

// nftAC is nftABC after DEL of B.
const nftAC = `
add table inet flatnet-portmap { comment "flatnet portmap: hostPort DNAT for CNI attachments" ; }
add chain inet flatnet-portmap dnat-ujajvl-cbftli2xat
add chain inet flatnet-portmap dnat-wqnkqj-efyokcjjcq
add chain inet flatnet-portmap hostports
add chain inet flatnet-portmap masquerade-bit13 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap masquerade-bit5 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap output { type nat hook output priority -100 ; }
add chain inet flatnet-portmap prerouting { type nat hook prerouting priority -100 ; }
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } tcp dport 8080 meta mark set meta mark | 0x2000 comment "v4 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv4 tcp dport 8080 dnat ip to 10.1.0.2:80 comment "v4 tcp 8080->80 dnat to 10.1.0.2:80"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip saddr { 10.1.0.0/24, 127.0.0.1 } ip daddr 10.0.0.1 udp dport 5353 meta mark set meta mark | 0x2000 comment "v4 udp 10.0.0.1:5353->53 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip daddr 10.0.0.1 udp dport 5353 dnat ip to 10.1.0.2:53 comment "v4 udp 10.0.0.1:5353->53 dnat to 10.1.0.2:53"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat ip6 saddr fd00::/64 tcp dport 8080 meta mark set meta mark | 0x2000 comment "v6 tcp 8080->80 mark for masquerade"
add rule inet flatnet-portmap dnat-ujajvl-cbftli2xat meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00::2]:80 comment "v6 tcp 8080->80 dnat to [fd00::2]:80"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 meta mark set meta mark | 0x20 comment "v4 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 dnat ip to 10.2.0.2:8443 comment "v4 tcp 443->8443 dnat to 10.2.0.2:8443"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 meta mark set meta mark | 0x20 comment "v6 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 dnat ip6 to [fd00:2::2]:8443 comment "v6 tcp 443->8443 dnat to [fd00:2::2]:8443"
add rule inet flatnet-portmap hostports jump dnat-ujajvl-cbftli2xat comment "ujajvl-cbftli2xat mxvxjj net=net1 id=ctr1 if=eth0"
add rule inet flatnet-portmap hostports meta nfproto ipv4 ip saddr 10.0.0.0/8 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq gs3wj7 net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap hostports meta nfproto ipv6 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq 5causd net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap masquerade-bit13 meta mark & 0x2000 == 0x2000 masquerade comment "flatnet-portmap: masquerade mark 0x2000"
add rule inet flatnet-portmap masquerade-bit5 meta mark & 0x20 == 0x20 masquerade comment "flatnet-portmap: masquerade mark 0x20"
add rule inet flatnet-portmap output fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
add rule inet flatnet-portmap prerouting fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
`

// nftC is nftAC after GC of net1 with no valid attachment: net2's C stays.
const nftC = `
add table inet flatnet-portmap { comment "flatnet portmap: hostPort DNAT for CNI attachments" ; }
add chain inet flatnet-portmap dnat-wqnkqj-efyokcjjcq
add chain inet flatnet-portmap hostports
add chain inet flatnet-portmap masquerade-bit13 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap masquerade-bit5 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap output { type nat hook output priority -100 ; }
add chain inet flatnet-portmap prerouting { type nat hook prerouting priority -100 ; }
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 meta mark set meta mark | 0x20 comment "v4 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv4 tcp dport 443 dnat ip to 10.2.0.2:8443 comment "v4 tcp 443->8443 dnat to 10.2.0.2:8443"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 meta mark set meta mark | 0x20 comment "v6 tcp 443->8443 mark for masquerade"
add rule inet flatnet-portmap dnat-wqnkqj-efyokcjjcq meta nfproto ipv6 tcp dport 443 dnat ip6 to [fd00:2::2]:8443 comment "v6 tcp 443->8443 dnat to [fd00:2::2]:8443"
add rule inet flatnet-portmap hostports meta nfproto ipv4 ip saddr 10.0.0.0/8 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq gs3wj7 net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap hostports meta nfproto ipv6 jump dnat-wqnkqj-efyokcjjcq comment "wqnkqj-efyokcjjcq 5causd net=net2 id=ctr3 if=net1"
add rule inet flatnet-portmap masquerade-bit13 meta mark & 0x2000 == 0x2000 masquerade comment "flatnet-portmap: masquerade mark 0x2000"
add rule inet flatnet-portmap masquerade-bit5 meta mark & 0x20 == 0x20 masquerade comment "flatnet-portmap: masquerade mark 0x20"
add rule inet flatnet-portmap output fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
add rule inet flatnet-portmap prerouting fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
`

// nftSkeleton is what DEL of the last attachment leaves (marks 0x2000 and
// 0x20 in use).
const nftSkeleton = `
add table inet flatnet-portmap { comment "flatnet portmap: hostPort DNAT for CNI attachments" ; }
add chain inet flatnet-portmap hostports
add chain inet flatnet-portmap masquerade-bit13 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap masquerade-bit5 { type nat hook postrouting priority 100 ; }
add chain inet flatnet-portmap output { type nat hook output priority -100 ; }
add chain inet flatnet-portmap prerouting { type nat hook prerouting priority -100 ; }
add rule inet flatnet-portmap masquerade-bit13 meta mark & 0x2000 == 0x2000 masquerade comment "flatnet-portmap: masquerade mark 0x2000"
add rule inet flatnet-portmap masquerade-bit5 meta mark & 0x20 == 0x20 masquerade comment "flatnet-portmap: masquerade mark 0x20"
add rule inet flatnet-portmap output fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
add rule inet flatnet-portmap prerouting fib daddr type local jump hostports comment "flatnet-portmap: connections to a local address"
`

func newNFTFake() (*nft.Fake, *nftBackend) {
	f := nft.NewFake(knftables.InetFamily, nftTable)
	return f, &nftBackend{nft: f}
}

// counting counts the calls that would each start an nft process.
type counting struct {
	*nft.Fake
	lists, runs int
}

func (c *counting) ListTable(ctx context.Context) (*nft.Table, error) {
	c.lists++
	return c.Fake.ListTable(ctx)
}

func (c *counting) Run(ctx context.Context, tx *knftables.Transaction) error {
	c.runs++
	return c.Fake.Run(ctx, tx)
}

func TestNFTCallsPerVerb(t *testing.T) {
	ctx := context.Background()
	c := &counting{Fake: nft.NewFake(knftables.InetFamily, nftTable)}
	b := &nftBackend{nft: c}
	step := func(name string, err error, lists, runs int) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.lists != lists || c.runs != runs {
			t.Fatalf("%s: %d listings and %d runs, want %d and %d", name, c.lists, c.runs, lists, runs)
		}
		c.lists, c.runs = 0, 0
	}
	step("ADD A on an empty node", b.add(ctx, planA()), 0, 1)
	step("ADD B", b.add(ctx, planB()), 0, 1)
	// A repeated ADD: the create fails, then one listing and one run.
	step("ADD A again", b.add(ctx, planA()), 1, 2)
	step("DEL A", b.del(ctx, attA.ID(), false), 1, 1)
	step("DEL A again", b.del(ctx, attA.ID(), false), 1, 0)
	step("GC nothing stale", b.gc(ctx, "net1", map[ID]bool{attB.ID(): true}), 1, 0)
}

func wantDump(t *testing.T, step, got, want string) {
	t.Helper()
	if d := cmp.Diff(lines(want), got); d != "" {
		t.Fatalf("%s: ruleset differs (-want +got):\n%s", step, d)
	}
}

func TestNFTLifecycle(t *testing.T) {
	ctx := context.Background()
	f, b := newNFTFake()
	a, bb, c := planA(), planB(), planC("ip saddr 10.0.0.0/8")

	must := func(step string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	must("ADD A", b.add(ctx, a))
	wantDump(t, "ADD A", f.Dump(), nftA)
	must("CHECK A", b.check(ctx, a))

	// Idempotent: a second ADD changes nothing, and does not even touch
	// the jump rule.
	must("ADD A again", b.add(ctx, a))
	wantDump(t, "ADD A twice", f.Dump(), nftA)

	must("ADD B", b.add(ctx, bb))
	must("ADD C", b.add(ctx, c))
	wantDump(t, "ADD A B C", f.Dump(), nftABC)
	for _, p := range []*Plan{a, bb, c} {
		must("CHECK "+p.ID.String(), b.check(ctx, p))
	}

	must("DEL B", b.del(ctx, bb.ID, false))
	wantDump(t, "DEL B", f.Dump(), nftAC)
	must("DEL B again", b.del(ctx, bb.ID, false))
	wantDump(t, "DEL B twice", f.Dump(), nftAC)
	if err := b.check(ctx, bb); err == nil {
		t.Fatal("CHECK B after DEL B passed")
	}

	// GC of net1 keeping only A: nothing to do.
	must("GC net1 {A}", b.gc(ctx, "net1", map[ID]bool{a.ID: true}))
	wantDump(t, "GC net1 {A}", f.Dump(), nftAC)
	// GC of net1 keeping nothing: A goes, net2's C stays.
	must("GC net1 {}", b.gc(ctx, "net1", map[ID]bool{}))
	wantDump(t, "GC net1 {}", f.Dump(), nftC)
	must("CHECK C", b.check(ctx, c))

	// DEL of the last attachment keeps the skeleton for the next ADD;
	// GC, with nothing left, takes the table away.
	must("DEL C", b.del(ctx, c.ID, false))
	wantDump(t, "DEL C", f.Dump(), nftSkeleton)
	must("DEL C twice", b.del(ctx, c.ID, false))
	wantDump(t, "DEL C twice", f.Dump(), nftSkeleton)
	must("GC of an empty table", b.gc(ctx, "net1", nil))
	wantDump(t, "GC of an empty table", f.Dump(), "")
	must("DEL C on no table", b.del(ctx, c.ID, false))
	must("GC on no table", b.gc(ctx, "net2", nil))
}

func TestNFTGCRemovesLast(t *testing.T) {
	ctx := context.Background()
	f, b := newNFTFake()
	if err := b.add(ctx, planA()); err != nil {
		t.Fatal(err)
	}
	if err := b.add(ctx, planB()); err != nil {
		t.Fatal(err)
	}
	if err := b.gc(ctx, "net1", map[ID]bool{}); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "GC all", f.Dump(), "")
}

func TestNFTAddReplacesChangedMappings(t *testing.T) {
	ctx := context.Background()
	f, b := newNFTFake()
	if err := b.add(ctx, planC()); err != nil {
		t.Fatal(err)
	}
	// Same attachment, now with a condition: the old jump is replaced.
	if err := b.add(ctx, planC("ip saddr 10.0.0.0/8")); err != nil {
		t.Fatal(err)
	}
	if err := b.add(ctx, planA()); err != nil {
		t.Fatal(err)
	}
	if err := b.add(ctx, planB()); err != nil {
		t.Fatal(err)
	}
	if err := b.del(ctx, attB.ID(), false); err != nil {
		t.Fatal(err)
	}
	got := f.Dump()
	for _, l := range strings.Split(lines(nftAC), "\n") {
		if !strings.Contains(got, l) {
			t.Errorf("missing %q in\n%s", l, got)
		}
	}
	if n := strings.Count(got, "\n"); n != strings.Count(lines(nftAC), "\n") {
		t.Errorf("got %d lines, want %d:\n%s", n, strings.Count(lines(nftAC), "\n"), got)
	}
}

func TestNFTCheckFindsMissingRules(t *testing.T) {
	ctx := context.Background()
	f, b := newNFTFake()
	a := planA()
	if err := b.check(ctx, a); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("CHECK before ADD: %v", err)
	}
	if err := b.add(ctx, a); err != nil {
		t.Fatal(err)
	}
	// Remove the IPv6 DNAT rule behind the plugin's back.
	rules := f.Table.Chains[nftChain(a.ID)].Rules
	tx := f.NewTransaction()
	tx.Delete(&knftables.Rule{Chain: nftChain(a.ID), Handle: rules[len(rules)-1].Handle})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	err := b.check(ctx, a)
	if err == nil || !strings.Contains(err.Error(), "dnat to [fd00::2]:80") {
		t.Fatalf("CHECK with a missing rule: %v", err)
	}
	// ADD repairs it.
	if err := b.add(ctx, a); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "repaired", f.Dump(), nftA)

	// Without the entry rule in prerouting.
	tx = f.NewTransaction()
	tx.Flush(&knftables.Chain{Name: nftPrerouting})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := b.check(ctx, a); err == nil || !strings.Contains(err.Error(), "prerouting") {
		t.Fatalf("CHECK without the prerouting jump: %v", err)
	}
}

func TestNFTFailedRunChangesNothing(t *testing.T) {
	ctx := context.Background()
	f, b := newNFTFake()
	if err := b.add(ctx, planA()); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	// A rule that jumps to a chain which does not exist makes the
	// transaction fail as a whole.
	p := planB()
	p.ID.Att = "zzzzzzzzzz"
	bad := renderNFT(p)
	tx := f.NewTransaction()
	tx.Add(bad.Jumps[0])
	if err := f.Run(ctx, tx); err == nil {
		t.Fatal("bad transaction accepted")
	}
	wantDump(t, "after failed run", f.Dump(), before)
}
