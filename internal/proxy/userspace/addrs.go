package userspace

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Addrs is the node's address state as the userspace mode sees it,
// behind an interface so most tests run on a fake; Netlink is the kernel.
type Addrs interface {
	// List returns, in one read, the service addresses this mode holds
	// (held) and every other address of the namespace (other).
	List() (held, other []netip.Addr, err error)
	// Add holds a (a /32 or /128) on the mode's device; Del releases it.
	// Both are idempotent.
	Add(a netip.Addr) error
	Del(a netip.Addr) error
}

const (
	// DefaultInterface is the dummy device the service addresses go on
	// when the kernel has the dummy driver.
	DefaultInterface = "flatnet-svc"
	// AddrProto tags the addresses this mode adds (IFA_PROTO, kernel 6.3+:
	// a number the kernel keeps and reports and otherwise ignores), on
	// whichever device, so a restarted agent, or Cleanup, finds exactly
	// its own, IPv6 ones included. 0-3 are the kernel's own.
	AddrProto = 0xf1
	// loLabel also marks the IPv4 ones on lo, for `ip addr` readers
	// (iproute2 before 6.3 does not show the protocol).
	loLabel = "lo:flatnetsvc"
)

// Netlink is Addrs on the kernel of the calling thread's namespace. The
// device is a dummy named Interface when the kernel can make one, else lo
// (this project's test kernels have no dummy driver): either way local
// delivery works the same, and AddrProto, not the device, says what is
// ours.
type Netlink struct {
	Interface string // DefaultInterface when ""

	index int // the device's, once found
	label string
	where map[netip.Addr]netlinkx.ProtoAddr // held addresses by what List and Add saw
}

var _ Addrs = (*Netlink)(nil)

func (n *Netlink) device() (int, error) {
	if n.index != 0 {
		return n.index, nil
	}
	name := n.Interface
	if name == "" {
		name = DefaultInterface
	}
	l, err := netlinkx.EnsureDummy(name)
	if errors.Is(err, netlinkx.ErrNotSupported) {
		l, err = netlinkx.LinkByName("lo")
		n.label = loLabel
	}
	if err != nil {
		return 0, fmt.Errorf("service address device: %w", err)
	}
	n.index = l.Attrs().Index
	return n.index, nil
}

// List implements Addrs.
func (n *Netlink) List() (held, other []netip.Addr, err error) {
	all, err := netlinkx.AddrListProto()
	if err != nil {
		return nil, nil, err
	}
	n.where = map[netip.Addr]netlinkx.ProtoAddr{}
	for _, a := range all {
		// The label too: a kernel before 6.3 drops IFA_PROTO, and
		// IPv4 addresses on lo are still found by it.
		if a.Proto == AddrProto || a.Label == loLabel {
			held = append(held, a.Prefix.Addr())
			n.where[a.Prefix.Addr()] = a
		} else {
			other = append(other, a.Prefix.Addr())
		}
	}
	return held, other, nil
}

// Add implements Addrs.
func (n *Netlink) Add(a netip.Addr) error {
	idx, err := n.device()
	if err != nil {
		return err
	}
	p := netip.PrefixFrom(a, a.BitLen())
	if err := netlinkx.AddrAddProto(idx, p, n.label, AddrProto); err != nil {
		return err
	}
	if n.where == nil {
		n.where = map[netip.Addr]netlinkx.ProtoAddr{}
	}
	n.where[a] = netlinkx.ProtoAddr{LinkIndex: idx, Prefix: p, Proto: AddrProto}
	return nil
}

// Del implements Addrs: a goes from whichever device List or Add saw it
// on (a restarted agent may find it on lo, or on the dummy).
func (n *Netlink) Del(a netip.Addr) error {
	w, ok := n.where[a]
	if !ok {
		return nil
	}
	if err := netlinkx.AddrDelPrefix(w.LinkIndex, w.Prefix); err != nil {
		return err
	}
	delete(n.where, a)
	return nil
}
