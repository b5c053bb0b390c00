package local

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Netlink is Addrs on the kernel: the loopback device of the current
// network namespace.
type Netlink struct{}

func lo() (netlink.Link, error) {
	l, err := netlinkx.LinkByName("lo")
	if err != nil {
		return nil, fmt.Errorf("loopback device: %w", err)
	}
	return l, nil
}

func addr(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is4() {
		na.Label = Label
	}
	return na
}

// Labelled implements Addrs.
func (Netlink) Labelled() ([]netip.Addr, error) {
	l, err := lo()
	if err != nil {
		return nil, err
	}
	list, err := netlinkx.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.Label == Label {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// Has implements Addrs.
func (Netlink) Has(a netip.Addr) (bool, error) {
	list, err := netlinkx.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return false, err
	}
	for _, x := range list {
		if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.Unmap() == a {
			return true, nil
		}
	}
	return false, nil
}

// Add implements Addrs.
func (Netlink) Add(a netip.Addr) error {
	l, err := lo()
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, addr(a)); err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}

// Del implements Addrs.
func (Netlink) Del(a netip.Addr) error {
	l, err := lo()
	if err != nil {
		return err
	}
	if err := netlink.AddrDel(l, addr(a)); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
		return err
	}
	return nil
}
