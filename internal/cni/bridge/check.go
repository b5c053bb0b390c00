package bridge

import (
	"context"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ipam"
	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
)

// containerState is what CHECK reads inside the container.
type containerState struct {
	found     bool
	isVeth    bool
	mac       string
	peerIndex int
	addrs     []net.IPNet
	routes    []netlink.Route
}

func readContainer(ifName string) (*containerState, error) {
	st := &containerState{}
	l, err := netlinkx.LinkByName(ifName)
	if err != nil {
		if netlinkx.IsNotFound(err) {
			return st, nil
		}
		return nil, err
	}
	st.found = true
	_, st.isVeth = l.(*netlink.Veth)
	st.mac = l.Attrs().HardwareAddr.String()
	st.peerIndex = l.Attrs().ParentIndex
	addrs, err := netlinkx.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		st.addrs = append(st.addrs, *a.IPNet)
	}
	if st.routes, err = netlinkx.RouteList(nil, netlink.FAMILY_ALL); err != nil {
		return nil, err
	}
	return st, nil
}

// compareContainer lists how the container interface differs from what
// prevResult says (pure).
func compareContainer(ifName string, want *current.Interface, ips []*current.IPConfig, routes []*types.Route, st *containerState) []string {
	var problems []string
	if !st.found {
		return []string{fmt.Sprintf("interface %s is missing from netns %s", ifName, want.Sandbox)}
	}
	if !st.isVeth {
		problems = append(problems, fmt.Sprintf("interface %s is not a veth", ifName))
	}
	if want.Mac != "" && want.Mac != st.mac {
		problems = append(problems, fmt.Sprintf("interface %s has MAC %s, prevResult says %s", ifName, st.mac, want.Mac))
	}
	for _, ip := range ips {
		if !vethplugin.HasAddr(st.addrs, ip.Address) {
			problems = append(problems, fmt.Sprintf("interface %s lacks address %s", ifName, ip.Address.String()))
		}
	}
	for _, r := range routes {
		if !vethplugin.HasRoute(st.routes, r.Dst, r.GW) {
			gw := ""
			if r.GW != nil {
				gw = " via " + r.GW.String()
			}
			problems = append(problems, fmt.Sprintf("netns %s lacks route %s%s", want.Sandbox, r.Dst.String(), gw))
		}
	}
	return problems
}

func cmdCheck(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if n.RawPrevResult == nil {
		return cnierr.New(cnierr.InvalidConfig, "bridge: CHECK needs a prevResult")
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return err
	}
	if err := plugin.CheckNetNS(args.Netns); err != nil {
		return err
	}
	ctx := context.Background()
	if n.Layer3() {
		if err := ipam.Check(ctx, args); err != nil {
			return err
		}
	}

	var brWant *current.Interface
	for _, intf := range prev.Interfaces {
		if intf.Name == n.BrName && intf.Sandbox == "" {
			brWant = intf
		}
	}
	contWant, _, ips := vethplugin.ContainerIface(prev, args.IfName, args.Netns)
	var problems []string
	if brWant == nil {
		problems = append(problems, fmt.Sprintf("prevResult has no bridge interface %q", n.BrName))
	}
	if contWant == nil {
		return cnierr.Mismatch("bridge", append(problems, fmt.Sprintf("prevResult has no interface %s in netns %s", args.IfName, args.Netns)))
	}

	// The bridge.
	l, err := netlinkx.LinkByName(n.BrName)
	var br *netlink.Bridge
	switch {
	case netlinkx.IsNotFound(err):
		problems = append(problems, fmt.Sprintf("bridge %q is missing", n.BrName))
	case err != nil:
		return fmt.Errorf("looking up bridge %q: %w", n.BrName, err)
	default:
		var ok bool
		if br, ok = l.(*netlink.Bridge); !ok {
			problems = append(problems, fmt.Sprintf("%q is a %s, not a bridge", n.BrName, l.Type()))
		} else {
			if brWant != nil && brWant.Mac != "" && brWant.Mac != br.HardwareAddr.String() {
				problems = append(problems, fmt.Sprintf("bridge %q has MAC %s, prevResult says %s", n.BrName, br.HardwareAddr, brWant.Mac))
			}
			if promisc := br.Promisc != 0; promisc != n.PromiscMode {
				problems = append(problems, fmt.Sprintf("bridge %q promiscuous mode is %v, config says %v", n.BrName, promisc, n.PromiscMode))
			}
		}
	}

	// The container end.
	var st *containerState
	if err := netns.Do(args.Netns, func() error {
		var err error
		st, err = readContainer(args.IfName)
		return err
	}); err != nil {
		return fmt.Errorf("reading %s in netns %s: %w", args.IfName, args.Netns, err)
	}
	problems = append(problems, compareContainer(args.IfName, contWant, ips, prev.Routes, st)...)

	// The host end: the container end's peer, a port of the bridge, and
	// listed in prevResult with its MAC.
	var hostName string
	if st.found && st.peerIndex != 0 {
		hl, err := netlink.LinkByIndex(st.peerIndex)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("the host end of %s (index %d) is missing", args.IfName, st.peerIndex))
		default:
			hostName = hl.Attrs().Name
			if br != nil && hl.Attrs().MasterIndex != br.Index {
				problems = append(problems, fmt.Sprintf("host veth %s is not attached to bridge %q", hostName, n.BrName))
			}
			problems = append(problems, vethplugin.CheckHostVeth(prev, hostName, hl.Attrs().HardwareAddr.String())...)
		}
	}

	if n.IPMasq && n.Layer3() {
		if err := cnierr.AddFinding(&problems, ipmasq.CheckWith(ctx, n.IPMasqBackend, attachment(n, args), masqAddrs(nil, &current.Result{IPs: ips}))); err != nil {
			return err
		}
	}
	if n.MacSpoofChk && hostName != "" {
		sc, err := newSpoofChecker()
		if err != nil {
			return err
		}
		mac, _ := net.ParseMAC(contWant.Mac)
		if err := cnierr.AddFinding(&problems, sc.Check(ctx, n.Name, args.ContainerID, args.IfName, hostName, mac)); err != nil {
			return err
		}
	}
	return cnierr.Mismatch("bridge", problems)
}
