package userspace

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/flatnet/flatnet/internal/proxy"
)

// kind says which of a service port's addresses a frontend serves; it
// decides which endpoints and which checks apply to a client.
type kind uint8

const (
	kindClusterIP    kind = iota
	kindExternalIP        // spec.externalIPs
	kindLoadBalancer      // status.loadBalancer.ingress[].ip
	kindNodePort          // a node address and the NodePort
)

func (k kind) String() string {
	return [...]string{"ClusterIP", "externalIP", "load-balancer IP", "NodePort"}[k]
}

// frontendKey is one listening socket: a protocol and a local address and
// port.
type frontendKey struct {
	Proto proxy.Protocol
	Addr  netip.AddrPort
}

func (k frontendKey) String() string { return string(k.Proto) + " " + k.Addr.String() }

// frontendSpec says what a frontend serves.
type frontendSpec struct {
	Port string // the service port's id (portID), the pool it picks from
	Kind kind
	// Listen is false when no client could be served (no usable
	// endpoint): the socket is closed, so TCP clients get a reset and UDP
	// clients an ICMP port unreachable from the kernel, at once.
	Listen bool
}

// targets is what a service port sends to, as plain data: replaced whole
// (atomically) when the service or its endpoints change, so a connection
// reads one consistent snapshot.
type targets struct {
	// Internal are the endpoints of ClusterIP traffic (the node's own
	// with internalTrafficPolicy Local); External those of NodePort,
	// externalIP and load-balancer traffic (the node's own with
	// externalTrafficPolicy Local).
	Internal, External []netip.AddrPort
	// ExternalLocal sends pods (clients in the cluster CIDRs) on external
	// addresses to Internal, as the kernel modes do.
	ExternalLocal bool
	Affinity      time.Duration // > 0: sessionAffinity ClientIP
	// Firewall: the load-balancer IPs take clients in SourceRanges only.
	Firewall     bool
	SourceRanges []netip.Prefix
}

// svcPlan is what one service wants.
type svcPlan struct {
	ports     map[string]*targets // by portID
	frontends map[frontendKey]frontendSpec
	addrs     []netip.Addr // ClusterIP, externalIPs, load-balancer IPs
}

// planner computes plans; it holds only configuration.
type planner struct {
	ipv6         bool
	nodeName     string
	clusterCIDRs []netip.Prefix
}

// want reports whether a (unmapped) is of the planner's family.
func (p *planner) want(a netip.Addr) bool { return a.IsValid() && a.Is6() == p.ipv6 }

func (p *planner) family(eps []proxy.Endpoint) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ep := range eps {
		if a := ep.IP.Unmap(); p.want(a) && ep.Port != 0 {
			out = append(out, netip.AddrPortFrom(a, ep.Port))
		}
	}
	return out
}

func portID(svc *proxy.Service, sp *proxy.ServicePort) string {
	name := sp.Name
	if name == "" {
		name = fmt.Sprint(sp.Port)
	}
	return svc.Namespace + "/" + svc.Name + "/" + string(sp.Protocol) + "/" + name
}

// plan computes one service's frontends, targets and addresses, NodePorts
// on nodeAddrs. The rules are the nftables mode's (internal/proxy/nftables
// renderService), said once more in terms of sockets.
func (p *planner) plan(svc *proxy.Service, nodeAddrs []netip.Addr) *svcPlan {
	pl := &svcPlan{ports: map[string]*targets{}, frontends: map[frontendKey]frontendSpec{}}
	cip := svc.ClusterIP.Unmap()
	if !p.want(cip) {
		// Headless (left to DNS) or the other family's.
		return pl
	}
	pl.addrs = append(pl.addrs, cip)
	var ext, lb []netip.Addr
	for _, a := range svc.ExternalIPs {
		if a = a.Unmap(); p.want(a) {
			ext = append(ext, a)
		}
	}
	for _, a := range svc.LoadBalancerIPs {
		if a = a.Unmap(); p.want(a) {
			lb = append(lb, a)
		}
	}
	pl.addrs = append(append(pl.addrs, ext...), lb...)
	var ranges []netip.Prefix
	for _, r := range svc.SourceRanges {
		if r.Addr().Is6() == p.ipv6 {
			ranges = append(ranges, r)
		}
	}
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		if sp.Protocol != proxy.TCP && sp.Protocol != proxy.UDP {
			continue // SCTP: the kernel modes only
		}
		id := portID(svc, sp)
		all := p.family(proxy.Usable(sp.Endpoints, ""))
		var local []netip.AddrPort
		if p.nodeName != "" {
			local = p.family(proxy.Usable(sp.Endpoints, p.nodeName))
		}
		t := &targets{
			Internal: all, External: all,
			ExternalLocal: svc.ExternalLocal,
			Affinity:      svc.AffinityTimeout,
			Firewall:      svc.Type == proxy.LoadBalancer && svc.Firewall,
			SourceRanges:  ranges,
		}
		if svc.InternalLocal {
			t.Internal = local
		}
		if svc.ExternalLocal {
			t.External = local
		}
		pl.ports[id] = t
		// With policy Local and no endpoint on this node, pods still
		// reach the external addresses (sent to Internal); other clients
		// are refused, per connection.
		extListen := len(t.External) > 0 || (svc.ExternalLocal && len(t.Internal) > 0)
		add := func(a netip.Addr, port uint16, k kind, listen bool) {
			pl.frontends[frontendKey{sp.Protocol, netip.AddrPortFrom(a, port)}] = frontendSpec{Port: id, Kind: k, Listen: listen}
		}
		add(cip, sp.Port, kindClusterIP, len(t.Internal) > 0)
		for _, a := range ext {
			add(a, sp.Port, kindExternalIP, extListen)
		}
		for _, a := range lb {
			add(a, sp.Port, kindLoadBalancer, extListen)
		}
		if sp.NodePort != 0 && (svc.Type == proxy.NodePort || svc.Type == proxy.LoadBalancer) {
			for _, a := range nodeAddrs {
				add(a, sp.NodePort, kindNodePort, extListen)
			}
		}
	}
	return pl
}
