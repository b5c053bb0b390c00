package hostroutes

// Added for the lab: re-checking a running lab's ranges must leave out the
// lab's own bridge, and only that one (a name prefix would also leave out
// another lab whose name starts the same way).

import (
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// HostPrefixesExcept is HostPrefixes leaving out the interfaces whose
// names are exactly one of ifnames.
func HostPrefixesExcept(ifnames ...string) ([]netip.Prefix, error) {
	links, err := netlinkx.LinkList()
	if err != nil {
		return nil, err
	}
	skip := map[string]bool{}
	for _, n := range ifnames {
		skip[n] = true
	}
	ignored := map[int]bool{}
	for _, l := range links {
		if skip[l.Attrs().Name] {
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
