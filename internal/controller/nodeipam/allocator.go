package nodeipam

// The allocator is pure data: a bitmap over the node subnets of the
// cluster CIDR. The controller (controller.go) owns the only instance and
// feeds it what the Nodes already hold before it hands anything out, which
// is what makes allocations stable across controller restarts: the API
// server (spec.podCIDR) is the store, this is only an index over it.

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
)

// maxSubnetBits caps the number of node subnets at 2^20 (a 128 KiB
// bitmap): a /8 cut into /28s is still fine; larger splits are a mistake.
const maxSubnetBits = 20

var (
	// ErrExhausted is returned by Allocate when every subnet is taken.
	ErrExhausted = errors.New("cluster CIDR has no free node subnet")
	// ErrOutOfRange is returned for a prefix outside the cluster CIDR.
	ErrOutOfRange = errors.New("prefix is outside the cluster CIDR")
)

// Allocator hands out the node subnets of one cluster CIDR. It is not
// safe for concurrent use.
type Allocator struct {
	cluster  netip.Prefix
	maskSize int
	size     int      // number of subnets
	used     []uint64 // bitmap: subnet i is bit i%64 of used[i/64]
	count    int      // subnets in use
	next     int      // where the next search starts (round-robin)
}

// NewAllocator returns an allocator for the subnets of size maskSize
// (e.g. 24) inside cluster (e.g. 10.244.0.0/16).
func NewAllocator(cluster netip.Prefix, maskSize int) (*Allocator, error) {
	if !cluster.IsValid() {
		return nil, fmt.Errorf("invalid cluster CIDR")
	}
	if cluster.Masked() != cluster {
		return nil, fmt.Errorf("cluster CIDR %s has host bits set (did you mean %s?)", cluster, cluster.Masked())
	}
	if maskSize < cluster.Bits() || maskSize > cluster.Addr().BitLen() {
		return nil, fmt.Errorf("node CIDR mask size %d must be between the cluster CIDR's /%d and /%d", maskSize, cluster.Bits(), cluster.Addr().BitLen())
	}
	if maskSize-cluster.Bits() > maxSubnetBits {
		return nil, fmt.Errorf("cluster CIDR %s cut into /%d gives 2^%d node subnets, more than 2^%d: use a larger node CIDR mask size (a smaller /N)",
			cluster, maskSize, maskSize-cluster.Bits(), maxSubnetBits)
	}
	size := 1 << (maskSize - cluster.Bits())
	return &Allocator{cluster: cluster, maskSize: maskSize, size: size, used: make([]uint64, (size+63)/64)}, nil
}

// Size is the number of node subnets.
func (a *Allocator) Size() int { return a.size }

// Used is the number of node subnets in use.
func (a *Allocator) Used() int { return a.count }

// Cluster is the cluster CIDR.
func (a *Allocator) Cluster() netip.Prefix { return a.cluster }

// Allocate returns the next free subnet, searching round-robin from the
// last one handed out, so that a subnet just freed is reused last (peers
// may still have a route to it).
func (a *Allocator) Allocate() (netip.Prefix, error) {
	if a.count == a.size {
		return netip.Prefix{}, fmt.Errorf("%w: all %d /%d subnets of %s are in use", ErrExhausted, a.size, a.maskSize, a.cluster)
	}
	for n := 0; n < a.size; n++ {
		i := (a.next + n) % a.size
		if !a.isSet(i) {
			a.set(i)
			a.next = (i + 1) % a.size
			return a.subnet(i), nil
		}
	}
	panic("nodeipam: count and bitmap disagree") // unreachable
}

// Occupy marks the subnets p covers as used: p may be a node subnet, a
// larger prefix (every subnet inside), or a smaller one (the subnet that
// holds it). It returns ErrOutOfRange when p does not overlap the cluster
// CIDR, and how many subnets were newly marked.
func (a *Allocator) Occupy(p netip.Prefix) (int, error) {
	lo, hi, err := a.span(p)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := lo; i <= hi; i++ {
		if !a.isSet(i) {
			a.set(i)
			n++
		}
	}
	return n, nil
}

// Release frees the subnets p covers (as Occupy reads p). Releasing a free
// subnet is not an error.
func (a *Allocator) Release(p netip.Prefix) error {
	lo, hi, err := a.span(p)
	if err != nil {
		return err
	}
	for i := lo; i <= hi; i++ {
		if a.isSet(i) {
			a.used[i/64] &^= 1 << (i % 64)
			a.count--
		}
	}
	return nil
}

// span returns the first and last subnet index p covers.
func (a *Allocator) span(p netip.Prefix) (int, int, error) {
	if !p.IsValid() || p.Addr().BitLen() != a.cluster.Addr().BitLen() || !a.cluster.Overlaps(p) {
		return 0, 0, fmt.Errorf("%w: %s is not inside %s", ErrOutOfRange, p, a.cluster)
	}
	p = p.Masked()
	if p.Bits() < a.cluster.Bits() { // p holds the whole cluster CIDR
		return 0, a.size - 1, nil
	}
	first := a.index(p.Addr())
	if p.Bits() >= a.maskSize {
		return first, first, nil
	}
	return first, first + (1 << (a.maskSize - p.Bits())) - 1, nil
}

// index is the subnet number of addr, which must be inside the cluster
// CIDR: bits [cluster.Bits(), maskSize) of the address.
func (a *Allocator) index(addr netip.Addr) int {
	hi, lo := u128(addr)
	shift := uint(addr.BitLen() - a.maskSize)
	// (hi,lo) >> shift, then keep maskSize-clusterBits bits.
	var v uint64
	switch {
	case shift >= 64:
		v = hi >> (shift - 64)
	case shift == 0:
		v = lo
	default:
		v = lo>>shift | hi<<(64-shift)
	}
	return int(v & (1<<uint(a.maskSize-a.cluster.Bits()) - 1))
}

// subnet is the i-th node subnet.
func (a *Allocator) subnet(i int) netip.Prefix {
	hi, lo := u128(a.cluster.Addr())
	shift := uint(a.cluster.Addr().BitLen() - a.maskSize)
	v := uint64(i)
	var addHi, addLo uint64
	switch {
	case shift >= 64:
		addHi = v << (shift - 64)
	case shift == 0:
		addLo = v
	default:
		addLo = v << shift
		addHi = v >> (64 - shift)
	}
	var carry uint64
	lo, carry = bits.Add64(lo, addLo, 0)
	hi, _ = bits.Add64(hi, addHi, carry)
	return netip.PrefixFrom(fromU128(hi, lo, a.cluster.Addr().Is4()), a.maskSize)
}

func (a *Allocator) isSet(i int) bool { return a.used[i/64]&(1<<(i%64)) != 0 }

func (a *Allocator) set(i int) {
	a.used[i/64] |= 1 << (i % 64)
	a.count++
}

// u128 is addr as a 128-bit number; an IPv4 address is its 32 bits.
func u128(addr netip.Addr) (hi, lo uint64) {
	if addr.Is4() {
		b := addr.As4()
		return 0, uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	}
	b := addr.As16()
	for i := 0; i < 8; i++ {
		hi = hi<<8 | uint64(b[i])
		lo = lo<<8 | uint64(b[8+i])
	}
	return hi, lo
}

func fromU128(hi, lo uint64, is4 bool) netip.Addr {
	if is4 {
		return netip.AddrFrom4([4]byte{byte(lo >> 24), byte(lo >> 16), byte(lo >> 8), byte(lo)})
	}
	var b [16]byte
	for i := 7; i >= 0; i-- {
		b[i] = byte(hi)
		hi >>= 8
		b[8+i] = byte(lo)
		lo >>= 8
	}
	return netip.AddrFrom16(b)
}
