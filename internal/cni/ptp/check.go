package ptp

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

// linkState is what CHECK reads about one end of the pair.
type linkState struct {
	found     bool
	isVeth    bool
	name      string
	mac       string
	peerIndex int
	addrs     []net.IPNet
	routes    []netlink.Route // routes through this link
}

func readLink(l netlink.Link) (*linkState, error) {
	st := &linkState{found: true, name: l.Attrs().Name, mac: l.Attrs().HardwareAddr.String(), peerIndex: l.Attrs().ParentIndex}
	_, st.isVeth = l.(*netlink.Veth)
	addrs, err := netlinkx.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		st.addrs = append(st.addrs, *a.IPNet)
	}
	if st.routes, err = netlinkx.RouteList(l, netlink.FAMILY_ALL); err != nil {
		return nil, err
	}
	return st, nil
}

// compare lists the differences between prevResult and the two ends
// (pure).
func compare(ifName, sandbox string, want *current.Interface, ips []*current.IPConfig, routes []*types.Route, cont, host *linkState) []string {
	if !cont.found {
		return []string{fmt.Sprintf("interface %s is missing from netns %s", ifName, sandbox)}
	}
	var problems []string
	if !cont.isVeth {
		problems = append(problems, fmt.Sprintf("interface %s is not a veth", ifName))
	}
	if want.Mac != "" && want.Mac != cont.mac {
		problems = append(problems, fmt.Sprintf("interface %s has MAC %s, prevResult says %s", ifName, cont.mac, want.Mac))
	}
	for _, ip := range ips {
		if !vethplugin.HasAddr(cont.addrs, ip.Address) {
			problems = append(problems, fmt.Sprintf("interface %s lacks address %s", ifName, ip.Address.String()))
		}
		if ip.Gateway == nil {
			continue
		}
		gw := net.IPNet{IP: ip.Gateway, Mask: hostMask(ip.Gateway)}
		if !vethplugin.HasRoute(cont.routes, gw, nil) {
			problems = append(problems, fmt.Sprintf("netns %s lacks the link route to gateway %s", sandbox, ip.Gateway))
		}
		if host == nil {
			continue
		}
		if !vethplugin.HasAddr(host.addrs, gw) {
			problems = append(problems, fmt.Sprintf("host veth %s lacks gateway address %s", host.name, gw.String()))
		}
		if !vethplugin.HasRoute(host.routes, ip.Address, nil) {
			problems = append(problems, fmt.Sprintf("host has no route to %s through %s", ip.Address.IP, host.name))
		}
	}
	for _, r := range routes {
		if !vethplugin.HasRoute(cont.routes, r.Dst, r.GW) {
			problems = append(problems, fmt.Sprintf("netns %s lacks route %s", sandbox, r.Dst.String()))
		}
	}
	if host == nil {
		problems = append(problems, fmt.Sprintf("the host end of %s (index %d) is missing", ifName, cont.peerIndex))
	}
	return problems
}

func cmdCheck(args *skel.CmdArgs) error {
	n, err := Load(args.StdinData)
	if err != nil {
		return err
	}
	if n.RawPrevResult == nil {
		return cnierr.New(cnierr.InvalidConfig, "ptp: CHECK needs a prevResult")
	}
	prev, err := plugin.LoadPrevResult(&n.NetConf)
	if err != nil {
		return err
	}
	if err := plugin.CheckNetNS(args.Netns); err != nil {
		return err
	}
	ctx := context.Background()
	if err := ipam.Check(ctx, args); err != nil {
		return err
	}
	want, _, ips := vethplugin.ContainerIface(prev, args.IfName, args.Netns)
	if want == nil {
		return cnierr.Mismatch("ptp", []string{fmt.Sprintf("prevResult has no interface %s in netns %s", args.IfName, args.Netns)})
	}
	cont := &linkState{}
	if err := netns.Do(args.Netns, func() error {
		l, err := netlinkx.LinkByName(args.IfName)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		cont, err = readLink(l)
		return err
	}); err != nil {
		return fmt.Errorf("reading %s in netns %s: %w", args.IfName, args.Netns, err)
	}
	var host *linkState
	if cont.found && cont.peerIndex != 0 {
		if l, err := netlink.LinkByIndex(cont.peerIndex); err == nil {
			if host, err = readLink(l); err != nil {
				return fmt.Errorf("reading host veth %s: %w", l.Attrs().Name, err)
			}
		}
	}
	problems := compare(args.IfName, args.Netns, want, ips, prev.Routes, cont, host)
	if host != nil {
		problems = append(problems, vethplugin.CheckHostVeth(prev, host.name, host.mac)...)
	}
	if n.IPMasq {
		if err := cnierr.AddFinding(&problems, ipmasq.CheckWith(ctx, n.IPMasqBackend, attachment(n, args), masqAddrs(nil, &current.Result{IPs: ips}))); err != nil {
			return err
		}
	}
	return cnierr.Mismatch("ptp", problems)
}
