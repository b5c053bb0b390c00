package controller

// Frontends: how a Gateway gets an address. Every `flatnet gateway`
// instance (one per node, host network) serves every Gateway, each
// Gateway listener port on a bind port of its own, since several Gateways
// may all want :80. The leader keeps, per Gateway, a Service of type
// LoadBalancer (externalTrafficPolicy Local, no selector) mapping each
// listener port to its bind port, and an EndpointSlice naming every
// ready node's InternalIP with those bind ports. flatnet's Service proxy
// (or any kube-proxy) then carries LoadBalancerIP:80 to the receiving
// node's own gateway, keeping the client's address; the address itself
// comes from whatever assigns LoadBalancer IPs (flatnet controller's pool
// in the lab). The Service is also the record of the bind ports: every
// instance reads them back from it, so nothing else needs to agree.
//
// Ingress gets one such Service for all Ingresses, in the gateway's own
// namespace, mapping 80 and 443 to the Ingress bind ports.
//
// Everything here is plain data in and out: plan computes the desired
// Services and EndpointSlices from the Gateways, the existing Services
// and the Nodes; apply.go writes the difference.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/kube"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

const (
	// LabelGateway names the Gateway a frontend Service fronts;
	// LabelGatewayNamespace its namespace (always the Service's own).
	LabelGateway = "gateway.flatnet.io/name"
	// LabelIngress marks the Ingress frontend Service.
	LabelIngress = "gateway.flatnet.io/ingress"
	// ManagedBy is the field manager of what the gateway writes, and
	// SliceManagedBy the EndpointSlices' endpointslice.kubernetes.io/managed-by
	// (a label value: no slash).
	ManagedBy      = "flatnet.io/gateway-controller"
	SliceManagedBy = "flatnet-gateway"
	// IngressService is the Ingress frontend's name.
	IngressService = "flatnet-ingress"
)

// PortRange is the bind ports the leader hands out to Gateway listeners.
type PortRange struct{ First, Last int32 }

// gatewayPort is one listener port of one Gateway.
type gatewayPort struct {
	Gateway types.NamespacedName
	Port    int32
}

// frontendName is the Service for a Gateway: <name>-flatnet-gw, or, when
// that is not a valid Service name (63 characters), a cut name with a hash.
func frontendName(gw string) string {
	n := gw + "-flatnet-gw"
	if len(n) <= 63 {
		return n
	}
	sum := sha256.Sum256([]byte(gw))
	return gw[:40] + "-" + hex.EncodeToString(sum[:])[:10] + "-flatnet-gw"
}

// bindsOf reads the bind ports back from the frontend Services (every
// instance does this, leader or not).
func bindsOf(services []*corev1.Service) map[gatewayPort]int32 {
	binds := map[gatewayPort]int32{}
	for _, s := range services {
		gw, ok := s.Labels[LabelGateway]
		if !ok {
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal > 0 {
				binds[gatewayPort{types.NamespacedName{Namespace: s.Namespace, Name: gw}, p.Port}] = p.TargetPort.IntVal
			}
		}
	}
	return binds
}

// addressesOf is each Gateway's load-balancer IPs, from its Service.
func addressesOf(services []*corev1.Service) map[types.NamespacedName][]string {
	out := map[types.NamespacedName][]string{}
	for _, s := range services {
		gw, ok := s.Labels[LabelGateway]
		if !ok {
			continue
		}
		out[types.NamespacedName{Namespace: s.Namespace, Name: gw}] = lbIPs(s)
	}
	return out
}

func lbIPs(s *corev1.Service) []string {
	var ips []string
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			ips = append(ips, in.IP)
		}
	}
	return ips
}

// frontendPlan is what the leader wants to exist: Services, and for
// Services[i] the EndpointSlices Slices[i].
type frontendPlan struct {
	Services []*corev1.Service
	Slices   [][]*discoveryv1.EndpointSlice
}

// planInput is what planning reads.
type planInput struct {
	// Gateways are the accepted Gateways of our classes.
	Gateways []*gwv1.Gateway
	// Existing are the frontend Services now (labelled LabelGateway or
	// LabelIngress), the record of bind ports handed out.
	Existing []*corev1.Service
	// ExistingSlices are the Existing Services' EndpointSlices, by
	// Service and slice name: a node keeps its slice.
	ExistingSlices map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice
	Nodes          []*corev1.Node
	Range          PortRange
	// Ingress, when set, adds the Ingress frontend in Namespace with
	// 80 -> IngressHTTP and 443 -> IngressHTTPS.
	Ingress                   bool
	Namespace                 string
	IngressHTTP, IngressHTTPS int32
}

// plan computes the frontend Services and EndpointSlices. A listener port
// keeps the bind port its Service already has; new ones get the lowest
// free port of the range; an error names a Gateway that found the range
// full (the others are still planned).
func plan(in planInput) (frontendPlan, []error) {
	var out frontendPlan
	var errs []error
	old := bindsOf(in.Existing)
	used := map[int32]bool{}
	for _, b := range old {
		used[b] = true
	}
	if in.Ingress {
		used[in.IngressHTTP], used[in.IngressHTTPS] = true, true
	}
	// Free what no Gateway listener wants any more, so that it can be
	// handed out again in this same pass.
	want := map[gatewayPort]bool{}
	for _, gw := range in.Gateways {
		for _, l := range gw.Spec.Listeners {
			want[gatewayPort{types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}, int32(l.Port)}] = true
		}
	}
	for k, b := range old {
		if !want[k] {
			delete(used, b)
		}
	}
	next := in.Range.First
	alloc := func() (int32, bool) {
		for ; next <= in.Range.Last; next++ {
			if !used[next] {
				used[next] = true
				return next, true
			}
		}
		return 0, false
	}
	addrs := nodeAddresses(in.Nodes)
	gws := slices.Clone(in.Gateways)
	slices.SortFunc(gws, func(a, b *gwv1.Gateway) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, gw := range gws {
		key := types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}
		var ports []int32
		for _, l := range gw.Spec.Listeners {
			if p := int32(l.Port); !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		slices.Sort(ports)
		var sp []corev1.ServicePort
		full := false
		for _, p := range ports {
			b, ok := old[gatewayPort{key, p}]
			if !ok {
				if b, ok = alloc(); !ok {
					full = true
					continue
				}
			}
			sp = append(sp, corev1.ServicePort{Name: "l" + strconv.Itoa(int(p)), Protocol: corev1.ProtocolTCP, Port: p, TargetPort: intstr.FromInt32(b)})
		}
		if full {
			errs = append(errs, fmt.Errorf("gateway %s: no free bind port left in %d-%d (flatnet gateway --bind-port-range)", key, in.Range.First, in.Range.Last))
		}
		if len(sp) == 0 {
			continue
		}
		owner := metav1.OwnerReference{APIVersion: gwv1.GroupVersion.String(), Kind: "Gateway", Name: gw.Name, UID: gw.UID}
		svc := frontendService(gw.Namespace, frontendName(gw.Name), map[string]string{LabelGateway: gw.Name}, sp, &owner)
		out.Services = append(out.Services, svc)
		out.Slices = append(out.Slices, frontendSlices(svc, addrs, in.ExistingSlices[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}]))
	}
	if in.Ingress {
		sp := []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(in.IngressHTTP)},
			{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(in.IngressHTTPS)},
		}
		svc := frontendService(in.Namespace, IngressService, map[string]string{LabelIngress: "true"}, sp, nil)
		out.Services = append(out.Services, svc)
		out.Slices = append(out.Slices, frontendSlices(svc, addrs, in.ExistingSlices[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}]))
	}
	return out, errs
}

func frontendService(ns, name string, labels map[string]string, ports []corev1.ServicePort, owner *metav1.OwnerReference) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 ports,
		},
	}
	if owner != nil {
		s.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return s
}

// nodeAddress is a node's name and InternalIP.
type nodeAddress struct{ Name, IP string }

// nodeAddresses are the Ready nodes' first IPv4 InternalIPs, by name.
func nodeAddresses(nodes []*corev1.Node) []nodeAddress {
	var out []nodeAddress
	for _, n := range nodes {
		if !kube.NodeReady(n) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && err == nil && ip.Is4() {
				out = append(out, nodeAddress{n.Name, a.Address})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b nodeAddress) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// maxFrontendEndpoints is how many nodes one frontend EndpointSlice
// names: upstream's default --max-endpoints-per-slice. Every node's proxy
// watches these slices, and a node that comes or goes rewrites one of
// them, so the smaller they are the less each change costs every node
// (a 1,000-endpoint slice is ~100 KB to send and decode, on each node,
// for each node that joins or leaves).
const maxFrontendEndpoints = 100

// frontendSliceName is the name of svc's k-th EndpointSlice (from 0):
// the Service's own name, then <name>-2, <name>-3, ... (never a frontend
// Service's name, which ends in -flatnet-gw or is flatnet-ingress).
func frontendSliceName(svc string, k int) string {
	if k == 0 {
		return svc
	}
	return svc + "-" + strconv.Itoa(k+1)
}

// frontendSliceIndex is k for frontendSliceName(svc, k) == name.
func frontendSliceIndex(svc, name string) (int, bool) {
	if name == svc {
		return 0, true
	}
	n, err := strconv.Atoi(strings.TrimPrefix(name, svc+"-"))
	if !strings.HasPrefix(name, svc+"-") || err != nil || n < 2 || frontendSliceName(svc, n-1) != name {
		return 0, false
	}
	return n - 1, true
}

// frontendSlices are svc's EndpointSlices: every node once, at most
// maxFrontendEndpoints a slice, on the bind ports; one slice with no
// endpoints when there are no nodes. have are the slices now, by name. A
// node stays in the slice that names it (with its address now); new
// nodes, by name, fill the slices with room, in order, before a new slice
// (the lowest free name) is made; a slice left empty goes. So a node that
// comes or goes rewrites one slice, not every slice after its place in a
// sorted list.
func frontendSlices(svc *corev1.Service, nodes []nodeAddress, have map[string]*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	ip := make(map[string]string, len(nodes))
	for _, n := range nodes {
		ip[n.Name] = n.IP
	}
	type slot struct {
		k     int
		nodes []nodeAddress
	}
	type current struct {
		k  int
		es *discoveryv1.EndpointSlice
	}
	var cur []current
	for name, es := range have {
		if k, ok := frontendSliceIndex(svc.Name, name); ok {
			cur = append(cur, current{k, es})
		}
	}
	slices.SortFunc(cur, func(a, b current) int { return a.k - b.k })
	placed := map[string]bool{}
	used := map[int]bool{}
	var out []*slot
	for _, c := range cur {
		s := &slot{k: c.k}
		for _, e := range c.es.Endpoints {
			if e.NodeName == nil || placed[*e.NodeName] || len(s.nodes) == maxFrontendEndpoints {
				continue
			}
			if a, ok := ip[*e.NodeName]; ok {
				s.nodes = append(s.nodes, nodeAddress{*e.NodeName, a})
				placed[*e.NodeName] = true
			}
		}
		if len(s.nodes) > 0 {
			out = append(out, s)
			used[s.k] = true
		}
	}
	open, free := 0, 0 // the first slice that may have room; the lowest k to try for a new one
	for _, n := range nodes {
		if placed[n.Name] {
			continue
		}
		for open < len(out) && len(out[open].nodes) >= maxFrontendEndpoints {
			open++
		}
		if open == len(out) {
			for used[free] {
				free++
			}
			used[free] = true
			out = append(out, &slot{k: free})
		}
		out[open].nodes = append(out[open].nodes, n)
	}
	if len(out) == 0 {
		out = append(out, &slot{k: 0})
	}
	slices.SortFunc(out, func(a, b *slot) int { return a.k - b.k })
	es := make([]*discoveryv1.EndpointSlice, len(out))
	for i, s := range out {
		slices.SortFunc(s.nodes, func(a, b nodeAddress) int { return strings.Compare(a.Name, b.Name) })
		es[i] = frontendSlice(svc, frontendSliceName(svc.Name, s.k), s.nodes)
	}
	return es
}

// frontendSlice is svc's EndpointSlice name for nodes, on the bind ports.
func frontendSlice(svc *corev1.Service, name string, nodes []nodeAddress) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace,
			Name:      name,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   SliceManagedBy,
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range svc.Spec.Ports {
		name, proto, port := p.Name, p.Protocol, p.TargetPort.IntVal
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	ready := true
	for _, n := range nodes {
		node := n.Name
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{n.IP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
			NodeName:   &node,
		})
	}
	return es
}
