package bridge

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
)

// addrPlan is what ADD does with an IPAM result, computed without touching
// the system.
type addrPlan struct {
	// IPs and Routes for the container interface; every IP's Interface
	// is the container interface's index in the final result.
	IPs    []*current.IPConfig
	Routes []*types.Route
	DNS    types.DNS
	// Gateways to put on the bridge (or the VLAN gateway interface), in
	// IPAM order, with the subnet's mask.
	Gateways []net.IPNet
	// Forward4/6: enable forwarding for the family (isGateway).
	Forward4, Forward6 bool
	// Masq: container addresses with their subnet length (ipMasq).
	Masq []netip.Prefix
}

// planAddrs applies the reference bridge's rules to an IPAM result:
// default gateways (first address of the subnet) under isGateway, a default
// route per family under isDefaultGateway unless IPAM already routes the
// default via a gateway, and the gateway list for the bridge. contIndex is
// the container interface's index in the result.
func planAddrs(n *NetConf, ipamRes *current.Result, contIndex int) (*addrPlan, error) {
	if len(ipamRes.IPs) == 0 {
		return nil, cnierr.New(cnierr.InvalidConfig, "bridge: IPAM plugin %q returned no IP address", n.IPAM.Type)
	}
	p := &addrPlan{DNS: ipamRes.DNS}
	if vethplugin.DNSSet(n.DNS) {
		p.DNS = n.DNS
	}
	for _, r := range ipamRes.Routes {
		rc := *r
		p.Routes = append(p.Routes, &rc)
	}
	defaultFound := map[bool]bool{}
	for _, r := range p.Routes {
		if r.GW != nil && isDefault(r.Dst) {
			defaultFound[r.Dst.IP.To4() != nil] = true
		}
	}
	for _, src := range ipamRes.IPs {
		ipc := *src
		v4 := ipc.Address.IP.To4() != nil
		if !v4 && len(ipc.Address.IP) != net.IPv6len {
			return nil, cnierr.New(cnierr.InvalidConfig, "bridge: IPAM returned an invalid address %q", ipc.Address.String())
		}
		ipc.Interface = current.Int(contIndex)
		if ipc.Gateway == nil && n.IsGW {
			ipc.Gateway = vethplugin.FirstIP(ipc.Address)
		}
		if n.IsDefaultGW && !defaultFound[v4] {
			dst := net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			if v4 {
				dst = net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
			}
			p.Routes = append(p.Routes, &types.Route{Dst: dst, GW: ipc.Gateway})
			defaultFound[v4] = true
		}
		if n.IsGW {
			p.Gateways = append(p.Gateways, net.IPNet{IP: ipc.Gateway, Mask: ipc.Address.Mask})
			if v4 {
				p.Forward4 = true
			} else {
				p.Forward6 = true
			}
		}
		if pf, ok := vethplugin.ToPrefix(ipc.Address); ok {
			p.Masq = append(p.Masq, pf)
		}
		p.IPs = append(p.IPs, &ipc)
	}
	return p, nil
}

func isDefault(n net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0 && n.IP.IsUnspecified()
}

// gatewayOps decides how to give a link the gateway address want, given
// the addresses it has (of want's family), with the reference's
// forceAddress rule: an IPv4 link holds one address; IPv6 addresses may
// coexist unless their subnets overlap. Conflicting addresses are deleted
// under forceAddress and are an error otherwise.
func gatewayOps(link string, existing []net.IPNet, want net.IPNet, force bool) (del []net.IPNet, add bool, err error) {
	v4 := want.IP.To4() != nil
	add = true
	for _, a := range existing {
		if a.String() == want.String() {
			add = false
			continue
		}
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if v4 || a.Contains(want.IP) || want.Contains(a.IP) {
			if !force {
				return nil, false, cnierr.New(cnierr.InvalidConfig,
					"bridge: %q already has address %s, not the gateway %s (set \"forceAddress\": true to replace it)", link, a.String(), want.String())
			}
			del = append(del, a)
		}
	}
	return del, add, nil
}

// assemble builds the ADD result: prevResult's contents (when chained),
// then ours (p is nil for a layer-2 attachment).
func assemble(prev *current.Result, ifaces []*current.Interface, p *addrPlan) *current.Result {
	if p == nil {
		return vethplugin.Result(prev, ifaces, nil, nil, types.DNS{})
	}
	return vethplugin.Result(prev, ifaces, p.IPs, p.Routes, p.DNS)
}

// vlanGatewayName is the interface that holds the gateway with "vlan".
func vlanGatewayName(br string, vlan int) string { return fmt.Sprintf("%s.%d", br, vlan) }
