package compile

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// route is what attachment needs of an HTTPRoute or GRPCRoute, with its
// rules already compiled.
type route struct {
	kind       gwv1.Kind
	namespace  string
	name       string
	nsName     string // namespace/name, set by names
	kindName   string // kind/namespace/name, for Action.Route
	generation int64
	hostnames  []string
	parentRefs []gwv1.ParentReference

	compiledRules
	ruleIndex int  // the rule being compiled
	ruleBad   bool // it has an unsupported value
}

// reject drops the rule being compiled.
func (r *route) reject(reason gwv1.RouteConditionReason, format string, args ...any) {
	r.ruleBad = true
	if r.notAccepted == "" {
		r.notAccepted = string(reason)
		r.notAcceptedMsg = fmt.Sprintf("rule %d: ", r.ruleIndex) + fmt.Sprintf(format, args...)
	}
}

// startRule begins compiling rule i.
func (r *route) startRule(i int) {
	r.ruleIndex, r.ruleBad = i, false
	r.rulesTotal++
}

// endRule keeps the rule's table rules unless it was rejected.
func (r *route) endRule(name string, rules []*table.Rule) {
	if r.ruleBad {
		r.rulesBad++
		r.dropped = append(r.dropped, name)
		return
	}
	r.rules = append(r.rules, rules...)
}

// acceptance is the Accepted condition a route's rules allow, and the
// PartiallyInvalid one when some rules were dropped.
func (r *route) acceptance() (metav1.Condition, *metav1.Condition) {
	if r.rulesBad == 0 {
		return cond(string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), "", r.generation), nil
	}
	if r.rulesBad == r.rulesTotal {
		return cond(string(gwv1.RouteConditionAccepted), false, r.notAccepted, r.notAcceptedMsg, r.generation), nil
	}
	partial := cond(string(gwv1.RouteConditionPartiallyInvalid), true, string(gwv1.RouteReasonUnsupportedValue),
		fmt.Sprintf("Dropped Rule(s) %s: %s", strings.Join(r.dropped, ", "), r.notAcceptedMsg), r.generation)
	return cond(string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), "", r.generation), &partial
}

func (r *route) unresolve(reason gwv1.RouteConditionReason, msg string) {
	if r.unresolved == "" {
		r.unresolved = string(reason)
		r.unresolvedMsg = msg
	}
}

func (r *route) key() string { return r.nsName }

// names sets kindName and nsName, which only compiling rules needs (a
// memoized route skips the allocation).
func (r *route) names() {
	r.kindName = string(r.kind) + "/" + r.namespace + "/" + r.name
	r.nsName = r.kindName[len(r.kind)+1:]
}

// hostRef names one hostname (canonical: lower case, no trailing dot)
// of one table Port by its bind, to file a route's rules there only once
// however many of its parentRefs lead to it; the incremental compiler
// records them per route.
type hostRef struct {
	bind int32
	host string
}

// attach resolves the route's parentRefs against our Gateways, files its
// rules into the table and returns its parents status entries.
func (c *compiler) attach(r *route) []gwv1.RouteParentStatus {
	var parents []gwv1.RouteParentStatus
	// A route has a parentRef or two: slices beat maps here.
	var counted []*listener
	var filed []hostRef
	for _, ref := range r.parentRefs {
		group, kind := gatewayGroup, "Gateway"
		if ref.Group != nil {
			group = string(*ref.Group)
		}
		if ref.Kind != nil {
			kind = string(*ref.Kind)
		}
		if group != gatewayGroup || kind != "Gateway" {
			continue
		}
		ns := r.namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		g := c.gateway(ns, string(ref.Name))
		if g == nil {
			continue // not ours, or not there: another controller's business
		}
		ps := gwv1.RouteParentStatus{ParentRef: ref, ControllerName: ControllerName}
		ps.ParentRef.Group = ptrTo(gwv1.Group(group))
		ps.ParentRef.Kind = ptrTo(gwv1.Kind(kind))

		accepted, partial := r.acceptance()
		var candidates, allowed []*listener
		type attachment struct {
			l     *listener
			hosts []string
		}
		var matched []attachment
		for _, l := range g.listeners {
			if ref.SectionName != nil && *ref.SectionName != l.spec.Name {
				continue
			}
			if ref.Port != nil && *ref.Port != l.spec.Port {
				continue
			}
			candidates = append(candidates, l)
			if !l.accepted || !c.allows(l, r.kind, r.namespace) {
				continue
			}
			allowed = append(allowed, l)
			if hosts := intersectHostnames(l.hostname, r.hostnames); hosts != nil {
				matched = append(matched, attachment{l, hosts})
			}
		}
		switch {
		case len(candidates) == 0:
			accepted = cond(string(gwv1.RouteConditionAccepted), false, string(gwv1.RouteReasonNoMatchingParent),
				"no listener of the Gateway matches the parentRef's sectionName and port", r.generation)
		case len(allowed) == 0:
			accepted = cond(string(gwv1.RouteConditionAccepted), false, string(gwv1.RouteReasonNotAllowedByListeners),
				fmt.Sprintf("no listener allows %s from namespace %s", r.kind, r.namespace), r.generation)
		case len(matched) == 0:
			accepted = cond(string(gwv1.RouteConditionAccepted), false, string(gwv1.RouteReasonNoMatchingListenerHostname),
				"no hostname of the route matches a listener's hostname", r.generation)
		case accepted.Status != metav1.ConditionTrue:
			// Every rule was dropped: nothing to attach.
		default:
			for _, a := range matched {
				if !slices.Contains(counted, a.l) {
					counted = append(counted, a.l)
					a.l.attached++
				}
				if a.l.bind == 0 {
					continue
				}
				for _, h := range a.hosts {
					ph := hostRef{a.l.bind, canonicalHost(h)}
					if slices.Contains(filed, ph) || hostOwner(a.l.gw, a.l.spec.Port, h) != a.l {
						continue
					}
					filed = append(filed, ph)
					c.file(ph, r.rules)
				}
			}
		}
		resolved := cond(string(gwv1.RouteConditionResolvedRefs), true, string(gwv1.RouteReasonResolvedRefs), "", r.generation)
		if r.unresolved != "" {
			resolved = cond(string(gwv1.RouteConditionResolvedRefs), false, r.unresolved, r.unresolvedMsg, r.generation)
		}
		ps.Conditions = []metav1.Condition{accepted, resolved}
		if partial != nil && accepted.Status == metav1.ConditionTrue {
			ps.Conditions = append(ps.Conditions, *partial)
		}
		parents = append(parents, ps)
	}
	if c.rec != nil {
		c.rec.counted, c.rec.filed = counted, filed
	}
	return parents
}

// file adds a route's rules under one hostname of a port: straight into
// the Port being built, or, in an incremental update, into the delta of
// the hosts to rebuild.
func (c *compiler) file(ph hostRef, rules []*table.Rule) {
	if c.delta != nil {
		c.delta[ph] = append(c.delta[ph], rules...)
		return
	}
	p := c.out.Table.Ports[ph.bind]
	for _, rule := range rules {
		p.Add(ph.host, rule)
	}
}

// canonicalHost is a hostname as the table files it.
func canonicalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// hostOwner is the listener that requests for hostname h (a name, a
// wildcard standing for the names under it, or "" for any) reach on a port
// of a Gateway: the one with the most specific hostname that covers h. A
// route's rules go under h only through that listener, which is how one
// table lookup by host keeps listeners isolated (GatewayHTTPListenerIsolation):
// a route on the catch-all listener with hostname a.example.com is not
// served when a listener *.example.com shares the port.
func hostOwner(g *gateway, port gwv1.PortNumber, h string) *listener {
	var best *listener
	rank := func(l *listener) (int, int) {
		switch {
		case l.hostname == "":
			return 0, 0
		case strings.HasPrefix(l.hostname, "*."):
			return 1, len(l.hostname)
		}
		return 2, 0
	}
	for _, l := range g.listeners {
		if !l.accepted || l.spec.Port != port {
			continue
		}
		if l.hostname != "" && l.hostname != h && !hostnameCovers(l.hostname, h) {
			continue
		}
		if best == nil {
			best = l
			continue
		}
		r1, n1 := rank(l)
		r2, n2 := rank(best)
		if r1 > r2 || r1 == r2 && n1 > n2 {
			best = l
		}
	}
	return best
}

// reserveListenerHosts gives every listener hostname a Host on its port,
// even with no rules: a request for that name belongs to that listener
// and must not fall through to a wider hostname's rules. It runs after
// every Add and before Finish.
func (c *compiler) reserveListenerHosts() {
	for _, g := range c.gwOrder {
		for _, l := range g.listeners {
			p := c.out.Table.Ports[l.bind]
			if l.bind == 0 || l.hostname == "" || p == nil {
				continue
			}
			if strings.HasPrefix(l.hostname, "*.") {
				if !slices.ContainsFunc(p.Wildcards, func(h *table.Host) bool { return h.Name == l.hostname }) {
					p.Wildcards = append(p.Wildcards, &table.Host{Name: l.hostname})
				}
			} else if p.Exact[l.hostname] == nil {
				p.Exact[l.hostname] = &table.Host{Name: l.hostname}
			}
		}
	}
}

// intersectHostnames returns the hostnames a route answers on a listener:
// nil when they share none, [""] when neither names one.
func intersectHostnames(listener string, route []string) []string {
	if len(route) == 0 {
		return []string{listener}
	}
	if listener == "" {
		return route
	}
	var out []string
	for _, h := range route {
		switch {
		case h == listener:
			out = append(out, h)
		case hostnameCovers(listener, h):
			out = append(out, h)
		case hostnameCovers(h, listener):
			out = append(out, listener)
		}
	}
	if len(out) > 1 {
		slices.Sort(out)
		out = slices.Compact(out)
	}
	return out
}

// hostnameCovers reports whether wildcard pattern w ("*.example.com")
// matches h, an exact name or a narrower wildcard; the wildcard stands for
// one or more labels, as the Gateway API says.
func hostnameCovers(w, h string) bool {
	if !strings.HasPrefix(w, "*.") {
		return false
	}
	suffix := w[1:] // ".example.com"
	return len(h) > len(suffix) && strings.HasSuffix(h, suffix) && h != w
}

// reset makes r the route of meta, keeping its slices' memory: one route
// value serves a whole Compile (its rules live on in the table's hosts,
// not in r).
func (r *route) reset(kind gwv1.Kind, meta *metav1.ObjectMeta, hostnames []gwv1.Hostname, refs []gwv1.ParentReference) {
	*r = route{kind: kind, namespace: meta.Namespace, name: meta.Name, generation: meta.Generation, parentRefs: refs,
		hostnames: r.hostnames[:0], compiledRules: compiledRules{rules: r.rules[:0], dropped: r.dropped[:0], deps: r.deps[:0]}}
	for _, h := range hostnames {
		r.hostnames = append(r.hostnames, strings.ToLower(string(h)))
	}
}

// sortedByKey returns objs in namespace/name order.
func sortedByKey[T any](objs []T, meta func(T) *metav1.ObjectMeta) []T {
	type keyed struct {
		ns, name string
		o        T
	}
	ks := make([]keyed, len(objs))
	for i, o := range objs {
		m := meta(o)
		ks[i] = keyed{m.Namespace, m.Name, o}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name))
	})
	out := make([]T, len(objs))
	for i := range ks {
		out[i] = ks[i].o
	}
	return out
}
