package backend

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// FindUnderlay finds the interface that holds ip in the calling thread's
// network namespace: its name, index, MTU and the networks of its
// addresses. A node IP on no interface is an error.
func FindUnderlay(ip netip.Addr) (Underlay, error) {
	u := Underlay{IP: ip}
	addrs, err := netlinkx.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return u, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if x, ok := netip.AddrFromSlice(a.IP); ok && x.Unmap() == ip {
			u.Index = a.LinkIndex
			break
		}
	}
	if u.Index == 0 {
		return u, fmt.Errorf("no interface of this node has the address %s", ip)
	}
	l, err := netlink.LinkByIndex(u.Index)
	if err != nil {
		return u, fmt.Errorf("interface #%d (holding %s): %w", u.Index, ip, err)
	}
	u.Link, u.MTU = l.Attrs().Name, l.Attrs().MTU
	for _, a := range addrs {
		x, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.LinkIndex != u.Index || a.Scope != int(netlink.SCOPE_UNIVERSE) {
			continue
		}
		ones, _ := a.Mask.Size()
		u.Prefixes = append(u.Prefixes, netip.PrefixFrom(x.Unmap(), ones).Masked())
	}
	return u, nil
}
