package allocator

import (
	"net/netip"
	"strings"
)

// Range is one validated range: addresses RangeStart..RangeEnd (both
// inclusive) of Subnet, with Gateway (never handed out).
type Range struct {
	Subnet     netip.Prefix
	RangeStart netip.Addr
	RangeEnd   netip.Addr
	Gateway    netip.Addr
}

// RangeSet is a list of ranges of one address family; a container gets one
// address from each range set.
type RangeSet []Range

// Contains reports whether ip is within r's start..end.
func (r Range) Contains(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.BitLen() == r.RangeStart.BitLen() && r.Subnet.Contains(ip) &&
		ip.Compare(r.RangeStart) >= 0 && ip.Compare(r.RangeEnd) <= 0
}

// Overlaps reports whether r and o share an address.
func (r Range) Overlaps(o Range) bool {
	if r.RangeStart.BitLen() != o.RangeStart.BitLen() {
		return false
	}
	return r.RangeStart.Compare(o.RangeEnd) <= 0 && o.RangeStart.Compare(r.RangeEnd) <= 0
}

// usable reports whether ip may be handed out: not the gateway, not the
// subnet's network address and not an IPv4 broadcast address. The
// defaults never include network or broadcast; explicit rangeStart or
// rangeEnd values may.
func (r Range) usable(ip netip.Addr) bool {
	if ip == r.Gateway || ip == r.Subnet.Addr() {
		return false
	}
	return !(ip.Is4() && ip == lastAddr(r.Subnet))
}

func (r Range) String() string { return r.RangeStart.String() + "-" + r.RangeEnd.String() }

// RangeFor returns the range of s containing ip.
func (s RangeSet) RangeFor(ip netip.Addr) (Range, bool) {
	for _, r := range s {
		if r.Contains(ip) {
			return r, true
		}
	}
	return Range{}, false
}

// Contains reports whether any range of s contains ip.
func (s RangeSet) Contains(ip netip.Addr) bool {
	_, ok := s.RangeFor(ip)
	return ok
}

func (s RangeSet) overlap(o RangeSet) (Range, Range, bool) {
	for _, a := range s {
		for _, b := range o {
			if a.Overlaps(b) {
				return a, b, true
			}
		}
	}
	return Range{}, Range{}, false
}

func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
