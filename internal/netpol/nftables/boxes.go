package nftables

// Disjoint boxes. The kernel's concatenated interval sets (pipapo) refuse
// an element whose start or end lies inside another element ("File
// exists"), so a set may only hold disjoint boxes: `10.0.0.0/16 . any` and
// `10.0.1.5 . tcp/80` cannot both be in it. disjoint turns a pod's entries
// (their union is what matters: every element of one set has the same
// meaning) into disjoint boxes covering the same points: cut the address
// axis where any entry starts or ends, take the (protocol, port) union of
// each piece, and merge neighbouring pieces with the same union.

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/netpol"
)

// box is a closed interval on each axis: peer address, protocol, port.
type box struct {
	lo, hi   netip.Addr
	plo, phi int
	from, to int
}

type span struct{ lo, hi int }

// protoPorts is one protocol range with its merged port ranges.
type protoPorts struct {
	plo, phi int
	ports    []span
}

func (a protoPorts) equal(b protoPorts) bool {
	return a.plo == b.plo && a.phi == b.phi && slices.Equal(a.ports, b.ports)
}

func entryBox(e netpol.Entry) (box, bool) {
	p := e.Peer
	if !p.IsValid() {
		return box{}, false
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	p = p.Masked()
	b := box{lo: p.Addr(), hi: lastAddr(p), plo: 0, phi: 255, from: 0, to: 65535}
	if e.Proto != netpol.ProtoAny {
		if e.From > e.To {
			return box{}, false
		}
		b.plo, b.phi, b.from, b.to = int(e.Proto), int(e.Proto), int(e.From), int(e.To)
	}
	return b, true
}

// lastAddr is the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// disjoint returns disjoint boxes whose union is the union of bs (all of
// one address family), in address order.
func disjoint(bs []box) []box {
	if len(bs) == 0 {
		return nil
	}
	bs = slices.Clone(bs)
	slices.SortFunc(bs, func(a, b box) int { return a.lo.Compare(b.lo) })
	var cuts []netip.Addr
	for _, b := range bs {
		cuts = append(cuts, b.lo)
		if n := b.hi.Next(); n.IsValid() {
			cuts = append(cuts, n)
		}
	}
	slices.SortFunc(cuts, netip.Addr.Compare)
	cuts = slices.Compact(cuts)

	type piece struct {
		lo, hi netip.Addr
		pp     []protoPorts
	}
	var pieces []piece
	var active []box
	next := 0
	for k, lo := range cuts {
		hi := lastAddr(netip.PrefixFrom(lo, 0)) // the family's last address
		if k+1 < len(cuts) {
			hi = cuts[k+1].Prev()
		}
		for next < len(bs) && bs[next].lo.Compare(lo) <= 0 {
			active = append(active, bs[next])
			next++
		}
		active = slices.DeleteFunc(active, func(b box) bool { return b.hi.Compare(lo) < 0 })
		if len(active) == 0 {
			continue
		}
		pp := union2D(active)
		if n := len(pieces); n > 0 && pieces[n-1].hi.Next() == lo && slices.EqualFunc(pieces[n-1].pp, pp, protoPorts.equal) {
			pieces[n-1].hi = hi
			continue
		}
		pieces = append(pieces, piece{lo: lo, hi: hi, pp: pp})
	}
	var out []box
	for _, p := range pieces {
		for _, x := range p.pp {
			for _, s := range x.ports {
				out = append(out, box{lo: p.lo, hi: p.hi, plo: x.plo, phi: x.phi, from: s.lo, to: s.hi})
			}
		}
	}
	return out
}

// union2D is the (protocol, port) union of bs as protocol ranges, each
// with merged port ranges; neighbouring protocols with the same ports
// share one range.
func union2D(bs []box) []protoPorts {
	var cuts []int
	for _, b := range bs {
		cuts = append(cuts, b.plo, b.phi+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []protoPorts
	for k := 0; k+1 < len(cuts); k++ {
		plo, phi := cuts[k], cuts[k+1]-1
		var spans []span
		for _, b := range bs {
			if b.plo <= plo && b.phi >= plo {
				spans = append(spans, span{b.from, b.to})
			}
		}
		if len(spans) == 0 {
			continue
		}
		spans = mergeSpans(spans)
		if n := len(out); n > 0 && out[n-1].phi+1 == plo && slices.Equal(out[n-1].ports, spans) {
			out[n-1].phi = phi
			continue
		}
		out = append(out, protoPorts{plo: plo, phi: phi, ports: spans})
	}
	return out
}

// mergeSpans sorts s and merges overlapping and touching spans.
func mergeSpans(s []span) []span {
	slices.SortFunc(s, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if x.lo <= last.hi+1 {
			last.hi = max(last.hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// fields writes b as the peer, protocol and port fields of a set element.
func (b box) fields() []string {
	return []string{addrField(b.lo, b.hi), intField(b.plo, b.phi), intField(b.from, b.to)}
}

// addrField writes lo..hi as an address, a prefix when it is one, else a
// range.
func addrField(lo, hi netip.Addr) string {
	if lo == hi {
		return lo.String()
	}
	for bits := 0; bits < lo.BitLen(); bits++ {
		p := netip.PrefixFrom(lo, bits)
		if p.Masked().Addr() == lo && lastAddr(p) == hi {
			return p.String()
		}
	}
	return lo.String() + "-" + hi.String()
}

func intField(lo, hi int) string {
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return strconv.Itoa(lo) + "-" + strconv.Itoa(hi)
}

// elementKey joins fields as knftables writes a concatenation.
func elementKey(fields []string) string { return strings.Join(fields, " . ") }
