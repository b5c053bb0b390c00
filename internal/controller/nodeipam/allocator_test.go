package nodeipam

import (
	"errors"
	"net/netip"
	"testing"
)

func mustAlloc(t *testing.T, cluster string, mask int) *Allocator {
	t.Helper()
	a, err := NewAllocator(netip.MustParsePrefix(cluster), mask)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestNewAllocatorRejects(t *testing.T) {
	for _, tc := range []struct {
		cidr string
		mask int
	}{
		{"10.244.0.1/16", 24}, // host bits
		{"10.244.0.0/16", 8},  // mask shorter than the cluster
		{"10.244.0.0/16", 33}, // longer than an address
		{"10.0.0.0/8", 30},    // 2^22 subnets
		{"fd00::/48", 129},
	} {
		if _, err := NewAllocator(netip.MustParsePrefix(tc.cidr), tc.mask); err == nil {
			t.Errorf("NewAllocator(%s, %d): no error", tc.cidr, tc.mask)
		}
	}
}

func TestAllocateInOrderThenExhausted(t *testing.T) {
	a := mustAlloc(t, "10.244.0.0/22", 24)
	var got []string
	for range 4 {
		p, err := a.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.String())
	}
	want := []string{"10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allocations %v, want %v", got, want)
		}
	}
	if _, err := a.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("fifth allocation: %v, want ErrExhausted", err)
	}
	if a.Used() != 4 || a.Size() != 4 {
		t.Errorf("used %d size %d", a.Used(), a.Size())
	}
	// A freed subnet is the only one left, so it comes back.
	if err := a.Release(netip.MustParsePrefix("10.244.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if p, err := a.Allocate(); err != nil || p.String() != "10.244.1.0/24" {
		t.Fatalf("after release: %v %v", p, err)
	}
}

func TestRoundRobinReusesFreedLast(t *testing.T) {
	a := mustAlloc(t, "10.244.0.0/16", 24)
	p0, _ := a.Allocate()
	p1, _ := a.Allocate()
	if err := a.Release(p0); err != nil {
		t.Fatal(err)
	}
	p2, _ := a.Allocate()
	if p2 == p0 || p2.String() != "10.244.2.0/24" || p1.String() != "10.244.1.0/24" {
		t.Errorf("got %s after releasing %s (and holding %s)", p2, p0, p1)
	}
}

func TestOccupySkipsRecorded(t *testing.T) {
	a := mustAlloc(t, "10.244.0.0/16", 24)
	for _, p := range []string{"10.244.0.0/24", "10.244.1.0/24", "10.244.3.0/24"} {
		if n, err := a.Occupy(netip.MustParsePrefix(p)); err != nil || n != 1 {
			t.Fatalf("Occupy(%s) = %d, %v", p, n, err)
		}
	}
	// Occupying again marks nothing new.
	if n, _ := a.Occupy(netip.MustParsePrefix("10.244.1.0/24")); n != 0 {
		t.Errorf("second Occupy marked %d", n)
	}
	for _, want := range []string{"10.244.2.0/24", "10.244.4.0/24"} {
		if p, err := a.Allocate(); err != nil || p.String() != want {
			t.Fatalf("Allocate = %v %v, want %s", p, err, want)
		}
	}
}

func TestOccupyLargerAndSmallerPrefixes(t *testing.T) {
	a := mustAlloc(t, "10.244.0.0/16", 24)
	if n, err := a.Occupy(netip.MustParsePrefix("10.244.8.0/22")); err != nil || n != 4 {
		t.Fatalf("a /22 = %d subnets, %v", n, err)
	}
	if n, err := a.Occupy(netip.MustParsePrefix("10.244.20.128/25")); err != nil || n != 1 {
		t.Fatalf("a /25 = %d subnets, %v", n, err)
	}
	if a.Used() != 5 {
		t.Errorf("used %d", a.Used())
	}
	if _, err := a.Occupy(netip.MustParsePrefix("10.245.0.0/24")); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("outside: %v", err)
	}
	if _, err := a.Occupy(netip.MustParsePrefix("fd00::/64")); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("other family: %v", err)
	}
	if err := a.Release(netip.MustParsePrefix("10.244.8.0/22")); err != nil || a.Used() != 1 {
		t.Errorf("release /22: %v, used %d", err, a.Used())
	}
	// A prefix holding the whole cluster CIDR covers every subnet.
	if n, err := a.Occupy(netip.MustParsePrefix("10.0.0.0/8")); err != nil || n != 255 {
		t.Errorf("a /8 = %d, %v", n, err)
	}
	if _, err := a.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Errorf("after /8: %v", err)
	}
}

func TestIPv6AndOddMasks(t *testing.T) {
	a := mustAlloc(t, "fd00:10:244::/56", 64)
	a.Occupy(netip.MustParsePrefix("fd00:10:244::/64"))
	if p, err := a.Allocate(); err != nil || p.String() != "fd00:10:244:1::/64" {
		t.Fatalf("v6: %v %v", p, err)
	}
	// Subnet bits straddling the 64-bit halves.
	b := mustAlloc(t, "fd00::/60", 68)
	for range 17 {
		if _, err := b.Allocate(); err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := b.Allocate(); p.String() != "fd00:0:0:1:1000::/68" {
		t.Errorf("18th /68 = %s", p)
	}
	if err := b.Release(netip.MustParsePrefix("fd00:0:0:1:1000::/68")); err != nil || b.Used() != 17 {
		t.Errorf("release: %v used %d", err, b.Used())
	}
	// Whole-address subnets: a /30 cut into /32s.
	c := mustAlloc(t, "10.9.9.4/30", 32)
	c.Occupy(netip.MustParsePrefix("10.9.9.5/32"))
	var got []string
	for range 3 {
		p, _ := c.Allocate()
		got = append(got, p.String())
	}
	if got[0] != "10.9.9.4/32" || got[1] != "10.9.9.6/32" || got[2] != "10.9.9.7/32" {
		t.Errorf("/32s: %v", got)
	}
}

// FuzzAllocator feeds arbitrary cluster CIDRs, mask sizes and prefixes
// (as Nodes may carry): nothing may panic, and every allocation must lie
// inside the cluster CIDR and never be handed out twice.
func FuzzAllocator(f *testing.F) {
	f.Add("10.244.0.0/16", 24, "10.244.3.0/24", "10.244.0.0/23")
	f.Add("fd00::/48", 64, "fd00::/56", "::/0")
	f.Add("10.0.0.0/30", 32, "10.0.0.1/32", "1.2.3.4/32")
	f.Fuzz(func(t *testing.T, cluster string, mask int, occ, rel string) {
		c, err := netip.ParsePrefix(cluster)
		if err != nil {
			return
		}
		a, err := NewAllocator(c, mask)
		if err != nil {
			return
		}
		if p, err := netip.ParsePrefix(occ); err == nil {
			a.Occupy(p)
		}
		if p, err := netip.ParsePrefix(rel); err == nil {
			a.Release(p)
		}
		seen := map[netip.Prefix]bool{}
		for range min(a.Size(), 300) {
			p, err := a.Allocate()
			if err != nil {
				if !errors.Is(err, ErrExhausted) {
					t.Fatal(err)
				}
				break
			}
			if !c.Contains(p.Addr()) || p.Bits() != mask || seen[p] {
				t.Fatalf("bad allocation %s in %s/%d (seen %v)", p, c, mask, seen[p])
			}
			seen[p] = true
		}
		if a.Used() < 0 || a.Used() > a.Size() {
			t.Fatalf("used %d of %d", a.Used(), a.Size())
		}
	})
}
