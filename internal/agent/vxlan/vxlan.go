// Package vxlan programs a node's VXLAN overlay: one VXLAN device and, for
// every peer reached through it, one neighbour entry and one FDB entry
// (the route to the peer's pod subnet lives in the routing table; see
// package routes).
//
// How a packet to a pod on node B leaves node A:
//
//	route  10.244.2.0/24 via 10.244.2.0 dev flatnet.1 onlink   (routes)
//	neigh  10.244.2.0 lladdr <B's VTEP MAC> PERMANENT          (this package)
//	fdb    <B's VTEP MAC> dst <B's underlay IP> self permanent (this package)
//
// The route sends the packet to B's VTEP address (the zero address of B's
// pod subnet, which B holds as a /32 on its own device); the neighbour
// entry gives that address B's VTEP MAC, so the kernel builds the inner
// Ethernet frame without ARP; the FDB entry tells the VXLAN device which
// underlay IP that MAC lives behind, so it sends the frame in a UDP packet
// to B. One route, one neighbour and one FDB entry per peer, all static.
//
// Design. Nothing here reacts to kernel misses (no L2MISS/L3MISS, no
// learning): flannel's first generations filled entries on demand from
// miss notifications, which raced and stalled under load. The desired
// State is plain data computed from the Node list (package backend); Sync
// reads what the kernel has, diffs (PlanDevice, PlanEntries) and applies
// the difference through the small Kernel interface (Netlink for real,
// Fake in unit tests). Sync twice and the second run changes nothing.
package vxlan

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// DeviceName is the VXLAN device's fixed name: the agent owns the device
// of that name, deletes it when the backend needs none, and never touches
// another.
const DeviceName = "flatnet.1"

// Defaults of the device.
const (
	// DefaultVNI is the VXLAN network identifier (any 24-bit value works
	// if every node agrees; 1 as flannel).
	DefaultVNI = 1
	// DefaultPort is the IANA-assigned VXLAN UDP port (RFC 7348).
	DefaultPort = 4789
)

// Overhead returns the encapsulation overhead in bytes for an underlay of
// the family of ip: outer IP header (20 or 40) + UDP (8) + VXLAN (8) +
// inner Ethernet header (14).
func Overhead(underlay netip.Addr) int {
	if underlay.Is6() && !underlay.Is4In6() {
		return 70
	}
	return 50
}

// MAC is an Ethernet address, comparable (a map key).
type MAC [6]byte

// ParseMAC reads a 6-byte Ethernet address ("aa:bb:cc:dd:ee:ff").
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return MAC{}, err
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("%q is not a 6-byte Ethernet address", s)
	}
	return MAC(hw), nil
}

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// IsZero reports whether m is unset.
func (m MAC) IsZero() bool { return m == MAC{} }

// MACFor returns the VTEP MAC of node: a locally administered unicast
// address derived from the name, so the device keeps its MAC when it is
// re-created (after a reboot, an agent upgrade, a VNI change) and peers'
// entries stay valid.
func MACFor(node string) MAC {
	sum := sha256.Sum256([]byte("flatnet vtep " + node))
	var m MAC
	copy(m[:], sum[:6])
	m[0] = m[0]&^0x01 | 0x02 // unicast, locally administered
	return m
}

// Device is the VXLAN device a node should have.
type Device struct {
	Name string
	VNI  uint32
	Port uint16
	// Local is the node's underlay address: the source of encapsulated
	// packets.
	Local netip.Addr
	// Underlay and UnderlayIndex name the device that holds Local:
	// encapsulated packets leave through it.
	Underlay      string
	UnderlayIndex int
	MAC           MAC
	MTU           int
	// TxChecksumOffload is the device's transmit checksum offload (the
	// kernel's default is on; off works around flannel#1279).
	TxChecksumOffload bool
}

// Link is what the kernel has under a device name.
type Link struct {
	Name  string
	Index int
	// IsVXLAN is false for a device of another type with our name.
	IsVXLAN           bool
	VNI               uint32
	Port              uint16
	Local             netip.Addr
	UnderlayIndex     int
	Learning          bool
	UDPCSum           bool
	L2Miss, L3Miss    bool
	FlowBased         bool
	MAC               MAC
	MTU               int
	Up                bool
	TxChecksumOffload bool
}

// Neigh is a permanent neighbour entry on the device: peer VTEP address ->
// peer VTEP MAC.
type Neigh struct {
	IP  netip.Addr
	MAC MAC
	// Node is the peer, for messages; not compared.
	Node string
}

func (n Neigh) String() string { return fmt.Sprintf("%s lladdr %s", n.IP, n.MAC) }

// FDB is a forwarding entry on the device: peer VTEP MAC -> peer underlay
// address.
type FDB struct {
	MAC MAC
	Dst netip.Addr
	// Node is the peer, for messages; not compared.
	Node string
}

func (f FDB) String() string { return fmt.Sprintf("%s dst %s", f.MAC, f.Dst) }

// State is the overlay a node should have.
type State struct {
	Device Device
	// Addrs are the device's addresses: the node's VTEP address (the zero
	// address of its pod subnet) as a /32.
	Addrs  []netip.Prefix
	Neighs []Neigh
	FDB    []FDB
}

// LinkUpdate changes a device in place; nil fields stay.
type LinkUpdate struct {
	MTU               *int
	MAC               *MAC
	Up                bool
	TxChecksumOffload *bool
}

// IsZero reports whether u changes nothing.
func (u LinkUpdate) IsZero() bool {
	return u.MTU == nil && u.MAC == nil && !u.Up && u.TxChecksumOffload == nil
}

// DevicePlan is what Sync does to the device.
type DevicePlan struct {
	// Delete removes the existing device first (Reason says why).
	Delete bool
	Reason string
	// Create adds the device.
	Create bool
	Update LinkUpdate
}

// PlanDevice compares want with the kernel's link of its name (nil: none).
// What the kernel cannot change in place (type, VNI, port, local address,
// underlay device, outer UDP checksums, learning and miss flags) means
// delete and create; MTU, MAC, state and checksum offload change in place.
// The device always computes outer UDP checksums (the kernel's default
// differs between versions): a zero outer checksum is what NAT of VXLAN
// packets corrupted in flannel#1279.
func PlanDevice(want Device, have *Link) DevicePlan {
	var p DevicePlan
	switch {
	case have == nil:
		p.Create = true
	case !have.IsVXLAN:
		p.Delete, p.Create, p.Reason = true, true, "not a VXLAN device"
	case have.VNI != want.VNI:
		p.Delete, p.Create, p.Reason = true, true, fmt.Sprintf("VNI %d, want %d", have.VNI, want.VNI)
	case have.Port != want.Port:
		p.Delete, p.Create, p.Reason = true, true, fmt.Sprintf("UDP port %d, want %d", have.Port, want.Port)
	case have.Local != want.Local:
		p.Delete, p.Create, p.Reason = true, true, fmt.Sprintf("local address %s, want %s", have.Local, want.Local)
	case have.UnderlayIndex != want.UnderlayIndex:
		p.Delete, p.Create, p.Reason = true, true, fmt.Sprintf("underlay device index %d, want %d (%s)", have.UnderlayIndex, want.UnderlayIndex, want.Underlay)
	case !have.UDPCSum:
		p.Delete, p.Create, p.Reason = true, true, "outer UDP checksums off"
	case have.Learning || have.L2Miss || have.L3Miss || have.FlowBased:
		p.Delete, p.Create, p.Reason = true, true, "learning, miss notifications or flow-based mode on"
	}
	if p.Create {
		// A new device comes with MTU and MAC; it still needs up and the
		// offload setting, which only exist once it does.
		on := want.TxChecksumOffload
		p.Update = LinkUpdate{Up: true, TxChecksumOffload: &on}
		return p
	}
	if have.MTU != want.MTU {
		p.Update.MTU = &want.MTU
	}
	if have.MAC != want.MAC {
		p.Update.MAC = &want.MAC
	}
	p.Update.Up = !have.Up
	if have.TxChecksumOffload != want.TxChecksumOffload {
		on := want.TxChecksumOffload
		p.Update.TxChecksumOffload = &on
	}
	return p
}

// EntryPlan is what Sync changes on the device's addresses, neighbour and
// FDB entries. Deletions run before additions.
type EntryPlan struct {
	AddAddrs, DelAddrs []netip.Prefix
	SetNeighs          []Neigh
	DelNeighs          []Neigh
	SetFDB             []FDB
	DelFDB             []FDB
}

// Empty reports whether p changes nothing.
func (p EntryPlan) Empty() bool {
	return len(p.AddAddrs)+len(p.DelAddrs)+len(p.SetNeighs)+len(p.DelNeighs)+len(p.SetFDB)+len(p.DelFDB) == 0
}

// PlanEntries diffs want's entries against the device's current
// addresses, permanent neighbour entries and FDB entries. A changed MAC or
// underlay address is one replace (Set), never a delete and add, so a
// moving peer has no window without an entry.
func PlanEntries(want State, addrs []netip.Prefix, neighs []Neigh, fdb []FDB) EntryPlan {
	var p EntryPlan
	for _, a := range addrs {
		if !slices.Contains(want.Addrs, a) {
			p.DelAddrs = append(p.DelAddrs, a)
		}
	}
	for _, a := range want.Addrs {
		if !slices.Contains(addrs, a) {
			p.AddAddrs = append(p.AddAddrs, a)
		}
	}

	wantNeigh := map[netip.Addr]Neigh{}
	for _, n := range want.Neighs {
		wantNeigh[n.IP] = n
	}
	haveNeigh := map[netip.Addr]MAC{}
	for _, n := range neighs {
		if _, ok := wantNeigh[n.IP]; !ok {
			p.DelNeighs = append(p.DelNeighs, n)
			continue
		}
		haveNeigh[n.IP] = n.MAC
	}
	for _, n := range want.Neighs {
		if mac, ok := haveNeigh[n.IP]; !ok || mac != n.MAC {
			p.SetNeighs = append(p.SetNeighs, n)
		}
	}

	// The kernel may hold several remotes for one MAC (appended by hand);
	// we want exactly one. Keep the right one if it is there, else the
	// first, which Set then replaces.
	wantFDB := map[MAC]FDB{}
	for _, f := range want.FDB {
		wantFDB[f.MAC] = f
	}
	byMAC := map[MAC][]FDB{}
	for _, f := range fdb {
		byMAC[f.MAC] = append(byMAC[f.MAC], f)
	}
	for _, f := range fdb {
		w, ok := wantFDB[f.MAC]
		if !ok {
			p.DelFDB = append(p.DelFDB, f)
			continue
		}
		group := byMAC[f.MAC]
		keep := group[0]
		if i := slices.IndexFunc(group, func(g FDB) bool { return g.Dst == w.Dst }); i >= 0 {
			keep = group[i]
		}
		if f.Dst != keep.Dst {
			p.DelFDB = append(p.DelFDB, f)
		}
	}
	for _, w := range want.FDB {
		group := byMAC[w.MAC]
		if !slices.ContainsFunc(group, func(g FDB) bool { return g.Dst == w.Dst }) {
			p.SetFDB = append(p.SetFDB, w)
		}
	}
	return p
}
