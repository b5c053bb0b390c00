// Package macvlan is the macvlan CNI plugin: it gives a container an
// interface of its own on the node's network (a macvlan on a "master"
// interface), addressed from the node's network by the IPAM: the Linux
// counterpart of Windows' l2bridge. It reads the reference macvlan
// plugin's configuration (v1.10.0): master, mode, mtu, mac (also from
// CNI_ARGS MAC= and the "mac" runtime capability), linkInContainer,
// bcqueuelen, ipam (absent or without a type: L2 only).
//
// ADD, in order: resolve the master (by name, or the default route's
// interface); refuse an existing CNI_IFNAME (104) before creating
// anything; create the macvlan under a temporary name directly in the
// container's netns (one netlink request: created on the master, placed in
// the netns), rename it to CNI_IFNAME; IPAM ADD; addresses, routes and link
// up, with arp_notify/ndisc_notify set first so the kernel announces the
// addresses (gratuitous ARP) when the link comes up. Every step after the
// link exists registers its undo; a failed ADD deletes the link and
// releases the reservation. The link is created before IPAM so that an ADD
// refused with 104 never releases the reservation of the attachment that
// owns the existing interface.
//
// DEL deletes the link (if it is a macvlan: another plugin's interface of
// the same name is left alone), then releases the IPAM reservation; it is
// idempotent and succeeds when the netns is gone (the link went with it).
// CHECK compares the link (kind, master, mode, MAC, addresses, routes) with
// prevResult and the config (106) and CHECKs the IPAM. GC and STATUS go to
// the IPAM; STATUS also reports 50 when the master is missing (see
// cmdStatus).
package macvlan

import (
	"context"
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ipam"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netns"
)

// Plugin is macvlan as a CNI plugin.
var Plugin = plugin.Plugin{Name: "macvlan", Funcs: skel.CNIFuncs{
	Add:    func(a *skel.CmdArgs) error { return cmdAdd(real, a) },
	Del:    func(a *skel.CmdArgs) error { return cmdDel(real, a) },
	Check:  func(a *skel.CmdArgs) error { return cmdCheck(real, a) },
	GC:     func(a *skel.CmdArgs) error { return cmdGC(real, a) },
	Status: func(a *skel.CmdArgs) error { return cmdStatus(real, a) },
}}

// deps are the plugin's effects: the kernel and the IPAM. Unit tests
// replace both.
type deps struct {
	k       kernel
	tmpName func() string
	ipam    ipamer
}

// ipamer is internal/cni/ipam's surface.
type ipamer interface {
	Add(context.Context, *skel.CmdArgs) (*current.Result, error)
	Del(context.Context, *skel.CmdArgs) error
	Check(context.Context, *skel.CmdArgs) error
	GC(context.Context, *skel.CmdArgs) error
	Status(context.Context, *skel.CmdArgs) error
}

type realIPAM struct{}

func (realIPAM) Add(ctx context.Context, a *skel.CmdArgs) (*current.Result, error) {
	return ipam.Add(ctx, a)
}
func (realIPAM) Del(ctx context.Context, a *skel.CmdArgs) error    { return ipam.Del(ctx, a) }
func (realIPAM) Check(ctx context.Context, a *skel.CmdArgs) error  { return ipam.Check(ctx, a) }
func (realIPAM) GC(ctx context.Context, a *skel.CmdArgs) error     { return ipam.GC(ctx, a) }
func (realIPAM) Status(ctx context.Context, a *skel.CmdArgs) error { return ipam.Status(ctx, a) }

var real = deps{k: netlinkKernel{}, tmpName: tmpName, ipam: realIPAM{}}

// masterNS is where n's master lives: the container's netns with
// linkInContainer, else the runtime's ("").
func masterNS(n *NetConf, netnsPath string) string {
	if n.LinkInContainer {
		return netnsPath
	}
	return ""
}

func cmdAdd(d deps, args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return err
	}
	own, err := add(d, n, args)
	if err != nil {
		return err
	}
	return plugin.PrintResult(merge(prev, own), n.CNIVersion)
}

// add creates and configures the attachment and returns this plugin's part
// of the result; on failure it leaves nothing behind.
func add(d deps, n *NetConf, args *skel.CmdArgs) (_ *current.Result, err error) {
	if err := d.k.CheckNetNS(args.Netns); err != nil {
		return nil, err
	}
	m, err := d.k.Master(n.Master, masterNS(n, args.Netns))
	if err != nil {
		return nil, err
	}
	p, err := planLink(n, m, args.IfName, d.tmpName())
	if err != nil {
		return nil, err
	}
	exists, err := d.k.Exists(args.Netns, args.IfName)
	if err != nil {
		return nil, err
	}
	if exists {
		return nil, cnierr.New(cnierr.InterfaceExists, "macvlan: interface %s already exists in netns %s", args.IfName, args.Netns)
	}

	if err := d.k.Create(p, args.Netns, n.LinkInContainer); err != nil {
		return nil, err
	}
	var undo plugin.Undo
	defer undo.OnError(&err)
	linkName := p.TmpName
	undo.Push(func() error { return d.k.Delete(args.Netns, linkName) })

	iface, err := d.k.Rename(args.Netns, p.TmpName, args.IfName)
	if err != nil {
		return nil, err
	}
	linkName = args.IfName

	ctx := context.Background()
	var ipamRes *current.Result
	if n.Layer3() {
		if ipamRes, err = d.ipam.Add(ctx, args); err != nil {
			return nil, err
		}
		undo.Push(func() error { return d.ipam.Del(ctx, args) })
	}
	own, err := ownResult(n, iface, ipamRes)
	if err != nil {
		return nil, err
	}
	apply := own
	if !n.Layer3() {
		apply = nil // L2 only: just set the link up
	}
	if err := d.k.Configure(args.Netns, args.IfName, apply); err != nil {
		return nil, err
	}
	return own, nil
}

func cmdDel(d deps, args *skel.CmdArgs) error {
	n, err := decode(args.StdinData)
	if err != nil {
		return err
	}
	var errs []error
	if args.Netns != "" {
		if err := d.k.Delete(args.Netns, args.IfName); err != nil && !errors.Is(err, netns.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// Released after the link is gone, so the address is never handed out
	// while this interface still answers for it.
	if n.Layer3() {
		if err := d.ipam.Del(context.Background(), args); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func cmdCheck(d deps, args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return err
	}
	if prev == nil {
		return cnierr.New(cnierr.InvalidConfig, "macvlan: CHECK needs the ADD result as prevResult")
	}
	if err := d.k.CheckNetNS(args.Netns); err != nil {
		return err
	}
	if n.Layer3() {
		if err := d.ipam.Check(context.Background(), args); err != nil {
			return err
		}
	}
	m, err := d.k.Master(n.Master, masterNS(n, args.Netns))
	if err != nil {
		return cnierr.Wrap(cnierr.CheckFailed, err, "macvlan: CHECK")
	}
	obs, err := d.k.Observe(args.Netns, args.IfName)
	if err != nil {
		if errors.Is(err, errLinkNotFound) {
			return cnierr.Wrap(cnierr.CheckFailed, err, "macvlan: CHECK")
		}
		return err
	}
	return checkAttachment(n, prev, args.Netns, args.IfName, m, obs)
}

// cmdGC passes GC to the IPAM: the macvlan itself lives in the container's
// netns and dies with it, so the reservations are the only state that can
// outlive an attachment. Without an IPAM there is nothing to collect.
func cmdGC(d deps, args *skel.CmdArgs) error {
	n, err := decode(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := plugin.ValidAttachments(args.StdinData); err != nil {
		return err
	}
	if !n.Layer3() {
		return nil
	}
	return d.ipam.GC(context.Background(), args)
}

// cmdStatus says whether the plugin can work at all. Beyond the IPAM (its
// dataDir; a full range is not "not ready"), an ADD needs the master: when it is missing
// from the runtime's netns (or, without "master", there is no default
// route) every ADD would fail, so STATUS reports 50 (plugin not available)
// naming it, and the runtime marks the node's network not ready instead of
// failing pod after pod. With linkInContainer the master lives in each
// container's netns and cannot be checked here.
func cmdStatus(d deps, args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, "")
	if err != nil {
		return err
	}
	if !n.LinkInContainer {
		if _, err := d.k.Master(n.Master, ""); err != nil {
			return cnierr.Wrap(cnierr.PluginNotAvailable, err, "macvlan: not ready")
		}
	}
	if !n.Layer3() {
		return nil
	}
	return d.ipam.Status(context.Background(), args)
}
