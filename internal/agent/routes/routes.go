// Package routes keeps the node's routes to its peers' pod subnets, for
// every backend (package backend decides which):
//
//	<peer podCIDR> via <peer InternalIP>                         host-gw
//	<peer podCIDR> via <peer VTEP address> dev flatnet.1 onlink  vxlan
//
// all with protocol flatnet (0x66). A host-gw route sends pod traffic
// straight to the node that holds the destination pod, with no
// encapsulation and no NAT; it needs the gateway on a directly connected
// network (one layer-2 segment), as flannel's host-gw does. An overlay
// route hands the packet to the VXLAN device (package vxlan).
//
// Design. Desired computes the host-gw routes as plain data from the Node
// list (the overlay's come from package backend); MakePlan diffs routes
// against the ones the kernel holds with our protocol number (the marker
// that says "flatnet owns this route": we never touch a route without it);
// Sync applies the plan through the small Kernel interface, which Netlink
// implements for real and Fake for unit tests. A changed peer IP, or a
// peer moving between host-gw and the overlay, is one RouteReplace (no
// window without a route); a departed peer's route is deleted; running
// Sync twice changes nothing the second time.
package routes

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Peer is what the backend needs from a Node.
type Peer struct {
	Name string
	// PodCIDRs are spec.podCIDRs (or spec.podCIDR).
	PodCIDRs []string
	// InternalIPs are the InternalIP addresses of status.addresses.
	InternalIPs []string
}

// Route is one route to a peer's pod subnet: `Dst via Gw` for host-gw,
// `Dst via Gw dev Dev onlink` for an overlay (Gw is then the peer's
// tunnel endpoint address, which no local network contains).
type Route struct {
	Dst netip.Prefix
	Gw  netip.Addr
	// Dev is the outgoing device; "" lets the kernel pick it from Gw
	// (host-gw) and matches a route on any device.
	Dev string
	// OnLink says Gw is reachable on Dev even though no address of Dev
	// covers it.
	OnLink bool
	// Node is the peer the route leads to, for messages; not compared.
	Node string
}

func (r Route) String() string {
	s := fmt.Sprintf("%s via %s", r.Dst, r.Gw)
	if r.Dev != "" {
		s += " dev " + r.Dev
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// satisfies reports whether the kernel's route have is what want asks for.
func satisfies(want, have Route) bool {
	return want.Dst == have.Dst && want.Gw == have.Gw && want.OnLink == have.OnLink &&
		(want.Dev == "" || want.Dev == have.Dev)
}

// Desired returns the routes node self needs to reach its peers' pod
// subnets, sorted by destination, and a problem per peer it could not
// route (no InternalIP of the subnet's family, unreadable fields, a subnet
// another peer or self already holds). Peers without a podCIDR yet are
// skipped silently.
func Desired(self string, peers []Peer) ([]Route, []error) {
	var problems []error
	peers = slices.Clone(peers)
	slices.SortFunc(peers, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	// Self's subnets first: a peer may never take them.
	owner := map[netip.Prefix]string{}
	for _, p := range peers {
		if p.Name == self {
			for _, s := range p.PodCIDRs {
				if pfx, err := netip.ParsePrefix(s); err == nil {
					owner[pfx.Masked()] = self
				}
			}
		}
	}
	var out []Route
	for _, p := range peers {
		if p.Name == self {
			continue
		}
		var ips []netip.Addr
		for _, s := range p.InternalIPs {
			a, err := netip.ParseAddr(s)
			if err != nil {
				problems = append(problems, fmt.Errorf("node %s: InternalIP %q: %w", p.Name, s, err))
				continue
			}
			ips = append(ips, a.Unmap())
		}
		for _, s := range p.PodCIDRs {
			dst, err := netip.ParsePrefix(s)
			if err != nil {
				problems = append(problems, fmt.Errorf("node %s: podCIDR %q: %w", p.Name, s, err))
				continue
			}
			dst = dst.Masked()
			if dst.Addr().Is4In6() {
				problems = append(problems, fmt.Errorf("node %s: podCIDR %s is IPv4-mapped IPv6", p.Name, dst))
				continue
			}
			i := slices.IndexFunc(ips, func(a netip.Addr) bool { return a.Is4() == dst.Addr().Is4() })
			if i < 0 {
				problems = append(problems, fmt.Errorf("node %s: no InternalIP of the family of its podCIDR %s (has %v); cannot route to it", p.Name, dst, p.InternalIPs))
				continue
			}
			if o, taken := owner[dst]; taken {
				problems = append(problems, fmt.Errorf("node %s: podCIDR %s is also node %s's; not routing it", p.Name, dst, o))
				continue
			}
			owner[dst] = p.Name
			out = append(out, Route{Dst: dst, Gw: ips[i], Node: p.Name})
		}
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return out, problems
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.Bits(), b.Bits())
}

// Plan is what Sync changes.
type Plan struct {
	// Replace adds a route or changes its gateway.
	Replace []Route
	// Delete removes routes we own that no peer needs.
	Delete []Route
	// Conflicts are desired routes left out because a route we do not
	// own has the same destination.
	Conflicts []error
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Replace) == 0 && len(p.Delete) == 0 }

// MakePlan diffs desired against owned (the kernel's routes with our
// protocol) and foreign (destinations of the other routes in the table).
func MakePlan(desired, owned []Route, foreign []netip.Prefix) Plan {
	var p Plan
	want := map[netip.Prefix]Route{}
	for _, r := range desired {
		want[r.Dst] = r
	}
	have := map[netip.Prefix]bool{}
	for _, r := range owned {
		w, ok := want[r.Dst]
		switch {
		case !ok || have[r.Dst]: // not needed, or a duplicate (another metric)
			p.Delete = append(p.Delete, r)
		case satisfies(w, r):
			have[r.Dst] = true
		}
	}
	for _, r := range desired {
		if have[r.Dst] {
			continue
		}
		if slices.Contains(foreign, r.Dst) {
			p.Conflicts = append(p.Conflicts, fmt.Errorf("not adding %s for node %s: the routing table already has a route to %s that flatnet does not own (remove it, or fix the node's podCIDR)", r, r.Node, r.Dst))
			continue
		}
		p.Replace = append(p.Replace, r)
	}
	return p
}

// Kernel is the narrow door to the routing table.
type Kernel interface {
	// List returns the routes we own and the destinations of all others
	// in the table.
	List() (owned []Route, foreign []netip.Prefix, err error)
	// Write applies cs in order, in as few kernel calls as it can, and
	// returns one error per change (nil: done).
	Write(cs []Change) []error
}

// Op is what a Change does.
type Op uint8

const (
	// Replace adds the route or changes our route to its destination.
	Replace Op = iota
	// Add adds the route; a route to its destination already there
	// (ours or not) is an error: the incremental path's way of never
	// taking over a route it does not know.
	Add
	// Delete removes our route; a route already gone is success.
	Delete
)

// Change is one route change.
type Change struct {
	Op    Op
	Route Route
}

// Write applies cs through k and returns every failure, joined, each
// naming its route (and peer).
func Write(k Kernel, cs []Change) error {
	if len(cs) == 0 {
		return nil
	}
	var errs []error
	for i, err := range k.Write(cs) {
		if err == nil {
			continue
		}
		if r := cs[i].Route; cs[i].Op == Delete {
			errs = append(errs, fmt.Errorf("deleting route %s: %w", r, err))
		} else {
			errs = append(errs, fmt.Errorf("route %s to node %s: %w", r, r.Node, err))
		}
	}
	return errors.Join(errs...)
}

// Sync makes the kernel's flatnet routes equal desired. It applies every
// step it can and returns the plan and every failure (including
// conflicts), joined.
func Sync(k Kernel, desired []Route) (Plan, error) {
	owned, foreign, err := k.List()
	if err != nil {
		return Plan{}, fmt.Errorf("reading routes: %w", err)
	}
	p := MakePlan(desired, owned, foreign)
	errs := slices.Clone(p.Conflicts)
	cs := make([]Change, 0, len(p.Delete)+len(p.Replace))
	for _, r := range p.Delete {
		cs = append(cs, Change{Op: Delete, Route: r})
	}
	for _, r := range p.Replace {
		cs = append(cs, Change{Op: Replace, Route: r})
	}
	if err := Write(k, cs); err != nil {
		errs = append(errs, err)
	}
	return p, errors.Join(errs...)
}
