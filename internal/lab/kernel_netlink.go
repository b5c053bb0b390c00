package lab

// netlinkKernel is the real kernelIO: it reads and changes the lab's
// namespaces through internal/netns (every namespace switch), netlinkx
// (every dump), sysctl and cni/veth (the veth pairs).

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/cni/veth"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

type netlinkKernel struct {
	hostNS string // "" the caller's namespace; else the path standing for it
}

// in runs fn in namespace path ("" the host).
func (k netlinkKernel) in(path string, fn func() error) error {
	if path == "" {
		if k.hostNS == "" {
			return fn()
		}
		path = k.hostNS
	}
	return netns.Do(path, fn)
}

// read implements kernelIO.
func (k netlinkKernel) read(qs map[string]*query) (view, error) {
	v := view{}
	for path, q := range qs {
		if path != "" {
			if err := netns.Check(path); errors.Is(err, netns.ErrNotExist) {
				v[path] = nil
				continue
			} else if err != nil {
				return nil, err
			}
		}
		err := k.in(path, func() error {
			n, err := readHere(q)
			v[path] = n
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", nsName(path), err)
		}
	}
	return v, nil
}

// readHere reads q in the calling thread's namespace.
func readHere(q *query) (*nsView, error) {
	n := &nsView{links: map[string]linkView{}, sysctls: map[string]string{}}
	names := map[int]string{}
	masters := map[string]int{}
	for _, name := range q.links {
		l, err := netlinkx.LinkByName(name)
		if netlinkx.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("link %s: %w", name, err)
		}
		a := l.Attrs()
		names[a.Index], masters[name] = name, a.MasterIndex
		addrs, err := netlinkx.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", name, err)
		}
		lv := linkView{kind: l.Type(), up: a.Flags&net.FlagUp != 0}
		for _, x := range addrs {
			if ip, ok := netip.AddrFromSlice(x.IP); ok {
				ones, _ := x.Mask.Size()
				lv.addrs = append(lv.addrs, netip.PrefixFrom(ip.Unmap(), ones))
			}
		}
		n.links[name] = lv
	}
	// Links outside the query get a name that matches none of the
	// topology's.
	nameOf := func(index int) string {
		if name, ok := names[index]; ok || index == 0 {
			return name
		}
		return fmt.Sprintf("#%d", index)
	}
	for name, m := range masters {
		lv := n.links[name]
		lv.master = nameOf(m)
		n.links[name] = lv
	}
	for _, dst := range q.dsts {
		rs, err := netlinkx.RouteListFiltered(netlink.FAMILY_V4,
			&netlink.Route{Dst: ipNet(dst), Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("routes to %s: %w", dst, err)
		}
		for _, x := range rs {
			r := route{dst: dst, dev: nameOf(x.LinkIndex)}
			if gw, ok := netip.AddrFromSlice(x.Gw); ok {
				r.vias = []netip.Addr{gw.Unmap()}
			}
			for i, nh := range x.MultiPath {
				if i == 0 {
					r.dev = nameOf(nh.LinkIndex)
				} else if nameOf(nh.LinkIndex) != r.dev {
					r.dev = "(several)"
				}
				if gw, ok := netip.AddrFromSlice(nh.Gw); ok {
					r.vias = append(r.vias, gw.Unmap())
				}
			}
			slices.SortFunc(r.vias, netip.Addr.Compare)
			n.routes = append(n.routes, r)
		}
	}
	for _, key := range q.sysctls {
		val, err := sysctl.Get(key)
		if err != nil {
			return nil, err
		}
		n.sysctls[key] = val
	}
	return n, nil
}

// apply implements kernelIO.
func (k netlinkKernel) apply(f fix) error {
	switch f.op {
	case fixRefuse:
		return errors.New(f.why)
	case fixCreateNetns, fixDeleteNetns:
		if filepath.Dir(f.ns) != netns.RunDir {
			return fmt.Errorf("netns %s is not under %s", f.ns, netns.RunDir)
		}
		if f.op == fixDeleteNetns {
			// A node's parked pod links go with it; their marker too.
			return errors.Join(parking.Forget(f.ns), netns.Delete(filepath.Base(f.ns)))
		}
		_, err := netns.Create(filepath.Base(f.ns))
		return err
	}
	err := k.in(f.ns, func() error {
		switch f.op {
		case fixCreateBridge:
			return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: f.link}})
		case fixCreateVeth:
			br, err := netlinkx.LinkByName(f.master)
			if err != nil {
				return err
			}
			_, err = veth.Create(veth.Spec{NetNS: f.peerNS, PeerName: "eth0", HostName: f.link, PeerMAC: f.mac,
				MasterIndex: br.Attrs().Index})
			return err
		case fixDeleteLink:
			return deleteLink(f.link)
		case fixSetSysctl:
			return sysctl.Set(f.key, f.value)
		case fixReplaceRoute:
			return replaceRoute(f.route)
		}
		l, err := netlinkx.LinkByName(f.link)
		if err != nil {
			return err
		}
		switch f.op {
		case fixSetMaster:
			br, err := netlinkx.LinkByName(f.master)
			if err != nil {
				return err
			}
			return netlink.LinkSetMaster(l, br)
		case fixSetUp:
			return netlink.LinkSetUp(l)
		case fixAddAddr:
			return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(f.addr)})
		}
		return fmt.Errorf("unknown fix %d", f.op)
	})
	if f.op == fixDeleteLink && errors.Is(err, netns.ErrNotExist) {
		return nil // the link went with its namespace
	}
	return err
}

// replaceRoute makes the main table route r (replacing another route to
// r.dst).
func replaceRoute(r route) error {
	l, err := netlinkx.LinkByName(r.dev)
	if err != nil {
		return err
	}
	nr := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(r.dst), Protocol: unix.RTPROT_STATIC, Table: unix.RT_TABLE_MAIN}
	switch len(r.vias) {
	case 0:
		nr.Scope = netlink.SCOPE_LINK
	case 1:
		nr.Gw = r.vias[0].AsSlice()
	default:
		nr.LinkIndex = 0
		for _, g := range r.vias {
			nr.MultiPath = append(nr.MultiPath, &netlink.NexthopInfo{LinkIndex: l.Attrs().Index, Gw: g.AsSlice()})
		}
	}
	return netlink.RouteReplace(nr)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// deleteLink removes a link by name; a missing one is fine.
func deleteLink(name string) error {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
