package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// IngressClassName is the IngressClass flatnet serves even when the input
// lacks the object (the lab and the manifest create it).
const IngressClassName = "flatnet"

const (
	annotationIngressClass   = "kubernetes.io/ingress.class"
	annotationDefaultIngress = networkingv1.AnnotationIsDefaultIngressClass
)

// defaultBackendTime sorts a defaultBackend rule after every rule of the
// same path ("/" prefix) on a host.
var defaultBackendTime = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// ingresses compiles every Ingress of our class into one HTTP and one HTTPS
// port. Ingress has no notion of a conflict, so the oldest Ingress wins
// where two give the same host and path: its rule sorts first.
func (c *compiler) ingresses() {
	ours := map[string]bool{IngressClassName: true}
	deflt := false
	for _, ic := range c.in.IngressClasses {
		if ic.Spec.Controller == IngressController {
			ours[ic.Name] = true
			deflt = deflt || ic.Annotations[annotationDefaultIngress] == "true"
		} else if ic.Name == IngressClassName {
			ours[ic.Name] = false // the name is taken by another controller
		}
	}
	var ings []*networkingv1.Ingress
	for _, ing := range c.in.Ingresses {
		class, set := "", false
		if ing.Spec.IngressClassName != nil {
			class, set = *ing.Spec.IngressClassName, true
		} else if a, ok := ing.Annotations[annotationIngressClass]; ok {
			class, set = a, true
		}
		if set && ours[class] || !set && deflt {
			ings = append(ings, ing)
		}
	}
	if len(ings) == 0 {
		return
	}
	slices.SortFunc(ings, func(a, b *networkingv1.Ingress) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})

	type filed struct {
		host string
		rule *table.Rule
	}
	var rules []filed
	var certs []table.Cert
	var deflt0 *table.Rule
	hosts := map[string]bool{}
	for _, ing := range ings {
		key := ing.Namespace + "/" + ing.Name
		for i, r := range ing.Spec.Rules {
			host := strings.ToLower(r.Host)
			hosts[host] = true
			if r.HTTP == nil {
				continue
			}
			for j, p := range r.HTTP.Paths {
				m := table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: p.Path}}
				if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
					m.Path.Type = table.PathExact
				}
				if m.Path.Value == "" {
					m.Path.Value = "/"
				}
				a := c.ingressAction(ing, &p.Backend, fmt.Sprintf("%d.%d", i, j))
				rules = append(rules, filed{host, &table.Rule{Match: m, Action: a,
					Created: ing.CreationTimestamp.Time, RouteKey: key, RuleIndex: i, MatchIndex: j}})
			}
		}
		if ing.Spec.DefaultBackend != nil && deflt0 == nil {
			deflt0 = &table.Rule{Match: table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: "/"}},
				Action:  c.ingressAction(ing, ing.Spec.DefaultBackend, "default"),
				Created: defaultBackendTime, RouteKey: key}
		}
		for _, t := range ing.Spec.TLS {
			if t.SecretName == "" {
				continue
			}
			cert, err := c.certificate(nn(ing.Namespace, t.SecretName))
			if err != nil {
				continue // Ingress has no condition to say so; the host keeps another certificate
			}
			if len(t.Hosts) == 0 {
				certs = append(certs, table.Cert{Cert: cert})
			}
			for _, h := range t.Hosts {
				certs = append(certs, table.Cert{Hostname: strings.ToLower(h), Cert: cert})
			}
		}
	}
	if deflt0 != nil {
		// Every host falls back to the default backend, since a request
		// only sees the rules of the most specific host that matches.
		hosts[""] = true
		for h := range hosts {
			rules = append(rules, filed{h, deflt0})
		}
	}
	var ports []*table.Port
	if c.in.IngressHTTPBind != 0 {
		ports = append(ports, c.port(c.in.IngressHTTPBind, 80, table.HTTP, ""))
	}
	if c.in.IngressHTTPSBind != 0 && len(certs) > 0 {
		p := c.port(c.in.IngressHTTPSBind, 443, table.HTTPS, "")
		p.Certs = append(p.Certs, certs...)
		ports = append(ports, p)
	}
	for _, p := range ports {
		for _, f := range rules {
			p.Add(f.host, f.rule)
		}
	}

	var lb []networkingv1.IngressLoadBalancerIngress
	for _, a := range c.in.IngressAddresses {
		if _, err := netip.ParseAddr(a); err == nil {
			lb = append(lb, networkingv1.IngressLoadBalancerIngress{IP: a})
		} else {
			lb = append(lb, networkingv1.IngressLoadBalancerIngress{Hostname: a})
		}
	}
	for _, ing := range ings {
		c.out.Ingresses[nn(ing.Namespace, ing.Name)] = networkingv1.IngressStatus{
			LoadBalancer: networkingv1.IngressLoadBalancerStatus{Ingress: slices.Clone(lb)}}
	}
}

// ingressAction sends to one Service port of the Ingress's namespace; a
// backend that does not resolve answers 500.
func (c *compiler) ingressAction(ing *networkingv1.Ingress, be *networkingv1.IngressBackend, rule string) *table.Action {
	a := &table.Action{Route: "Ingress/" + ing.Namespace + "/" + ing.Name, RuleName: rule}
	b := &table.Backend{Weight: 1, Invalid: true}
	a.Backends = []*table.Backend{b}
	a.Balancer = table.NewWRR([]int32{1})
	if be.Service == nil {
		b.Name = ing.Namespace + "/resource"
		return a
	}
	port := be.Service.Port.Number
	if svc := c.services[nn(ing.Namespace, be.Service.Name)]; svc != nil && be.Service.Port.Name != "" {
		for _, p := range svc.Spec.Ports {
			if p.Name == be.Service.Port.Name {
				port = p.Port
			}
		}
	}
	sp := c.servicePort(ing.Namespace, be.Service.Name, port)
	b.Name = sp.name
	if sp.port != nil && sp.protoOK {
		b.Invalid = false
		b.Protocol = sp.proto
		b.Endpoints = sp.endpoints
	}
	return a
}
