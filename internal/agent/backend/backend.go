// Package backend decides how pod traffic crosses nodes. A Backend turns
// the Node list into the node's desired data plane, as plain data (State):
//
//   - host-gw: one route per peer, `podCIDR via <peer InternalIP>`; every
//     node must share one layer-2 segment; no encapsulation, pod MTU =
//     underlay MTU.
//   - vxlan: one VXLAN device (vxlan.DeviceName) and per peer one route
//     `podCIDR via <peer VTEP> dev flatnet.1 onlink`, one neighbour and
//     one FDB entry; works across any IP network; pod MTU = underlay MTU
//   - 50.
//   - vxlan-direct: host-gw to peers whose underlay address is on one of
//     this node's underlay networks, VXLAN to the others (flannel's
//     DirectRouting); pod MTU as vxlan, since a pod talks to both kinds.
//
// Apply programs any State, whichever backend computed it: the routes
// table (package routes: every route with flatnet's protocol that the
// State lacks goes) and the VXLAN device (package vxlan: created, synced,
// or deleted when the State has none). So switching backends at an agent
// restart needs no special code: the new backend's State simply has none
// of the old one's routes or device, and Apply removes them.
//
// A node publishes what its peers need in annotations on its Node
// (AnnotationBackend, AnnotationVTEPMAC, AnnotationPublicIP); State
// carries the annotations this node should have, and the agent patches
// its Node when they differ.
package backend

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// Backend names.
const (
	HostGW      = "host-gw"
	VXLAN       = "vxlan"
	VXLANDirect = "vxlan-direct"
)

// Names are the backends, for flags and messages.
var Names = []string{HostGW, VXLAN, VXLANDirect}

// Node annotations the agent publishes.
const (
	// AnnotationBackend is the backend the node's agent runs.
	AnnotationBackend = "flatnet.io/backend"
	// AnnotationVTEPMAC is the MAC of the node's VXLAN device (vxlan
	// backends only).
	AnnotationVTEPMAC = "flatnet.io/vtep-mac"
	// AnnotationPublicIP is the node's underlay address, where peers send
	// its VXLAN packets (vxlan backends only).
	AnnotationPublicIP = "flatnet.io/public-ip"
	// AnnotationPrefix starts every annotation the agent owns.
	AnnotationPrefix = "flatnet.io/"
)

// Node is what a backend needs from a Node object.
type Node struct {
	Name string
	// PodCIDRs are spec.podCIDRs (or spec.podCIDR).
	PodCIDRs []string
	// InternalIPs are the InternalIP addresses of status.addresses.
	InternalIPs []string
	// Annotations are the node's flatnet.io/ annotations.
	Annotations map[string]string
}

// Underlay is this node's underlay: the interface holding its node IP.
type Underlay struct {
	// IP is the node's address on the underlay (its InternalIP or
	// --node-ip); invalid when not known yet.
	IP netip.Addr
	// Link and Index name the interface that holds IP (Index 0: none
	// found).
	Link  string
	Index int
	MTU   int
	// Prefixes are the networks of the interface's addresses: peers in
	// them are directly reachable (vxlan-direct).
	Prefixes []netip.Prefix
}

// Config is the backends' configuration (agent flags).
type Config struct {
	// VNI and Port of the VXLAN device.
	VNI  uint32
	Port uint16
	// MTU overrides the computed pod MTU when > 0.
	MTU int
	// TxChecksumOffload is the VXLAN device's transmit checksum offload
	// (the agent's default: on; off is the flannel#1279 workaround, see
	// docs/overlay.md).
	TxChecksumOffload bool
}

// Input is everything a backend computes from.
type Input struct {
	Self     string
	Nodes    []Node
	Underlay Underlay
}

// State is a node's desired cross-node data plane.
type State struct {
	// Routes are the routes to peers' pod subnets.
	Routes []routes.Route
	// VXLAN is the overlay device and its entries; nil means the node
	// has no VXLAN device (an existing one is deleted).
	VXLAN *vxlan.State
	// Annotations are this node's flatnet.io/ annotations; "" means
	// absent.
	Annotations map[string]string
	// PodMTU is the MTU for the CNI config; 0 when unknown (the plugin's
	// default).
	PodMTU int
}

// Backend computes a node's State.
type Backend interface {
	Name() string
	// Desired returns the node's State, and a problem per peer it cannot
	// reach (the others are still programmed). An error means no State
	// can be computed yet (a vxlan backend without an underlay): the
	// caller then changes nothing.
	Desired(in Input) (State, []error, error)
}

// New returns the backend called name.
func New(name string, cfg Config) (Backend, error) {
	switch name {
	case HostGW:
		return hostGW{cfg: cfg}, nil
	case VXLAN:
		return overlay{cfg: cfg}, nil
	case VXLANDirect:
		return overlay{cfg: cfg, direct: true}, nil
	}
	return nil, fmt.Errorf("unknown backend %q (want one of %s)", name, strings.Join(Names, ", "))
}

// hostGW is the host-gw backend.
type hostGW struct{ cfg Config }

func (hostGW) Name() string { return HostGW }

func (b hostGW) Desired(in Input) (State, []error, error) {
	peers := make([]routes.Peer, 0, len(in.Nodes))
	for _, n := range in.Nodes {
		peers = append(peers, routes.Peer{Name: n.Name, PodCIDRs: n.PodCIDRs, InternalIPs: n.InternalIPs})
	}
	rs, problems := routes.Desired(in.Self, peers)
	st := State{
		Routes:      rs,
		Annotations: map[string]string{AnnotationBackend: HostGW, AnnotationVTEPMAC: "", AnnotationPublicIP: ""},
		PodMTU:      b.cfg.MTU,
	}
	if st.PodMTU == 0 {
		st.PodMTU = in.Underlay.MTU // no encapsulation
	}
	return st, problems, nil
}

// overlay is the vxlan backend, and with direct the vxlan-direct one.
type overlay struct {
	cfg    Config
	direct bool
}

func (b overlay) Name() string {
	if b.direct {
		return VXLANDirect
	}
	return VXLAN
}

func (b overlay) Desired(in Input) (State, []error, error) {
	u := in.Underlay
	if !u.IP.IsValid() {
		return State{}, nil, fmt.Errorf("%s: this node's underlay address is not known yet (no InternalIP on the Node and no --node-ip)", b.Name())
	}
	if u.Index == 0 || u.MTU == 0 {
		return State{}, nil, fmt.Errorf("%s: no interface of this node holds its address %s (the VXLAN device needs the underlay interface; check --node-ip or the Node's InternalIP)", b.Name(), u.IP)
	}
	overhead := vxlan.Overhead(u.IP)
	if u.MTU-overhead < 68 {
		return State{}, nil, fmt.Errorf("%s: underlay %s has MTU %d, too small for %d bytes of VXLAN overhead", b.Name(), u.Link, u.MTU, overhead)
	}
	mac := vxlan.MACFor(in.Self)
	dev := vxlan.Device{
		Name: vxlan.DeviceName, VNI: b.cfg.VNI, Port: b.cfg.Port,
		Local: u.IP, Underlay: u.Link, UnderlayIndex: u.Index,
		MAC: mac, MTU: u.MTU - overhead, TxChecksumOffload: b.cfg.TxChecksumOffload,
	}
	st := State{
		VXLAN: &vxlan.State{Device: dev},
		Annotations: map[string]string{
			AnnotationBackend:  b.Name(),
			AnnotationVTEPMAC:  mac.String(),
			AnnotationPublicIP: u.IP.String(),
		},
		PodMTU: dev.MTU,
	}
	var problems []error
	if b.cfg.MTU > 0 {
		st.PodMTU = b.cfg.MTU
		if b.cfg.MTU > dev.MTU {
			problems = append(problems, fmt.Errorf("--mtu %d is larger than the overlay's %d (underlay %s MTU %d - %d bytes of VXLAN): full-size pod packets will be refused", b.cfg.MTU, dev.MTU, u.Link, u.MTU, overhead))
		}
	}

	nodes := slices.Clone(in.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	// Self's subnets first: a peer may never take them.
	owner := map[netip.Prefix]string{}
	for _, n := range nodes {
		if n.Name != in.Self {
			continue
		}
		for _, s := range n.PodCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil || !p.Addr().Is4() {
				continue
			}
			p = p.Masked()
			owner[p] = in.Self
			// The VTEP address: the subnet's zero address, which no pod
			// gets (host-local starts at .1 for the gateway), as a /32.
			st.VXLAN.Addrs = append(st.VXLAN.Addrs, netip.PrefixFrom(p.Addr(), 32))
		}
	}
	macOwner := map[vxlan.MAC]string{mac: in.Self}
	for _, n := range nodes {
		if n.Name == in.Self {
			continue
		}
		problems = append(problems, b.peer(&st, u, n, owner, macOwner)...)
	}
	slices.SortFunc(st.Routes, func(a, b routes.Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
	return st, problems, nil
}

// peer adds what reaches node n to st.
func (b overlay) peer(st *State, u Underlay, n Node, owner map[netip.Prefix]string, macOwner map[vxlan.MAC]string) []error {
	var problems []error
	var subnets []netip.Prefix
	for _, s := range n.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			problems = append(problems, fmt.Errorf("node %s: podCIDR %q: %w", n.Name, s, err))
			continue
		case !p.Addr().Is4():
			problems = append(problems, fmt.Errorf("node %s: podCIDR %s: the %s backend carries IPv4 pod subnets only", n.Name, p, b.Name()))
			continue
		case p.Masked().Bits() > 30:
			problems = append(problems, fmt.Errorf("node %s: podCIDR %s is too small for a VTEP address and pods", n.Name, p))
			continue
		}
		p = p.Masked()
		if o, taken := owner[p]; taken {
			problems = append(problems, fmt.Errorf("node %s: podCIDR %s is also node %s's; not routing it", n.Name, p, o))
			continue
		}
		owner[p] = n.Name
		subnets = append(subnets, p)
	}
	if len(subnets) == 0 {
		return problems // no podCIDR yet: nothing to reach
	}

	// Where the peer's VXLAN packets go: its published underlay address,
	// else its InternalIP of our underlay's family.
	var under netip.Addr
	if s := n.Annotations[AnnotationPublicIP]; s != "" {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return append(problems, fmt.Errorf("node %s: annotation %s=%q: %w", n.Name, AnnotationPublicIP, s, err))
		}
		under = a.Unmap()
	} else {
		for _, s := range n.InternalIPs {
			if a, err := netip.ParseAddr(s); err == nil && a.Unmap().Is4() == u.IP.Is4() {
				under = a.Unmap()
				break
			}
		}
	}
	switch {
	case !under.IsValid():
		return append(problems, fmt.Errorf("node %s: no underlay address of this node's family (%s annotation or InternalIP; has %v)", n.Name, AnnotationPublicIP, n.InternalIPs))
	case under.Is4() != u.IP.Is4():
		return append(problems, fmt.Errorf("node %s: underlay address %s is not of this node's underlay family (%s)", n.Name, under, u.IP))
	case under == u.IP:
		return append(problems, fmt.Errorf("node %s: underlay address %s is this node's own", n.Name, under))
	}

	if b.direct && slices.ContainsFunc(u.Prefixes, func(p netip.Prefix) bool { return p.Contains(under) }) {
		// Same underlay network: a plain route, as host-gw.
		for _, p := range subnets {
			st.Routes = append(st.Routes, routes.Route{Dst: p, Gw: under, Node: n.Name})
		}
		return problems
	}

	s, ok := n.Annotations[AnnotationVTEPMAC]
	if !ok || s == "" {
		return append(problems, fmt.Errorf("node %s has not published its VTEP MAC (%s; its %s annotation is %q): its agent is not running a vxlan backend, or has not started yet",
			n.Name, AnnotationVTEPMAC, AnnotationBackend, n.Annotations[AnnotationBackend]))
	}
	mac, err := vxlan.ParseMAC(s)
	if err != nil {
		return append(problems, fmt.Errorf("node %s: annotation %s=%q: %w", n.Name, AnnotationVTEPMAC, s, err))
	}
	if o, taken := macOwner[mac]; taken {
		return append(problems, fmt.Errorf("node %s: VTEP MAC %s is also node %s's; not reaching it", n.Name, mac, o))
	}
	macOwner[mac] = n.Name
	st.VXLAN.FDB = append(st.VXLAN.FDB, vxlan.FDB{MAC: mac, Dst: under, Node: n.Name})
	for _, p := range subnets {
		vtep := p.Addr()
		st.VXLAN.Neighs = append(st.VXLAN.Neighs, vxlan.Neigh{IP: vtep, MAC: mac, Node: n.Name})
		st.Routes = append(st.Routes, routes.Route{Dst: p, Gw: vtep, Dev: vxlan.DeviceName, OnLink: true, Node: n.Name})
	}
	return problems
}

// String renders st one item a line (annotations, MTU, device, addresses,
// routes, neighbour and FDB entries), for tests and debugging.
func (st State) String() string {
	var b strings.Builder
	keys := make([]string, 0, len(st.Annotations))
	for k := range st.Annotations {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "annotation %s=%s\n", k, st.Annotations[k])
	}
	fmt.Fprintf(&b, "pod mtu %d\n", st.PodMTU)
	if v := st.VXLAN; v != nil {
		d := v.Device
		fmt.Fprintf(&b, "device %s vni %d port %d local %s dev %s mac %s mtu %d txcsum %v\n", d.Name, d.VNI, d.Port, d.Local, d.Underlay, d.MAC, d.MTU, d.TxChecksumOffload)
		for _, a := range v.Addrs {
			fmt.Fprintf(&b, "addr %s\n", a)
		}
	}
	for _, r := range st.Routes {
		fmt.Fprintf(&b, "route %s (%s)\n", r, r.Node)
	}
	if v := st.VXLAN; v != nil {
		for _, n := range v.Neighs {
			fmt.Fprintf(&b, "neigh %s (%s)\n", n, n.Node)
		}
		for _, f := range v.FDB {
			fmt.Fprintf(&b, "fdb %s (%s)\n", f, f.Node)
		}
	}
	return b.String()
}
