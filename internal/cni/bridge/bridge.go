// Package bridge is the bridge CNI plugin: it reads the reference bridge
// plugin's configuration (v1.10.0) and connects a container to a Linux
// bridge in the host namespace through a veth pair.
//
// ADD, in order: ensure the bridge; create the veth pair (the container
// end is created directly inside the container netns, see package veth);
// port settings (hairpin, isolation, VLANs, MAC spoof check); IPAM; the
// container's addresses and routes; the gateway on the bridge and
// forwarding; ipMasq; wait for the port to be up. Every step after the
// pair exists registers its undo, and a failed ADD runs them in reverse:
// no veth, no reservation, no rule is left behind (the reference leaves
// its veth when IPAM fails). The pair is created before IPAM so that an
// ADD that fails because CNI_IFNAME already exists (code 104) never
// releases the reservation of the attachment that owns that interface.
//
// DEL removes the container interface (its host end goes with it), the
// masquerade and spoof-check rules, and releases the IPAM reservation last,
// so that an address is never handed out while rules for it remain.
package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ipam"
	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/cni/veth"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
)

// Plugin is bridge as a CNI plugin.
var Plugin = plugin.Plugin{
	Name: "bridge",
	Funcs: skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		GC:     cmdGC,
		Status: cmdStatus,
	},
}

// Stage is bridge's verbs in process, for the flatnet plugin type.
var Stage = plugin.Stage{Name: "bridge", Add: add, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus,
	Unhook: unhook, Release: release}

func attachment(n *NetConf, args *skel.CmdArgs) ipmasq.Attachment {
	return ipmasq.Attachment{Network: n.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

// cmdAdd is ADD as the standalone plugin: add, then print the result.
func cmdAdd(args *skel.CmdArgs) error {
	r, err := add(args)
	if err != nil {
		return err
	}
	return r.Print()
}

// add sets the container up and returns its result in the config's CNI
// version (the flatnet plugin type calls it in process).
func add(args *skel.CmdArgs) (out types.Result, err error) {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return nil, err
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return nil, err
	}
	if err := plugin.CheckNetNS(args.Netns); err != nil {
		return nil, err
	}
	ctx := context.Background()
	defer parking.CollectStaleBeside()()

	br, created, err := ensureBridge(n)
	if err != nil {
		return nil, err
	}
	pair, err := veth.Create(veth.Spec{NetNS: args.Netns, PeerName: args.IfName, MTU: n.MTU, PeerMAC: n.mac, MasterIndex: br.Index})
	if err != nil {
		return nil, err
	}
	var u plugin.Undo
	defer u.OnError(&err)
	u.Push(func() error { return veth.DeleteHost(pair.HostName) })

	if err := setupPort(n, br, pair.HostName, pair.HostIndex, n.Vlan); err != nil {
		return nil, err
	}
	if n.MacSpoofChk {
		sc, err := newSpoofChecker()
		if err != nil {
			return nil, err
		}
		if err := sc.Setup(ctx, n.Name, args.ContainerID, args.IfName, pair.HostName, pair.PeerMAC); err != nil {
			return nil, err
		}
		u.Push(func() error { return sc.Teardown(ctx, n.Name, args.ContainerID, args.IfName) })
	}

	base := 0
	if prev != nil {
		base = len(prev.Interfaces)
	}
	brIface := &current.Interface{Name: n.BrName}
	ifaces := []*current.Interface{
		brIface,
		{Name: pair.HostName, Mac: pair.HostMAC.String()},
		{Name: args.IfName, Mac: pair.PeerMAC.String(), Sandbox: args.Netns},
	}
	var p *addrPlan
	masq := func() error { return nil }
	if n.Layer3() {
		ipamRes, err := ipam.Add(ctx, args)
		if err != nil {
			return nil, err
		}
		u.Push(func() error { return ipam.Del(ctx, args) })
		if p, err = planAddrs(n, ipamRes, base+2); err != nil {
			return nil, err
		}
		// The masquerade rules need only the addresses: install them
		// (an nft process) while the container and the gateway are set up.
		if n.IPMasq {
			wait, undoMasq := ipmasq.Start(ctx, n.IPMasqBackend, attachment(n, args), p.Masq)
			masq = wait
			u.Push(undoMasq)
		}
		if err := netns.Do(args.Netns, func() error { return configureContainer(n, args.IfName, p) }); err != nil {
			return nil, fmt.Errorf("configuring %s in netns %s: %w", args.IfName, args.Netns, err)
		}
		if n.IsGW {
			link, gwIface, err := gatewayLink(n, br)
			if err != nil {
				return nil, err
			}
			if gwIface != nil {
				ifaces = append(ifaces, gwIface)
			}
			if err := ensureGateways(n, link, p); err != nil {
				return nil, err
			}
			if !created && n.Vlan == 0 {
				if err := pinMAC(br); err != nil {
					return nil, err
				}
			}
		}
	} else if !n.DisableContainerInterface {
		if err := netns.Do(args.Netns, func() error { return linkUp(args.IfName) }); err != nil {
			return nil, fmt.Errorf("setting %s up in netns %s: %w", args.IfName, args.Netns, err)
		}
	}
	if !n.DisableContainerInterface {
		if err := veth.WaitUp(pair.HostIndex, pair.HostName, 3*time.Second); err != nil {
			return nil, err
		}
	}
	if err := masq(); err != nil {
		return nil, err
	}
	// The bridge's MAC may have changed when its first port arrived.
	if l, err := netlink.LinkByIndex(br.Index); err == nil {
		brIface.Mac = l.Attrs().HardwareAddr.String()
	} else {
		return nil, fmt.Errorf("looking up bridge %q: %w", n.BrName, err)
	}

	result := assemble(prev, ifaces, p)
	if p == nil && vethplugin.DNSSet(n.DNS) {
		result.DNS = n.DNS
	}
	out, err = result.GetAsVersion(n.CNIVersion)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.IncompatibleVersion, err, "bridge: result as CNI %s", n.CNIVersion)
	}
	return out, nil
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// masqAddrs merges the addresses found on the deleted interface with
// those of prevResult (either may be missing).
func masqAddrs(linkAddrs []netlink.Addr, prev *current.Result) []netip.Prefix {
	seen := map[netip.Prefix]bool{}
	var out []netip.Prefix
	addP := func(a net.IPNet) {
		if !a.IP.IsGlobalUnicast() {
			return
		}
		if p, ok := vethplugin.ToPrefix(a); ok && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, a := range linkAddrs {
		if a.IPNet != nil {
			addP(*a.IPNet)
		}
	}
	if prev != nil {
		for _, ip := range prev.IPs {
			addP(ip.Address)
		}
	}
	return out
}

// cmdDel parks the veth (internal/cni/parking) rather than waiting for
// the kernel to delete it.
func cmdDel(args *skel.CmdArgs) error {
	links := parking.New()
	if err := errors.Join(unhook(args, links), links.Flush()); err != nil {
		return err
	}
	return release(args)
}

// unhook is DEL but for the address: the interface, the masquerade and
// spoof-check rules. An address is only released (release) once this has
// succeeded, so that it is never handed out while an interface holds it.
func unhook(args *skel.CmdArgs, links netlinkx.LinkDeleter) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	prev, _ := plugin.LoadPrevResult(&n.NetConf)
	ctx := context.Background()
	// Removing the interface and removing rules each wait for the kernel
	// (an RCU grace period apiece), so they run at the same time when
	// prevResult names the addresses. The rules go by name either way;
	// the addresses only let the masquerade teardown skip reading the
	// table.
	prevAddrs := masqAddrs(nil, prev)
	early := n.IPMasq && len(prevAddrs) > 0
	var wg sync.WaitGroup
	var masqErr, spoofErr error
	if early {
		wg.Add(1)
		go func() {
			defer wg.Done()
			masqErr = ipmasq.TeardownIfAny(ctx, n.IPMasqBackend, attachment(n, args), prevAddrs)
		}()
	}
	if n.MacSpoofChk {
		wg.Add(1)
		go func() { defer wg.Done(); spoofErr = teardownSpoof(ctx, n, args) }()
	}
	addrs, err := vethplugin.DeleteVeth(prev, args.Netns, args.IfName, links)
	wg.Wait()
	if err := errors.Join(err, masqErr, spoofErr); err != nil {
		return err
	}
	if n.IPMasq && !early {
		return ipmasq.TeardownIfAny(ctx, n.IPMasqBackend, attachment(n, args), masqAddrs(addrs, nil))
	}
	return nil
}

// release frees the pod's address (IPAM's DEL), last in DEL.
func release(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if n.Layer3() {
		return ipam.Del(context.Background(), args)
	}
	return nil
}

func teardownSpoof(ctx context.Context, n *NetConf, args *skel.CmdArgs) error {
	sc, err := newSpoofChecker()
	if ipmasq.IsUnavailable(err) {
		return nil // no nftables, so no rules of ours
	}
	if err != nil {
		return err
	}
	return sc.Teardown(ctx, n.Name, args.ContainerID, args.IfName)
}

// cmdStatus: code 50 when ADD could not install what the config asks
// for: masquerade or spoof-check rules (a GETGEN over netlink for
// nftables, a PATH lookup for iptables: no process either way), or an
// address (IPAM's own STATUS).
func cmdStatus(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	unavailable := func(err error) error {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "bridge is not available")
	}
	if n.IPMasq && n.Layer3() {
		if _, err := ipmasq.Select(n.IPMasqBackend); err != nil {
			return unavailable(err)
		}
	}
	if n.MacSpoofChk {
		if err := probeSpoofCheck(); err != nil {
			return unavailable(err)
		}
	}
	if n.Layer3() {
		return ipam.Status(context.Background(), args)
	}
	return nil
}

func cmdGC(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	valid, err := plugin.ValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if _, err := parking.Collect(); err != nil {
		return err
	}
	// Rules first, addresses last (as DEL).
	var atts []ipmasq.Attachment
	keep := map[[2]string]bool{}
	for a := range valid {
		atts = append(atts, ipmasq.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
		keep[[2]string{a.ContainerID, a.IfName}] = true
	}
	if err := ipmasq.GCAll(ctx, n.IPMasqBackend, n.IPMasq, n.Name, atts); err != nil {
		return err
	}
	if sc, err := newSpoofChecker(); err == nil {
		if err := sc.GC(ctx, n.Name, keep); err != nil {
			return err
		}
	} else if n.MacSpoofChk {
		return err
	}
	if n.Layer3() {
		return ipam.GC(ctx, args)
	}
	return nil
}
