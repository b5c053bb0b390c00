package macvlan

import (
	"fmt"
	"net"
	"slices"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// master is what ADD needs to know about the parent interface.
type master struct {
	Name  string
	Index int
	MTU   int
}

// linkPlan is the macvlan ADD creates: it is made under TmpName (so it can
// never collide with a name in the namespace it is created from) and then
// renamed to IfName inside the container.
type linkPlan struct {
	TmpName     string
	IfName      string
	ParentIndex int
	MTU         int // 0: the master's
	MAC         net.HardwareAddr
	Mode        netlink.MacvlanMode
	BCQueueLen  uint32
}

// planLink checks the config against the master and returns the link to
// create. An MTU above the master's is an invalid config (code 7).
func planLink(n *NetConf, m master, ifName, tmpName string) (linkPlan, error) {
	if n.MTU > m.MTU {
		return linkPlan{}, cnierr.New(cnierr.InvalidConfig,
			`macvlan: "mtu" %d is larger than master %q's MTU %d: use at most %d, or 0 for the master's`, n.MTU, m.Name, m.MTU, m.MTU)
	}
	return linkPlan{
		TmpName:     tmpName,
		IfName:      ifName,
		ParentIndex: m.Index,
		MTU:         n.MTU,
		MAC:         n.mac,
		Mode:        n.mode,
		BCQueueLen:  n.BCQueueLen,
	}, nil
}

// link is the netlink object for p (without a target namespace).
func (p linkPlan) link() *netlink.Macvlan {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.TmpName
	attrs.ParentIndex = p.ParentIndex
	attrs.MTU = p.MTU
	attrs.HardwareAddr = p.MAC
	return &netlink.Macvlan{LinkAttrs: attrs, Mode: p.Mode, BCQueueLen: p.BCQueueLen}
}

// isDefault reports whether dst is a default route's destination (netlink
// reports it as nil or as a zero-length prefix, depending on version).
func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0 && dst.IP.IsUnspecified()
}

// defaultRouteLink picks the interface of the default route, preferring
// IPv4's (as the reference does in practice: the kernel lists v4 first).
func defaultRouteLink(routes []netlink.Route) (int, bool) {
	var v6 int
	for _, r := range routes {
		if !isDefault(r.Dst) || r.LinkIndex == 0 {
			continue
		}
		if r.Family == netlink.FAMILY_V6 || (r.Dst != nil && r.Dst.IP.To4() == nil) || (r.Gw != nil && r.Gw.To4() == nil) {
			if v6 == 0 {
				v6 = r.LinkIndex
			}
			continue
		}
		return r.LinkIndex, true
	}
	return v6, v6 != 0
}

// ownResult is this plugin's part of the ADD result: the container
// interface (index 0) and, with an IPAM, its addresses and routes. An IPAM
// that hands out no address at all is a configuration problem (code 7).
// DNS comes from the config when it sets any, otherwise from the IPAM.
func ownResult(n *NetConf, iface *current.Interface, ipamRes *current.Result) (*current.Result, error) {
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: []*current.Interface{iface}}
	if ipamRes != nil {
		if len(ipamRes.IPs) == 0 {
			return nil, cnierr.New(cnierr.InvalidConfig, "macvlan: ipam %q returned no IP address: check the ipam block", n.IPAM.Type)
		}
		for _, ip := range ipamRes.IPs {
			c := *ip
			c.Interface = current.Int(0)
			r.IPs = append(r.IPs, &c)
		}
		r.Routes = ipamRes.Routes
		r.DNS = ipamRes.DNS
	}
	if !dnsEmpty(n.DNS.Nameservers, n.DNS.Domain, n.DNS.Search, n.DNS.Options) {
		r.DNS = n.DNS
	}
	return r, nil
}

func dnsEmpty(ns []string, domain string, search, opts []string) bool {
	return len(ns) == 0 && domain == "" && len(search) == 0 && len(opts) == 0
}

// merge appends own (from ownResult) to prev, the result of the plugins
// before us in a chain (nil when macvlan comes first), shifting own's
// interface indexes past prev's interfaces.
func merge(prev, own *current.Result) *current.Result {
	if prev == nil {
		return own
	}
	out := *prev
	out.CNIVersion = current.ImplementedSpecVersion
	base := len(prev.Interfaces)
	out.Interfaces = append(slices.Clone(prev.Interfaces), own.Interfaces...)
	out.IPs = slices.Clone(prev.IPs)
	for _, ip := range own.IPs {
		c := *ip
		if c.Interface != nil {
			c.Interface = current.Int(*c.Interface + base)
		}
		out.IPs = append(out.IPs, &c)
	}
	out.Routes = append(slices.Clone(prev.Routes), own.Routes...)
	if !dnsEmpty(own.DNS.Nameservers, own.DNS.Domain, own.DNS.Search, own.DNS.Options) {
		out.DNS = own.DNS
	}
	return &out
}

// observed is what CHECK reads from the container's netns.
type observed struct {
	Kind        string
	ParentIndex int
	Mode        netlink.MacvlanMode
	MAC         string
	Addrs       []net.IPNet
	Routes      []route
}

type route struct {
	Dst *net.IPNet // a default route is 0.0.0.0/0 or ::/0, never nil
	GW  net.IP
}

// checkAttachment compares the container's interface with prevResult and
// the config. Every mismatch is code 106 and names what differs.
func checkAttachment(n *NetConf, prev *current.Result, netnsPath, ifName string, m master, obs *observed) error {
	fail := func(format string, a ...any) error {
		return cnierr.New(cnierr.CheckFailed, "macvlan: "+format, a...)
	}
	idx := -1
	for i, intf := range prev.Interfaces {
		if intf.Name == ifName && intf.Sandbox == netnsPath {
			idx = i
		}
	}
	if idx < 0 {
		return fail("prevResult has no interface %q in sandbox %s", ifName, netnsPath)
	}
	want := prev.Interfaces[idx]
	where := fmt.Sprintf("%s in netns %s", ifName, netnsPath)
	if obs.Kind != "macvlan" {
		return fail("%s is a %s, not a macvlan", where, obs.Kind)
	}
	if obs.ParentIndex != m.Index {
		return fail("%s is not on master %q (parent index %d, master's index %d)", where, m.Name, obs.ParentIndex, m.Index)
	}
	if obs.Mode != n.mode {
		return fail("%s has mode %s, config says %s", where, modeName(obs.Mode), modeName(n.mode))
	}
	if want.Mac != "" && want.Mac != obs.MAC {
		return fail("%s has MAC %s, prevResult says %s", where, obs.MAC, want.Mac)
	}
	for _, ip := range prev.IPs {
		if ip.Interface == nil || *ip.Interface != idx {
			continue
		}
		found := slices.ContainsFunc(obs.Addrs, func(a net.IPNet) bool {
			return a.IP.Equal(ip.Address.IP) && slices.Equal(a.Mask, ip.Address.Mask)
		})
		if !found {
			return fail("%s lacks address %s from prevResult", where, ip.Address.String())
		}
	}
	for _, r := range prev.Routes {
		found := slices.ContainsFunc(obs.Routes, func(o route) bool {
			return sameDst(o.Dst, &r.Dst) && (r.GW == nil || r.GW.Equal(o.GW))
		})
		if !found {
			return fail("netns %s lacks route %s via %v from prevResult", netnsPath, r.Dst.String(), r.GW)
		}
	}
	return nil
}

// sameDst compares destinations; Observe normalises a nil (default)
// destination to 0.0.0.0/0 or ::/0.
func sameDst(a, b *net.IPNet) bool {
	if a == nil || b == nil {
		return a == b
	}
	ao, ab := a.Mask.Size()
	bo, bb := b.Mask.Size()
	return ao == bo && ab == bb && (a.IP.To4() == nil) == (b.IP.To4() == nil) && a.IP.Equal(b.IP)
}
