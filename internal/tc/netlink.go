package tc

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Netlink is the Kernel of the calling thread's network namespace.
type Netlink struct{}

var _ Kernel = Netlink{}

// KernelClock reads the packet scheduler's tick length.
func KernelClock() Clock { return Clock{TicksPerUsec: netlink.TickInUsec()} }

var (
	rootHandle    = netlink.MakeHandle(1, 0)
	ingressHandle = netlink.MakeHandle(0xffff, 0)
)

func toLink(l netlink.Link) Link {
	a := l.Attrs()
	return Link{Index: a.Index, Name: a.Name, Kind: l.Type(), Alias: a.Alias, MAC: a.HardwareAddr.String(), MTU: a.MTU, Up: a.Flags&net.FlagUp != 0, Parent: a.ParentIndex}
}

// randomMAC returns a random locally administered unicast address, as
// the kernel would give an IFB; choosing it ourselves saves reading it back.
func randomMAC() (net.HardwareAddr, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	b[0] = b[0]&^0x01 | 0x02
	return net.HardwareAddr(b), nil
}

// AddIFB implements Kernel.
func (Netlink) AddIFB(name, alias string, mtu int) (Link, error) {
	mac, err := randomMAC()
	if err != nil {
		return Link{}, fmt.Errorf("making a MAC address for IFB %s: %w", name, err)
	}
	ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{
		Name:         name,
		Flags:        net.FlagUp,
		MTU:          mtu,
		HardwareAddr: mac,
		// As the reference plugin: no TX queue length on IFBs (see
		// containernetworking/plugins#1097); the root TBF queues instead.
		TxQLen: 0,
	}}
	if err := netlink.LinkAdd(ifb); err != nil {
		switch {
		case errors.Is(err, unix.EEXIST):
			return Link{}, fmt.Errorf("creating IFB %s: %w (%w)", name, ErrExist, err)
		case errors.Is(err, unix.EOPNOTSUPP):
			return Link{}, fmt.Errorf("creating IFB %s: %w", name, featureErr(FeatureIFB, err))
		}
		return Link{}, fmt.Errorf("creating IFB %s: %w", name, err)
	}
	// The kernel ignores IFLA_IFALIAS when creating a link; set it now.
	if alias != "" {
		if err := netlink.LinkSetAlias(ifb, alias); err != nil {
			_ = netlink.LinkDel(ifb)
			return Link{}, fmt.Errorf("setting alias %q on IFB %s: %w", alias, name, err)
		}
	}
	if ifb.Index == 0 {
		_ = netlink.LinkDel(ifb)
		return Link{}, fmt.Errorf("creating IFB %s: it vanished right after creation", name)
	}
	return Link{Index: ifb.Index, Name: name, Kind: "ifb", Alias: alias, MAC: mac.String(), MTU: mtu, Up: true}, nil
}

// LinkByName implements Kernel.
func (Netlink) LinkByName(name string) (Link, bool, error) {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return Link{}, false, nil
	}
	if err != nil {
		return Link{}, false, fmt.Errorf("looking up link %s: %w", name, err)
	}
	return toLink(l), true, nil
}

// LinkByIndex implements Kernel.
func (Netlink) LinkByIndex(index int) (Link, bool, error) {
	l, err := netlink.LinkByIndex(index)
	if netlinkx.IsNotFound(err) || errors.Is(err, unix.ENODEV) {
		return Link{}, false, nil
	}
	if err != nil {
		return Link{}, false, fmt.Errorf("looking up link index %d: %w", index, err)
	}
	return toLink(l), true, nil
}

// IFBs implements Kernel.
func (Netlink) IFBs() ([]Link, error) {
	all, err := netlinkx.LinkList()
	if err != nil {
		return nil, err
	}
	var out []Link
	for _, l := range all {
		if l.Type() == "ifb" {
			out = append(out, toLink(l))
		}
	}
	return out, nil
}

// DeleteLink implements Kernel.
func (Netlink) DeleteLink(index int) error {
	err := netlink.LinkDel(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Index: index}})
	if err == nil || errors.Is(err, unix.ENODEV) || netlinkx.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("deleting link index %d: %w", index, err)
}

// SetRootTBF implements Kernel.
func (Netlink) SetRootTBF(link int, t TBF) error {
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: rootHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       t.Rate,
		Buffer:     t.Buffer,
		Limit:      t.Limit,
	}
	if err := netlink.QdiscReplace(q); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("adding TBF qdisc to link %d: %w", link, featureErr(FeatureTBF, err))
		}
		return fmt.Errorf("adding TBF qdisc (%v) to link %d: %w", t, link, err)
	}
	return nil
}

// RootTBF implements Kernel.
func (Netlink) RootTBF(link int) (TBF, bool, error) {
	qs, err := netlinkx.QdiscList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: link}})
	if err != nil {
		return TBF{}, false, fmt.Errorf("listing qdiscs of link %d: %w", link, err)
	}
	for _, q := range qs {
		if q.Attrs().LinkIndex != link || q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		if t, ok := q.(*netlink.Tbf); ok {
			return TBF{Rate: t.Rate, Buffer: t.Buffer, Limit: t.Limit}, true, nil
		}
		return TBF{}, false, nil
	}
	return TBF{}, false, nil
}

// DeleteRoot implements Kernel. It removes the root qdisc only if its
// handle is 1:, the one SetRootTBF gives.
func (Netlink) DeleteRoot(link int) error {
	q := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: rootHandle, Parent: netlink.HANDLE_ROOT}}
	err := netlink.QdiscDel(q)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV) {
		return nil
	}
	return fmt.Errorf("deleting root qdisc of link %d: %w", link, err)
}

// AddIngress implements Kernel.
func (Netlink) AddIngress(link int) error {
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscAdd(q); err != nil {
		switch {
		case errors.Is(err, unix.EEXIST):
			return fmt.Errorf("adding ingress qdisc to link %d: %w (%w)", link, ErrExist, err)
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP):
			return fmt.Errorf("adding ingress qdisc to link %d: %w", link, featureErr(FeatureIngress, err))
		}
		return fmt.Errorf("adding ingress qdisc to link %d: %w", link, err)
	}
	return nil
}

// HasIngress implements Kernel.
func (Netlink) HasIngress(link int) (bool, error) {
	qs, err := netlinkx.QdiscList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: link}})
	if err != nil {
		return false, fmt.Errorf("listing qdiscs of link %d: %w", link, err)
	}
	for _, q := range qs {
		if _, ok := q.(*netlink.Ingress); ok && q.Attrs().LinkIndex == link {
			return true, nil
		}
	}
	return false, nil
}

// DeleteIngress implements Kernel.
func (Netlink) DeleteIngress(link int) error {
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
	err := netlink.QdiscDel(q)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV) {
		return nil
	}
	return fmt.Errorf("deleting ingress qdisc of link %d: %w", link, err)
}

// AddRedirect implements Kernel: the netlink form of
// `tc filter add dev L parent ffff: protocol all prio 1 u32 match u32 0 0
// action mirred egress redirect dev TO`.
func (Netlink) AddRedirect(link, to int) error {
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: link,
			Parent:    ingressHandle,
			Priority:  1,
			Protocol:  unix.ETH_P_ALL,
		},
		// No selector: netlink sends one empty key, which matches all.
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to,
		}},
	}
	if err := netlink.FilterAdd(f); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("adding redirect filter on link %d: %w", link, featureErr(FeatureRedirect, err))
		}
		return fmt.Errorf("adding redirect filter on link %d to link %d: %w", link, to, err)
	}
	return nil
}

// Redirects implements Kernel.
func (Netlink) Redirects(link int) ([]int, error) {
	fs, err := netlinkx.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: link}}, ingressHandle)
	if err != nil {
		// No ingress qdisc: no filters.
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing ingress filters of link %d: %w", link, err)
	}
	var out []int
	for _, f := range fs {
		var acts []netlink.Action
		switch f := f.(type) {
		case *netlink.U32:
			acts = f.Actions
		case *netlink.MatchAll:
			acts = f.Actions
		}
		for _, a := range acts {
			if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR {
				out = append(out, m.Ifindex)
			}
		}
	}
	return out, nil
}

// AllRedirects implements Kernel.
func (n Netlink) AllRedirects() (map[int][]int, error) {
	qs, err := netlinkx.QdiscList(nil)
	if err != nil {
		return nil, fmt.Errorf("listing qdiscs: %w", err)
	}
	out := map[int][]int{}
	for _, q := range qs {
		switch q.(type) {
		case *netlink.Ingress, *netlink.Clsact:
		default:
			continue
		}
		from := q.Attrs().LinkIndex
		to, err := n.Redirects(from)
		if err != nil {
			return nil, err
		}
		for _, t := range to {
			out[t] = append(out[t], from)
		}
	}
	return out, nil
}
