// Package conntrack cuts established flows that a policy change now
// denies. The policy chain accepts packets of established connections
// before it looks at any rule (that is what lets replies through), so
// without this a connection opened while a policy allowed it would live on
// after the policy stopped allowing it (calico#2759). Deleting the flow's
// conntrack entry sends its next packet through the rules again as a new
// flow, where it is dropped.
//
// Design. Which flows to cut is a pure function of the flow and the local
// pods' compiled rules (Denied); the kernel work is one dump of the
// table with a per-entry match and a delete for each hit
// (netlink.ConntrackDeleteFilters), behind Interface so tests use Fake.
// A flow is described as the policy sees it in the forward hook: the
// original source (before any SNAT) and the destination after DNAT, which
// conntrack keeps as the reply's source.
package conntrack

import (
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netpol"
)

// Flow is one conntrack entry as a policy check sees it.
type Flow struct {
	Src   netip.Addr
	Dst   netip.Addr // after DNAT
	Proto netpol.Protocol
	Port  uint16 // destination port after DNAT; 0 for protocols without ports
}

// Interface deletes the flows of one address family that match.
type Interface interface {
	DeleteMatching(ipv6 bool, match func(Flow) bool) (int, error)
}

// Pods are the rules of this node's pods, by address.
type Pods map[netip.Addr]*netpol.Pod

// Denied reports whether the rules of pods now drop f: its source's
// egress (when the source is one of pods) or its destination's ingress
// (when the destination is).
func (pods Pods) Denied(f Flow) bool {
	if p := pods[f.Src]; p != nil && !p.Egress.Empty() && !p.Egress.Check(f.Dst, f.Proto, f.Port).Allowed {
		return true
	}
	if p := pods[f.Dst]; p != nil && !p.Ingress.Empty() && !p.Ingress.Check(f.Src, f.Proto, f.Port).Allowed {
		return true
	}
	return false
}

// Cut deletes the flows of both families that pods deny, and returns how
// many it deleted.
func Cut(ct Interface, pods Pods) (int, error) {
	total := 0
	for _, v6 := range []bool{false, true} {
		n, err := ct.DeleteMatching(v6, pods.Denied)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// Netlink is the kernel's conntrack table in the caller's namespace.
type Netlink struct{}

type matchFunc func(Flow) bool

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (m matchFunc) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	f, ok := flowOf(c)
	return ok && m(f)
}

// DeleteMatching implements Interface.
func (Netlink) DeleteMatching(ipv6 bool, match func(Flow) bool) (int, error) {
	family := netlink.InetFamily(unix.AF_INET)
	if ipv6 {
		family = unix.AF_INET6
	}
	n, err := netlinkx.ConntrackDeleteFilters(netlink.ConntrackTable, family, matchFunc(match))
	return int(n), err
}

func flowOf(c *netlink.ConntrackFlow) (Flow, bool) {
	src, ok1 := netip.AddrFromSlice(c.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(c.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return Flow{}, false
	}
	f := Flow{Src: src.Unmap(), Dst: dst.Unmap(), Proto: netpol.Protocol(c.Forward.Protocol)}
	switch f.Proto {
	case netpol.ProtoTCP, netpol.ProtoUDP, netpol.ProtoSCTP:
		f.Port = c.Reverse.SrcPort
	}
	return f, true
}

// Fake is an in-memory table for tests.
type Fake struct {
	mu    sync.Mutex
	Flows map[bool][]Flow
}

// NewFake returns a fake holding flows (IPv4 and IPv6 by their addresses).
func NewFake(flows ...Flow) *Fake {
	f := &Fake{Flows: map[bool][]Flow{}}
	for _, fl := range flows {
		f.Flows[fl.Src.Is6()] = append(f.Flows[fl.Src.Is6()], fl)
	}
	return f
}

// Len returns how many flows of the family are left.
func (f *Fake) Len(ipv6 bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.Flows[ipv6])
}

// DeleteMatching implements Interface.
func (f *Fake) DeleteMatching(ipv6 bool, match func(Flow) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.Flows[ipv6][:0]
	n := 0
	for _, fl := range f.Flows[ipv6] {
		if match(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.Flows[ipv6] = kept
	return n, nil
}
