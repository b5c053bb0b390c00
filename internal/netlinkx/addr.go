package netlinkx

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, kernel 6.3+): who added an
// address. The kernel stores and reports it and does nothing else with it,
// so an owner can find exactly its own addresses again, IPv6 ones included
// (which, unlike IPv4 ones, cannot carry a label). x/sys/unix lacks it.
const ifaProto = 11

// ErrNotSupported is returned (wrapped) when the kernel lacks what was
// asked, e.g. the dummy link driver.
var ErrNotSupported = errors.New("not supported by this kernel")

func addrFamily(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// AddrAddProto adds p to the link with index linkIndex, tagged with proto
// (IFA_PROTO) and, for IPv4 when label is not "", that label. Scope host
// for IPv4 keeps the address out of source address selection for traffic
// leaving the node (the kernel derives IPv6 scopes itself). An address
// already on the link is not an error.
func AddrAddProto(linkIndex int, p netip.Prefix, label string, proto uint8) error {
	a := p.Addr().Unmap()
	fam := addrFamily(a)
	req := nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	msg := nl.NewIfAddrmsg(fam)
	msg.Index = uint32(linkIndex)
	msg.Prefixlen = uint8(p.Bits())
	if a.Is4() {
		msg.Scope = unix.RT_SCOPE_HOST
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, a.AsSlice()))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, a.AsSlice()))
	if a.Is4() && label != "" {
		req.AddData(nl.NewRtAttr(unix.IFA_LABEL, nl.ZeroTerminated(label)))
	}
	req.AddData(nl.NewRtAttr(ifaProto, []byte{proto}))
	if fam == unix.AF_INET6 {
		// Usable at once: no duplicate address detection on a /128 only
		// this node answers for.
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(unix.IFA_F_NODAD)))
	}
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("adding address %s to link %d: %w", p, linkIndex, err)
	}
	return nil
}

// AddrDelPrefix removes p from the link with index linkIndex; an address
// already gone is not an error.
func AddrDelPrefix(linkIndex int, p netip.Prefix) error {
	a := p.Addr().Unmap()
	req := nl.NewNetlinkRequest(unix.RTM_DELADDR, unix.NLM_F_ACK)
	msg := nl.NewIfAddrmsg(addrFamily(a))
	msg.Index = uint32(linkIndex)
	msg.Prefixlen = uint8(p.Bits())
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, a.AsSlice()))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, a.AsSlice()))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
		return fmt.Errorf("removing address %s from link %d: %w", p, linkIndex, err)
	}
	return nil
}

// ProtoAddr is one address of AddrListProto.
type ProtoAddr struct {
	LinkIndex int
	Prefix    netip.Prefix
	Proto     uint8  // IFA_PROTO; 0 when unset (or a kernel before 6.3)
	Label     string // IPv4 only
}

// AddrListProto lists every address of the namespace (both families) with
// its link, IFA_PROTO and label, retrying interrupted dumps.
func AddrListProto() ([]ProtoAddr, error) {
	return retry("listing addresses", func() ([]ProtoAddr, error) {
		req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
		var out []ProtoAddr
		for _, m := range msgs {
			if len(m) < unix.SizeofIfAddrmsg {
				continue
			}
			hdr := nl.DeserializeIfAddrmsg(m)
			attrs, perr := nl.ParseRouteAttr(m[hdr.Len():])
			if perr != nil {
				return nil, fmt.Errorf("parsing address message: %w", perr)
			}
			pa := ProtoAddr{LinkIndex: int(hdr.Index)}
			var local, address netip.Addr
			for _, at := range attrs {
				switch at.Attr.Type {
				case unix.IFA_LOCAL:
					local, _ = netip.AddrFromSlice(at.Value)
				case unix.IFA_ADDRESS:
					address, _ = netip.AddrFromSlice(at.Value)
				case unix.IFA_LABEL:
					pa.Label = strings.TrimRight(string(at.Value), "\x00")
				case ifaProto:
					if len(at.Value) > 0 {
						pa.Proto = at.Value[0]
					}
				}
			}
			// IFA_LOCAL is the address itself; IFA_ADDRESS is the peer
			// on point-to-point links (and the only one for IPv6).
			a := local
			if !a.IsValid() {
				a = address
			}
			if !a.IsValid() {
				continue
			}
			pa.Prefix = netip.PrefixFrom(a.Unmap(), int(hdr.Prefixlen))
			out = append(out, pa)
		}
		return out, err
	})
}

// EnsureDummy returns the dummy link name, created and set up if absent.
// Without the kernel's dummy driver the error wraps ErrNotSupported; a
// link of that name that is not a dummy is an error too.
func EnsureDummy(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if IsNotFound(err) {
		err = netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
		if errors.Is(err, syscall.EOPNOTSUPP) {
			return nil, fmt.Errorf("creating dummy link %s: %w (%w)", name, ErrNotSupported, err)
		}
		if err != nil && !errors.Is(err, syscall.EEXIST) {
			return nil, fmt.Errorf("creating dummy link %s: %w", name, err)
		}
		l, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("finding link %s: %w", name, err)
	}
	if l.Type() != "dummy" {
		return nil, fmt.Errorf("link %s exists and is a %s, not a dummy; remove or rename it", name, l.Type())
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("setting %s up: %w", name, err)
	}
	return l, nil
}

// DeleteDummy removes the dummy link name; absent is not an error, a link
// of that name that is not a dummy is left alone.
func DeleteDummy(name string) error {
	l, err := netlink.LinkByName(name)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finding link %s: %w", name, err)
	}
	if l.Type() != "dummy" {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("deleting link %s: %w", name, err)
	}
	return nil
}
