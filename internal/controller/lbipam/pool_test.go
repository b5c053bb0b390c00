package lbipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestParsePool(t *testing.T) {
	for _, c := range []struct {
		in, want string
		v4, v6   uint64
	}{
		{"", "(empty)", 0, 0},
		{" , ,\n", "(empty)", 0, 0},
		{"10.251.0.0/25", "10.251.0.0/25", 128, 0},
		{"10.251.0.1-10.251.0.127", "10.251.0.1-10.251.0.127", 127, 0},
		{"10.251.0.7", "10.251.0.7", 1, 0},
		{" 10.251.1.0/24 ,10.251.0.0/24", "10.251.0.0/23", 512, 0}, // sorted, adjacent merged
		{"10.0.0.0/30\n10.0.0.4 - 10.0.0.5", "10.0.0.0-10.0.0.5", 6, 0},
		{"fd00:1b::/120, 10.9.0.0/31", "10.9.0.0/31,fd00:1b::/120", 2, 256},
		{"fd00::/64", "fd00::/64", 0, 0}, // 2^64: saturates (below)
		{"fd00::1-fd00::3", "fd00::1-fd00::3", 0, 3},
	} {
		p, err := ParsePool(c.in)
		if err != nil {
			t.Errorf("ParsePool(%q): %v", c.in, err)
			continue
		}
		if got := p.String(); got != c.want {
			t.Errorf("ParsePool(%q) = %s, want %s", c.in, got, c.want)
		}
		v6 := c.v6
		if c.in == "fd00::/64" {
			v6 = ^uint64(0)
		}
		if p.Size(corev1.IPv4Protocol) != c.v4 || p.Size(corev1.IPv6Protocol) != v6 {
			t.Errorf("ParsePool(%q): sizes %d, %d, want %d, %d", c.in, p.Size(corev1.IPv4Protocol), p.Size(corev1.IPv6Protocol), c.v4, v6)
		}
	}
}

func TestParsePoolErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.251.0.1/24", `item 1 "10.251.0.1/24": host bits set; did you mean 10.251.0.0/24?`},
		{"10.251.0.0/24,10.251.0.9-10.251.0.2", `item 2 "10.251.0.9-10.251.0.2": the range ends (10.251.0.2) before it starts (10.251.0.9)`},
		{"10.0.0.0/8,10.251.0.0/24", `item 2 "10.251.0.0/24" overlaps item 1 (10.0.0.0/8)`},
		{"10.0.0.1-fd00::1", "mixes IPv4 and IPv6"},
		{"10.0.0.0/33", "not a CIDR"},
		{"lb.example", "not a CIDR, a range a-b or an address"},
		{"10.0.0.1-x", "not a range of two addresses"},
		{"fe80::1%eth0", "zone"},
		{"::ffff:10.0.0.1", "write it as 10.0.0.1"},
		{"127.0.0.0/30", "not a usable unicast address"},
		{"0.0.0.0/0", "not a usable unicast address"},
	} {
		_, err := ParsePool(c.in)
		if err == nil || !errors.Is(err, ErrInvalidPool) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParsePool(%q) = %v, want an ErrInvalidPool saying %q", c.in, err, c.want)
		}
	}
}

func TestUnionAndContains(t *testing.T) {
	a, _ := ParsePool("10.0.0.0/29")
	b, _ := ParsePool("10.0.0.4-10.0.0.9, fd00::1")
	u := Union(a, b)
	if got := u.String(); got != "10.0.0.0-10.0.0.9,fd00::1" {
		t.Errorf("union = %s", got)
	}
	for s, want := range map[string]bool{"10.0.0.0": true, "10.0.0.9": true, "10.0.0.10": false, "fd00::1": true, "fd00::2": false} {
		if got := u.Contains(netip.MustParseAddr(s)); got != want {
			t.Errorf("Contains(%s) = %v", s, got)
		}
	}
}

// FuzzParsePool: whatever parses prints as text that parses to the same
// pool, with sorted, disjoint ranges of one family each.
func FuzzParsePool(f *testing.F) {
	for _, s := range []string{"10.251.0.0/25", "10.0.0.1-10.0.0.9,fd00::/120", "1.2.3.4\n5.6.7.8", "10.0.0.0/8,10.1.0.0/16", "::-::1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePool(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidPool) {
				t.Fatalf("error %v does not wrap ErrInvalidPool", err)
			}
			return
		}
		rs := p.Ranges()
		for i, r := range rs {
			if r.First.BitLen() != r.Last.BitLen() || r.Last.Less(r.First) {
				t.Fatalf("bad range %v", r)
			}
			if i > 0 && !rs[i-1].Last.Less(r.First) {
				t.Fatalf("ranges %v and %v not sorted and disjoint", rs[i-1], r)
			}
		}
		if p.Empty() {
			return
		}
		q, err := ParsePool(p.String())
		if err != nil || q.String() != p.String() {
			t.Fatalf("%q -> %s -> %s, %v", s, p, q, err)
		}
	})
}
