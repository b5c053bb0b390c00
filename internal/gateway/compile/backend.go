package compile

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// backendRef is an HTTPBackendRef or GRPCBackendRef.
type backendRef struct {
	ref     *gwv1.BackendObjectReference
	weight  *int32
	filters []gwv1.HTTPRouteFilter // GRPCRoute's in this shape
}

// backendKey is one port of one Service, whose endpoints many routes share.
type backendKey struct {
	svc  types.NamespacedName
	port string
}

// backends fills a rule's weighted backends. An invalid ref stays in the
// list, marked Invalid, so its share of the traffic gets a 500.
func (c *compiler) backends(r *route, a *table.Action, refs []backendRef, grpc bool) {
	if len(refs) == 0 {
		a.Direct = 500
		return
	}
	weights := make([]int32, 0, len(refs))
	slab := make([]table.Backend, len(refs)) // one allocation for the rule
	for i, br := range refs {
		b := &slab[i]
		c.backend(r, br.ref, grpc, b)
		b.Weight = 1
		if br.weight != nil {
			b.Weight = *br.weight
		}
		for _, f := range br.filters {
			switch f.Type {
			case gwv1.HTTPRouteFilterRequestHeaderModifier:
				if f.RequestHeaderModifier != nil {
					b.RequestHeaders = headerFilter(f.RequestHeaderModifier)
				}
			case gwv1.HTTPRouteFilterResponseHeaderModifier:
				if f.ResponseHeaderModifier != nil {
					b.ResponseHeaders = headerFilter(f.ResponseHeaderModifier)
				}
			default:
				r.reject(gwv1.RouteReasonUnsupportedValue, "backendRef filter type %q is not supported", f.Type)
			}
		}
		a.Backends = append(a.Backends, b)
		weights = append(weights, b.Weight)
	}
	a.Balancer = table.NewWRR(weights)
	if a.Balancer == nil {
		a.Direct = 500 // every weight is 0
	}
}

// mirror adds a RequestMirror; a ref that does not resolve mirrors nothing.
func (c *compiler) mirror(r *route, a *table.Action, m *gwv1.HTTPRequestMirrorFilter) {
	b := &table.Backend{}
	c.backend(r, &m.BackendRef, a.GRPC, b)
	if b.Invalid {
		return
	}
	pct := 100.0
	switch {
	case m.Percent != nil:
		pct = float64(*m.Percent)
	case m.Fraction != nil:
		den := int32(100)
		if m.Fraction.Denominator != nil {
			den = *m.Fraction.Denominator
		}
		if den > 0 {
			pct = 100 * float64(m.Fraction.Numerator) / float64(den)
		}
	}
	a.Mirrors = append(a.Mirrors, &table.Mirror{Backend: b, Percent: min(max(pct, 0), 100)})
}

// backend resolves one reference to a Service port into b; a reference
// that does not resolve makes b Invalid and sets the route's ResolvedRefs.
func (c *compiler) backend(r *route, ref *gwv1.BackendObjectReference, grpc bool, b *table.Backend) {
	group, kind := "", "Service"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		kind = string(*ref.Kind)
	}
	ns := r.namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	port := int32(0)
	if ref.Port != nil {
		port = int32(*ref.Port)
	}
	b.Name = c.backendName(ns, string(ref.Name), port)
	fail := func(reason gwv1.RouteConditionReason, format string, args ...any) {
		r.unresolve(reason, fmt.Sprintf(format, args...))
		b.Invalid = true
	}
	if group != "" || kind != "Service" {
		fail(gwv1.RouteReasonInvalidKind, "backendRef %s: kind %s/%s is not supported; use a Service", ref.Name, group, kind)
		return
	}
	if ns != r.namespace && !c.referenceGranted(gatewayGroup, string(r.kind), r.namespace, "", "Service", ns, string(ref.Name)) {
		fail(gwv1.RouteReasonRefNotPermitted, "backendRef %s/%s: no ReferenceGrant in %s allows %ss from %s", ns, ref.Name, ns, r.kind, r.namespace)
		return
	}
	svc := c.services[nn(ns, string(ref.Name))]
	if svc == nil {
		fail(gwv1.RouteReasonBackendNotFound, "Service %s/%s not found", ns, ref.Name)
		return
	}
	if ref.Port == nil {
		fail(gwv1.RouteReasonBackendNotFound, "backendRef %s/%s needs a port", ns, ref.Name)
		return
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
			break
		}
	}
	if sp == nil {
		fail(gwv1.RouteReasonBackendNotFound, "Service %s/%s has no port %d", ns, ref.Name, port)
		return
	}
	proto, ok := appProtocol(sp.AppProtocol)
	if !ok {
		fail(gwv1.RouteReasonUnsupportedProtocol, "Service %s/%s port %d: appProtocol %q is not supported", ns, ref.Name, port, *sp.AppProtocol)
		return
	}
	if grpc {
		proto = table.H2C // gRPC without TLS is HTTP/2 with prior knowledge
	}
	b.Protocol = proto
	b.Endpoints = c.endpoints(svc, sp)
}

// svcPort names one port of one Service.
type svcPort struct {
	namespace, name string
	port            int32
}

// backendName is "namespace/service:port", made once per Compile.
func (c *compiler) backendName(ns, name string, port int32) string {
	k := svcPort{ns, name, port}
	if s, ok := c.names[k]; ok {
		return s
	}
	s := ns + "/" + name + ":" + strconv.Itoa(int(port))
	c.names[k] = s
	return s
}

// appProtocol maps a Service port's appProtocol to the protocol the proxy
// speaks to it; TLS to backends is not supported.
func appProtocol(p *string) (table.AppProtocol, bool) {
	if p == nil {
		return table.HTTP1, true
	}
	switch strings.ToLower(*p) {
	case string(table.H2C):
		return table.H2C, true
	case string(table.WS):
		return table.WS, true
	case "https", "kubernetes.io/wss", "tls":
		return "", false
	}
	return table.HTTP1, true
}

// endpoints lists "ip:port" of a Service port's ready endpoints, or of its
// serving terminating ones when none is ready, sorted.
func (c *compiler) endpoints(svc *corev1.Service, sp *corev1.ServicePort) []string {
	k := backendKey{nn(svc.Namespace, svc.Name), sp.Name}
	if eps, ok := c.endpointMem[k]; ok {
		return eps
	}
	var ready, terminating []string
	if svc.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.ExternalName != "" {
		ready = append(ready, net.JoinHostPort(svc.Spec.ExternalName, strconv.Itoa(int(sp.Port))))
	}
	for _, s := range c.slices[k.svc] {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		port := int32(0)
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == sp.Name && p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				port = *p.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		ps := strconv.Itoa(int(port))
		for _, e := range s.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			addr := net.JoinHostPort(e.Addresses[0], ps)
			cd := e.Conditions
			switch {
			case cd.Ready == nil || *cd.Ready:
				ready = append(ready, addr)
			case cd.Serving != nil && *cd.Serving && cd.Terminating != nil && *cd.Terminating:
				terminating = append(terminating, addr)
			}
		}
	}
	eps := ready
	if len(eps) == 0 {
		eps = terminating
	}
	slices.Sort(eps)
	eps = slices.Compact(eps)
	c.endpointMem[k] = eps
	return eps
}
