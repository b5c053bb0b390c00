package local

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

// fakeAddrs is lo plus addresses on other devices.
type fakeAddrs struct {
	lo        map[netip.Addr]bool // value: labelled
	elsewhere []netip.Addr
	ops       []string
}

func (f *fakeAddrs) Labelled() ([]netip.Addr, error) {
	var out []netip.Addr
	for a, l := range f.lo {
		if l {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (f *fakeAddrs) Has(a netip.Addr) (bool, error) {
	_, ok := f.lo[a]
	return ok || slices.Contains(f.elsewhere, a), nil
}

func (f *fakeAddrs) Add(a netip.Addr) error {
	f.lo[a] = a.Is4()
	f.ops = append(f.ops, "add "+a.String())
	return nil
}

func (f *fakeAddrs) Del(a netip.Addr) error {
	delete(f.lo, a)
	f.ops = append(f.ops, "del "+a.String())
	return nil
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

const want = `add table inet flatnet-dns { comment "flatnet agent: cluster DNS packets skip conntrack" ; }
add chain inet flatnet-dns output { type filter hook output priority -300 ; }
add chain inet flatnet-dns prerouting { type filter hook prerouting priority -300 ; }
add rule inet flatnet-dns output ip daddr { 10.96.0.10, 169.254.20.10 } udp dport 53 notrack comment "queries to { 10.96.0.10, 169.254.20.10 } udp/53"
add rule inet flatnet-dns output ip saddr { 10.96.0.10, 169.254.20.10 } udp sport 53 notrack comment "replies from { 10.96.0.10, 169.254.20.10 } udp/53"
add rule inet flatnet-dns output ip daddr { 10.96.0.10, 169.254.20.10 } tcp dport 53 notrack comment "queries to { 10.96.0.10, 169.254.20.10 } tcp/53"
add rule inet flatnet-dns output ip saddr { 10.96.0.10, 169.254.20.10 } tcp sport 53 notrack comment "replies from { 10.96.0.10, 169.254.20.10 } tcp/53"
add rule inet flatnet-dns output ip6 daddr fd00::a udp dport 53 notrack comment "queries to fd00::a udp/53"
add rule inet flatnet-dns output ip6 saddr fd00::a udp sport 53 notrack comment "replies from fd00::a udp/53"
add rule inet flatnet-dns output ip6 daddr fd00::a tcp dport 53 notrack comment "queries to fd00::a tcp/53"
add rule inet flatnet-dns output ip6 saddr fd00::a tcp sport 53 notrack comment "replies from fd00::a tcp/53"
add rule inet flatnet-dns prerouting ip daddr { 10.96.0.10, 169.254.20.10 } udp dport 53 notrack comment "queries to { 10.96.0.10, 169.254.20.10 } udp/53"
add rule inet flatnet-dns prerouting ip saddr { 10.96.0.10, 169.254.20.10 } udp sport 53 notrack comment "replies from { 10.96.0.10, 169.254.20.10 } udp/53"
add rule inet flatnet-dns prerouting ip daddr { 10.96.0.10, 169.254.20.10 } tcp dport 53 notrack comment "queries to { 10.96.0.10, 169.254.20.10 } tcp/53"
add rule inet flatnet-dns prerouting ip saddr { 10.96.0.10, 169.254.20.10 } tcp sport 53 notrack comment "replies from { 10.96.0.10, 169.254.20.10 } tcp/53"
add rule inet flatnet-dns prerouting ip6 daddr fd00::a udp dport 53 notrack comment "queries to fd00::a udp/53"
add rule inet flatnet-dns prerouting ip6 saddr fd00::a udp sport 53 notrack comment "replies from fd00::a udp/53"
add rule inet flatnet-dns prerouting ip6 daddr fd00::a tcp dport 53 notrack comment "queries to fd00::a tcp/53"
add rule inet flatnet-dns prerouting ip6 saddr fd00::a tcp sport 53 notrack comment "replies from fd00::a tcp/53"
`

func TestSyncIdempotentAndRemove(t *testing.T) {
	ctx := context.Background()
	f := nft.NewFake(knftables.InetFamily, Table)
	a := &fakeAddrs{lo: map[netip.Addr]bool{netip.MustParseAddr("127.0.0.1"): false}, elsewhere: addrs("10.0.0.5")}
	l := New(f, a)
	want4 := addrs("169.254.20.10", "10.96.0.10", "fd00::a")
	for i := range 2 {
		if err := l.Sync(ctx, want4, 53); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, f.Dump()); d != "" {
			t.Fatalf("sync %d: ruleset (-want +got):\n%s", i, d)
		}
	}
	if f.Runs() != 1 {
		t.Errorf("two syncs ran %d transactions, want 1", f.Runs())
	}
	if got, w := fmt.Sprint(a.ops), "[add 169.254.20.10 add 10.96.0.10 add fd00::a]"; got != w {
		t.Errorf("address ops %s, want %s", got, w)
	}
	// A list without the ClusterIP, plus addresses already local: the
	// ClusterIP goes; 127.0.0.1 and 10.0.0.5 are used, never added.
	a.ops = nil
	if err := l.Sync(ctx, addrs("169.254.20.10", "127.0.0.1", "10.0.0.5"), 1053); err != nil {
		t.Fatal(err)
	}
	if got, w := fmt.Sprint(a.ops), "[del 10.96.0.10 del fd00::a]"; got != w {
		t.Errorf("address ops %s, want %s", got, w)
	}
	a.ops = nil
	if err := l.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if got, w := fmt.Sprint(a.ops), "[del 169.254.20.10]"; got != w {
		t.Errorf("remove: address ops %s, want %s (never 127.0.0.1)", got, w)
	}
	if d := f.Dump(); d != "" {
		t.Errorf("table left after Remove:\n%s", d)
	}
	if err := l.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// TestRestartFindsLabelledAddresses: a new process removes the IPv4
// addresses a previous one left (by their label), not others.
func TestRestartFindsLabelledAddresses(t *testing.T) {
	a := &fakeAddrs{lo: map[netip.Addr]bool{netip.MustParseAddr("169.254.20.11"): true, netip.MustParseAddr("10.1.1.1"): false}}
	l := New(nft.NewFake(knftables.InetFamily, Table), a)
	if err := l.Sync(context.Background(), addrs("169.254.20.10"), 53); err != nil {
		t.Fatal(err)
	}
	if got, w := fmt.Sprint(a.ops), "[del 169.254.20.11 add 169.254.20.10]"; got != w {
		t.Errorf("address ops %s, want %s", got, w)
	}
}
