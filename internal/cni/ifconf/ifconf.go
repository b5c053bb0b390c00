// Package ifconf applies an IPAM result to an interface: addresses, link
// up, routes. Callers run it inside the container's namespace (netns.Do).
package ifconf

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Configure assigns to ifName every IP of res whose Interface points at
// ifName's entry in res.Interfaces (or that has no Interface set), sets the
// link up and adds res.Routes. A route without a gateway uses the gateway
// of the first address of the same family (as the reference's
// ipam.ConfigureIface does), unless its scope is link or host: such a
// route is on-link by definition (the kernel refuses a gateway on it), so
// link routes can be expressed. Routes that already exist are accepted, so
// calling Configure twice is harmless.
func Configure(ifName string, res *current.Result) error {
	link, err := netlinkx.LinkByName(ifName)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", ifName, err)
	}
	var gw4, gw6 net.IP
	for _, ip := range res.IPs {
		if ip.Interface != nil {
			i := *ip.Interface
			if i < 0 || i >= len(res.Interfaces) || res.Interfaces[i].Name != ifName {
				continue
			}
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.Address.IP, Mask: ip.Address.Mask}}
		if err := netlink.AddrAdd(link, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("adding %s to %s: %w", ip.Address.String(), ifName, err)
		}
		if ip.Gateway != nil {
			if ip.Address.IP.To4() != nil && gw4 == nil {
				gw4 = ip.Gateway
			} else if ip.Address.IP.To4() == nil && gw6 == nil {
				gw6 = ip.Gateway
			}
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", ifName, err)
	}
	for _, r := range res.Routes {
		if r.Dst.IP == nil {
			continue
		}
		route := netlinkRoute(link.Attrs().Index, r, gw4, gw6)
		if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("adding route %s via %v on %s: %w", r.Dst.String(), route.Gw, ifName, err)
		}
	}
	return nil
}

// netlinkRoute is r as a route through the link with index, with gw4 or
// gw6 as the gateway a universe-scope route without one goes through.
func netlinkRoute(index int, r *types.Route, gw4, gw6 net.IP) *netlink.Route {
	gw := r.GW
	if gw == nil && (r.Scope == nil || *r.Scope < int(netlink.SCOPE_LINK)) {
		if r.Dst.IP.To4() != nil {
			gw = gw4
		} else {
			gw = gw6
		}
	}
	route := &netlink.Route{
		LinkIndex: index,
		Dst:       &net.IPNet{IP: r.Dst.IP, Mask: r.Dst.Mask},
		Gw:        gw,
		MTU:       r.MTU,
		AdvMSS:    r.AdvMSS,
	}
	if r.Table != nil {
		route.Table = *r.Table
	}
	if r.Priority != 0 {
		route.Priority = r.Priority
	}
	if r.Scope != nil {
		route.Scope = netlink.Scope(*r.Scope)
	}
	return route
}

// AddrsOf lists ifName's global addresses (used by CHECK).
func AddrsOf(link netlink.Link) ([]netlink.Addr, error) {
	return netlinkx.AddrList(link, netlink.FAMILY_ALL)
}
