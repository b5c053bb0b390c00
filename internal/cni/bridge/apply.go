package bridge

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ifconf"
	"github.com/flatnet/flatnet/internal/cni/veth"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// ensureBridge finds or creates the bridge in the calling thread's
// namespace and brings it up. created is true when this call made it.
// A new bridge gets a fixed random MAC so that its MAC does not follow
// its ports as they come and go.
func ensureBridge(n *NetConf) (br *netlink.Bridge, created bool, err error) {
	l, err := netlinkx.LinkByName(n.BrName)
	if err != nil && !netlinkx.IsNotFound(err) {
		return nil, false, fmt.Errorf("looking up bridge %q: %w", n.BrName, err)
	}
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = n.BrName
		la.MTU = n.MTU
		la.Flags = net.FlagUp
		la.HardwareAddr = veth.RandomMAC()
		nb := &netlink.Bridge{LinkAttrs: la}
		if n.Vlan != 0 || n.VlanTrunk != nil {
			on := true
			nb.VlanFiltering = &on
		}
		switch err := netlink.LinkAdd(nb); {
		case err == nil:
			created = true
		case errors.Is(err, unix.EEXIST):
			// Another ADD made it first.
		case errors.Is(err, unix.EOPNOTSUPP) && nb.VlanFiltering != nil:
			return nil, false, cnierr.Wrap(cnierr.KernelFeatureMissing, err,
				"bridge: creating bridge %q with VLAN filtering (for \"vlan\"/\"vlanTrunk\"): this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)", n.BrName)
		default:
			return nil, false, fmt.Errorf("creating bridge %q: %w", n.BrName, err)
		}
		if l, err = netlinkx.LinkByName(n.BrName); err != nil {
			return nil, false, fmt.Errorf("looking up bridge %q: %w", n.BrName, err)
		}
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, false, cnierr.New(cnierr.InvalidConfig, "bridge: %q already exists but is a %s, not a bridge", n.BrName, l.Type())
	}
	if n.PromiscMode && br.Promisc == 0 {
		if err := netlink.SetPromiscOn(br); err != nil {
			return nil, false, fmt.Errorf("setting promiscuous mode on %q: %w", n.BrName, err)
		}
	}
	// We own the routes of this interface: no router advertisements.
	_ = sysctl.SetPath("0", "net/ipv6/conf", n.BrName, "accept_ra")
	if br.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return nil, false, fmt.Errorf("setting bridge %q up: %w", n.BrName, err)
		}
	}
	return br, created, nil
}

// setupPort applies the per-port settings to the host end of a pair.
func setupPort(n *NetConf, br *netlink.Bridge, name string, index int, vlan int) (err error) {
	defer func() {
		if errors.Is(err, unix.EOPNOTSUPP) {
			err = cnierr.Wrap(cnierr.KernelFeatureMissing, err, "bridge: port %s: the kernel does not support this bridge port setting", name)
		}
	}()
	port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: index}}
	if n.HairpinMode {
		if err := netlink.LinkSetHairpin(port, true); err != nil {
			return fmt.Errorf("setting hairpin mode on %s: %w", name, err)
		}
	}
	if n.PortIsolation {
		if err := netlink.LinkSetIsolated(port, true); err != nil {
			return fmt.Errorf("isolating port %s: %w", name, err)
		}
	}
	if vlan == 0 && len(n.vlans) == 0 {
		return nil
	}
	if !n.PreserveDefaultVlan && br.VlanDefaultPVID != nil && *br.VlanDefaultPVID != 0 {
		// A new port has only the bridge's default PVID; drop it.
		if err := netlink.BridgeVlanDel(port, *br.VlanDefaultPVID, true, true, false, true); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("removing default VLAN %d from %s: %w", *br.VlanDefaultPVID, name, err)
		}
	}
	if vlan != 0 {
		if err := netlink.BridgeVlanAdd(port, uint16(vlan), true, true, false, true); err != nil {
			return fmt.Errorf("setting VLAN %d on %s: %w", vlan, name, err)
		}
	}
	for _, v := range n.vlans {
		if err := netlink.BridgeVlanAdd(port, uint16(v), false, false, false, true); err != nil {
			return fmt.Errorf("adding trunk VLAN %d to %s: %w", v, name, err)
		}
	}
	if vlan == 0 && len(n.vlans) > 0 {
		// As the reference: a trunk without "vlan" has native VLAN 1.
		if err := netlink.BridgeVlanAdd(port, 1, true, true, false, true); err != nil {
			return fmt.Errorf("setting native VLAN 1 on %s: %w", name, err)
		}
	}
	return nil
}

// configureContainer runs inside the container's namespace.
func configureContainer(n *NetConf, ifName string, p *addrPlan) error {
	if n.EnableDad {
		_ = sysctl.SetPath("1", "net/ipv6/conf", ifName, "enhanced_dad")
		_ = sysctl.SetPath("1", "net/ipv6/conf", ifName, "accept_dad")
	} else {
		_ = sysctl.SetPath("0", "net/ipv6/conf", ifName, "accept_dad")
	}
	_ = sysctl.SetPath("1", "net/ipv4/conf", ifName, "arp_notify")
	res := &current.Result{Interfaces: []*current.Interface{{Name: ifName}}, Routes: p.Routes}
	for _, ip := range p.IPs {
		c := *ip
		c.Interface = current.Int(0)
		res.IPs = append(res.IPs, &c)
	}
	if err := ifconf.Configure(ifName, res); err != nil {
		return err
	}
	if n.EnableDad {
		return settleDAD(ifName, 5*time.Second)
	}
	return nil
}

// settleDAD waits until ifName has no tentative IPv6 address, link-local
// included (as the reference does: neighbour discovery needs it).
func settleDAD(ifName string, timeout time.Duration) error {
	link, err := netlinkx.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", ifName, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		addrs, err := netlinkx.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", ifName, err)
		}
		tentative := false
		for _, a := range addrs {
			if a.Flags&unix.IFA_F_DADFAILED != 0 {
				return fmt.Errorf("duplicate address detection failed for %s on %s", a.IPNet, ifName)
			}
			if a.Flags&unix.IFA_F_TENTATIVE != 0 {
				tentative = true
			}
		}
		if !tentative {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("IPv6 addresses of %s still tentative after %s", ifName, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatewayLink returns the link that holds the gateway addresses: the
// bridge, or with "vlan" a "<bridge>.<vlan>" veth whose peer is a bridge
// port untagged in that VLAN (created on first use).
func gatewayLink(n *NetConf, br *netlink.Bridge) (netlink.Link, *current.Interface, error) {
	if n.Vlan == 0 {
		return br, nil, nil
	}
	name := vlanGatewayName(n.BrName, n.Vlan)
	l, err := netlinkx.LinkByName(name)
	if err != nil && !netlinkx.IsNotFound(err) {
		return nil, nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	if err != nil {
		pair, err := veth.Create(veth.Spec{PeerName: name, MTU: br.MTU, MasterIndex: br.Index})
		if err != nil {
			return nil, nil, fmt.Errorf("creating VLAN gateway interface %s: %w", name, err)
		}
		if err := setupPort(&NetConf{PreserveDefaultVlan: n.PreserveDefaultVlan}, br, pair.HostName, pair.HostIndex, n.Vlan); err != nil {
			_ = veth.DeleteHost(pair.HostName)
			return nil, nil, err
		}
		if l, err = netlinkx.LinkByName(name); err != nil {
			return nil, nil, fmt.Errorf("looking up %s: %w", name, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, nil, fmt.Errorf("setting %s up: %w", name, err)
		}
	}
	return l, &current.Interface{Name: name, Mac: l.Attrs().HardwareAddr.String()}, nil
}

// ensureGateways puts the gateway addresses on link (forceAddress rules
// in gatewayOps) and enables forwarding for their families.
func ensureGateways(n *NetConf, link netlink.Link, p *addrPlan) error {
	name := link.Attrs().Name
	existing := map[int][]net.IPNet{}
	for _, gw := range p.Gateways {
		fam := netlink.FAMILY_V6
		if gw.IP.To4() != nil {
			fam = netlink.FAMILY_V4
		}
		have, ok := existing[fam]
		if !ok {
			addrs, err := netlinkx.AddrList(link, fam)
			if err != nil {
				return fmt.Errorf("listing addresses of %s: %w", name, err)
			}
			for _, a := range addrs {
				have = append(have, *a.IPNet)
			}
		}
		del, add, err := gatewayOps(name, have, gw, n.ForceAddress)
		if err != nil {
			return err
		}
		for _, d := range del {
			if err := netlink.AddrDel(link, &netlink.Addr{IPNet: &d}); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				return fmt.Errorf("removing %s from %s: %w", d.String(), name, err)
			}
			have = remove(have, d)
		}
		if add {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: gw.IP, Mask: gw.Mask}}
			if fam == netlink.FAMILY_V6 {
				// Usable at once: the gateway must not sit tentative
				// while the first pod talks to it.
				a.Flags = unix.IFA_F_NODAD
			}
			if err := netlink.AddrAdd(link, a); err != nil && !errors.Is(err, syscall.EEXIST) {
				return fmt.Errorf("adding gateway %s to %s: %w", gw.String(), name, err)
			}
			have = append(have, gw)
		}
		existing[fam] = have
	}
	return vethplugin.EnableForwarding(p.Forward4, p.Forward6)
}

func remove(list []net.IPNet, x net.IPNet) []net.IPNet {
	out := list[:0]
	for _, a := range list {
		if a.String() != x.String() {
			out = append(out, a)
		}
	}
	return out
}

// pinMAC sets the bridge's MAC to itself, so that the kernel stops
// deriving it from the ports (as the reference does for gateway bridges).
func pinMAC(br *netlink.Bridge) error {
	mac := br.HardwareAddr
	zero := true
	for _, b := range mac {
		zero = zero && b == 0
	}
	if zero {
		mac = veth.RandomMAC()
	}
	if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
		return fmt.Errorf("pinning MAC of bridge %q: %w", br.Name, err)
	}
	return nil
}
