package compile

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// backends fills a rule's weighted backends. An invalid ref stays in the
// list, marked Invalid, so its share of the traffic gets a 500.
func (c *compiler) backends(r *route, a *table.Action, refs []gwv1.HTTPBackendRef, grpc bool) {
	if len(refs) == 0 {
		a.Direct = 500
		return
	}
	weights := make([]int32, 0, len(refs))
	slab := make([]table.Backend, len(refs)) // one allocation for the rule
	for i := range refs {
		br := &refs[i]
		b := &slab[i]
		c.backend(r, &br.BackendObjectReference, grpc, b)
		b.Weight = 1
		if br.Weight != nil {
			b.Weight = *br.Weight
		}
		for _, f := range br.Filters {
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
	sp := c.servicePort(ns, string(ref.Name), port)
	r.deps = append(r.deps, sp)
	b.Name = sp.name
	fail := func(reason gwv1.RouteConditionReason, format string, args ...any) {
		r.unresolve(reason, fmt.Sprintf(format, args...))
		b.Invalid = true
	}
	switch {
	case group != "" || kind != "Service":
		fail(gwv1.RouteReasonInvalidKind, "backendRef %s: kind %s/%s is not supported; use a Service", ref.Name, group, kind)
	case ns != r.namespace && !c.referenceGranted(gatewayGroup, string(r.kind), r.namespace, "", "Service", ns, string(ref.Name)):
		fail(gwv1.RouteReasonRefNotPermitted, "backendRef %s/%s: no ReferenceGrant in %s allows %ss from %s", ns, ref.Name, ns, r.kind, r.namespace)
	case sp.svc == nil:
		fail(gwv1.RouteReasonBackendNotFound, "Service %s/%s not found", ns, ref.Name)
	case ref.Port == nil:
		fail(gwv1.RouteReasonBackendNotFound, "backendRef %s/%s needs a port", ns, ref.Name)
	case sp.port == nil:
		fail(gwv1.RouteReasonBackendNotFound, "Service %s/%s has no port %d", ns, ref.Name, port)
	case !sp.protoOK:
		fail(gwv1.RouteReasonUnsupportedProtocol, "Service %s/%s port %d: appProtocol %q is not supported", ns, ref.Name, port, *sp.port.AppProtocol)
	default:
		b.Protocol = sp.proto
		if grpc {
			b.Protocol = table.H2C // gRPC without TLS is HTTP/2 with prior knowledge
		}
		b.Endpoints = sp.endpoints
	}
}

// svcPort names one port of one Service.
type svcPort struct {
	namespace, name string
	port            int32
}

// servicePortInfo is a Service port resolved once per Compile, however
// many backendRefs name it.
type servicePortInfo struct {
	key       svcPort
	name      string // "namespace/service:port"
	svc       *corev1.Service
	port      *corev1.ServicePort
	proto     table.AppProtocol
	protoOK   bool
	endpoints []string
}

func (c *compiler) servicePort(ns, name string, port int32) *servicePortInfo {
	k := svcPort{ns, name, port}
	if sp := c.ports[k]; sp != nil {
		return sp
	}
	sp := c.memoPort(k, func() *servicePortInfo { return c.resolvePort(k) })
	c.ports[k] = sp
	c.used.add(nn(k.namespace, k.name))
	return sp
}

// serviceSet is a set of Services safe for one writer (the compile) and
// readers on other goroutines.
type serviceSet struct {
	mu sync.RWMutex
	m  map[types.NamespacedName]bool
}

func (s *serviceSet) add(k types.NamespacedName) {
	s.mu.Lock()
	s.m[k] = true
	s.mu.Unlock()
}

func (s *serviceSet) has(k types.NamespacedName) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[k]
}

func (c *compiler) resolvePort(k svcPort) *servicePortInfo {
	ns, name, port := k.namespace, k.name, k.port
	sp := &servicePortInfo{key: k, name: ns + "/" + name + ":" + strconv.Itoa(int(port))}
	sp.svc = c.services[nn(ns, name)]
	if sp.svc == nil {
		return sp
	}
	for i := range sp.svc.Spec.Ports {
		if sp.svc.Spec.Ports[i].Port == port {
			sp.port = &sp.svc.Spec.Ports[i]
			break
		}
	}
	if sp.port == nil {
		return sp
	}
	sp.proto, sp.protoOK = appProtocol(sp.port.AppProtocol)
	sp.endpoints = c.endpoints(sp.svc, sp.port)
	return sp
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
	var ready, terminating []string
	if svc.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.ExternalName != "" {
		ready = append(ready, net.JoinHostPort(svc.Spec.ExternalName, strconv.Itoa(int(sp.Port))))
	}
	for _, s := range c.slices[nn(svc.Namespace, svc.Name)] {
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
	return eps
}
