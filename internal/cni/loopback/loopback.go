// Package loopback is the loopback CNI plugin: it sets lo up in the
// container's netns. It reads the same config as the reference
// plugins/main/loopback and answers every CNI 1.1 verb.
//
// CNI_IFNAME is ignored (as in the reference): the plugin only ever acts on
// lo. ADD passes a prevResult through unchanged; without one it reports lo
// with 127.0.0.1/8 and ::1/128 (whatever addresses the kernel gave lo).
package loopback

import (
	"errors"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
)

const ifName = "lo"

// Plugin is loopback as a CNI plugin.
var Plugin = plugin.Plugin{Name: "loopback", Funcs: skel.CNIFuncs{
	Add:    cmdAdd,
	Del:    cmdDel,
	Check:  cmdCheck,
	GC:     cmdGC,
	Status: cmdStatus,
}}

// inNetNS runs fn in path, turning a missing netns into code 3.
func inNetNS(path string, fn func() error) error {
	err := netns.Do(path, fn)
	if errors.Is(err, netns.ErrNotExist) {
		return cnierr.Wrap(cnierr.UnknownContainer, err, "loopback")
	}
	return err
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	var v4, v6 []net.IPNet
	err = inNetNS(args.Netns, func() error {
		link, err := netlinkx.LinkByName(ifName)
		if err != nil {
			return cnierr.Wrap(cnierr.Internal, err, "loopback: looking up %s", describe(args.Netns))
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return cnierr.Wrap(cnierr.Internal, err, "loopback: setting %s up", describe(args.Netns))
		}
		// The kernel assigns 127.0.0.1/8 and ::1/128 when lo comes up.
		addrs, err := netlinkx.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return cnierr.Wrap(cnierr.Internal, err, "loopback: listing addresses of %s", describe(args.Netns))
		}
		for _, a := range addrs {
			if a.IP.To4() != nil {
				v4 = append(v4, *a.IPNet)
			} else {
				v6 = append(v6, *a.IPNet)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	res, err := buildResult(conf, args.Netns, v4, v6)
	if err != nil {
		return err
	}
	return plugin.PrintResult(res, conf.CNIVersion)
}

// cmdDel sets lo down, best effort: lo dies with the netns anyway, so a
// netns that is already gone (or never given) is success.
// The config is not parsed: a DEL must not fail over a prevResult we
// would ignore anyway.
func cmdDel(args *skel.CmdArgs) error {
	if args.Netns == "" {
		return nil
	}
	err := netns.Do(args.Netns, func() error {
		link, err := netlinkx.LinkByName(ifName)
		if err != nil {
			if netlinkx.IsNotFound(err) {
				return nil
			}
			return cnierr.Wrap(cnierr.Internal, err, "loopback: looking up %s", describe(args.Netns))
		}
		if err := netlink.LinkSetDown(link); err != nil {
			return cnierr.Wrap(cnierr.Internal, err, "loopback: setting %s down", describe(args.Netns))
		}
		return nil
	})
	if errors.Is(err, netns.ErrNotExist) {
		return nil
	}
	return err
}

// cmdCheck verifies lo is up (code 106 if not).
func cmdCheck(args *skel.CmdArgs) error {
	if _, err := parseConf(args.StdinData); err != nil {
		return err
	}
	return inNetNS(args.Netns, func() error {
		link, err := netlinkx.LinkByName(ifName)
		if err != nil {
			return cnierr.Wrap(cnierr.CheckFailed, err, "loopback: looking up %s", describe(args.Netns))
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			return cnierr.New(cnierr.CheckFailed, "loopback: %s is down", describe(args.Netns))
		}
		return nil
	})
}

// cmdGC has nothing to collect: loopback keeps no state outside the
// container's netns (no files, no reservations, no host interfaces or
// rules), and lo disappears with the netns.
func cmdGC(args *skel.CmdArgs) error {
	_, err := plugin.ValidAttachments(args.StdinData)
	return err
}

// cmdStatus always reports ready: loopback needs nothing from the host
// (no IPAM, no master interface) to service an ADD.
func cmdStatus(args *skel.CmdArgs) error {
	_, err := parseConf(args.StdinData)
	return err
}
