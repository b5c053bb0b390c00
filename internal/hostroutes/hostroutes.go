// Package hostroutes guards the machine's own networks. Before flatnet (or
// a test) takes an address range, it checks that the range does not overlap
// any network the root namespace already routes to or sits on; using such
// a range can cut the machine off its uplink.
package hostroutes

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// HostPrefixes returns the prefixes of every route (except default routes)
// and every address in the calling thread's network namespace, leaving
// out interfaces whose names start with one of ignorePrefixes (the caller's
// own interfaces).
func HostPrefixes(ignorePrefixes ...string) ([]netip.Prefix, error) {
	return prefixesExcept(func(name string) bool {
		for _, p := range ignorePrefixes {
			if p != "" && strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	})
}

// HostPrefixesExcept is HostPrefixes leaving out only the interfaces whose
// names are exactly one of ifnames (a running lab re-checking its ranges
// must skip its own bridge, but not another lab whose name starts alike).
func HostPrefixesExcept(ifnames ...string) ([]netip.Prefix, error) {
	return prefixesExcept(func(name string) bool { return slices.Contains(ifnames, name) })
}

func prefixesExcept(ignore func(ifname string) bool) ([]netip.Prefix, error) {
	links, err := netlinkx.LinkList()
	if err != nil {
		return nil, err
	}
	ignored := map[int]bool{}
	for _, l := range links {
		if ignore(l.Attrs().Name) {
			ignored[l.Attrs().Index] = true
		}
	}
	var out []netip.Prefix
	routes, err := netlinkx.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if r.Dst == nil || ignored[r.LinkIndex] {
			continue
		}
		if p, ok := toPrefix(r.Dst); ok && p.Bits() > 0 {
			out = append(out, p)
		}
	}
	addrs, err := netlinkx.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if ignored[a.LinkIndex] || a.IPNet == nil {
			continue
		}
		if p, ok := toPrefix(a.IPNet); ok && !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

func toPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

// CheckFree returns an error naming the first of want that overlaps one
// of host, and the host network it collides with.
func CheckFree(want, host []netip.Prefix) error {
	for _, w := range want {
		for _, h := range host {
			if w.Overlaps(h) {
				return fmt.Errorf("address range %s overlaps %s, which this machine already uses (see `ip route`); pick another range", w, h)
			}
		}
	}
	return nil
}

// EnsureFree checks want against the calling namespace's routes and addresses.
func EnsureFree(want []netip.Prefix, ignorePrefixes ...string) error {
	host, err := HostPrefixes(ignorePrefixes...)
	if err != nil {
		return fmt.Errorf("reading host routes: %w", err)
	}
	return CheckFree(want, host)
}
