// Package allocator is host-local's allocation logic, pure over a
// store.Store: it never touches the disk itself, so every rule below is
// unit tested against store.Fake.
//
// Design note.
//
// Compatibility first: a node must be able to switch between this plugin
// and the reference host-local (containernetworking/plugins v1.10.0)
// without losing or double-issuing an address. So we keep its config
// (range sets, legacy single range, runtime ipRanges prepended, static IPs
// from CNI_ARGS IP=, args.cni.ips and runtimeConfig.ips), its range-set
// indexing (runtime ipRanges, then the legacy range, then ipam.ranges: the
// index names last_reserved_ip.N), and its allocation order:
//
//   - A container gets one address per range set.
//   - Without a static request, the search starts right after the set's
//     last_reserved_ip (round robin: a released address is not reused until
//     the set wraps around), or at the first range's rangeStart when there
//     is no usable last_reserved_ip. It walks each range from rangeStart to
//     rangeEnd, then on to the next range of the set, wrapping from the last
//     to the first, and gives up when it is back where it began (code 101).
//   - The gateway is skipped. So are the subnet's network address and the
//     IPv4 broadcast address: the reference's defaults never reach them,
//     but it would hand them out if rangeStart/rangeEnd named them
//     explicitly; we don't (a deliberate divergence).
//   - An attachment (container ID + ifname) that already holds an address
//     in a set gets an error, not a second address (the spec forbids a
//     second ADD without DEL; the reference errors the same way).
//   - Static requests must fall inside a range (103), not be the gateway,
//     and be free (102).
//
// Unlike the reference, which locks around each range set separately,
// the caller holds the store lock for the whole ADD (all range sets), and a
// failed ADD frees exactly the addresses it reserved, never an address the
// attachment held before. Every failure carries a CNI code: 7 for config,
// 101/102/103 for allocation, 5 for store I/O.
package allocator

import (
	"net/netip"
	"strconv"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/hostlocal/store"
)

// Allocator hands out addresses from one range set.
type Allocator struct {
	set     RangeSet
	store   store.Store
	rangeID string // index of the set: names last_reserved_ip.N
}

// New returns the allocator of range set index idx.
func New(set RangeSet, st store.Store, idx int) *Allocator {
	return &Allocator{set: set, store: st, rangeID: strconv.Itoa(idx)}
}

// Get reserves an address for (id, ifname): requested when it is valid,
// otherwise the next free one in round-robin order. held is what the
// attachment holds already (from store.GetByID).
func (a *Allocator) Get(id, ifname string, requested netip.Addr, held []netip.Addr) (*current.IPConfig, error) {
	if requested.IsValid() {
		return a.getStatic(id, ifname, requested.Unmap())
	}
	for _, ip := range held {
		if a.set.Contains(ip) {
			return nil, cnierr.New(cnierr.AddressInUse,
				"%s is already allocated to container %q interface %q; duplicate allocation is not allowed (DEL it first)", ip, id, ifname)
		}
	}
	it := a.iter()
	for {
		r, ip, ok := it.next()
		if !ok {
			return nil, cnierr.New(cnierr.RangeExhausted, "no free IP address left in range set %s (usable addresses: %s, all reserved)",
				a.set, Free(a.set, nil))
		}
		reserved, err := a.store.Reserve(id, ifname, ip, a.rangeID)
		if err != nil {
			return nil, cnierr.Wrap(cnierr.IOFailure, err, "reserving %s", ip)
		}
		if reserved {
			return ipConfig(r, ip), nil
		}
	}
}

func (a *Allocator) getStatic(id, ifname string, ip netip.Addr) (*current.IPConfig, error) {
	r, ok := a.set.RangeFor(ip)
	if !ok {
		return nil, cnierr.New(cnierr.AddressNotInRange, "requested IP %s is not in range set %s", ip, a.set)
	}
	if ip == r.Gateway {
		return nil, cnierr.New(cnierr.AddressInUse, "requested IP %s is the gateway of subnet %s", ip, r.Subnet)
	}
	if !r.usable(ip) {
		return nil, cnierr.New(cnierr.AddressNotInRange, "requested IP %s is the network or broadcast address of subnet %s", ip, r.Subnet)
	}
	reserved, err := a.store.Reserve(id, ifname, ip, a.rangeID)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.IOFailure, err, "reserving %s", ip)
	}
	if !reserved {
		return nil, cnierr.New(cnierr.AddressInUse, "requested IP %s is already reserved%s", ip, holder(a.store, ip))
	}
	return ipConfig(r, ip), nil
}

// holder describes who holds ip, for error messages.
func holder(st store.Store, ip netip.Addr) string {
	all, err := st.List()
	if err != nil {
		return ""
	}
	for _, r := range all {
		if r.IP == ip {
			if r.Legacy {
				return " by container " + strconv.Quote(r.ContainerID)
			}
			return " by container " + strconv.Quote(r.ContainerID) + " interface " + strconv.Quote(r.IfName)
		}
	}
	return ""
}

func ipConfig(r Range, ip netip.Addr) *current.IPConfig {
	return &current.IPConfig{
		Address: prefixToIPNet(netip.PrefixFrom(ip, r.Subnet.Bits())),
		Gateway: r.Gateway.AsSlice(),
	}
}

// iterator walks a range set in the reference's order; see the package
// comment.
type iterator struct {
	set   RangeSet
	idx   int
	cur   netip.Addr // invalid: not started
	start netip.Addr // invalid: not set yet
}

func (a *Allocator) iter() *iterator {
	it := &iterator{set: a.set}
	if last, ok := a.store.LastReservedIP(a.rangeID); ok {
		for i, r := range a.set {
			if r.Contains(last) {
				// next() advances first, so the search begins at last+1
				// and ends with last itself.
				it.idx, it.cur = i, last.Unmap()
				break
			}
		}
	}
	return it
}

// next returns the next candidate and its range, or false after a full
// cycle.
func (it *iterator) next() (Range, netip.Addr, bool) {
	for {
		r := it.set[it.idx]
		switch {
		case !it.cur.IsValid():
			it.cur = r.RangeStart
			it.start = it.cur
		default:
			if it.cur == r.RangeEnd {
				it.idx = (it.idx + 1) % len(it.set)
				r = it.set[it.idx]
				it.cur = r.RangeStart
			} else {
				it.cur = it.cur.Next()
			}
			if !it.start.IsValid() {
				it.start = it.cur
			} else if it.cur == it.start {
				return Range{}, netip.Addr{}, false
			}
		}
		if r.usable(it.cur) {
			return r, it.cur, true
		}
	}
}

// Allocate is host-local's ADD over a locked store: one address per range
// set (static requests honoured), plus the config's routes. On failure it
// frees what it reserved and returns a coded error.
func Allocate(c *Config, st store.Store, id, ifname string) (*current.Result, error) {
	// Place every static request in its range set before reserving
	// anything, so a bad request fails with nothing to undo.
	wanted := make([]netip.Addr, len(c.Ranges))
	for _, ip := range c.Requested {
		placed := false
		for i, set := range c.Ranges {
			if !set.Contains(ip) {
				continue
			}
			if wanted[i].IsValid() {
				return nil, cnierr.New(cnierr.InvalidConfig,
					"host-local: requested IPs %s and %s both fall in %s; one address per range set", wanted[i], ip, c.Where(i))
			}
			wanted[i], placed = ip, true
			break
		}
		if !placed {
			sets := make([]string, len(c.Ranges))
			for i, s := range c.Ranges {
				sets[i] = s.String()
			}
			return nil, cnierr.New(cnierr.AddressNotInRange,
				"host-local: requested IP %s is not in any range set (%s)", ip, strings.Join(sets, "; "))
		}
	}
	held, err := st.GetByID(id, ifname)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.IOFailure, err, "host-local: reading reservations")
	}
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	var got []netip.Addr
	for i, set := range c.Ranges {
		ipc, err := New(set, st, i).Get(id, ifname, wanted[i], held)
		if err != nil {
			for _, ip := range got {
				_ = st.Release(ip)
			}
			code, _ := cnierr.Code(err)
			return nil, cnierr.Wrap(code, err, "host-local: network %q, %s", c.Name, c.Where(i))
		}
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		got = append(got, a.Unmap())
		res.IPs = append(res.IPs, ipc)
	}
	res.Routes = c.Routes
	return res, nil
}
