// Package vethplugin holds what the veth plugins (bridge and ptp) share
// beyond internal/cni/plugin: finding an attachment's entries in
// prevResult, deleting its veth, building the ADD result, and the address
// and route matching of CHECK.
package vethplugin

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/veth"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// ContainerIface returns prevResult's entry for the container interface
// ifName in netns, its index, and the IPs assigned to it; nil and -1 when
// prevResult does not list it.
func ContainerIface(prev *current.Result, ifName, netns string) (*current.Interface, int, []*current.IPConfig) {
	var want *current.Interface
	idx := -1
	for i, intf := range prev.Interfaces {
		if intf.Name == ifName && intf.Sandbox == netns {
			want, idx = intf, i
		}
	}
	var ips []*current.IPConfig
	for _, ip := range prev.IPs {
		if ip.Interface != nil && *ip.Interface == idx {
			ips = append(ips, ip)
		}
	}
	return want, idx, ips
}

// HostEnd returns the name and MAC prevResult gives for the host end of
// the container interface ifName in netns: the interface listed just
// before it.
func HostEnd(prev *current.Result, ifName, netns string) (name, mac string) {
	if prev == nil {
		return "", ""
	}
	for i, intf := range prev.Interfaces {
		if i > 0 && intf.Name == ifName && intf.Sandbox == netns {
			if h := prev.Interfaces[i-1]; h.Sandbox == "" {
				return h.Name, h.Mac
			}
		}
	}
	return "", ""
}

// DeleteVeth deletes the container interface ifName in netns (its host
// end goes with it) and returns the addresses it had. When the interface
// is gone (so is the netns, usually), it deletes the host end prevResult
// lists, if that still exists with the listed MAC. links, when not nil,
// takes the host end instead (veth.DeleteInNS).
func DeleteVeth(prev *current.Result, netns, ifName string, links netlinkx.LinkDeleter) ([]netlink.Addr, error) {
	addrs, found, err := veth.DeleteInNS(netns, ifName, links)
	if err == nil && !found {
		err = veth.DeleteHostEnd(HostEnd(prev, ifName, netns))
	}
	return addrs, err
}

// Result builds the ADD result: prevResult's contents (when chained),
// then ours. dns replaces prevResult's when it sets anything.
func Result(prev *current.Result, ifaces []*current.Interface, ips []*current.IPConfig, routes []*types.Route, dns types.DNS) *current.Result {
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if prev != nil {
		r.Interfaces = append(r.Interfaces, prev.Interfaces...)
		r.IPs = append(r.IPs, prev.IPs...)
		r.Routes = append(r.Routes, prev.Routes...)
		r.DNS = prev.DNS
	}
	r.Interfaces = append(r.Interfaces, ifaces...)
	r.IPs = append(r.IPs, ips...)
	r.Routes = append(r.Routes, routes...)
	if DNSSet(dns) {
		r.DNS = dns
	}
	return r
}

// DNSSet reports whether d sets anything.
func DNSSet(d types.DNS) bool {
	return d.Nameservers != nil || d.Search != nil || d.Options != nil || d.Domain != ""
}

// CheckHostVeth lists how prevResult's entry for the host veth name
// differs from the link's MAC, or says that prevResult does not list it.
func CheckHostVeth(prev *current.Result, name, mac string) []string {
	var problems []string
	listed := false
	for _, intf := range prev.Interfaces {
		if intf.Name == name && intf.Sandbox == "" {
			listed = true
			if intf.Mac != "" && intf.Mac != mac {
				problems = append(problems, "host veth "+name+" has MAC "+mac+", prevResult says "+intf.Mac)
			}
		}
	}
	if !listed {
		problems = append(problems, "host veth "+name+" is not in prevResult")
	}
	return problems
}

// HasAddr reports whether have holds want (address and prefix length).
func HasAddr(have []net.IPNet, want net.IPNet) bool {
	for _, a := range have {
		if a.String() == want.String() {
			return true
		}
	}
	return false
}

// HasRoute reports whether have holds a route to dst (via gw, when gw is
// set). A route without a destination is the default route of its family.
func HasRoute(have []netlink.Route, dst net.IPNet, gw net.IP) bool {
	wantOnes, wantBits := dst.Mask.Size()
	for _, r := range have {
		var ones, bits int
		var ip net.IP
		if r.Dst == nil {
			ip, bits = net.IPv6zero, 128
			if r.Family == netlink.FAMILY_V4 {
				ip, bits = net.IPv4zero, 32
			}
		} else {
			ip = r.Dst.IP
			ones, bits = r.Dst.Mask.Size()
		}
		if ones == wantOnes && bits == wantBits && ip.Equal(dst.IP) && (gw == nil || gw.Equal(r.Gw)) {
			return true
		}
	}
	return false
}

// EnableForwarding turns on forwarding (in the calling thread's netns) for
// the families that need it.
func EnableForwarding(v4, v6 bool) error {
	if v4 {
		if err := sysctl.Set("net.ipv4.ip_forward", "1"); err != nil {
			return fmt.Errorf("enabling IPv4 forwarding: %w", err)
		}
	}
	if v6 {
		if err := sysctl.Set("net.ipv6.conf.all.forwarding", "1"); err != nil {
			return fmt.Errorf("enabling IPv6 forwarding: %w", err)
		}
	}
	return nil
}

// FirstIP is the subnet's first host address (network + 1).
func FirstIP(a net.IPNet) net.IP {
	ip := a.IP.Mask(a.Mask)
	if ip == nil {
		return nil
	}
	out := make(net.IP, len(ip))
	copy(out, ip)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			break
		}
	}
	return out
}

// ToPrefix converts a (IPv4 possibly in 16-byte form) to a prefix.
func ToPrefix(a net.IPNet) (netip.Prefix, bool) {
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	ones, bits := a.Mask.Size()
	if bits == 0 {
		return netip.Prefix{}, false
	}
	if ip.Is4() && bits == 128 {
		ones -= 96
	}
	return netip.PrefixFrom(ip, ones), true
}
