package lab

// The lab's kernel objects: the underlay bridge with the host's address,
// and per node a network namespace joined to the bridge by a veth pair.
// Every function here is idempotent: it checks each piece and makes only
// what is missing, so a half-built lab (an interrupted up) is completed.
//
// hostNS stands for the root namespace: "" is the caller's own namespace
// (the lab), a namespace path is used by root tests so they never touch
// the machine's root namespace.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

type kernel struct {
	hostNS string
}

// inHost runs fn in the host namespace.
func (k kernel) inHost(fn func() error) error {
	if k.hostNS == "" {
		return fn()
	}
	return netns.Do(k.hostNS, fn)
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

func hasAddr(l netlink.Link, want netip.Addr, bits int) (bool, error) {
	addrs, err := netlinkx.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return false, fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if ok && got.Unmap() == want && ones == bits {
			return true, nil
		}
	}
	return false, nil
}

func isUp(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }

// bridgeReady reports whether the underlay bridge exists, is up and holds
// the host address.
func (k kernel) bridgeReady(s *Spec) (bool, error) {
	ready := false
	err := k.inHost(func() error {
		l, err := netlinkx.LinkByName(s.Bridge)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if l.Type() != "bridge" || !isUp(l) {
			return nil
		}
		ready, err = hasAddr(l, s.HostAddr, s.Underlay.Bits())
		return err
	})
	return ready, err
}

// ensureBridge creates the underlay bridge with the host address.
func (k kernel) ensureBridge(s *Spec) error {
	return k.inHost(func() error {
		l, err := netlinkx.LinkByName(s.Bridge)
		if netlinkx.IsNotFound(err) {
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: s.Bridge}}
			if err := netlink.LinkAdd(br); err != nil {
				return fmt.Errorf("creating underlay bridge %s: %w", s.Bridge, err)
			}
			l, err = netlinkx.LinkByName(s.Bridge)
		}
		if err != nil {
			return fmt.Errorf("underlay bridge %s: %w", s.Bridge, err)
		}
		if l.Type() != "bridge" {
			return fmt.Errorf("interface %s exists and is a %s, not the lab's bridge; remove it or pick another --name", s.Bridge, l.Type())
		}
		ok, err := hasAddr(l, s.HostAddr, s.Underlay.Bits())
		if err != nil {
			return err
		}
		if !ok {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(s.HostAddr, s.Underlay.Bits())}); err != nil {
				return fmt.Errorf("adding %s/%d to %s: %w", s.HostAddr, s.Underlay.Bits(), s.Bridge, err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("setting %s up: %w", s.Bridge, err)
		}
		return nil
	})
}

// nodeReady reports whether node n is fully wired: its namespace exists,
// its host veth is up on the bridge, and inside, lo and eth0 are up, eth0
// holds the node IP, and IPv4 forwarding is on.
func (k kernel) nodeReady(s *Spec, n Node) (bool, error) {
	path := NetnsPath(n.Netns)
	if err := netns.Check(path); err != nil {
		if errors.Is(err, netns.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	ready := false
	err := k.inHost(func() error {
		br, err := netlinkx.LinkByName(s.Bridge)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := netlinkx.LinkByName(n.HostVeth)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ready = v.Type() == "veth" && isUp(v) && v.Attrs().MasterIndex == br.Attrs().Index
		return nil
	})
	if err != nil || !ready {
		return false, err
	}
	err = netns.Do(path, func() error {
		ready = false
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return err
		}
		eth, err := netlinkx.LinkByName("eth0")
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ok, err := hasAddr(eth, n.IP, s.Underlay.Bits())
		if err != nil {
			return err
		}
		fwd, err := sysctl.Get("net.ipv4.ip_forward")
		if err != nil {
			return err
		}
		ready = ok && isUp(lo) && isUp(eth) && fwd == "1"
		return nil
	})
	return ready, err
}

// ensureNode creates node n's namespace and wires it to the bridge.
func (k kernel) ensureNode(s *Spec, n Node) error {
	path := NetnsPath(n.Netns)
	if err := netns.Check(path); errors.Is(err, netns.ErrNotExist) {
		if _, err := netns.Create(n.Netns); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	h, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("node %s: opening netns %s: %w", n.Name, path, err)
	}
	defer h.Close()

	// A veth pair lives or dies as a whole, so eth0 in the node without
	// our host veth is not ours: remove it, then make the pair.
	hostVethOK := false
	err = k.inHost(func() error {
		v, err := netlinkx.LinkByName(n.HostVeth)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if v.Type() != "veth" {
			return fmt.Errorf("interface %s exists and is a %s, not node %s's veth; remove it", n.HostVeth, v.Type(), n.Name)
		}
		hostVethOK = true
		return nil
	})
	if err != nil {
		return err
	}
	var eth0OK bool
	if err := netns.DoHandle(h, func() error {
		eth, err := netlinkx.LinkByName("eth0")
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !hostVethOK {
			return netlink.LinkDel(eth)
		}
		eth0OK = true
		return nil
	}); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if hostVethOK && !eth0OK {
		// Our host veth's peer went elsewhere: recreate the pair.
		if err := k.inHost(func() error { return deleteLink(n.HostVeth) }); err != nil {
			return err
		}
		hostVethOK = false
	}

	err = k.inHost(func() error {
		br, err := netlinkx.LinkByName(s.Bridge)
		if err != nil {
			return fmt.Errorf("underlay bridge %s: %w", s.Bridge, err)
		}
		if !hostVethOK {
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: n.HostVeth, MasterIndex: br.Attrs().Index},
				PeerName:      "eth0",
				PeerNamespace: netlink.NsFd(int(h)),
				// A MAC derived from the node IP: a rebuilt node keeps it,
				// so its peers' ARP entries stay right.
				PeerHardwareAddr: nodeMAC(n.IP),
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("node %s: creating veth %s <-> eth0: %w", n.Name, n.HostVeth, err)
			}
		}
		v, err := netlinkx.LinkByName(n.HostVeth)
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if v.Attrs().MasterIndex != br.Attrs().Index {
			if err := netlink.LinkSetMaster(v, br); err != nil {
				return fmt.Errorf("node %s: attaching %s to %s: %w", n.Name, n.HostVeth, s.Bridge, err)
			}
		}
		if err := netlink.LinkSetUp(v); err != nil {
			return fmt.Errorf("node %s: setting %s up: %w", n.Name, n.HostVeth, err)
		}
		return nil
	})
	if err != nil {
		return err
	}

	return netns.DoHandle(h, func() error {
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("node %s: lo up: %w", n.Name, err)
		}
		eth, err := netlinkx.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("node %s: eth0: %w", n.Name, err)
		}
		ok, err := hasAddr(eth, n.IP, s.Underlay.Bits())
		if err != nil {
			return err
		}
		if !ok {
			if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(n.IP, s.Underlay.Bits())}); err != nil {
				return fmt.Errorf("node %s: adding %s to eth0: %w", n.Name, n.IP, err)
			}
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return fmt.Errorf("node %s: eth0 up: %w", n.Name, err)
		}
		// The node routes between its pods' bridge and the underlay.
		if err := sysctl.Set("net.ipv4.ip_forward", "1"); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		return nil
	})
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
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// removeNode deletes node n's host veth (and with it eth0) and its
// namespace. Processes still inside keep the namespace alive, so callers
// stop them first.
func (k kernel) removeNode(n Node) error {
	var errs []error
	if err := k.inHost(func() error { return deleteLink(n.HostVeth) }); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	if err := netns.Delete(n.Netns); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// removeBridge deletes the underlay bridge (and the host address on it).
func (k kernel) removeBridge(s *Spec) error {
	return k.inHost(func() error { return deleteLink(s.Bridge) })
}

// linkExists reports whether a link named name exists in the host.
func (k kernel) linkExists(name string) (bool, error) {
	found := false
	err := k.inHost(func() error {
		_, err := netlinkx.LinkByName(name)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		found = err == nil
		return err
	})
	return found, err
}

// nodeMAC is 0a:58 followed by the IPv4 address, as Kubernetes networking
// conventionally derives a MAC from an IP.
func nodeMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
