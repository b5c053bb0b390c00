// Package veth creates and deletes the veth pairs of the bridge and ptp
// plugins.
//
// The pair is made with a single RTM_NEWLINK from the host namespace whose
// peer attributes name the container's namespace (IFLA_NET_NS_FD): the
// container end is born in the container with its final name, MTU and MAC,
// and the host end is born up, with its MTU and MAC. The reference plugins
// instead create the pair inside the container under temporary names and
// move the host end out, which costs several more netlink round trips and
// two namespace switches, and then read both ends back for their MACs. We
// choose the MACs (random, locally administered) so nothing is read back.
package veth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// Spec describes a pair to create from the calling thread's namespace
// (the host).
type Spec struct {
	// NetNS is the path of the namespace that gets the peer; "" keeps
	// the peer in the host namespace.
	NetNS string
	// PeerName is the peer's name (CNI_IFNAME).
	PeerName string
	// HostName is the host end's name; "" picks a random "veth" name.
	HostName string
	// MTU of both ends; 0 leaves the kernel default.
	MTU int
	// PeerMAC and HostMAC; nil picks a random locally administered MAC.
	PeerMAC, HostMAC net.HardwareAddr
	// MasterIndex attaches the host end to this bridge; 0: none.
	MasterIndex int
	// NoHostDAD turns off IPv6 duplicate address detection on the host
	// end before it goes up. A routed (ptp) host end needs its link-local
	// address at once: while it is tentative the kernel delays neighbour
	// discovery toward the container by about a second.
	NoHostDAD bool
}

// Pair is a created pair.
type Pair struct {
	HostName  string
	HostIndex int
	HostMAC   net.HardwareAddr
	PeerName  string
	PeerMAC   net.HardwareAddr
}

// RandomMAC returns a random unicast, locally administered MAC.
func RandomMAC() net.HardwareAddr {
	b := make(net.HardwareAddr, 6)
	_, _ = rand.Read(b)
	b[0] = (b[0] &^ 0x01) | 0x02
	return b
}

// RandomName returns "veth" plus 8 random hex digits.
func RandomName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "veth" + hex.EncodeToString(b)
}

// Create makes the pair. When PeerName already exists in NetNS the error
// has code 104; a missing NetNS gives code 3.
func Create(s Spec) (*Pair, error) {
	if s.PeerName == "" {
		return nil, cnierr.New(cnierr.InvalidEnvironment, "no interface name (CNI_IFNAME) given")
	}
	var peerNS any
	if s.NetNS != "" {
		if err := netns.Check(s.NetNS); err != nil {
			return nil, nsErr(err, s.NetNS)
		}
		f, err := os.Open(s.NetNS)
		if err != nil {
			return nil, nsErr(err, s.NetNS)
		}
		defer f.Close()
		peerNS = netlink.NsFd(f.Fd())
	}
	peerMAC, hostMAC := s.PeerMAC, s.HostMAC
	if peerMAC == nil {
		peerMAC = RandomMAC()
	}
	if hostMAC == nil {
		hostMAC = RandomMAC()
	}
	const attempts = 5
	for i := 0; ; i++ {
		name := s.HostName
		if name == "" {
			name = RandomName()
		}
		la := netlink.NewLinkAttrs()
		la.Name = name
		la.MTU = s.MTU
		la.HardwareAddr = hostMAC
		if !s.NoHostDAD {
			la.Flags = net.FlagUp
		}
		la.MasterIndex = s.MasterIndex
		v := &netlink.Veth{
			LinkAttrs:        la,
			PeerName:         s.PeerName,
			PeerHardwareAddr: peerMAC,
			PeerNamespace:    peerNS,
		}
		err := netlink.LinkAdd(v)
		if err == nil && s.NoHostDAD {
			_ = sysctl.SetPath("0", "net/ipv6/conf", name, "accept_dad")
			if err := netlink.LinkSetUp(v); err != nil {
				_ = DeleteHost(name)
				return nil, fmt.Errorf("setting %s up: %w", name, err)
			}
		}
		if err == nil {
			return &Pair{HostName: name, HostIndex: v.Index, HostMAC: hostMAC, PeerName: s.PeerName, PeerMAC: peerMAC}, nil
		}
		if v.Index != 0 {
			// Created, but attaching to the bridge failed.
			_ = netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}})
			return nil, fmt.Errorf("attaching %s to bridge index %d: %w", name, s.MasterIndex, err)
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("creating veth pair %s (host) / %s (container): %w", name, s.PeerName, err)
		}
		if exists, cerr := peerExists(s.NetNS, s.PeerName); cerr == nil && exists {
			where := "the host namespace"
			if s.NetNS != "" {
				where = "netns " + s.NetNS
			}
			return nil, cnierr.New(cnierr.InterfaceExists, "interface %s already exists in %s", s.PeerName, where)
		}
		if s.HostName != "" || i+1 == attempts {
			return nil, fmt.Errorf("creating veth pair %s (host) / %s (container): host name taken: %w", name, s.PeerName, err)
		}
	}
}

func nsErr(err error, path string) error {
	if errors.Is(err, netns.ErrNotExist) || errors.Is(err, os.ErrNotExist) {
		return cnierr.Wrap(cnierr.UnknownContainer, err, "container netns %s", path)
	}
	return cnierr.Wrap(cnierr.InvalidNetNS, err, "opening container netns %s", path)
}

func linkExists(name string) bool {
	_, err := netlinkx.LinkByName(name)
	return err == nil
}

func peerExists(nsPath, name string) (bool, error) {
	if nsPath == "" {
		return linkExists(name), nil
	}
	var exists bool
	err := netns.Do(nsPath, func() error {
		exists = linkExists(name)
		return nil
	})
	return exists, err
}

// DeleteInNS deletes ifName in the namespace at nsPath (its veth peer goes
// with it) and returns the addresses it had; found is false when there
// was no such interface. A missing namespace or interface is not an
// error: DEL must succeed when things are gone. With links, a veth whose
// host end is in the caller's namespace is removed by that end, handed
// to links (a batch that removes several links at once, or a parker that
// sets them aside for a collector: then the container's end is parked
// and renamed here); nil deletes at once.
func DeleteInNS(nsPath, ifName string, links netlinkx.LinkDeleter) (addrs []netlink.Addr, found bool, err error) {
	if nsPath == "" {
		return nil, false, nil
	}
	var index, peer int
	err = netns.Do(nsPath, func() error {
		link, err := netlinkx.LinkByName(ifName)
		if err != nil {
			if netlinkx.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("looking up %s: %w", ifName, err)
		}
		found = true
		addrs, err = netlinkx.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", ifName, err)
		}
		if _, ok := link.(*netlink.Veth); ok && links != nil {
			index, peer = link.Attrs().Index, link.Attrs().ParentIndex
			if _, ok := links.(parker); ok {
				return park(index)
			}
			return nil
		}
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, syscall.ENODEV) {
			return fmt.Errorf("deleting %s: %w", ifName, err)
		}
		return nil
	})
	if errors.Is(err, netns.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("netns %s: %w", nsPath, err)
	}
	if peer != 0 {
		// The peer index is the host end's only when that end is here
		// and names ifName's index as its own peer.
		if h, err := netlink.LinkByIndex(peer); err == nil {
			if _, ok := h.(*netlink.Veth); ok && h.Attrs().ParentIndex == index {
				return addrs, found, links.DeleteLink(peer)
			}
		}
		// Not ours to batch: delete the container's end (parked or not)
		// by index.
		err := netns.Do(nsPath, func() error {
			err := netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}})
			if err != nil && !errors.Is(err, syscall.ENODEV) {
				return fmt.Errorf("deleting %s: %w", ifName, err)
			}
			return nil
		})
		if err != nil && !errors.Is(err, netns.ErrNotExist) {
			return addrs, found, fmt.Errorf("netns %s: %w", nsPath, err)
		}
		return addrs, found, nil
	}
	return addrs, found, nil
}

// parker is a LinkDeleter that parks links instead of deleting them
// (internal/cni/parking).
type parker interface{ ParksLinks() }

// park parks the container's end of a pair (index, in the calling
// thread's namespace) under a name of its own, so that the container's
// interface name is free at once; its host end is parked by the caller.
// The pair goes with the namespace, or with the host end when a
// collector deletes it.
func park(index int) error {
	if err := netlinkx.ParkLink(index); err != nil {
		return err
	}
	return netlinkx.RenameLink(index, ParkedName(index))
}

// ParkedName is the name of a parked container end: "fnpk" and its index.
func ParkedName(index int) string { return fmt.Sprintf("fnpk%x", index) }

// DeleteHostEnd deletes the host end a result lists for a container
// interface that could not be found (the netns is gone). The kernel
// destroys a dead namespace's veths asynchronously, and a namespace some
// process still holds keeps them for good; deleting the host end makes
// DEL complete either way. Only a veth with the listed MAC is deleted (a
// recycled name is left alone).
func DeleteHostEnd(name, mac string) error {
	if name == "" {
		return nil
	}
	l, err := netlinkx.LinkByName(name)
	if err != nil {
		if netlinkx.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Veth); !ok || (mac != "" && l.Attrs().HardwareAddr.String() != mac) {
		return nil
	}
	if netlinkx.IsParked(l) {
		return nil // parked by an earlier DEL: a collector removes it
	}
	return DeleteHost(name)
}

// DeleteHost deletes the host end name (its peer goes with it); a missing
// link is fine. Used to undo Create.
func DeleteHost(name string) error {
	err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if err != nil && !errors.Is(err, syscall.ENODEV) && !netlinkx.IsNotFound(err) {
		// A pair whose container netns was just deleted is being torn
		// down by the kernel meanwhile; the request may then fail (seen:
		// EINVAL) while the link goes anyway.
		if _, lerr := netlinkx.LinkByName(name); netlinkx.IsNotFound(lerr) {
			return nil
		}
		return fmt.Errorf("deleting veth %s: %w", name, err)
	}
	return nil
}

// WaitUp waits until the host end (index) is operationally up: until the
// kernel has processed the carrier change, what is sent through it is
// dropped.
func WaitUp(index int, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	sleep := 500 * time.Microsecond
	for {
		l, err := netlink.LinkByIndex(index)
		if err != nil {
			return fmt.Errorf("looking up %s: %w", name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("veth %s is still %s after %s", name, l.Attrs().OperState, timeout)
		}
		time.Sleep(sleep)
		if sleep < 50*time.Millisecond {
			sleep *= 2
		}
	}
}
