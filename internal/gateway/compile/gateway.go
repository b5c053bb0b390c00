package compile

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/features"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// SupportedFeatures is what GatewayClass status.supportedFeatures lists
// (the conformance suite runs the tests of exactly these). Trim it to what
// the data plane passes. HTTPRouteRetry is not claimed: the data plane
// retries, but HTTPRouteRule.retry is experimental-channel in v1.6.3, so
// the standard CRDs prune it and no route can ask for it (the suite's
// HTTPRouteRetry failed for that reason).
var SupportedFeatures = []features.FeatureName{
	features.SupportGRPCRoute,
	features.SupportGRPCRouteNamedRouteRule,
	features.SupportGateway,
	features.SupportGatewayHTTPListenerIsolation,
	features.SupportGatewayHTTPSListenerDetectMisdirectedRequests,
	features.SupportGatewayPort8080,
	features.SupportHTTPRoute,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteBackendProtocolH2C,
	features.SupportHTTPRouteBackendProtocolWebSocket,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportReferenceGrant,
}

const gatewayGroup = gwv1.GroupName

var (
	kindHTTPRoute = gwv1.RouteGroupKind{Group: ptrTo(gwv1.Group(gatewayGroup)), Kind: "HTTPRoute"}
	kindGRPCRoute = gwv1.RouteGroupKind{Group: ptrTo(gwv1.Group(gatewayGroup)), Kind: "GRPCRoute"}
)

func ptrTo[T any](v T) *T { return &v }

func cond(typ string, ok bool, reason, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
}

func (c *compiler) gatewayClasses() {
	names := make([]string, 0, len(c.classes))
	for n := range c.classes {
		names = append(names, n)
	}
	slices.Sort(names)
	feats := make([]gwv1.SupportedFeature, 0, len(SupportedFeatures))
	for _, f := range SupportedFeatures {
		feats = append(feats, gwv1.SupportedFeature{Name: gwv1.FeatureName(f)})
	}
	slices.SortFunc(feats, func(a, b gwv1.SupportedFeature) int { return cmp.Compare(a.Name, b.Name) })
	for _, n := range names {
		gc := c.classes[n]
		st := gwv1.GatewayClassStatus{SupportedFeatures: slices.Clone(feats)}
		if gc.Spec.ParametersRef != nil {
			st.Conditions = []metav1.Condition{cond(string(gwv1.GatewayClassConditionStatusAccepted), false,
				string(gwv1.GatewayClassReasonInvalidParameters), "flatnet takes no parameters; remove spec.parametersRef", gc.Generation)}
		} else {
			st.Conditions = []metav1.Condition{cond(string(gwv1.GatewayClassConditionStatusAccepted), true,
				string(gwv1.GatewayClassReasonAccepted), "accepted by "+ControllerName, gc.Generation)}
		}
		c.out.GatewayClasses[n] = st
	}
}

// gateway is one Gateway of our class being compiled.
type gateway struct {
	obj       *gwv1.Gateway
	key       types.NamespacedName
	listeners []*listener
	// rejected is the reason the Gateway is not Accepted whatever its
	// listeners (InvalidParameters, UnsupportedAddress); it then serves
	// nothing.
	rejected, rejectedMsg string
}

// gateway returns our Gateway namespace/name, or nil. Routes come in runs
// with the same parent, so the last answer is kept.
func (c *compiler) gateway(namespace, name string) *gateway {
	if l := &c.lastGateway; l.ok && l.namespace == namespace && l.name == name {
		return l.g
	}
	g := c.gateways[nn(namespace, name)]
	c.lastGateway = lastGateway{namespace, name, g, true}
	return g
}

// lastGateway is the last lookup of gateway.
type lastGateway struct {
	namespace, name string
	g               *gateway
	ok              bool
}

// listener is one Gateway listener and what was decided about it.
type listener struct {
	gw       *gateway
	spec     *gwv1.Listener
	hostname string // "" for any

	accepted       bool // protocol supported and not conflicted: routes may attach
	acceptedReason string
	acceptedMsg    string
	resolved       bool
	resolvedReason string
	resolvedMsg    string
	conflict       string // ListenerReason*Conflict, "" for none

	kinds    []gwv1.RouteGroupKind
	from     gwv1.FromNamespaces
	selector labels.Selector
	certs    []table.Cert
	bind     int32
	attached int32
}

// programmed: the listener serves traffic.
func (l *listener) programmed() bool { return l.accepted && l.resolved && l.bind != 0 }

func (c *compiler) compileGateways() {
	gws := slices.Clone(c.in.Gateways)
	slices.SortFunc(gws, func(a, b *gwv1.Gateway) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, obj := range gws {
		if c.classes[string(obj.Spec.GatewayClassName)] == nil {
			continue
		}
		g := &gateway{obj: obj, key: nn(obj.Namespace, obj.Name)}
		for i := range obj.Spec.Listeners {
			g.listeners = append(g.listeners, c.listener(g, &obj.Spec.Listeners[i]))
		}
		markConflicts(g.listeners)
		g.validate()
		for _, l := range g.listeners {
			if l.accepted && l.resolved && g.rejected == "" {
				if b := c.in.Binds[BindKey{Gateway: g.key, Port: int32(l.spec.Port)}]; b != 0 {
					l.bind = b
					proto := table.HTTP
					if l.spec.Protocol == gwv1.HTTPSProtocolType {
						proto = table.HTTPS
					}
					p := c.port(b, int32(l.spec.Port), proto, g.key.String())
					p.Certs = append(p.Certs, l.certs...)
				}
			}
		}
		c.gateways[g.key] = g
		c.gwOrder = append(c.gwOrder, g)
	}
}

// validate rejects what flatnet cannot honour in a Gateway's spec: it takes
// no parameters, and its addresses come from the load balancer, so only IP
// addresses can be asked for (finishGateways checks they were given).
func (g *gateway) validate() {
	if inf := g.obj.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
		g.rejected = string(gwv1.GatewayReasonInvalidParameters)
		g.rejectedMsg = "flatnet takes no parameters; remove spec.infrastructure.parametersRef"
		return
	}
	for _, a := range g.obj.Spec.Addresses {
		if a.Type != nil && *a.Type != gwv1.IPAddressType {
			g.rejected = string(gwv1.GatewayReasonUnsupportedAddress)
			g.rejectedMsg = fmt.Sprintf("address type %s is not supported; ask for an IPAddress or none", *a.Type)
			return
		}
	}
}

func (c *compiler) listener(g *gateway, spec *gwv1.Listener) *listener {
	l := &listener{gw: g, spec: spec, accepted: true, resolved: true,
		acceptedReason: string(gwv1.ListenerReasonAccepted), resolvedReason: string(gwv1.ListenerReasonResolvedRefs),
		from: gwv1.NamespacesFromSame}
	if spec.Hostname != nil {
		l.hostname = strings.ToLower(string(*spec.Hostname))
	}
	switch spec.Protocol {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType:
	default:
		l.accepted = false
		l.acceptedReason = string(gwv1.ListenerReasonUnsupportedProtocol)
		l.acceptedMsg = fmt.Sprintf("protocol %q is not supported; use HTTP or HTTPS", spec.Protocol)
		return l
	}
	// Route kinds.
	l.kinds = []gwv1.RouteGroupKind{kindHTTPRoute, kindGRPCRoute}
	if ar := spec.AllowedRoutes; ar != nil {
		if len(ar.Kinds) > 0 {
			l.kinds = nil
			var bad []string
			for _, k := range ar.Kinds {
				grp := gatewayGroup
				if k.Group != nil {
					grp = string(*k.Group)
				}
				if grp == gatewayGroup && (k.Kind == "HTTPRoute" || k.Kind == "GRPCRoute") {
					if !slices.ContainsFunc(l.kinds, func(x gwv1.RouteGroupKind) bool { return x.Kind == k.Kind }) {
						l.kinds = append(l.kinds, gwv1.RouteGroupKind{Group: ptrTo(gwv1.Group(gatewayGroup)), Kind: k.Kind})
					}
				} else {
					bad = append(bad, grp+"/"+string(k.Kind))
				}
			}
			if len(bad) > 0 {
				l.resolved = false
				l.resolvedReason = string(gwv1.ListenerReasonInvalidRouteKinds)
				l.resolvedMsg = fmt.Sprintf("route kinds %s are not supported; use HTTPRoute or GRPCRoute", strings.Join(bad, ", "))
			}
		}
		if ns := ar.Namespaces; ns != nil {
			if ns.From != nil {
				l.from = *ns.From
			}
			if l.from == gwv1.NamespacesFromSelector {
				sel, err := metav1.LabelSelectorAsSelector(ns.Selector)
				if err != nil || ns.Selector == nil {
					l.accepted = false
					l.acceptedReason = string(gwv1.ListenerReasonUnsupportedValue)
					l.acceptedMsg = fmt.Sprintf("allowedRoutes.namespaces.selector is invalid: %v", err)
				}
				l.selector = sel
			}
		}
	}
	if spec.Protocol == gwv1.HTTPSProtocolType {
		c.listenerTLS(l)
	}
	return l
}

// listenerTLS resolves an HTTPS listener's certificates.
func (c *compiler) listenerTLS(l *listener) {
	spec := l.spec
	if spec.TLS == nil || len(spec.TLS.CertificateRefs) == 0 {
		l.setUnresolved(gwv1.ListenerReasonInvalidCertificateRef, "an HTTPS listener needs tls.certificateRefs")
		return
	}
	if spec.TLS.Mode != nil && *spec.TLS.Mode != gwv1.TLSModeTerminate {
		l.accepted = false
		l.acceptedReason = string(gwv1.ListenerReasonUnsupportedValue)
		l.acceptedMsg = "HTTPS listeners support only tls.mode Terminate"
		return
	}
	gwNS := l.gw.obj.Namespace
	for _, ref := range spec.TLS.CertificateRefs {
		if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Secret") {
			l.setUnresolved(gwv1.ListenerReasonInvalidCertificateRef,
				fmt.Sprintf("certificateRef %s: only core Secrets are supported", ref.Name))
			continue
		}
		ns := gwNS
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		if ns != gwNS && !c.referenceGranted(gatewayGroup, "Gateway", gwNS, "", "Secret", ns, string(ref.Name)) {
			l.setUnresolved(gwv1.ListenerReasonRefNotPermitted,
				fmt.Sprintf("Secret %s/%s: no ReferenceGrant in %s allows Gateways from %s", ns, ref.Name, ns, gwNS))
			continue
		}
		cert, err := c.certificate(nn(ns, string(ref.Name)))
		if err != nil {
			l.setUnresolved(gwv1.ListenerReasonInvalidCertificateRef, err.Error())
			continue
		}
		l.certs = append(l.certs, table.Cert{Hostname: l.hostname, Cert: cert})
	}
}

// setUnresolved records the first reason the listener's refs do not resolve.
func (l *listener) setUnresolved(reason gwv1.ListenerConditionReason, msg string) {
	if !l.resolved {
		return
	}
	l.resolved = false
	l.resolvedReason = string(reason)
	l.resolvedMsg = msg
}

// certificate loads a kubernetes.io/tls Secret as a certificate.
func (c *compiler) certificate(k types.NamespacedName) (*tls.Certificate, error) {
	s := c.secrets[k]
	if s == nil {
		return nil, fmt.Errorf("Secret %s not found", k)
	}
	crt, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(crt) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("Secret %s has no %s and %s; use a kubernetes.io/tls Secret", k, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	return loadKeyPair(k, crt, key)
}

// markConflicts flags listeners that share a port with a different protocol
// or the same protocol and hostname; the first listener in spec order keeps
// the port.
func markConflicts(ls []*listener) {
	type hostKey struct {
		port int32
		host string
	}
	portProto := map[int32]gwv1.ProtocolType{}
	hosts := map[hostKey]bool{}
	for _, l := range ls {
		if !l.accepted {
			continue
		}
		port := int32(l.spec.Port)
		if p, ok := portProto[port]; ok && p != l.spec.Protocol {
			l.conflict = string(gwv1.ListenerReasonProtocolConflict)
		} else {
			portProto[port] = l.spec.Protocol
			hk := hostKey{port, l.hostname}
			if hosts[hk] {
				l.conflict = string(gwv1.ListenerReasonHostnameConflict)
			}
			hosts[hk] = true
		}
		if l.conflict != "" {
			l.accepted = false
			l.acceptedReason = l.conflict
			l.acceptedMsg = fmt.Sprintf("another listener on port %d comes first", port)
		}
	}
}

// allows reports whether the listener takes routes of kind from namespace ns.
func (c *compiler) allows(l *listener, kind gwv1.Kind, ns string) bool {
	if !slices.ContainsFunc(l.kinds, func(k gwv1.RouteGroupKind) bool { return k.Kind == kind }) {
		return false
	}
	switch l.from {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSame:
		return ns == l.gw.obj.Namespace
	case gwv1.NamespacesFromSelector:
		return l.selector != nil && l.selector.Matches(labels.Set(c.namespaceLabels(ns)))
	}
	return false
}

// finishGateways writes the Gateway statuses once routes are attached.
func (c *compiler) finishGateways() {
	for _, g := range c.gwOrder {
		gen := g.obj.Generation
		st := gwv1.GatewayStatus{}
		valid, invalid := 0, 0
		missingBind := false
		for _, l := range g.listeners {
			if l.accepted {
				valid++
				if l.resolved && l.bind == 0 {
					missingBind = true
				}
			} else {
				invalid++
			}
			st.Listeners = append(st.Listeners, listenerStatus(l, gen, g.rejected != ""))
		}
		addrs := c.in.Addresses[g.key]
		for _, a := range addrs {
			st.Addresses = append(st.Addresses, gwv1.GatewayStatusAddress{Type: addressType(a), Value: a})
		}
		acc := cond(string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), "accepted by "+ControllerName, gen)
		unusable := ""
		for _, a := range g.obj.Spec.Addresses {
			if a.Value != "" && !slices.Contains(addrs, a.Value) {
				unusable = a.Value
			}
		}
		switch {
		case g.rejected != "":
			acc = cond(string(gwv1.GatewayConditionAccepted), false, g.rejected, g.rejectedMsg, gen)
		case valid == 0:
			acc = cond(string(gwv1.GatewayConditionAccepted), false, string(gwv1.GatewayReasonListenersNotValid), "no listener is valid", gen)
		case invalid > 0:
			acc.Reason = string(gwv1.GatewayReasonListenersNotValid)
			acc.Message = fmt.Sprintf("%d of %d listeners are not valid", invalid, len(g.listeners))
		}
		prog := cond(string(gwv1.GatewayConditionProgrammed), true, string(gwv1.GatewayReasonProgrammed), "", gen)
		switch {
		case g.rejected != "":
			prog = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "the Gateway is not accepted", gen)
		case valid == 0:
			prog = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "no listener is valid", gen)
		case missingBind:
			prog = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonPending), "waiting for a bind port for every listener port", gen)
		case len(addrs) == 0:
			prog = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonAddressNotAssigned), "waiting for the load balancer address", gen)
		case unusable != "":
			prog = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonAddressNotUsable),
				fmt.Sprintf("the load balancer did not give the requested address %s", unusable), gen)
		}
		st.Conditions = []metav1.Condition{acc, prog}
		c.out.Gateways[g.key] = st
	}
}

func listenerStatus(l *listener, gen int64, gwRejected bool) gwv1.ListenerStatus {
	ls := gwv1.ListenerStatus{Name: l.spec.Name, SupportedKinds: slices.Clone(l.kinds), AttachedRoutes: l.attached}
	if ls.SupportedKinds == nil {
		ls.SupportedKinds = []gwv1.RouteGroupKind{}
	}
	progReason, progMsg := string(gwv1.ListenerReasonProgrammed), ""
	switch {
	case !l.accepted || !l.resolved:
		progReason, progMsg = string(gwv1.ListenerReasonInvalid), "the listener is not valid"
	case gwRejected:
		progReason, progMsg = string(gwv1.ListenerReasonInvalid), "the Gateway is not accepted"
	case l.bind == 0:
		progReason, progMsg = string(gwv1.ListenerReasonPending), "waiting for a bind port"
	}
	conflictReason := l.conflict
	if conflictReason == "" {
		conflictReason = string(gwv1.ListenerReasonNoConflicts)
	}
	ls.Conditions = []metav1.Condition{
		cond(string(gwv1.ListenerConditionAccepted), l.accepted, l.acceptedReason, l.acceptedMsg, gen),
		cond(string(gwv1.ListenerConditionProgrammed), l.programmed(), progReason, progMsg, gen),
		cond(string(gwv1.ListenerConditionResolvedRefs), l.resolved, l.resolvedReason, l.resolvedMsg, gen),
		cond(string(gwv1.ListenerConditionConflicted), l.conflict != "", conflictReason, "", gen),
	}
	return ls
}
