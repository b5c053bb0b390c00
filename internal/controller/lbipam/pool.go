package lbipam

// The pool is pure data: sorted, disjoint address ranges per family, read
// from text such as "10.251.0.0/25, 10.251.1.10-10.251.1.20, fd00:lb::/120".

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ErrInvalidPool is wrapped by every error ParsePool returns.
var ErrInvalidPool = errors.New("invalid load-balancer IP pool")

// Range is the addresses First..Last (inclusive, one family).
type Range struct {
	First, Last netip.Addr
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	// A range that is exactly a prefix prints as one.
	for bits := 0; bits <= r.First.BitLen(); bits++ {
		p := netip.PrefixFrom(r.First, bits)
		if p.Masked().Addr() == r.First && lastOf(p) == r.Last {
			return p.String()
		}
	}
	return r.First.String() + "-" + r.Last.String()
}

// Contains reports whether a is in r.
func (r Range) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

func (r Range) overlaps(o Range) bool {
	return r.First.BitLen() == o.First.BitLen() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// Pool is a set of address ranges, sorted, disjoint and not adjacent
// (adjacent ranges are merged). The zero Pool is empty.
type Pool struct {
	ranges []Range
}

// Ranges returns the pool's ranges in order (IPv4 first).
func (p Pool) Ranges() []Range { return slices.Clone(p.ranges) }

// Empty reports whether the pool holds no address.
func (p Pool) Empty() bool { return len(p.ranges) == 0 }

// String is the pool in ParsePool's syntax.
func (p Pool) String() string {
	if p.Empty() {
		return "(empty)"
	}
	var ss []string
	for _, r := range p.ranges {
		ss = append(ss, r.String())
	}
	return strings.Join(ss, ",")
}

// Contains reports whether a is in the pool.
func (p Pool) Contains(a netip.Addr) bool {
	for _, r := range p.ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// Family returns the ranges of one family.
func (p Pool) Family(f corev1.IPFamily) []Range {
	var out []Range
	for _, r := range p.ranges {
		if familyOf(r.First) == f {
			out = append(out, r)
		}
	}
	return out
}

// Size is the number of addresses of family f, saturated at MaxUint64.
func (p Pool) Size(f corev1.IPFamily) uint64 {
	var n uint64
	for _, r := range p.Family(f) {
		d, ok := span(r)
		if !ok || n+d < n {
			return ^uint64(0)
		}
		n += d
	}
	return n
}

// Union is the pool holding the addresses of both pools.
func Union(a, b Pool) Pool {
	return normalize(append(slices.Clone(a.ranges), b.ranges...))
}

// ParsePool reads a pool: items separated by commas (or newlines, for a
// ConfigMap value), each a CIDR ("10.251.0.0/25"), an inclusive range
// ("10.251.1.10-10.251.1.20") or one address, IPv4 or IPv6. Blank items
// are ignored. Overlapping items are an error: one of them is a typo.
func ParsePool(text string) (Pool, error) {
	var rs []Range
	item := 0
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == '\n' }) {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		item++
		r, err := parseItem(f)
		if err != nil {
			return Pool{}, fmt.Errorf("%w: item %d %q: %w", ErrInvalidPool, item, f, err)
		}
		for j, o := range rs {
			if r.overlaps(o) {
				return Pool{}, fmt.Errorf("%w: item %d %q overlaps item %d (%s)", ErrInvalidPool, item, f, j+1, o)
			}
		}
		rs = append(rs, r)
	}
	return normalize(rs), nil
}

func parseItem(s string) (Range, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Range{}, errors.New("not a CIDR (want e.g. 10.251.0.0/25)")
		}
		if err := checkAddr(p.Addr()); err != nil {
			return Range{}, err
		}
		if p.Masked() != p {
			return Range{}, fmt.Errorf("host bits set; did you mean %s?", p.Masked())
		}
		return Range{p.Addr(), lastOf(p)}, nil
	}
	if a, b, ok := strings.Cut(s, "-"); ok {
		first, err1 := netip.ParseAddr(strings.TrimSpace(a))
		last, err2 := netip.ParseAddr(strings.TrimSpace(b))
		if err1 != nil || err2 != nil {
			return Range{}, errors.New("not a range of two addresses (want e.g. 10.251.1.10-10.251.1.20)")
		}
		for _, x := range []netip.Addr{first, last} {
			if err := checkAddr(x); err != nil {
				return Range{}, err
			}
		}
		if first.BitLen() != last.BitLen() {
			return Range{}, errors.New("the range mixes IPv4 and IPv6")
		}
		if last.Less(first) {
			return Range{}, fmt.Errorf("the range ends (%s) before it starts (%s)", last, first)
		}
		return Range{first, last}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return Range{}, errors.New("not a CIDR, a range a-b or an address")
	}
	if err := checkAddr(a); err != nil {
		return Range{}, err
	}
	return Range{a, a}, nil
}

func checkAddr(a netip.Addr) error {
	switch {
	case a.Zone() != "":
		return errors.New("an IPv6 zone has no place in a pool")
	case a.Is4In6():
		return fmt.Errorf("IPv4-mapped IPv6 address; write it as %s", a.Unmap())
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast(), a.IsLinkLocalUnicast():
		return fmt.Errorf("%s is not a usable unicast address", a)
	}
	return nil
}

// normalize sorts ranges (IPv4 first) and merges overlapping or adjacent
// ones.
func normalize(rs []Range) Pool {
	slices.SortFunc(rs, func(a, b Range) int { return a.First.Compare(b.First) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.First.BitLen() == r.First.BitLen() && (last.overlaps(r) || last.Last.Next() == r.First) {
				if last.Last.Less(r.Last) {
					last.Last = r.Last
				}
				continue
			}
		}
		out = append(out, r)
	}
	return Pool{ranges: out}
}

// lastOf is the last address of p.
func lastOf(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// span is Last-First+1, false when it does not fit in a uint64.
func span(r Range) (uint64, bool) {
	f, l := r.First.As16(), r.Last.As16()
	var hi, lo [8]byte
	borrow := 0
	// l - f over 128 bits, byte by byte from the low end.
	var d [16]byte
	for i := 15; i >= 0; i-- {
		v := int(l[i]) - int(f[i]) - borrow
		borrow = 0
		if v < 0 {
			v += 256
			borrow = 1
		}
		d[i] = byte(v)
	}
	copy(hi[:], d[:8])
	copy(lo[:], d[8:])
	if hi != [8]byte{} {
		return 0, false
	}
	var n uint64
	for _, x := range lo {
		n = n<<8 | uint64(x)
	}
	if n == ^uint64(0) {
		return 0, false
	}
	return n + 1, true
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}
