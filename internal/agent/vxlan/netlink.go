package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Netlink implements Kernel on the calling thread's network namespace
// (call it inside netns.Do for another one).
type Netlink struct{}

func (Netlink) link(name string) (netlink.Link, error) {
	l, err := netlinkx.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	return l, nil
}

// Link implements Kernel.
func (n Netlink) Link(name string) (*Link, error) {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	a := l.Attrs()
	out := &Link{Name: a.Name, Index: a.Index, MTU: a.MTU, Up: a.Flags&net.FlagUp != 0}
	if len(a.HardwareAddr) == 6 {
		out.MAC = MAC(a.HardwareAddr)
	}
	if v, ok := l.(*netlink.Vxlan); ok {
		out.IsVXLAN = true
		out.VNI = uint32(v.VxlanId)
		out.Port = uint16(v.Port)
		if ip, ok := netip.AddrFromSlice(v.SrcAddr); ok {
			out.Local = ip.Unmap()
		}
		out.UnderlayIndex = v.VtepDevIndex
		out.Learning, out.UDPCSum, out.L2Miss, out.L3Miss, out.FlowBased = v.Learning, v.UDPCSum, v.L2miss, v.L3miss, v.FlowBased
		on, err := txChecksum(name)
		if err != nil {
			return nil, err
		}
		out.TxChecksumOffload = on
	}
	return out, nil
}

// CreateLink implements Kernel.
func (n Netlink) CreateLink(d Device) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = d.Name
	attrs.MTU = d.MTU
	attrs.HardwareAddr = net.HardwareAddr(d.MAC[:])
	v := &netlink.Vxlan{
		LinkAttrs:    attrs,
		VxlanId:      int(d.VNI),
		VtepDevIndex: d.UnderlayIndex,
		SrcAddr:      d.Local.AsSlice(),
		Port:         int(d.Port),
		Learning:     false,
		UDPCSum:      true,
	}
	err := netlink.LinkAdd(v)
	switch {
	case errors.Is(err, syscall.EEXIST):
		return fmt.Errorf("another VXLAN device on this node already uses VNI %d on UDP port %d (another overlay, e.g. flannel?): pick another --vxlan-vni or --vxlan-port: %w", d.VNI, d.Port, err)
	case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOTSUP):
		return fmt.Errorf("the kernel has no VXLAN support (modprobe vxlan): %w", err)
	}
	return err
}

// DeleteLink implements Kernel.
func (n Netlink) DeleteLink(name string) error {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) {
		return err
	}
	return nil
}

// UpdateLink implements Kernel.
func (n Netlink) UpdateLink(name string, u LinkUpdate) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if u.MTU != nil {
		if err := netlink.LinkSetMTU(l, *u.MTU); err != nil {
			return fmt.Errorf("setting MTU %d: %w", *u.MTU, err)
		}
	}
	if u.MAC != nil {
		if err := netlink.LinkSetHardwareAddr(l, net.HardwareAddr(u.MAC[:])); err != nil {
			return fmt.Errorf("setting MAC %s: %w", *u.MAC, err)
		}
	}
	if u.TxChecksumOffload != nil {
		if err := setTxChecksum(name, *u.TxChecksumOffload); err != nil {
			return err
		}
	}
	if u.Up {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("setting up: %w", err)
		}
	}
	return nil
}

// Addrs implements Kernel.
func (n Netlink) Addrs(name string) ([]netip.Prefix, error) {
	l, err := n.link(name)
	if err != nil {
		return nil, err
	}
	as, err := netlinkx.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AddAddr implements Kernel.
func (n Netlink) AddAddr(name string, a netip.Prefix) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(a)})
}

// DelAddr implements Kernel.
func (n Netlink) DelAddr(name string, a netip.Prefix) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	err = netlink.AddrDel(l, &netlink.Addr{IPNet: ipNet(a)})
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		return nil
	}
	return err
}

// Neighs implements Kernel.
func (n Netlink) Neighs(name string) ([]Neigh, error) {
	l, err := n.link(name)
	if err != nil {
		return nil, err
	}
	ns, err := netlinkx.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []Neigh
	for _, e := range ns {
		ip, ok := netip.AddrFromSlice(e.IP)
		if e.State&netlink.NUD_PERMANENT == 0 || !ok || len(e.HardwareAddr) != 6 {
			continue // the kernel's own entries (failed lookups) age out
		}
		out = append(out, Neigh{IP: ip.Unmap(), MAC: MAC(e.HardwareAddr)})
	}
	return out, nil
}

// FDB implements Kernel.
func (n Netlink) FDB(name string) ([]FDB, error) {
	l, err := n.link(name)
	if err != nil {
		return nil, err
	}
	es, err := netlinkx.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return nil, err
	}
	var out []FDB
	for _, e := range es {
		if len(e.HardwareAddr) != 6 {
			continue
		}
		f := FDB{MAC: MAC(e.HardwareAddr)}
		if ip, ok := netip.AddrFromSlice(e.IP); ok {
			f.Dst = ip.Unmap()
		}
		out = append(out, f)
	}
	return out, nil
}

// WriteEntries implements Kernel: one netlink batch (netlinkx.RouteBatch).
func (n Netlink) WriteEntries(name string, cs []EntryChange) []error {
	errs := make([]error, len(cs))
	l, err := n.link(name)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	var b netlinkx.RouteBatch
	for _, c := range cs {
		op := netlinkx.OpReplace
		if c.Del {
			op = netlinkx.OpDelete
		}
		e := netlinkx.BatchNeigh{LinkIndex: l.Attrs().Index}
		if c.Neigh != nil {
			e.IP, e.MAC = c.Neigh.IP, net.HardwareAddr(c.Neigh.MAC[:])
		} else {
			e.IP, e.MAC, e.FDB = c.FDB.Dst, net.HardwareAddr(c.FDB.MAC[:]), true
		}
		b.Neigh(op, e)
	}
	res, err := b.Exec()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return res
}
