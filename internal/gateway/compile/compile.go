// Package compile turns Gateway API and Ingress objects into flatnet
// gateway's routing table and the statuses the controller writes back.
//
// Design. Compile is a pure function of its Input: no API calls, no clock,
// no randomness, no output that depends on the order of the input or of a
// map, so the same objects give the same table and the same statuses (the
// writer compares them with what the API holds and writes only
// differences). It runs on every change, so it indexes the input once
// (namespaces, Services, EndpointSlices by Service, Secrets, ReferenceGrants
// by namespace), reuses the previous Compile's rules for routes that did
// not change (memo.go), and makes one pass over the Gateways and one over
// each route kind:
//
//  1. GatewayClasses with our controllerName are Accepted.
//  2. Each Gateway of such a class: its listeners are validated (protocol,
//     route kinds, certificates with ReferenceGrants, conflicts on a port).
//  3. Each route's parentRefs pick listeners (sectionName, port), which
//     must allow the route (namespaces, kinds) and share a hostname with
//     it; each attachment files the route's rules into the Port of that
//     listener's bind under the intersected hostname (when that listener
//     owns it: listener isolation, see hostOwner), and counts towards the
//     listener's attachedRoutes.
//  4. The Gateway statuses are finished last, once attachedRoutes are known.
//
// When only routes changed, Incremental (incremental.go) redoes steps 3
// and 4 for those routes alone, on the state a full compile left.
//
// Statuses are desired data: conditions carry ObservedGeneration and a zero
// LastTransitionTime; the writer merges them with the current ones
// (status.go: Merge*).
package compile

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// ControllerName is the GatewayClass controllerName flatnet serves.
const ControllerName = "flatnet.io/gateway-controller"

// IngressController is the IngressClass spec.controller flatnet serves.
const IngressController = "flatnet.io/ingress-controller"

// BindKey names one listener port of one Gateway.
type BindKey struct {
	Gateway types.NamespacedName
	Port    int32
}

// Input is everything Compile reads. Slices may be in any order.
type Input struct {
	GatewayClasses  []*gwv1.GatewayClass
	Gateways        []*gwv1.Gateway
	HTTPRoutes      []*gwv1.HTTPRoute
	GRPCRoutes      []*gwv1.GRPCRoute
	ReferenceGrants []*gwv1.ReferenceGrant
	Namespaces      []*corev1.Namespace
	Services        []*corev1.Service
	EndpointSlices  []*discoveryv1.EndpointSlice
	Secrets         []*corev1.Secret
	Ingresses       []*networkingv1.Ingress
	IngressClasses  []*networkingv1.IngressClass

	// Binds maps a Gateway's listener port to the port the proxy binds
	// (allocated by the leader, recorded in the Gateway's Service). A port
	// with no bind is left out of the table and keeps its Gateway from
	// being Programmed.
	Binds map[BindKey]int32
	// Addresses are each Gateway's IPs (its Service's load balancer).
	Addresses map[types.NamespacedName][]string

	// Ingress ports: the proxy binds these for every Ingress of class
	// flatnet (0 leaves that port out); IngressAddresses go to status.
	IngressHTTPBind, IngressHTTPSBind int32
	IngressAddresses                  []string
}

// Output is the routing table and the desired statuses.
type Output struct {
	Table *table.Table
	// Desired statuses of the objects this controller owns, conditions with
	// ObservedGeneration set and LastTransitionTime zero (the writer merges
	// them with the current status: MergeGatewayStatus, MergeRouteParents,
	// which keep the old time when the status did not change). Route
	// statuses hold only the parents entries with our ControllerName; every
	// route in the Input has an entry, with no parents when none of its
	// parentRefs is ours, so the writer can drop stale ones.
	GatewayClasses map[string]gwv1.GatewayClassStatus
	Gateways       map[types.NamespacedName]gwv1.GatewayStatus
	HTTPRoutes     map[types.NamespacedName]gwv1.HTTPRouteStatus
	GRPCRoutes     map[types.NamespacedName]gwv1.GRPCRouteStatus
	Ingresses      map[types.NamespacedName]networkingv1.IngressStatus
}

// Compile computes the table and statuses for in. It does not modify in.
func Compile(in *Input) *Output {
	return compileAll(newCompiler(in))
}

// compileAll is Compile on a prepared compiler, which it leaves holding
// the indexes and listeners for Incremental.
func compileAll(c *compiler) *Output {
	in := c.in
	c.loadMemo()
	out := &Output{
		Table:          &table.Table{Ports: map[int32]*table.Port{}},
		GatewayClasses: map[string]gwv1.GatewayClassStatus{},
		Gateways:       map[types.NamespacedName]gwv1.GatewayStatus{},
		HTTPRoutes:     make(map[types.NamespacedName]gwv1.HTTPRouteStatus, len(in.HTTPRoutes)),
		GRPCRoutes:     make(map[types.NamespacedName]gwv1.GRPCRouteStatus, len(in.GRPCRoutes)),
		Ingresses:      map[types.NamespacedName]networkingv1.IngressStatus{},
	}
	c.out = out
	c.gatewayClasses()
	c.compileGateways()
	c.httpRoutes()
	c.grpcRoutes()
	c.finishGateways()
	c.reserveListenerHosts()
	c.ingresses()
	for _, p := range out.Table.Ports {
		p.Finish()
	}
	c.saveMemo()
	return out
}

// compiler holds the indexes of one Compile call.
type compiler struct {
	in  *Input
	out *Output
	// used holds every Service a backend names (resolved or not), read by
	// the controller's event handlers while compiles run (Incremental.Uses).
	used *serviceSet

	classes     map[string]*gwv1.GatewayClass // ours only
	nsLabels    map[string]map[string]string
	services    map[types.NamespacedName]*corev1.Service
	slices      map[types.NamespacedName][]*discoveryv1.EndpointSlice // by Service
	secrets     map[types.NamespacedName]*corev1.Secret
	grants      map[string][]*gwv1.ReferenceGrant // by namespace
	gateways    map[types.NamespacedName]*gateway // ours only
	gwOrder     []*gateway
	ports       map[svcPort]*servicePortInfo
	memo        memoState
	lastGateway lastGateway
	names       map[svcPort]string

	// Incremental only: the records of what each route filed and
	// counted (recs, rec: the route being attached) and, during Routes,
	// the rules to file per touched host (delta).
	recs  map[RouteKey]*routeRec
	rec   *routeRec
	delta map[hostRef][]*table.Rule
}

func newCompiler(in *Input) *compiler {
	c := &compiler{
		in:       in,
		classes:  map[string]*gwv1.GatewayClass{},
		nsLabels: make(map[string]map[string]string, len(in.Namespaces)),
		services: make(map[types.NamespacedName]*corev1.Service, len(in.Services)),
		slices:   make(map[types.NamespacedName][]*discoveryv1.EndpointSlice, len(in.Services)),
		secrets:  make(map[types.NamespacedName]*corev1.Secret, len(in.Secrets)),
		grants:   map[string][]*gwv1.ReferenceGrant{},
		gateways: map[types.NamespacedName]*gateway{},
		ports:    make(map[svcPort]*servicePortInfo, len(in.Services)),
		names:    make(map[svcPort]string, len(in.Services)),
		used:     &serviceSet{m: map[types.NamespacedName]bool{}},
	}
	for _, gc := range in.GatewayClasses {
		if gc.Spec.ControllerName == ControllerName {
			c.classes[gc.Name] = gc
		}
	}
	for _, ns := range in.Namespaces {
		c.nsLabels[ns.Name] = ns.Labels
	}
	for _, s := range in.Services {
		c.services[nn(s.Namespace, s.Name)] = s
	}
	for _, s := range in.EndpointSlices {
		svc := s.Labels[discoveryv1.LabelServiceName]
		if svc == "" {
			continue
		}
		k := nn(s.Namespace, svc)
		c.slices[k] = append(c.slices[k], s)
	}
	for _, l := range c.slices {
		slices.SortFunc(l, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	}
	for _, s := range in.Secrets {
		c.secrets[nn(s.Namespace, s.Name)] = s
	}
	for _, g := range in.ReferenceGrants {
		c.grants[g.Namespace] = append(c.grants[g.Namespace], g)
	}
	return c
}

func nn(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}

// namespaceLabels returns a namespace's labels; a namespace the input does
// not hold still has the name label the API server sets on every one.
func (c *compiler) namespaceLabels(ns string) map[string]string {
	if l, ok := c.nsLabels[ns]; ok {
		return l
	}
	return map[string]string{corev1.LabelMetadataName: ns}
}

// referenceGranted reports whether a ReferenceGrant in toNS lets objects of
// fromGroup/fromKind in fromNS refer to toGroup/toKind toName.
func (c *compiler) referenceGranted(fromGroup, fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	for _, g := range c.grants[toNS] {
		from := false
		for _, f := range g.Spec.From {
			if string(f.Group) == fromGroup && string(f.Kind) == fromKind && string(f.Namespace) == fromNS {
				from = true
				break
			}
		}
		if !from {
			continue
		}
		for _, t := range g.Spec.To {
			if string(t.Group) == toGroup && string(t.Kind) == toKind && (t.Name == nil || string(*t.Name) == toName) {
				return true
			}
		}
	}
	return false
}

// port returns the table Port for a bind, creating it.
func (c *compiler) port(bind, listen int32, proto table.Protocol, gw string) *table.Port {
	p := c.out.Table.Ports[bind]
	if p == nil {
		p = table.NewPort(bind, listen, proto)
		p.Gateway = gw
		c.out.Table.Ports[bind] = p
	}
	return p
}

// addressType says whether a status address is an IP or a hostname.
func addressType(a string) *gwv1.AddressType {
	t := gwv1.IPAddressType
	if _, err := netip.ParseAddr(a); err != nil {
		t = gwv1.HostnameAddressType
	}
	return &t
}
