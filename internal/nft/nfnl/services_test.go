package nfnl_test

import (
	"fmt"
	"net/netip"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
)

const testNode = "node-a"

// renderConfig is a proxy renderer config using every option.
func renderConfig(fam knftables.Family, table string) nftables.Config {
	p := netip.MustParsePrefix
	return nftables.Config{Family: fam, Table: table, NodeName: testNode,
		ClusterCIDRs:      []netip.Prefix{p("10.244.0.0/16"), p("10.245.0.0/16"), p("fd00:244::/64")},
		NodePortAddresses: []netip.Prefix{p("172.30.0.0/24"), p("172.31.0.0/24"), p("fd00:30::/64")}}
}

// services returns n Services cycling through the proxy's features:
// ClusterIP with one and many endpoints, NodePort, LoadBalancer with and
// without source ranges, externalIPs, session affinity, traffic policy
// Local (external and internal), no endpoints, UDP and SCTP, several ports.
// gen changes the endpoints (a later generation of the same Services).
func services(n int, v6 bool, gen int) []*proxy.Service {
	addr := func(kind byte, i int) netip.Addr {
		if v6 {
			return netip.MustParseAddr(fmt.Sprintf("fd00:%x::%x:%x", kind, i>>16, i&0xffff))
		}
		return netip.AddrFrom4([4]byte{kind, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	var out []*proxy.Service
	for i := 0; i < n; i++ {
		s := &proxy.Service{Namespace: fmt.Sprintf("ns%d", i%7), Name: fmt.Sprintf("svc%d", i), Type: proxy.ClusterIP,
			ClusterIP: addr(10, 0x600000+i)}
		neps := 1 + (i+gen)%4
		var eps []proxy.Endpoint
		for j := 0; j < neps; j++ {
			node := "node-b"
			if j == 0 && i%3 == 0 {
				node = testNode
			}
			eps = append(eps, proxy.Endpoint{IP: addr(10, 0xf40000+i*8+j+gen), Port: uint16(8000 + j), Ready: true, Serving: true, NodeName: node})
		}
		if i%11 == 5 {
			eps = nil // no endpoints: rejected
		}
		if i%13 == 6 && len(eps) > 1 {
			eps[1].Ready, eps[1].Terminating = false, true
		}
		ports := []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, Endpoints: eps}}
		if i%4 == 1 {
			ports = append(ports, proxy.ServicePort{Name: "dns", Protocol: proxy.UDP, Port: 53, Endpoints: eps})
		}
		if i%17 == 3 {
			ports = append(ports, proxy.ServicePort{Name: "sctp", Protocol: proxy.SCTP, Port: 9999, Endpoints: eps})
		}
		switch i % 5 {
		case 1:
			s.Type = proxy.NodePort
		case 2:
			s.Type = proxy.LoadBalancer
			s.LoadBalancerIPs = []netip.Addr{addr(172, 0x1d0000+i)}
			if i%10 == 2 {
				s.Firewall = true
				s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("1.2.3.0/24"), netip.MustParsePrefix("fd00:1::/64")}
				if i%20 == 2 {
					s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix("5.6.0.0/16"), netip.MustParsePrefix("fd00:2::/64"))
				}
			}
		}
		if s.Type != proxy.ClusterIP {
			for k := range ports {
				ports[k].NodePort = uint16(30000 + (i*3+k)%2700)
			}
		}
		if i%6 == 4 {
			s.ExternalIPs = []netip.Addr{addr(172, 0x1c0000+i)}
		}
		if i%9 == 2 {
			s.AffinityTimeout = time.Duration(3+gen%2) * time.Hour
		}
		if i%7 == 3 {
			s.ExternalLocal = true
		}
		if i%19 == 8 {
			s.InternalLocal = true
		}
		s.Ports = ports
		out = append(out, s)
	}
	return out
}
