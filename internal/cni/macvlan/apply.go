package macvlan

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ifconf"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// kernel is every kernel step the verbs take, so that unit tests can run
// ADD/DEL/CHECK (and their rollback) against a fake. Paths are netns
// paths; "" for netnsPath in Master means the runtime's netns.
type kernel interface {
	// CheckNetNS: code 3 for a missing netns.
	CheckNetNS(path string) error
	// Master finds the parent by name, or the default route's interface
	// when name is empty, in the runtime's netns (inNS == "") or in inNS.
	Master(name, inNS string) (master, error)
	// Exists reports whether ifName exists in netnsPath.
	Exists(netnsPath, ifName string) (bool, error)
	// Create makes p's link (named p.TmpName) so that it lands in
	// netnsPath; with inContainer it is created there directly.
	Create(p linkPlan, netnsPath string, inContainer bool) error
	// Rename renames from to to inside netnsPath and describes the result.
	Rename(netnsPath, from, to string) (*current.Interface, error)
	// Configure applies res (nil: L2 only, just set the link up).
	Configure(netnsPath, ifName string, res *current.Result) error
	// Delete removes the macvlan name in netnsPath; absent is success, and
	// an interface of another kind is left alone.
	Delete(netnsPath, name string) error
	// Observe reads ifName in netnsPath for CHECK.
	Observe(netnsPath, ifName string) (*observed, error)
}

// errLinkNotFound marks an absent interface (CHECK turns it into 106).
var errLinkNotFound = errors.New("interface not found")

// tmpName is a fresh temporary interface name ("fmv" + 8 hex digits).
func tmpName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "fmv" + hex.EncodeToString(b)
}

// netlinkKernel is kernel over netlink.
type netlinkKernel struct{}

func (netlinkKernel) CheckNetNS(path string) error {
	if err := plugin.CheckNetNS(path); err != nil {
		return fmt.Errorf("macvlan: %w", err)
	}
	return nil
}

// inNS runs fn in path, or right here when path is "".
func inNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return netns.Do(path, fn)
}

func (netlinkKernel) Master(name, in string) (master, error) {
	where := "the runtime netns"
	if in != "" {
		where = "container netns " + in
	}
	var m master
	err := inNS(in, func() error {
		if name == "" {
			routes, err := netlinkx.RouteList(nil, netlink.FAMILY_ALL)
			if err != nil {
				return fmt.Errorf("macvlan: listing routes in %s: %w", where, err)
			}
			idx, ok := defaultRouteLink(routes)
			if !ok {
				return cnierr.New(cnierr.InvalidConfig, `macvlan: no "master" given and %s has no default route to take it from: set "master"`, where)
			}
			l, err := netlink.LinkByIndex(idx)
			if err != nil {
				return fmt.Errorf("macvlan: looking up the default route's interface (index %d) in %s: %w", idx, where, err)
			}
			m = master{Name: l.Attrs().Name, Index: idx, MTU: l.Attrs().MTU}
			return nil
		}
		l, err := netlinkx.LinkByName(name)
		if err != nil {
			if netlinkx.IsNotFound(err) {
				return cnierr.New(cnierr.InvalidConfig, "macvlan: master interface %q not found in %s", name, where)
			}
			return fmt.Errorf("macvlan: looking up master %q in %s: %w", name, where, err)
		}
		m = master{Name: name, Index: l.Attrs().Index, MTU: l.Attrs().MTU}
		return nil
	})
	return m, err
}

func (netlinkKernel) Exists(netnsPath, ifName string) (bool, error) {
	var ok bool
	err := netns.Do(netnsPath, func() error {
		_, err := netlinkx.LinkByName(ifName)
		switch {
		case err == nil:
			ok = true
		case netlinkx.IsNotFound(err):
		default:
			return fmt.Errorf("macvlan: looking up %s in netns %s: %w", ifName, netnsPath, err)
		}
		return nil
	})
	return ok, err
}

func (netlinkKernel) Create(p linkPlan, netnsPath string, inContainer bool) error {
	mv := p.link()
	if inContainer {
		return netns.Do(netnsPath, func() error { return linkAdd(mv, p) })
	}
	// Created in our netns and placed in the container's in one request.
	f, err := os.Open(netnsPath)
	if err != nil {
		return cnierr.Wrap(cnierr.UnknownContainer, err, "macvlan: opening container netns")
	}
	defer f.Close()
	mv.Namespace = netlink.NsFd(int(f.Fd()))
	return linkAdd(mv, p)
}

func linkAdd(mv *netlink.Macvlan, p linkPlan) error {
	err := netlink.LinkAdd(mv)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EOPNOTSUPP):
		return cnierr.Wrap(cnierr.KernelFeatureMissing, err,
			"macvlan: the kernel has no macvlan support (build it with CONFIG_MACVLAN or run `modprobe macvlan`)")
	case errors.Is(err, unix.EADDRNOTAVAIL) && p.MAC != nil:
		return cnierr.Wrap(cnierr.InvalidConfig, err, "macvlan: the kernel refused MAC %s", p.MAC)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("macvlan: creating %s on master index %d in mode %s: the master is busy "+
			"(passthru allows one macvlan per master, and a master cannot mix passthru with other modes): %w",
			p.TmpName, p.ParentIndex, modeName(p.Mode), err)
	default:
		return fmt.Errorf("macvlan: creating %s on master index %d: %w", p.TmpName, p.ParentIndex, err)
	}
}

func (netlinkKernel) Rename(netnsPath, from, to string) (*current.Interface, error) {
	var iface *current.Interface
	err := netns.Do(netnsPath, func() error {
		l, err := netlinkx.LinkByName(from)
		if err != nil {
			return fmt.Errorf("macvlan: looking up new link %s in netns %s: %w", from, netnsPath, err)
		}
		if err := netlink.LinkSetName(l, to); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return cnierr.Wrap(cnierr.InterfaceExists, err, "macvlan: interface %s already exists in netns %s", to, netnsPath)
			}
			return fmt.Errorf("macvlan: renaming %s to %s in netns %s: %w", from, to, netnsPath, err)
		}
		l, err = netlinkx.LinkByName(to)
		if err != nil {
			return fmt.Errorf("macvlan: looking up %s in netns %s after renaming: %w", to, netnsPath, err)
		}
		iface = &current.Interface{Name: to, Mac: l.Attrs().HardwareAddr.String(), Mtu: l.Attrs().MTU, Sandbox: netnsPath}
		return nil
	})
	return iface, err
}

func (netlinkKernel) Configure(netnsPath, ifName string, res *current.Result) error {
	return netns.Do(netnsPath, func() error {
		if res == nil {
			l, err := netlinkx.LinkByName(ifName)
			if err != nil {
				return fmt.Errorf("macvlan: looking up %s in netns %s: %w", ifName, netnsPath, err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("macvlan: setting %s up in netns %s: %w", ifName, netnsPath, err)
			}
			return nil
		}
		// Announce the addresses when the link comes up: a gratuitous ARP
		// and an unsolicited neighbour advertisement, so that neighbours
		// that cached a previous owner of the IP learn the new MAC. Best
		// effort: a kernel without IPv6 has no ndisc_notify.
		_ = sysctl.SetPath("1", "net", "ipv4", "conf", ifName, "arp_notify")
		_ = sysctl.SetPath("1", "net", "ipv6", "conf", ifName, "ndisc_notify")
		if err := ifconf.Configure(ifName, res); err != nil {
			return fmt.Errorf("macvlan: configuring %s in netns %s: %w", ifName, netnsPath, err)
		}
		return nil
	})
}

func (netlinkKernel) Delete(netnsPath, name string) error {
	return netns.Do(netnsPath, func() error {
		l, err := netlinkx.LinkByName(name)
		if err != nil {
			if netlinkx.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("macvlan: looking up %s in netns %s: %w", name, netnsPath, err)
		}
		if l.Type() != "macvlan" {
			return nil // not ours
		}
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("macvlan: deleting %s in netns %s: %w", name, netnsPath, err)
		}
		return nil
	})
}

func (netlinkKernel) Observe(netnsPath, ifName string) (*observed, error) {
	var o observed
	err := netns.Do(netnsPath, func() error {
		l, err := netlinkx.LinkByName(ifName)
		if err != nil {
			if netlinkx.IsNotFound(err) {
				return fmt.Errorf("%w: %s in netns %s", errLinkNotFound, ifName, netnsPath)
			}
			return fmt.Errorf("macvlan: looking up %s in netns %s: %w", ifName, netnsPath, err)
		}
		o.Kind = l.Type()
		o.ParentIndex = l.Attrs().ParentIndex
		o.MAC = l.Attrs().HardwareAddr.String()
		if mv, ok := l.(*netlink.Macvlan); ok {
			o.Mode = mv.Mode
		}
		addrs, err := netlinkx.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("macvlan: listing addresses of %s in netns %s: %w", ifName, netnsPath, err)
		}
		for _, a := range addrs {
			o.Addrs = append(o.Addrs, *a.IPNet)
		}
		routes, err := netlinkx.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("macvlan: listing routes in netns %s: %w", netnsPath, err)
		}
		for _, r := range routes {
			dst := r.Dst
			if dst == nil {
				dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
				if r.Family == netlink.FAMILY_V6 {
					dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
				}
			}
			o.Routes = append(o.Routes, route{Dst: dst, GW: r.Gw})
		}
		return nil
	})
	return &o, err
}
