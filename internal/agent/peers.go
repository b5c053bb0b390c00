package agent

// Per-peer updates.
//
// A full Reconcile reads the whole Node list and the kernel's tables, so at
// 5,000 nodes one peer's change cost ~2.4 ms of CPU, and 5,000 changes (an
// annotation rolled out to every node) 12 s. Most changes concern one peer
// and only that peer's entries: its routes, and with a VXLAN backend its
// neighbour and FDB entries. So the full Reconcile also keeps, in memory,
// what it programmed for each peer (peerIndex), plus what the backend needs
// to compute one peer alone (this node's Node and underlay); Peer then
// computes the changed peer's entries as plain data, diffs them against
// the remembered ones and writes only the difference. Nothing else runs
// for a peer: the conflist, masquerade, sysctls and this node's
// annotations depend on this node only.
//
// One peer can be computed alone when no two peers claim the same pod
// subnet or VTEP MAC (the backends give a contested one to the first peer
// by name, and a change could hand it to another). The full Reconcile
// records claims; Peer hands over to a full Reconcile (errNeedFull) when
// the index is missing or stale (a failed reconcile or write), the change
// is this node's own, or the peer now claims what another holds. A route
// to a subnet the index does not hold is added, never replaced, so a
// route that flatnet does not own is not taken over: the kernel refuses,
// and the full Reconcile that follows reports the conflict.
//
// The periodic resync stays a full Reconcile: it reads the kernel and
// repairs what drifted (an entry someone deleted), and rebuilds the index.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// errNeedFull says a change needs a full Reconcile.
var errNeedFull = errors.New("needs a full reconcile")

// peerEntries is one peer's part of the backend State, and what it claims.
type peerEntries struct {
	routes []routes.Route
	neighs []vxlan.Neigh
	fdb    []vxlan.FDB
	// cidrs and mac are the pod subnets and VTEP MAC the Node claims
	// (routed or not).
	cidrs []netip.Prefix
	mac   vxlan.MAC
}

// peerIndex is what the last full Reconcile programmed, by peer.
type peerIndex struct {
	self     backend.Node
	underlay backend.Underlay
	overlay  bool // the State has a VXLAN device
	peers    map[string]*peerEntries
	// cidrOwner and macOwner say which peer claims a subnet or MAC.
	cidrOwner map[netip.Prefix]string
	macOwner  map[vxlan.MAC]string
}

// claims are the pod subnets and VTEP MAC node n asks for.
func claims(n backend.Node) ([]netip.Prefix, vxlan.MAC) {
	var cidrs []netip.Prefix
	for _, s := range n.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			cidrs = append(cidrs, p.Masked())
		}
	}
	mac, _ := vxlan.ParseMAC(n.Annotations[backend.AnnotationVTEPMAC])
	return cidrs, mac
}

// newPeerIndex indexes st, the State computed from nodes, by peer; nil
// when two peers claim one subnet or MAC (each change then needs the full
// computation).
func newPeerIndex(selfName string, nodes []backend.Node, u backend.Underlay, st backend.State) *peerIndex {
	x := &peerIndex{underlay: u, overlay: st.VXLAN != nil, peers: map[string]*peerEntries{},
		cidrOwner: map[netip.Prefix]string{}, macOwner: map[vxlan.MAC]string{}}
	for _, n := range nodes {
		if n.Name == selfName {
			x.self = n
			continue
		}
		e := &peerEntries{}
		e.cidrs, e.mac = claims(n)
		if !x.claim(n.Name, e) {
			return nil
		}
		x.peers[n.Name] = e
	}
	if x.self.Name == "" {
		return nil
	}
	for _, r := range st.Routes {
		if e := x.peers[r.Node]; e != nil {
			e.routes = append(e.routes, r)
		}
	}
	if v := st.VXLAN; v != nil {
		for _, n := range v.Neighs {
			if e := x.peers[n.Node]; e != nil {
				e.neighs = append(e.neighs, n)
			}
		}
		for _, f := range v.FDB {
			if e := x.peers[f.Node]; e != nil {
				e.fdb = append(e.fdb, f)
			}
		}
	}
	return x
}

// claim records e's subnets and MAC as name's; false when another peer
// holds one of them.
func (x *peerIndex) claim(name string, e *peerEntries) bool {
	for _, p := range e.cidrs {
		if o, ok := x.cidrOwner[p]; ok && o != name {
			return false
		}
	}
	if o, ok := x.macOwner[e.mac]; ok && o != name && !e.mac.IsZero() {
		return false
	}
	for _, p := range e.cidrs {
		x.cidrOwner[p] = name
	}
	if !e.mac.IsZero() {
		x.macOwner[e.mac] = name
	}
	return true
}

func (x *peerIndex) release(name string, e *peerEntries) {
	for _, p := range e.cidrs {
		if x.cidrOwner[p] == name {
			delete(x.cidrOwner, p)
		}
	}
	if x.macOwner[e.mac] == name {
		delete(x.macOwner, e.mac)
	}
}

// Peer programs the change of one peer Node (nil: deleted) on its own:
// only that peer's routes, neighbour and FDB entries change. errNeedFull
// (or any other error) means the caller must run a full Reconcile.
func (r *Reconciler) Peer(ctx context.Context, name string, node *corev1.Node) error {
	x := r.peers
	if x == nil || name == r.NodeName {
		return errNeedFull
	}
	logger := klog.FromContext(ctx)
	want := &peerEntries{}
	if node != nil {
		bn := backendNode(node)
		st, problems, err := r.Backend.Desired(backend.Input{Self: r.NodeName, Nodes: []backend.Node{x.self, bn}, Underlay: x.underlay})
		if err != nil || (st.VXLAN != nil) != x.overlay {
			return errNeedFull
		}
		for _, p := range problems {
			logger.Info("Cannot reach a peer node", "backend", r.Backend.Name(), "problem", p.Error())
		}
		want.routes = st.Routes
		if st.VXLAN != nil {
			want.neighs, want.fdb = st.VXLAN.Neighs, st.VXLAN.FDB
		}
		want.cidrs, want.mac = claims(bn)
	}
	have := x.peers[name]
	if have == nil {
		have = &peerEntries{}
	}
	x.release(name, have)
	if !x.claim(name, want) {
		r.peers = nil
		return errNeedFull
	}

	res, rcs := diffPeer(have, want)
	err := r.writePeer(res, rcs)
	logApply(logger, res)
	if err != nil {
		r.peers = nil // the kernel is in an unknown state: the full path reads it
		return fmt.Errorf("%s backend, node %s: %w", r.Backend.Name(), name, err)
	}
	if node == nil {
		delete(x.peers, name)
	} else {
		x.peers[name] = want
	}
	return nil
}

// diffPeer is what changes one peer's entries from have to want: the
// result to log and the route changes (a subnet we did not route is
// added, one we did is replaced).
func diffPeer(have, want *peerEntries) (backend.Result, []routes.Change) {
	var (
		res backend.Result
		rcs []routes.Change
	)
	for _, w := range want.routes {
		i := slices.IndexFunc(have.routes, func(h routes.Route) bool { return h.Dst == w.Dst })
		switch {
		case i < 0:
			rcs = append(rcs, routes.Change{Op: routes.Add, Route: w})
		case have.routes[i] != w:
			rcs = append(rcs, routes.Change{Op: routes.Replace, Route: w})
		default:
			continue
		}
		res.Routes.Replace = append(res.Routes.Replace, w)
	}
	for _, h := range have.routes {
		if slices.IndexFunc(want.routes, func(w routes.Route) bool { return w.Dst == h.Dst }) < 0 {
			rcs = append(rcs, routes.Change{Op: routes.Delete, Route: h})
			res.Routes.Delete = append(res.Routes.Delete, h)
		}
	}
	// The device's entries diff as in a full sync, over this peer's only.
	e := vxlan.PlanEntries(vxlan.State{Neighs: want.neighs, FDB: want.fdb}, nil, have.neighs, have.fdb)
	if !e.Empty() {
		res.VXLAN = &vxlan.Result{Entries: e}
	}
	return res, rcs
}

// writePeer writes one peer's changes in the order that keeps traffic
// flowing: new neighbour and FDB entries, then routes, then the entries
// no route uses any more.
func (r *Reconciler) writePeer(res backend.Result, rcs []routes.Change) error {
	var set, del []vxlan.EntryChange
	if v := res.VXLAN; v != nil {
		set = vxlan.EntryPlan{SetNeighs: v.Entries.SetNeighs, SetFDB: v.Entries.SetFDB}.Changes()
		del = vxlan.EntryPlan{DelNeighs: v.Entries.DelNeighs, DelFDB: v.Entries.DelFDB}.Changes()
	}
	if err := vxlan.WriteEntries(r.Kernel.VXLAN, vxlan.DeviceName, set); err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	if err := routes.Write(r.Kernel.Routes, rcs); err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	if err := vxlan.WriteEntries(r.Kernel.VXLAN, vxlan.DeviceName, del); err != nil {
		return fmt.Errorf("vxlan: %w", err)
	}
	return nil
}
