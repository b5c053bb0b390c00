package routes

// Netlink writes each route through a nexthop object (`ip route add DST
// nhid ID`, the object `ip nexthop add id ID via GW dev DEV`), one per
// gateway, all with protocol flatnet. The kernel keeps a plain route's
// gateway in a fib_info found through a hash that ignores the gateway,
// so a node's thousands of peer routes, all through one device, share one
// hash chain that every insert walks: 5,000 routes took 297 ms of kernel
// time, through nexthop objects 44 ms (netlinkx.BenchmarkRootPeerRoutes),
// and at 50,000 peers the plain way is 100 times worse, not 10.
//
// A nexthop needs its device, so a route without one (host-gw) gets the
// device of the directly connected network that holds its gateway, read
// from the table by List; one with no such network, or whose device has
// no carrier (the kernel refuses a nexthop there), is written plain, as
// is every route on a kernel without nexthop objects (before 5.3). Routes
// written plain by an older agent satisfy the plan as they are and move
// to a nexthop when they next change. A nexthop no route of ours uses any
// more is deleted with the last route through it; one List finds without
// a route (the routes were deleted by hand, or by a crash between the
// two writes) is reused by the next Write or deleted by it. IDs are ours
// from nexthopBase up, skipping any the namespace already has.
//
// With net.ipv4.nexthop_compat_mode 0 (a namespace's choice, default 1)
// the kernel's route dumps leave out the gateway and device of a route
// through a nexthop object, so List could not read what Write wrote:
// every sync would rewrite every route. There the routes are written
// plain (as without nexthop support); the nexthop routes already there
// read as wrong and are replaced once.

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// Protocol marks flatnet's routes and nexthops (`ip route show proto
// 0x66`, `ip nexthop show proto 0x66`): the agent owns exactly those
// that carry it.
const Protocol netlink.RouteProtocol = 0x66

// nexthopBase is the first nexthop ID flatnet takes: away from the low
// IDs other daemons (FRR, ip by hand) usually use.
const nexthopBase = 0x66000000

// Netlink implements Kernel on the calling thread's network namespace
// (call it inside netns.Do for another one). Use one per namespace, by
// pointer: it remembers the nexthops between calls.
type Netlink struct {
	// Table is the routing table (0: main).
	Table int

	mu           sync.Mutex
	nh           *nexthops
	saidNoCompat bool // logged that nexthop_compat_mode is 0
}

type nhKey struct {
	gw     netip.Addr
	link   int
	onlink bool
}

// nexthops is what Netlink knows of the namespace's nexthop objects,
// from the last List and the writes since.
type nexthops struct {
	unsupported bool
	ids         map[nhKey]uint32       // ours
	taken       map[uint32]bool        // every ID in the namespace
	via         map[netip.Prefix]nhKey // our routes' gateways
	users       map[nhKey]int          // our routes through each
	orphans     map[nhKey]bool         // ours no route used at List: deleted by the next Write unless it reuses them
	connected   []connected            // networks without a gateway, by device
	lowerUp     map[int]bool           // devices with carrier: a nexthop on one without is refused
	next        uint32
}

type connected struct {
	dst  netip.Prefix
	link int
}

func (n *Netlink) table() int {
	if n.Table == 0 {
		return unix.RT_TABLE_MAIN
	}
	return n.Table
}

// List implements Kernel.
func (n *Netlink) List() ([]Route, []netip.Prefix, error) {
	rs, err := netlinkx.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: n.table()}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, err
	}
	st := &nexthops{ids: map[nhKey]uint32{}, taken: map[uint32]bool{}, via: map[netip.Prefix]nhKey{}, users: map[nhKey]int{}, next: nexthopBase}
	nhs, err := netlinkx.NexthopList()
	switch {
	case errors.Is(err, netlinkx.ErrNotSupported):
		st.unsupported = true
	case err != nil:
		return nil, nil, err
	}
	if !st.unsupported && !nexthopCompat() {
		st.unsupported = true
		n.mu.Lock()
		if !n.saidNoCompat {
			n.saidNoCompat = true
			klog.InfoS("net.ipv4.nexthop_compat_mode is 0 here: route dumps would hide the gateways of routes through nexthop objects, so routes are written plain (set it to 1 for nexthop objects, the faster way to write thousands of routes)")
		}
		n.mu.Unlock()
	}
	for _, nh := range nhs {
		st.taken[nh.ID] = true
		if nh.Protocol == uint8(Protocol) && nh.Gw.IsValid() {
			st.ids[nhKey{nh.Gw, nh.LinkIndex, nh.OnLink}] = nh.ID
		}
	}
	names, lowerUp, err := links()
	if err != nil {
		return nil, nil, err
	}
	st.lowerUp = lowerUp
	var (
		owned   []Route
		foreign []netip.Prefix
	)
	for _, r := range rs {
		if r.Dst == nil {
			continue // a default route: never a pod subnet
		}
		dst, ok := netlinkx.PrefixOf(r.Dst)
		if !ok {
			continue
		}
		if r.Protocol != Protocol {
			foreign = append(foreign, dst)
			if r.Gw == nil && r.LinkIndex != 0 && r.Scope == netlink.SCOPE_LINK {
				st.connected = append(st.connected, connected{dst, r.LinkIndex})
			}
			continue
		}
		gw, _ := netip.AddrFromSlice(r.Gw)
		rt := Route{Dst: dst, Gw: gw.Unmap(), Dev: names[r.LinkIndex], OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
		owned = append(owned, rt)
		k := nhKey{rt.Gw, r.LinkIndex, rt.OnLink}
		if _, ours := st.ids[k]; ours {
			st.via[dst] = k
			st.users[k]++
		}
	}
	for k := range st.ids {
		if st.users[k] == 0 {
			if st.orphans == nil {
				st.orphans = map[nhKey]bool{}
			}
			st.orphans[k] = true
		}
	}
	n.mu.Lock()
	n.nh = st
	n.mu.Unlock()
	return owned, foreign, nil
}

// nexthopCompat reports whether route dumps show the gateway of a route
// through a nexthop object: net.ipv4.nexthop_compat_mode is not 0 (a
// kernel without the sysctl, before 5.8, always shows it).
func nexthopCompat() bool {
	v, err := sysctl.Get("net.ipv4.nexthop_compat_mode")
	return err != nil || v != "0"
}

// links are the devices' names, and which have carrier, by index.
func links() (map[int]string, map[int]bool, error) {
	ls, err := netlinkx.LinkList()
	if err != nil {
		return nil, nil, err
	}
	names, up := make(map[int]string, len(ls)), make(map[int]bool, len(ls))
	for _, l := range ls {
		a := l.Attrs()
		names[a.Index], up[a.Index] = a.Name, a.RawFlags&unix.IFF_LOWER_UP != 0
	}
	return names, up, nil
}

// link is the device of the most specific connected network holding gw
// (0: none known).
func (st *nexthops) link(gw netip.Addr) int {
	best, link := -1, 0
	for _, c := range st.connected {
		if c.dst.Contains(gw) && c.dst.Bits() > best {
			best, link = c.dst.Bits(), c.link
		}
	}
	return link
}

// use makes dst's route go through the nexthop of k (release it from
// any other first), and returns its ID and whether it is new (to be
// written before the route).
func (st *nexthops) use(dst netip.Prefix, k nhKey) (id uint32, created bool) {
	id, ok := st.ids[k]
	if !ok {
		for st.taken[st.next] || st.next == 0 {
			st.next++
		}
		id, created = st.next, true
		st.ids[k], st.taken[id] = id, true
		st.next++
	}
	if st.via[dst] != k {
		st.via[dst] = k
		st.users[k]++
	}
	return id, created
}

// release: dst's route no longer goes through its nexthop unless keep is
// that nexthop; returns the ID of a nexthop left unused (0: none).
func (st *nexthops) release(dst netip.Prefix, keep nhKey) uint32 {
	k, ok := st.via[dst]
	if !ok || k == keep {
		return 0
	}
	delete(st.via, dst)
	if st.users[k]--; st.users[k] > 0 {
		return 0
	}
	delete(st.users, k)
	id := st.ids[k]
	delete(st.ids, k)
	return id // still taken: its delete may be in the same batch as a new nexthop
}

// Write implements Kernel: one netlink batch (netlinkx.RouteBatch); the
// devices routes name are looked up once.
func (n *Netlink) Write(cs []Change) []error {
	n.mu.Lock()
	unknown := n.nh == nil
	n.mu.Unlock()
	if unknown {
		// Never listed, or a failed write made the bookkeeping unsure:
		// read the namespace first, or a per-peer change (written with no
		// List before it) would go plain until the next full sync.
		_, _, _ = n.List() // on failure: plain routes, below
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.nh
	if st == nil { // the namespace could not be read: write plain routes
		st = &nexthops{unsupported: true}
	}
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
		sent []int // the batch's requests, as indexes into cs (-1: a nexthop no change asked for)
	)
	dropNexthop := func(id uint32) {
		if id != 0 {
			b.Nexthop(netlinkx.OpDelete, netlinkx.BatchNexthop{ID: id})
			sent = append(sent, -1)
		}
	}
	for i, c := range cs {
		r := c.Route
		br := netlinkx.BatchRoute{Dst: r.Dst, Gw: r.Gw, OnLink: r.OnLink, Protocol: uint8(Protocol), Table: n.table()}
		if r.Dev != "" {
			idx, ok := index[r.Dev]
			if !ok {
				l, err := netlinkx.LinkByName(r.Dev)
				switch {
				case netlinkx.IsNotFound(err) && c.Op == Delete:
					dropNexthop(st.release(r.Dst, nhKey{}))
					continue // its device is gone, and the route with it
				case err != nil:
					errs[i] = fmt.Errorf("route %s: device %s: %w", r, r.Dev, err)
					continue
				}
				idx = l.Attrs().Index
				index[r.Dev] = idx
				if st.lowerUp != nil {
					st.lowerUp[idx] = l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0
				}
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
		var unused uint32
		if op == netlinkx.OpDelete {
			// By destination and our protocol alone: the kernel does not
			// match a gateway against a route through a nexthop object.
			br.Gw, br.LinkIndex, br.OnLink = netip.Addr{}, 0, false
			unused = st.release(r.Dst, nhKey{})
		} else if link := br.LinkIndex; !st.unsupported && r.Gw.IsValid() {
			if link == 0 {
				link = st.link(r.Gw)
			}
			// The kernel refuses a nexthop on a device without carrier
			// (a plain route it takes, marked linkdown).
			if link != 0 && st.lowerUp[link] {
				k := nhKey{r.Gw, link, r.OnLink}
				unused = st.release(r.Dst, k)
				id, created := st.use(r.Dst, k)
				if created {
					b.Nexthop(netlinkx.OpReplace, netlinkx.BatchNexthop{ID: id, Gw: r.Gw, LinkIndex: link, OnLink: r.OnLink, Protocol: uint8(Protocol)})
					sent = append(sent, i)
				}
				br.Nexthop = id
			} else {
				unused = st.release(r.Dst, nhKey{}) // written plain now
			}
		}
		b.Route(op, br)
		sent = append(sent, i)
		dropNexthop(unused) // after the route that left it
	}
	for k := range st.orphans {
		if st.users[k] == 0 {
			dropNexthop(st.ids[k])
			delete(st.ids, k)
		}
	}
	st.orphans = nil
	res, err := b.Exec()
	if err != nil {
		n.nh = nil // unknown now: the next List reads it again
		return fail(err)
	}
	for j, err := range res {
		i := sent[j]
		if err == nil || i < 0 || errs[i] != nil {
			continue // a nexthop left behind is found by the next List
		}
		if errors.Is(err, syscall.ENETUNREACH) {
			err = fmt.Errorf("gateway %s is not on a directly connected network of this node (host-gw needs all nodes on one layer-2 segment; check the node's InternalIP): %w", cs[i].Route.Gw, err)
		}
		errs[i] = err
	}
	for _, e := range errs {
		if e != nil {
			n.nh = nil // a failed write leaves the bookkeeping unsure: read it again
			break
		}
	}
	return errs
}
