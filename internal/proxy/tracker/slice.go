package tracker

import (
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Slice is what the proxy keeps of an EndpointSlice: the informers'
// transform (Slim) turns each slice into one before it is cached, and the
// tracker builds models from them. An API EndpointSlice of three
// endpoints, even with what the proxy does not read cleared, is about
// 2 KB in memory (a map per label and annotation, a pointer per condition
// and port field, a 200-byte struct per endpoint); a Slice is about a
// quarter of that, which at 10,000 Services is most of the proxy's heap.
type Slice struct {
	// Meta holds the name, namespace, UID and resourceVersion: the
	// informer's key and version.
	Meta
	Service     string // the kubernetes.io/service-name label ("": no service)
	AddressType discovery.AddressType
	// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
	// annotation, zero when there is none or it does not parse.
	TriggerTime time.Time
	Endpoints   []SliceEndpoint
	Ports       []SlicePort
}

// SliceEndpoint is one endpoint, with the API's defaults applied.
type SliceEndpoint struct {
	// Addr is the first address (as kube-proxy, the others are the same
	// pod); invalid when there is none or it does not parse.
	Addr     netip.Addr
	NodeName string
	// Ready defaults to true, Serving to Ready, Terminating to false.
	Ready, Serving, Terminating bool
}

// SlicePort is one port; Protocol defaults to TCP, Port 0 is unset.
type SlicePort struct {
	Name     string
	Protocol v1.Protocol
	Port     int32
}

// CompactSlice returns the Slice of an API EndpointSlice.
func CompactSlice(s *discovery.EndpointSlice) *Slice {
	out := &Slice{
		Meta:        metaOf(&s.ObjectMeta),
		Service:     s.Labels[discovery.LabelServiceName],
		AddressType: s.AddressType,
	}
	if at, ok := s.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, at); err == nil {
			out.TriggerTime = t
		}
	}
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]SliceEndpoint, len(s.Endpoints))
	}
	for i, e := range s.Endpoints {
		ep := &out.Endpoints[i]
		if len(e.Addresses) > 0 {
			if a, err := netip.ParseAddr(e.Addresses[0]); err == nil {
				ep.Addr = a.Unmap()
			}
		}
		if e.NodeName != nil {
			ep.NodeName = *e.NodeName
		}
		c := e.Conditions
		ep.Ready = c.Ready == nil || *c.Ready
		ep.Serving = ep.Ready
		if c.Serving != nil {
			ep.Serving = *c.Serving
		}
		ep.Terminating = c.Terminating != nil && *c.Terminating
	}
	if len(s.Ports) > 0 {
		out.Ports = make([]SlicePort, len(s.Ports))
	}
	for i, p := range s.Ports {
		sp := &out.Ports[i]
		sp.Protocol = v1.ProtocolTCP
		if p.Name != nil {
			sp.Name = *p.Name
		}
		if p.Protocol != nil {
			sp.Protocol = *p.Protocol
		}
		if p.Port != nil {
			sp.Port = *p.Port
		}
	}
	return out
}

// Svc is what the proxy keeps of a Service: the informers' transform
// (Slim) turns each Service into one before it is cached. A Service's
// struct alone is about 1 KB, most of it fields the proxy never reads.
type Svc struct {
	// Meta holds the name, namespace, UID and resourceVersion: the
	// informer's key and version.
	Meta
	Type v1.ServiceType
	// ClusterIPs is spec.clusterIPs, or spec.clusterIP when that is empty.
	ClusterIPs      []string
	ExternalIPs     []string
	LoadBalancerIPs []string // status.loadBalancer.ingress[].ip
	SourceRanges    []string // spec.loadBalancerSourceRanges
	// AffinityTimeout is the ClientIP affinity's timeout; 0 without
	// affinity.
	AffinityTimeout              time.Duration
	ExternalLocal, InternalLocal bool // the traffic policies are Local
	HealthCheckNodePort          int32
	Ports                        []SvcPort
}

// SvcPort is one spec.ports entry; Protocol "" is TCP.
type SvcPort struct {
	Name           string
	Protocol       v1.Protocol
	Port, NodePort int32
}

// CompactService returns the Svc of an API Service.
func CompactService(svc *v1.Service) *Svc {
	s := &svc.Spec
	out := &Svc{
		Meta:                metaOf(&svc.ObjectMeta),
		Type:                s.Type,
		ClusterIPs:          s.ClusterIPs,
		ExternalIPs:         s.ExternalIPs,
		SourceRanges:        s.LoadBalancerSourceRanges,
		ExternalLocal:       s.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal,
		InternalLocal:       s.InternalTrafficPolicy != nil && *s.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		HealthCheckNodePort: s.HealthCheckNodePort,
	}
	if len(out.ClusterIPs) == 0 && s.ClusterIP != "" {
		out.ClusterIPs = []string{s.ClusterIP}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, ing.IP)
		}
	}
	if s.SessionAffinity == v1.ServiceAffinityClientIP {
		out.AffinityTimeout = defaultAffinityTimeout
		if c := s.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			out.AffinityTimeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	if len(s.Ports) > 0 {
		out.Ports = make([]SvcPort, len(s.Ports))
	}
	for i, p := range s.Ports {
		out.Ports[i] = SvcPort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
	}
	return out
}
