// Package ptp is the ptp CNI plugin: it reads the reference ptp plugin's
// configuration (ipMasq, mtu, ipam) and gives a container a veth whose
// host end routes to it, without a bridge (see plan.go for the addresses
// and routes).
//
// Same failure rules as bridge: the pair is created first (so a 104 for
// an existing CNI_IFNAME never releases another attachment's address),
// every later step registers its undo, and a failed ADD runs them all:
// no veth, no reservation, no rule remain. DEL removes the interface
// (the host end, its addresses and routes go with it), then the masquerade
// rules, then the reservation.
package ptp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ifconf"
	"github.com/flatnet/flatnet/internal/cni/ipam"
	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/cni/veth"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// Plugin is ptp as a CNI plugin.
var Plugin = plugin.Plugin{
	Name: "ptp",
	Funcs: skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		GC:     cmdGC,
		Status: cmdStatus,
	},
}

func attachment(n *NetConf, args *skel.CmdArgs) ipmasq.Attachment {
	return ipmasq.Attachment{Network: n.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	n, err := Load(args.StdinData)
	if err != nil {
		return err
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return err
	}
	if err := plugin.CheckNetNS(args.Netns); err != nil {
		return err
	}
	ctx := context.Background()

	pair, err := veth.Create(veth.Spec{NetNS: args.Netns, PeerName: args.IfName, MTU: n.MTU, NoHostDAD: true})
	if err != nil {
		return err
	}
	var u plugin.Undo
	defer u.OnError(&err)
	u.Push(func() error { return veth.DeleteHost(pair.HostName) })

	ipamRes, err := ipam.Add(ctx, args)
	if err != nil {
		return err
	}
	u.Push(func() error { return ipam.Del(ctx, args) })

	base := 0
	if prev != nil {
		base = len(prev.Interfaces)
	}
	p, err := makePlan(n, ipamRes, base+1)
	if err != nil {
		return err
	}
	// The masquerade rules need only the addresses: install them (an nft
	// process) while the interfaces are configured.
	masq := func() error { return nil }
	if n.IPMasq {
		wait, undoMasq := ipmasq.Start(ctx, n.IPMasqBackend, attachment(n, args), p.Masq)
		masq = wait
		u.Push(undoMasq)
	}
	if err := netns.Do(args.Netns, func() error { return configureContainer(args.IfName, p) }); err != nil {
		return fmt.Errorf("configuring %s in netns %s: %w", args.IfName, args.Netns, err)
	}
	if err := configureHost(pair, p); err != nil {
		return err
	}
	if err := veth.WaitUp(pair.HostIndex, pair.HostName, 3*time.Second); err != nil {
		return err
	}
	if err := masq(); err != nil {
		return err
	}

	result := vethplugin.Result(prev, []*current.Interface{
		{Name: pair.HostName, Mac: pair.HostMAC.String()},
		{Name: args.IfName, Mac: pair.PeerMAC.String(), Sandbox: args.Netns},
	}, p.IPs, p.Routes, p.DNS)
	out, err := result.GetAsVersion(n.CNIVersion)
	if err != nil {
		return cnierr.Wrap(cnierr.IncompatibleVersion, err, "ptp: result as CNI %s", n.CNIVersion)
	}
	return out.Print()
}

// configureContainer runs inside the container's namespace.
func configureContainer(ifName string, p *plan) error {
	// A /32 on a point-to-point link has nobody to collide with: no DAD,
	// so IPv6 works at once.
	_ = sysctl.SetPath("0", "net/ipv6/conf", ifName, "accept_dad")
	res := &current.Result{
		Interfaces: []*current.Interface{{Name: ifName}},
		IPs:        p.ContIPs,
		Routes:     p.ContRoutes,
	}
	return ifconf.Configure(ifName, res)
}

// configureHost gives the host end the gateway addresses and routes the
// container's addresses to it, and enables forwarding.
func configureHost(pair *veth.Pair, p *plan) error {
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair.HostName, Index: pair.HostIndex}}
	for _, a := range p.HostAddrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP, Mask: a.Mask}}
		if a.IP.To4() == nil {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("adding %s to %s: %w", a.String(), pair.HostName, err)
		}
	}
	for _, dst := range p.HostRoutes {
		r := &netlink.Route{LinkIndex: pair.HostIndex, Dst: &net.IPNet{IP: dst.IP, Mask: dst.Mask}, Scope: netlink.SCOPE_LINK}
		// Replace: the address is ours now; a route left by a dead
		// attachment must not keep it.
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("adding route %s dev %s: %w", dst.String(), pair.HostName, err)
		}
	}
	return vethplugin.EnableForwarding(p.Forward4, p.Forward6)
}

// masqAddrs returns the container addresses with their subnet lengths for
// DEL: from prevResult (the result says /32, the subnet comes from the
// route via the gateway) or, failing that, the interface's /32s, which
// Teardown only uses as keys.
func masqAddrs(linkAddrs []netlink.Addr, prev *current.Result) []netip.Prefix {
	seen := map[netip.Addr]bool{}
	var out []netip.Prefix
	add := func(a net.IPNet) {
		if !a.IP.IsGlobalUnicast() {
			return
		}
		if p, ok := vethplugin.ToPrefix(a); ok && !seen[p.Addr()] {
			seen[p.Addr()] = true
			out = append(out, p)
		}
	}
	if prev != nil {
		for _, ip := range prev.IPs {
			add(ip.Address)
		}
	}
	for _, a := range linkAddrs {
		if a.IPNet != nil {
			add(*a.IPNet)
		}
	}
	return out
}

func cmdDel(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData)
	if err != nil {
		return err
	}
	prev, _ := plugin.LoadPrevResult(&n.NetConf)
	ctx := context.Background()
	// The interface and the rules are removed at the same time when
	// prevResult names the addresses (each waits for the kernel).
	prevAddrs := masqAddrs(nil, prev)
	early := n.IPMasq && len(prevAddrs) > 0
	masqErr := make(chan error, 1)
	if early {
		go func() { masqErr <- ipmasq.TeardownIfAny(ctx, n.IPMasqBackend, attachment(n, args), prevAddrs) }()
	} else {
		masqErr <- nil
	}
	addrs, err := vethplugin.DeleteVeth(prev, args.Netns, args.IfName, nil)
	if err := errors.Join(err, <-masqErr); err != nil {
		return err
	}
	if n.IPMasq && !early {
		if err := ipmasq.TeardownIfAny(ctx, n.IPMasqBackend, attachment(n, args), masqAddrs(addrs, nil)); err != nil {
			return err
		}
	}
	return ipam.Del(ctx, args)
}

func cmdStatus(args *skel.CmdArgs) error {
	if _, err := Load(args.StdinData); err != nil {
		return err
	}
	return ipam.Status(context.Background(), args)
}

func cmdGC(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData)
	if err != nil {
		return err
	}
	valid, err := plugin.ValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var atts []ipmasq.Attachment
	for a := range valid {
		atts = append(atts, ipmasq.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	if err := ipmasq.GCAll(ctx, n.IPMasqBackend, n.IPMasq, n.Name, atts); err != nil {
		return err
	}
	return ipam.GC(ctx, args)
}
