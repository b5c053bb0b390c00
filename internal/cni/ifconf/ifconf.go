// Package ifconf applies an IPAM result to an interface: addresses, link
// up, routes. Callers run it inside the container's namespace (netns.Do).
package ifconf

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Configure assigns to ifName every IP of res whose Interface points at
// ifName's entry in res.Interfaces (or that has no Interface set), sets the
// link up and adds res.Routes. A route without a gateway uses the gateway
// of the first address of the same family. Routes that already exist are
// accepted, so calling Configure twice is harmless.
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
		gw := r.GW
		if gw == nil {
			if r.Dst.IP.To4() != nil {
				gw = gw4
			} else {
				gw = gw6
			}
		}
		route := &netlink.Route{
			LinkIndex: link.Attrs().Index,
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
		if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("adding route %s via %v on %s: %w", r.Dst.String(), gw, ifName, err)
		}
	}
	return nil
}

// AddrsOf lists ifName's global addresses (used by CHECK).
func AddrsOf(link netlink.Link) ([]netlink.Addr, error) {
	return netlinkx.AddrList(link, netlink.FAMILY_ALL)
}
