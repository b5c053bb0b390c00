// Package bandwidth is flatnet's bandwidth CNI plugin: a chained plugin
// that limits a container's traffic with the kernel's token-bucket filter,
// reading the same config as containernetworking/plugins' bandwidth
// (ingressRate/ingressBurst/egressRate/egressBurst in bits per second and
// bits, statically or through the `bandwidth` runtime capability).
//
// Design. The container's traffic crosses the host-side end of its veth
// pair, which the previous plugin (bridge, ptp) created and lists in
// prevResult:
//
//	host ns:  ... -> [host veth] root TBF ----------------> container (ingress limit)
//	          ... <- IFB root TBF <- mirred <- [host veth] ingress qdisc <- container (egress limit)
//
// Traffic toward the container leaves the host veth, so a root TBF there
// shapes it. Traffic from the container *arrives* on the host veth, and a
// qdisc can only shape what a device sends; so an ingress qdisc with a
// match-all filter redirects it to an IFB device, whose root TBF shapes
// it before the packets re-enter the stack. The qdisc parameters are a
// pure Plan (plan.go, with the arithmetic in internal/tc); apply.go
// installs, checks and removes it through the tc.Kernel interface, all
// over netlink: no tc(8), no process started.
//
// The IFB is named like the reference's ("bwp" + hash of network name and
// container ID), so DEL removes IFBs either plugin made. Its alias records
// the owning attachment ("flatnet-bw:NET:CONTAINERID:IFNAME"), which GC
// needs because the hash cannot be reversed. ADD undoes every step when a
// later one fails. Error codes: 7 for bad limits, 104 when the IFB name is
// taken by another attachment, 105 when the kernel lacks
// IFB, TBF, the ingress qdisc or u32/mirred, 106 when CHECK finds a
// difference, 50 from STATUS when shaping is unavailable.
package bandwidth

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/tc"
)

// Name is the plugin's type name.
const Name = "bandwidth"

// Plugin is bandwidth as a CNI plugin.
var Plugin = plugin.Plugin{Name: Name, Funcs: skel.CNIFuncs{
	Add:    cmdAdd,
	Del:    cmdDel,
	Check:  cmdCheck,
	GC:     cmdGC,
	Status: cmdStatus,
}}

// kernel is the host namespace's traffic control (the calling thread's).
var kernel tc.Kernel = tc.Netlink{}

// Stage is bandwidth's verbs in process, for the flatnet plugin type.
var Stage = plugin.Stage{Name: Name, Add: add, Del: cmdDel, Unhook: unhook, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}

// cmdAdd is ADD as the standalone plugin: add, then print the result (a
// result that cannot be printed undoes the shaping: the runtime will not
// know it exists).
func cmdAdd(args *skel.CmdArgs) error {
	r, err := add(args)
	if err != nil {
		return err
	}
	if err := r.Print(); err != nil {
		return errors.Join(cnierr.Wrap(cnierr.IOFailure, err, "bandwidth: printing the result"), cmdDel(args))
	}
	return nil
}

// add shapes the container's traffic and returns the prevResult (with the
// IFB, when one was made) in the config's CNI version.
func add(args *skel.CmdArgs) (types.Result, error) {
	cfg, err := parseConfig(args.StdinData, true)
	if err != nil {
		return nil, err
	}
	prev, err := plugin.PrevResult(&cfg.NetConf)
	if err != nil {
		return nil, err
	}
	if prev == nil {
		return nil, cnierr.New(cnierr.InvalidConfig, "bandwidth: no prevResult: bandwidth is a chained plugin and must follow the plugin that creates the container's interface (bridge, ptp) in a conflist")
	}
	if !cfg.Ingress.IsSet() && !cfg.Egress.IsSet() {
		return asVersion(prev, cfg.CNIVersion)
	}
	defer parking.CollectStaleBeside()()
	owner := Owner{Network: cfg.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	host, err := hostVeth(kernel, args.Netns, args.IfName, prev, cnierr.InvalidConfig)
	if err != nil {
		return nil, err
	}
	p, err := NewPlan(cfg, owner, host, tc.KernelClock())
	if err != nil {
		return nil, err
	}
	ifb, undo, err := apply(kernel, p, owner)
	if err != nil {
		return nil, err
	}
	if ifb != nil {
		prev.Interfaces = append(prev.Interfaces, &current.Interface{Name: ifb.Name, Mac: ifb.MAC})
	}
	r, err := asVersion(prev, cfg.CNIVersion)
	if err != nil {
		return nil, errors.Join(err, undo())
	}
	return r, nil
}

// asVersion is r in CNI version v.
func asVersion(r types.Result, v string) (types.Result, error) {
	out, err := r.GetAsVersion(v)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.IncompatibleVersion, err, "bandwidth: result as CNI %s", v)
	}
	return out, nil
}

// cmdDel parks the IFB (internal/cni/parking) rather than waiting for the
// kernel to delete it.
func cmdDel(args *skel.CmdArgs) error {
	links := parking.New()
	return errors.Join(unhook(args, links), links.Flush())
}

// unhook is DEL handing the IFB to links (nil: deleting it at once).
func unhook(args *skel.CmdArgs, links netlinkx.LinkDeleter) error {
	cfg, err := parseConfig(args.StdinData, false)
	if err != nil {
		return err
	}
	// The IFB lives in the host namespace and is found by name: neither
	// the container's netns nor prevResult is needed, so DEL works after
	// the container is gone. The host veth's qdiscs go with the veth,
	// which the main plugin deletes.
	var del netlinkx.LinkDeleter = kernel
	if links != nil {
		del = links
	}
	return teardown(kernel, del, Owner{Network: cfg.Name, ContainerID: args.ContainerID, IfName: args.IfName})
}

func cmdCheck(args *skel.CmdArgs) error {
	cfg, err := parseConfig(args.StdinData, true)
	if err != nil {
		return err
	}
	prev, err := plugin.PrevResult(&cfg.NetConf)
	if err != nil {
		return err
	}
	if prev == nil {
		return cnierr.New(cnierr.InvalidConfig, "bandwidth: no prevResult: CHECK of a chained plugin needs the result of ADD")
	}
	if !cfg.Ingress.IsSet() && !cfg.Egress.IsSet() {
		return nil
	}
	owner := Owner{Network: cfg.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	host, err := hostVeth(kernel, args.Netns, args.IfName, prev, cnierr.CheckFailed)
	if err != nil {
		return err
	}
	p, err := NewPlan(cfg, owner, host, tc.KernelClock())
	if err != nil {
		return err
	}
	return check(kernel, p)
}

func cmdGC(args *skel.CmdArgs) error {
	cfg, err := parseConfig(args.StdinData, false)
	if err != nil {
		return err
	}
	valid, err := plugin.ValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	// Parked IFBs (and veths) go in one request, before the one-by-one
	// removal of IFBs whose attachment is gone.
	if _, err := parking.Collect(); err != nil {
		return err
	}
	_, err = collect(kernel, cfg.Name, valid)
	return err
}

func cmdStatus(args *skel.CmdArgs) error {
	if _, err := parseConfig(args.StdinData, true); err != nil {
		return err
	}
	if err := probe(); err != nil {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "bandwidth: traffic shaping is not available")
	}
	return nil
}

// probe builds, in a throwaway namespace, everything ADD builds: two IFBs,
// a TBF on one, an ingress qdisc and a redirect filter on the other.
func probe() error {
	return netns.DoScratch(func() error {
		k := tc.Netlink{}
		t, err := tc.KernelClock().TBFFor(10_000_000, 100_000)
		if err != nil {
			return err
		}
		a, err := k.AddIFB("bwprobe0", "", 1500)
		if err != nil {
			return err
		}
		b, err := k.AddIFB("bwprobe1", "", 1500)
		if err != nil {
			return err
		}
		if err := k.SetRootTBF(a.Index, t); err != nil {
			return err
		}
		if err := k.AddIngress(b.Index); err != nil {
			return err
		}
		return k.AddRedirect(b.Index, a.Index)
	})
}

// hostVeth finds the host-side end of the container's veth pair: the peer
// of ifName in the container's netns. Like the reference, it must be a
// host-side interface of prevResult; a peer that prevResult does not list
// is accepted only if it is a veth pointing back at the container's end.
// Failures carry code (7 in ADD, 106 in CHECK); a missing netns is 3.
func hostVeth(k tc.Kernel, netnsPath, ifName string, prev *current.Result, code uint) (tc.Link, error) {
	var cont tc.Link
	err := netns.Do(netnsPath, func() error {
		l, err := netlinkx.LinkByName(ifName)
		if netlinkx.IsNotFound(err) {
			return cnierr.New(code, "bandwidth: interface %s not found in netns %s: the plugin before bandwidth must create it", ifName, netnsPath)
		}
		if err != nil {
			return fmt.Errorf("bandwidth: looking up %s in netns %s: %w", ifName, netnsPath, err)
		}
		a := l.Attrs()
		cont = tc.Link{Index: a.Index, Name: a.Name, Kind: l.Type(), Parent: a.ParentIndex}
		return nil
	})
	if errors.Is(err, netns.ErrNotExist) {
		return tc.Link{}, cnierr.Wrap(cnierr.UnknownContainer, err, "bandwidth: container netns")
	}
	if err != nil {
		return tc.Link{}, err
	}
	if cont.Kind != "veth" || cont.Parent == 0 {
		return tc.Link{}, cnierr.New(code, "bandwidth: %s in netns %s is a %s link, not one end of a veth pair: bandwidth shapes the host side of a veth (bridge, ptp)", ifName, netnsPath, cont.Kind)
	}
	host, ok, err := k.LinkByIndex(cont.Parent)
	if err != nil {
		return tc.Link{}, err
	}
	listed := false
	if ok {
		for _, i := range prev.Interfaces {
			if i != nil && i.Sandbox == "" && i.Name == host.Name {
				listed = true
			}
		}
	}
	if !ok || !listed && !(host.Kind == "veth" && host.Parent == cont.Index) {
		return tc.Link{}, cnierr.New(code, "bandwidth: the veth peer of %s in netns %s (index %d) is not a host interface listed in prevResult", ifName, netnsPath, cont.Parent)
	}
	return host, nil
}
