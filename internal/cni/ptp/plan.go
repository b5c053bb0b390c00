package ptp

import (
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/vethplugin"
)

// plan is what ptp ADD does once IPAM has answered, computed without
// touching the system.
//
// For an IPAM answer of 10.1.0.5/24 with gateway 10.1.0.1:
//
//	container:  10.1.0.5/32 on eth0
//	            10.1.0.1 dev eth0 scope link
//	            10.1.0.0/24 via 10.1.0.1          (other pods: through the host)
//	            IPAM routes, via 10.1.0.1 unless they name a gateway
//	host veth:  10.1.0.1/32 (the same gateway on every host veth)
//	            10.1.0.5 dev vethXXX scope link
//
// The container has no on-link subnet, so everything it sends goes to the
// host, which routes by the /32 host routes.
type plan struct {
	// ContIPs are the container's addresses (/32, /128) without
	// gateways, and ContRoutes its routes, in order, each with an
	// explicit gateway except the link routes to the gateways.
	ContIPs    []*current.IPConfig
	ContRoutes []*types.Route
	// HostAddrs go on the host veth, HostRoutes point at it.
	HostAddrs  []net.IPNet
	HostRoutes []net.IPNet
	Forward4   bool
	Forward6   bool
	// Masq: container addresses with their subnet length.
	Masq []netip.Prefix
	// Result parts: IPs (Interface = contIndex, /32 addresses, with
	// gateways), the IPAM routes, DNS.
	IPs    []*current.IPConfig
	Routes []*types.Route
	DNS    types.DNS
}

func hostMask(ip net.IP) net.IPMask {
	if ip.To4() != nil {
		return net.CIDRMask(32, 32)
	}
	return net.CIDRMask(128, 128)
}

func norm(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

// makePlan builds the plan from an IPAM result. contIndex is the
// container interface's index in the result.
func makePlan(n *NetConf, ipamRes *current.Result, contIndex int) (*plan, error) {
	if len(ipamRes.IPs) == 0 {
		return nil, cnierr.New(cnierr.InvalidConfig, "ptp: IPAM plugin %q returned no IP address", n.IPAM.Type)
	}
	p := &plan{DNS: ipamRes.DNS}
	if vethplugin.DNSSet(n.DNS) {
		p.DNS = n.DNS
	}
	link := unix.RT_SCOPE_LINK
	gwOf := map[bool]net.IP{} // first gateway per family (v4 true)
	var subnetRoutes []*types.Route
	for _, src := range ipamRes.IPs {
		ip := norm(src.Address.IP)
		v4 := ip.To4() != nil
		if !v4 && len(ip) != net.IPv6len {
			return nil, cnierr.New(cnierr.InvalidConfig, "ptp: IPAM returned an invalid address %q", src.Address.String())
		}
		gw := src.Gateway
		if gw == nil {
			gw = vethplugin.FirstIP(src.Address)
		}
		gw = norm(gw)
		if gw.Equal(ip) {
			return nil, cnierr.New(cnierr.InvalidConfig, "ptp: the gateway of %s is the container's own address; set another gateway in the IPAM range", src.Address.String())
		}
		if (gw.To4() != nil) != v4 {
			return nil, cnierr.New(cnierr.InvalidConfig, "ptp: gateway %s and address %s are of different families", gw, src.Address.String())
		}
		host := net.IPNet{IP: ip, Mask: hostMask(ip)}
		p.IPs = append(p.IPs, &current.IPConfig{Interface: current.Int(contIndex), Address: host, Gateway: gw})
		p.ContIPs = append(p.ContIPs, &current.IPConfig{Interface: current.Int(0), Address: host})
		gwNet := net.IPNet{IP: gw, Mask: hostMask(gw)}
		if !containsNet(p.HostAddrs, gwNet) {
			p.HostAddrs = append(p.HostAddrs, gwNet)
			p.ContRoutes = append(p.ContRoutes, &types.Route{Dst: gwNet, Scope: &link})
		}
		p.HostRoutes = append(p.HostRoutes, host)
		subnet := net.IPNet{IP: ip.Mask(src.Address.Mask), Mask: src.Address.Mask}
		if ones, bits := subnet.Mask.Size(); ones < bits {
			subnetRoutes = append(subnetRoutes, &types.Route{Dst: subnet, GW: gw})
		}
		if _, ok := gwOf[v4]; !ok {
			gwOf[v4] = gw
		}
		if v4 {
			p.Forward4 = true
		} else {
			p.Forward6 = true
		}
		if pf, ok := vethplugin.ToPrefix(net.IPNet{IP: ip, Mask: src.Address.Mask}); ok {
			p.Masq = append(p.Masq, pf)
		}
	}
	p.ContRoutes = append(p.ContRoutes, subnetRoutes...)
	for _, r := range ipamRes.Routes {
		rc := *r
		p.Routes = append(p.Routes, &rc)
		cr := *r
		if cr.GW == nil {
			cr.GW = gwOf[cr.Dst.IP.To4() != nil]
			if cr.GW == nil {
				return nil, cnierr.New(cnierr.InvalidConfig, "ptp: route %s has no gateway and IPAM gave no address of its family", r.Dst.String())
			}
		}
		p.ContRoutes = append(p.ContRoutes, &cr)
	}
	return p, nil
}

func containsNet(list []net.IPNet, n net.IPNet) bool {
	for _, x := range list {
		if x.String() == n.String() {
			return true
		}
	}
	return false
}
