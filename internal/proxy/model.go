// Package proxy holds the plain-data model of Services and endpoints that
// flatnet's kube-proxy replacement renders into kernel rules. Watchers and
// change trackers fill it; renderers (nftables/) read it and never call the
// API server.
package proxy

import (
	"net/netip"
	"strings"
	"time"
)

// Protocol is a service port's L4 protocol, lower case as nft spells it.
type Protocol string

// Protocols a service port may use.
const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// ServiceType mirrors spec.type.
type ServiceType string

// Service types.
const (
	ClusterIP    ServiceType = "ClusterIP"
	NodePort     ServiceType = "NodePort"
	LoadBalancer ServiceType = "LoadBalancer"
)

// Service is the part of a Service (plus its endpoints) the proxy needs.
type Service struct {
	Namespace string
	Name      string
	Type      ServiceType
	// ClusterIP is invalid (zero) for headless services, which are left to DNS.
	ClusterIP       netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr // status.loadBalancer.ingress[].ip
	// SourceRanges are spec.loadBalancerSourceRanges of this family;
	// Firewall says the Service had any (of either family), so that
	// the load-balancer IPs only take traffic from SourceRanges.
	SourceRanges []netip.Prefix
	Firewall     bool
	// AffinityTimeout > 0 means sessionAffinity ClientIP with that timeout.
	AffinityTimeout time.Duration
	ExternalLocal   bool // externalTrafficPolicy: Local
	InternalLocal   bool // internalTrafficPolicy: Local
	// HealthCheckNodePort is spec.healthCheckNodePort of a LoadBalancer
	// with externalTrafficPolicy Local (0 otherwise): the agent answers
	// load balancers' health checks there, the rules leave it alone.
	HealthCheckNodePort uint16
	Ports               []ServicePort
}

// Key is "namespace/name".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// Changes are the services changed since the previous sync, by key
// ("namespace/name"): each one's model now, nil for one deleted. The
// proxier's rounds carry them ready-made (the tracker keeps every model by
// key), so a partial sync costs the change, not a pass over every Service:
// at 10,000 Services each such pass cost a churn sync about 2 ms.
type Changes map[string]*Service

// ChangesOf finds the Changes to keys in services (every Service, any
// order), for callers without a tracker: O(len(services)). It builds no
// key string per service.
func ChangesOf[V any](services []*Service, keys map[string]V) Changes {
	type nsName struct{ ns, name string }
	want := make(map[nsName]string, len(keys))
	out := make(Changes, len(keys))
	for k := range keys {
		out[k] = nil
		if ns, name, ok := strings.Cut(k, "/"); ok {
			want[nsName{ns, name}] = k
		}
	}
	for _, svc := range services {
		if k, ok := want[nsName{svc.Namespace, svc.Name}]; ok {
			out[k] = svc
		}
	}
	return out
}

// ServicePort is one entry of spec.ports with its endpoints. Endpoints carry
// their own resolved target port, so a named targetPort may differ per pod.
type ServicePort struct {
	Name      string
	Protocol  Protocol
	Port      uint16
	NodePort  uint16 // 0 when none
	Endpoints []Endpoint
}

// Endpoint is one address of an EndpointSlice for one port.
type Endpoint struct {
	IP          netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
}

// Usable returns the endpoints traffic may go to, restricted to node when
// node != "": the ready ones, or when none is ready the serving terminating
// ones (so connections drain instead of failing during a rollout). Ready
// alone decides, as in kube-proxy: a terminating pod is not ready, except
// behind a Service with publishNotReadyAddresses, whose endpoints are all
// ready by the EndpointSlice API's definition, terminating or not.
func Usable(eps []Endpoint, node string) []Endpoint {
	var ready, term []Endpoint
	for _, ep := range eps {
		if node != "" && ep.NodeName != node {
			continue
		}
		switch {
		case ep.Ready:
			ready = append(ready, ep)
		case ep.Serving && ep.Terminating:
			term = append(term, ep)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return term
}

// HasUsable says whether Usable(eps, node) has any endpoint, without
// building it: one on node (any when node is "") that is ready, or serving
// and terminating (Usable's fallback when none is ready).
func HasUsable(eps []Endpoint, node string) bool {
	for _, ep := range eps {
		if (node == "" || ep.NodeName == node) && (ep.Ready || ep.Serving && ep.Terminating) {
			return true
		}
	}
	return false
}

// PortEndpoints is how a service port's traffic policies split its
// usable endpoints; the kernel modes' renderers both serve from it.
type PortEndpoints struct {
	All   []Endpoint // usable endpoints of the mode's family
	Local []Endpoint // the usable ones on this node (none without a node name)
	// Internal is where ClusterIP traffic goes (Local with
	// internalTrafficPolicy Local), External where NodePort, external and
	// load-balancer traffic goes (Local with externalTrafficPolicy Local).
	Internal, External []Endpoint
	// NeedAll and NeedLocal say whether a choice among All or Local is
	// wanted, by the ClusterIP or by the external entry.
	NeedAll, NeedLocal bool
	// ExtReachable: the external entry has somewhere to send some
	// packets: its endpoints, or with policy Local and none on this node,
	// pods short-circuited to the internal ones.
	ExtReachable bool
}

// SplitEndpoints splits sp's endpoints for node. hasExternal says whether
// the port has an external entry (a NodePort, external or load-balancer
// IPs); usable picks a mode's usable endpoints (Usable, restricted to its
// family).
func SplitEndpoints(svc *Service, sp *ServicePort, node string, hasExternal bool, usable func(eps []Endpoint, node string) []Endpoint) PortEndpoints {
	pe := PortEndpoints{All: usable(sp.Endpoints, "")}
	if node != "" {
		pe.Local = usable(sp.Endpoints, node)
	}
	pe.Internal, pe.External = pe.All, pe.All
	if svc.InternalLocal {
		pe.Internal = pe.Local
	}
	if svc.ExternalLocal {
		pe.External = pe.Local
	}
	pe.NeedAll = len(pe.All) > 0 && (!svc.InternalLocal || (hasExternal && !svc.ExternalLocal))
	pe.NeedLocal = len(pe.Local) > 0 && (svc.InternalLocal || (hasExternal && svc.ExternalLocal))
	pe.ExtReachable = len(pe.External) > 0 || (svc.ExternalLocal && len(pe.All) > 0)
	return pe
}
