package ipmasq

import (
	"context"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/nft"
)

// strictFake is knftables' fake plus the two kernel refusals this package
// relies on, which the fake does not model: overwriting a map element with
// a different verdict (EEXIST) and deleting a chain that a map element
// still points to (EBUSY).
type strictFake struct {
	*knftables.Fake
	runs int
}

var (
	addElemRE = regexp.MustCompile(`^add element inet \S+ (\S+) \{ (\S+) : goto (\S+) \}`)
	delElemRE = regexp.MustCompile(`^delete element inet \S+ (\S+) \{ (\S+) \}`)
	delChain  = regexp.MustCompile(`^delete chain inet \S+ (\S+)`)
)

func (s *strictFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	s.runs++
	deleted := map[string]bool{}
	for _, line := range strings.Split(tx.String(), "\n") {
		if m := addElemRE.FindStringSubmatch(line); m != nil {
			if s.Table == nil {
				break
			}
			if fm := s.Table.Maps[m[1]]; fm != nil {
				if e := fm.FindElement(m[2]); e != nil && e.Value[0] != "goto "+m[3] && !deleted[m[1]+" "+m[2]] {
					return &nft.Error{Msg: "Error: Could not process rule: File exists", Errno: syscall.EEXIST}
				}
			}
		}
		if m := delElemRE.FindStringSubmatch(line); m != nil {
			deleted[m[1]+" "+m[2]] = true
		}
		if m := delChain.FindStringSubmatch(line); m != nil && s.Table != nil {
			for name, fm := range s.Table.Maps {
				for _, e := range fm.Elements {
					if e.Value[0] == "goto "+m[1] && !deleted[name+" "+e.Key[0]] {
						return &nft.Error{Msg: "Error: Could not process rule: Device or resource busy", Errno: syscall.EBUSY}
					}
				}
			}
		}
	}
	return s.Fake.Run(ctx, tx)
}

func newFake() *strictFake { return &strictFake{Fake: knftables.NewFake(knftables.InetFamily, Table)} }

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

var (
	attA = Attachment{Network: "mynet", ContainerID: "ctr-a", IfName: "eth0"}
	attB = Attachment{Network: "mynet", ContainerID: "ctr-b", IfName: "eth0"}
	attC = Attachment{Network: "othernet", ContainerID: "ctr-a", IfName: "net1"}
)

const baseDump = `add table inet flatnet-cni-masq { comment "flatnet CNI ipMasq: masquerade container traffic leaving its subnet" ; }
add chain inet flatnet-cni-masq postrouting { type nat hook postrouting priority 100 ; }
add map inet flatnet-cni-masq masq4 { type ipv4_addr : verdict ; }
add map inet flatnet-cni-masq masq6 { type ipv6_addr : verdict ; }
add rule inet flatnet-cni-masq postrouting ip daddr 224.0.0.0/4 return
add rule inet flatnet-cni-masq postrouting ip6 daddr ff00::/8 return
add rule inet flatnet-cni-masq postrouting ip saddr vmap @masq4
add rule inet flatnet-cni-masq postrouting ip6 saddr vmap @masq6
`

// dump returns the fake's ruleset with chain names made readable.
func dump(f *strictFake) string {
	d := f.Dump()
	for _, a := range []Attachment{attA, attB, attC} {
		d = strings.ReplaceAll(d, ChainName(a), "<"+a.ContainerID+"/"+a.IfName+"@"+a.Network+">")
	}
	return d
}

func TestChainNames(t *testing.T) {
	if got := ChainName(attA); !strings.HasPrefix(got, NetworkPrefix("mynet")) || len(got) != 29 {
		t.Errorf("ChainName = %q", got)
	}
	if ChainName(attA) == ChainName(attB) || ChainName(attA) == ChainName(attC) {
		t.Error("chain names collide")
	}
	// The separator keeps ("ab","c") and ("a","bc") apart.
	if ChainName(Attachment{"n", "ab", "c"}) == ChainName(Attachment{"n", "a", "bc"}) {
		t.Error("ambiguous hash input")
	}
}

func TestSetupTeardown(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	m := New(f)
	addrs := pfx("10.1.0.5/24", "fd00:1::5/64")
	if err := m.Setup(ctx, attA, addrs); err != nil {
		t.Fatal(err)
	}
	want := baseDump + `add chain inet flatnet-cni-masq <ctr-a/eth0@mynet> { comment "net: mynet, if: eth0, id: ctr-a" ; }
add rule inet flatnet-cni-masq <ctr-a/eth0@mynet> ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade comment "10.1.0.5; net: mynet, if: eth0, id: ctr-a"
add rule inet flatnet-cni-masq <ctr-a/eth0@mynet> ip6 saddr fd00:1::5 ip6 daddr != fd00:1::/64 masquerade comment "fd00:1::5; net: mynet, if: eth0, id: ctr-a"
add element inet flatnet-cni-masq masq4 { 10.1.0.5 : goto <ctr-a/eth0@mynet> }
add element inet flatnet-cni-masq masq6 { fd00:1::5 : goto <ctr-a/eth0@mynet> }
`
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("after Setup (-want +got):\n%s", d)
	}
	// First Setup: one failed add-only transaction (no table), the base,
	// the retry.
	if f.runs != 3 {
		t.Errorf("first Setup ran %d transactions, want 3", f.runs)
	}
	// Idempotent, and the second time a single transaction.
	f.runs = 0
	if err := m.Setup(ctx, attA, addrs); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("after second Setup (-want +got):\n%s", d)
	}
	if f.runs != 1 {
		t.Errorf("second Setup ran %d transactions, want 1", f.runs)
	}
	if err := m.Check(ctx, attA, addrs); err != nil {
		t.Errorf("Check after Setup: %v", err)
	}

	f.runs = 0
	if err := m.Teardown(ctx, attA, addrs); err != nil {
		t.Fatal(err)
	}
	if f.runs != 1 {
		t.Errorf("Teardown with known addresses ran %d transactions, want 1", f.runs)
	}
	if d := cmp.Diff(sortLines(baseDump), sortLines(dump(f))); d != "" {
		t.Fatalf("after Teardown (-want +got):\n%s", d)
	}
	// Again, with and without addresses: nothing to do, no error.
	for _, as := range [][]netip.Prefix{addrs, nil} {
		if err := m.Teardown(ctx, attA, as); err != nil {
			t.Fatalf("second Teardown(%v): %v", as, err)
		}
	}
	if d := cmp.Diff(sortLines(baseDump), sortLines(dump(f))); d != "" {
		t.Fatalf("after repeated Teardown (-want +got):\n%s", d)
	}
}

func TestTeardownWithoutTable(t *testing.T) {
	f := newFake()
	if err := New(f).Teardown(context.Background(), attA, nil); err != nil {
		t.Fatal(err)
	}
	if err := New(f).Teardown(context.Background(), attA, pfx("10.1.0.5/24")); err != nil {
		t.Fatal(err)
	}
	if f.runs > 1 {
		t.Errorf("ran %d transactions on an empty ruleset", f.runs)
	}
}

func TestTeardownUnknownAddressesKeepsOthers(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	m := New(f)
	must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	must(t, m.Setup(ctx, attB, pfx("10.1.0.6/24")))
	before := dump(f)
	// DEL after the netns is gone: no addresses known.
	must(t, m.Teardown(ctx, attA, nil))
	want := baseDump + `add chain inet flatnet-cni-masq <ctr-b/eth0@mynet> { comment "net: mynet, if: eth0, id: ctr-b" ; }
add rule inet flatnet-cni-masq <ctr-b/eth0@mynet> ip saddr 10.1.0.6 ip daddr != 10.1.0.0/24 masquerade comment "10.1.0.6; net: mynet, if: eth0, id: ctr-b"
add element inet flatnet-cni-masq masq4 { 10.1.0.6 : goto <ctr-b/eth0@mynet> }
`
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("before:\n%s\nafter Teardown(A) (-want +got):\n%s", before, d)
	}
	// Only some addresses known (prevResult lost the v6 one): the fast
	// transaction fails on the busy chain and the slow path cleans up.
	must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	must(t, m.Teardown(ctx, attA, pfx("10.1.0.5/24")))
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("after partial-address Teardown (-want +got):\n%s", d)
	}
}

// An IP released and handed out again before the old attachment's DEL:
// the new ADD evicts the stale attachment, and the stale DEL leaves the
// new one alone.
func TestReusedAddress(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	m := New(f)
	must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	must(t, m.Setup(ctx, attB, pfx("10.1.0.5/24")))
	want := baseDump + `add chain inet flatnet-cni-masq <ctr-b/eth0@mynet> { comment "net: mynet, if: eth0, id: ctr-b" ; }
add rule inet flatnet-cni-masq <ctr-b/eth0@mynet> ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade comment "10.1.0.5; net: mynet, if: eth0, id: ctr-b"
add element inet flatnet-cni-masq masq4 { 10.1.0.5 : goto <ctr-b/eth0@mynet> }
`
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("after Setup(B) with A's address (-want +got):\n%s", d)
	}
	must(t, m.Teardown(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("stale Teardown(A) touched B (-want +got):\n%s", d)
	}
	must(t, m.Check(ctx, attB, pfx("10.1.0.5/24")))
}

func TestCheck(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	m := New(f)
	addrs := pfx("10.1.0.5/24", "fd00:1::5/64")
	err := m.Check(ctx, attA, addrs)
	wantCode(t, err, cnierr.CheckFailed, "chain inet flatnet-cni-masq postrouting is missing")
	must(t, m.Setup(ctx, attA, addrs))
	must(t, m.Setup(ctx, attB, pfx("10.1.0.6/24")))
	must(t, m.Check(ctx, attA, addrs))

	// An address the rules do not cover.
	err = m.Check(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64", "10.2.0.5/24"))
	wantCode(t, err, cnierr.CheckFailed, "no masquerade rule for 10.2.0.5")
	wantCode(t, err, cnierr.CheckFailed, "map masq4 has no element for 10.2.0.5")

	// A map element removed behind our back.
	tx := f.NewTransaction()
	tx.Delete(&knftables.Element{Map: "masq6", Key: []string{"fd00:1::5"}})
	must(t, f.Fake.Run(ctx, tx))
	wantCode(t, m.Check(ctx, attA, addrs), cnierr.CheckFailed, "map masq6 has no element for fd00:1::5")

	// An element pointing elsewhere.
	tx = f.NewTransaction()
	tx.Add(&knftables.Element{Map: "masq6", Key: []string{"fd00:1::5"}, Value: []string{"goto " + ChainName(attB)}})
	must(t, f.Fake.Run(ctx, tx))
	wantCode(t, m.Check(ctx, attA, addrs), cnierr.CheckFailed, "map masq6 sends fd00:1::5 to")

	// The attachment's chain gone.
	must(t, m.Teardown(ctx, attA, nil))
	wantCode(t, m.Check(ctx, attA, addrs), cnierr.CheckFailed, "is missing")

	// The base chain flushed.
	tx = f.NewTransaction()
	tx.Flush(&knftables.Chain{Name: BaseChain})
	must(t, f.Fake.Run(ctx, tx))
	wantCode(t, m.Check(ctx, attB, pfx("10.1.0.6/24")), cnierr.CheckFailed, "postrouting has 0 rules, want 4")
}

func TestGC(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	m := New(f)
	must(t, m.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	must(t, m.Setup(ctx, attB, pfx("10.1.0.6/24")))
	must(t, m.Setup(ctx, attC, pfx("10.9.0.5/24")))

	got, err := m.Attachments(ctx, "mynet")
	must(t, err)
	wantNames := []string{ChainName(attA), ChainName(attB)}
	if ChainName(attA) > ChainName(attB) {
		wantNames = []string{ChainName(attB), ChainName(attA)}
	}
	if d := cmp.Diff(wantNames, got); d != "" {
		t.Errorf("Attachments(mynet) (-want +got):\n%s", d)
	}

	// B is still valid; A is not; othernet is not ours to collect.
	must(t, m.GC(ctx, "mynet", []Attachment{{ContainerID: "ctr-b", IfName: "eth0"}, {ContainerID: "ctr-zzz", IfName: "eth0"}}))
	want := baseDump + `add chain inet flatnet-cni-masq <ctr-a/net1@othernet> { comment "net: othernet, if: net1, id: ctr-a" ; }
add chain inet flatnet-cni-masq <ctr-b/eth0@mynet> { comment "net: mynet, if: eth0, id: ctr-b" ; }
add rule inet flatnet-cni-masq <ctr-a/net1@othernet> ip saddr 10.9.0.5 ip daddr != 10.9.0.0/24 masquerade comment "10.9.0.5; net: othernet, if: net1, id: ctr-a"
add rule inet flatnet-cni-masq <ctr-b/eth0@mynet> ip saddr 10.1.0.6 ip daddr != 10.1.0.0/24 masquerade comment "10.1.0.6; net: mynet, if: eth0, id: ctr-b"
add element inet flatnet-cni-masq masq4 { 10.1.0.6 : goto <ctr-b/eth0@mynet> }
add element inet flatnet-cni-masq masq4 { 10.9.0.5 : goto <ctr-a/net1@othernet> }
`
	if d := cmp.Diff(sortLines(want), sortLines(dump(f))); d != "" {
		t.Fatalf("after GC (-want +got):\n%s", d)
	}
	// GC with nothing stale, and on an empty ruleset, is a no-op.
	must(t, m.GC(ctx, "mynet", []Attachment{{ContainerID: "ctr-b", IfName: "eth0"}}))
	must(t, New(newFake()).GC(ctx, "mynet", nil))
}

func TestSetupRejectsBadInput(t *testing.T) {
	err := New(newFake()).Setup(context.Background(), attA, []netip.Prefix{{}})
	wantCode(t, err, cnierr.InvalidConfig, "invalid address")
	// No addresses: nothing to do, not even the table.
	f := newFake()
	must(t, New(f).Setup(context.Background(), attA, nil))
	if f.Dump() != "" {
		t.Errorf("Setup without addresses wrote:\n%s", f.Dump())
	}
}

func TestIPv4MappedAddresses(t *testing.T) {
	f := newFake()
	must(t, New(f).Setup(context.Background(), attA, pfx("::ffff:10.1.0.5/120")))
	if !strings.Contains(f.Dump(), "ip saddr 10.1.0.5 ip daddr != 10.1.0.0/24 masquerade") {
		t.Errorf("mapped address not unmapped:\n%s", f.Dump())
	}
}

// sortLines makes dumps comparable regardless of the order in which the
// fake lists chains (by name, and names are hashes).
func sortLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code uint, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want error with code %d containing %q, got nil", code, substr)
	}
	if got, _ := cnierr.Code(err); got != code {
		t.Errorf("code = %d, want %d (%v)", got, code, err)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("error %q does not contain %q", err, substr)
	}
}

// TestClassifyCodes: a kernel refusal "not supported" gets code 105, other
// failures stay as reported (so IsNotFound still works).
func TestClassifyCodes(t *testing.T) {
	wantCode(t, Classify(&nft.Error{Msg: "nftables over netlink: operation not supported", Errno: syscall.EOPNOTSUPP}), cnierr.KernelFeatureMissing, "lacks an nftables feature")
	wantCode(t, Classify(&nft.Error{Msg: "opening an nftables netlink socket: protocol not supported", Errno: syscall.EPROTONOSUPPORT}), cnierr.KernelFeatureMissing, "lacks an nftables feature")
	if err := Classify(&nft.Error{Msg: "nft -f -: Error: No such file or directory", Errno: syscall.ENOENT}); !nft.IsNotFound(err) {
		t.Errorf("ENOENT: %v", err)
	} else if _, ok := cnierr.Code(err); ok {
		t.Errorf("ENOENT got a code: %v", err)
	}
}
