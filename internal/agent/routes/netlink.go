package routes

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

// Protocol marks flatnet's routes (`ip route show proto 0x66`): the agent
// owns exactly the routes that carry it.
const Protocol netlink.RouteProtocol = 0x66

// Netlink implements Kernel on the calling thread's network namespace
// (call it inside netns.Do for another one).
type Netlink struct {
	// Table is the routing table (0: main).
	Table int
}

func (n Netlink) table() int {
	if n.Table == 0 {
		return unix.RT_TABLE_MAIN
	}
	return n.Table
}

// List implements Kernel.
func (n Netlink) List() ([]Route, []netip.Prefix, error) {
	rs, err := netlinkx.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: n.table()}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, err
	}
	var (
		owned   []Route
		foreign []netip.Prefix
		names   map[int]string
	)
	for _, r := range rs {
		if r.Dst == nil {
			continue // a default route: never a pod subnet
		}
		dst, ok := prefixOf(r.Dst)
		if !ok {
			continue
		}
		if r.Protocol != Protocol {
			foreign = append(foreign, dst)
			continue
		}
		if names == nil {
			if names, err = linkNames(); err != nil {
				return nil, nil, err
			}
		}
		gw, _ := netip.AddrFromSlice(r.Gw)
		owned = append(owned, Route{Dst: dst, Gw: gw.Unmap(), Dev: names[r.LinkIndex], OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0})
	}
	return owned, foreign, nil
}

func linkNames() (map[int]string, error) {
	links, err := netlinkx.LinkList()
	if err != nil {
		return nil, err
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names, nil
}

// Replace implements Kernel.
func (n Netlink) Replace(r Route) error {
	nr, err := n.route(r)
	if err != nil {
		return err
	}
	err = netlink.RouteReplace(nr)
	if errors.Is(err, syscall.ENETUNREACH) {
		return fmt.Errorf("gateway %s is not on a directly connected network of this node (host-gw needs all nodes on one layer-2 segment; check the node's InternalIP): %w", r.Gw, err)
	}
	return err
}

// Delete implements Kernel.
func (n Netlink) Delete(r Route) error {
	nr, err := n.route(r)
	if netlinkx.IsNotFound(err) {
		return nil // its device is gone, and the route with it
	}
	if err != nil {
		return err
	}
	err = netlink.RouteDel(nr)
	if errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}

func (n Netlink) route(r Route) (*netlink.Route, error) {
	nr := &netlink.Route{
		Dst:      &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Protocol: Protocol,
		Table:    n.table(),
		Scope:    netlink.SCOPE_UNIVERSE,
	}
	if r.Gw.IsValid() {
		nr.Gw = r.Gw.AsSlice()
	}
	if r.Dev != "" {
		l, err := netlinkx.LinkByName(r.Dev)
		if err != nil {
			return nil, fmt.Errorf("route %s: device %s: %w", r, r.Dev, err)
		}
		nr.LinkIndex = l.Attrs().Index
	}
	if r.OnLink {
		nr.SetFlag(netlink.FLAG_ONLINK)
	}
	return nr, nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	if a.Is4In6() && ones >= 96 {
		ones -= 96
	}
	return netip.PrefixFrom(a.Unmap(), ones), true
}
