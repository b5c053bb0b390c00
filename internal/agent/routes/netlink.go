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

// Write implements Kernel: one netlink batch (netlinkx.RouteBatch); the
// devices routes name are looked up once.
func (n Netlink) Write(cs []Change) []error {
	errs := make([]error, len(cs))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	index := map[string]int{}
	var (
		b    netlinkx.RouteBatch
		sent []int // the batch's changes, as indexes into cs
	)
	for i, c := range cs {
		r := c.Route
		br := netlinkx.BatchRoute{Dst: r.Dst, Gw: r.Gw, OnLink: r.OnLink, Protocol: uint8(Protocol), Table: n.table()}
		if r.Dev != "" {
			idx, ok := index[r.Dev]
			if !ok {
				l, err := netlinkx.LinkByName(r.Dev)
				switch {
				case netlinkx.IsNotFound(err) && c.Op == Delete:
					continue // its device is gone, and the route with it
				case err != nil:
					errs[i] = fmt.Errorf("route %s: device %s: %w", r, r.Dev, err)
					continue
				}
				idx = l.Attrs().Index
				index[r.Dev] = idx
			}
			br.LinkIndex = idx
		}
		op := netlinkx.OpReplace
		switch c.Op {
		case Add:
			op = netlinkx.OpAdd
		case Delete:
			op = netlinkx.OpDelete
		}
		b.Route(op, br)
		sent = append(sent, i)
	}
	res, err := b.Exec()
	if err != nil {
		return fail(err)
	}
	for j, err := range res {
		if errors.Is(err, syscall.ENETUNREACH) {
			err = fmt.Errorf("gateway %s is not on a directly connected network of this node (host-gw needs all nodes on one layer-2 segment; check the node's InternalIP): %w", cs[sent[j]].Route.Gw, err)
		}
		errs[sent[j]] = err
	}
	return errs
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
