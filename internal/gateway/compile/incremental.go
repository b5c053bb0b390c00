package compile

// Incremental. At 10,000 routes a full Compile costs tens of milliseconds
// (attaching every route, filing every rule, sorting every host), which
// is what a one-route change took to go live. Incremental keeps the
// state of its last full compile (the compiler: indexes, Gateways and
// listeners with their decisions) plus, per route, what attaching it did
// (the hosts it filed rules under, the listeners it counted), so a change
// to a few routes is: undo the old versions' counts, compile and attach
// the new versions with their rules going to a delta, rebuild only the
// touched Hosts (each: the rules it had, minus the changed routes', plus
// the delta) in a copy of their Port (table.Port.Clone: the table the
// proxy serves is never written), and finish the Gateway statuses again
// from the listeners' counts.
//
// That is only right while everything but routes is what the last full
// compile saw: a change to any other kind of object (Gateway, class,
// Service, EndpointSlice, Secret, ReferenceGrant, Namespace, Ingress, a
// bind or address) must go through Compile. A route that changes its
// parentRefs or hostnames is fine: its record says where its old version
// was. One known difference: an HTTPRoute and a GRPCRoute with the same
// namespace/name and creation time on one hostname tie in the table's
// sort, and their relative order may then differ from a full Compile's.
//
// Routes does not record its route compilations in the package memo (the
// next full Compile compiles those few routes again).

import (
	"cmp"
	"maps"
	"slices"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// RouteKey names an HTTPRoute or GRPCRoute (Kind "HTTPRoute" or
// "GRPCRoute").
type RouteKey struct {
	Kind            gwv1.Kind
	Namespace, Name string
}

// routeRec is what attaching one route did.
type routeRec struct {
	counted []*listener
	filed   []hostRef
}

// Incremental compiles a whole Input once (Compile) and then only the
// routes that changed (Routes). Its outputs are equal to Compile's of the
// same Input. Not safe for concurrent use; the Outputs it returns are
// never modified afterwards (they share maps and Hosts with each other).
type Incremental struct {
	c        *compiler
	out      *Output
	reserved map[hostRef]bool // listener hostnames: their Host stays, even empty
	used     atomic.Pointer[serviceSet]
}

// Uses reports whether a backend of the last Compile or Routes names the
// Service namespace/name (resolved or not), or whether nothing was
// compiled yet: a change to any other Service or its EndpointSlices
// changes nothing in the output. Safe to call while a compile runs; a
// Service a running compile adds may be reported only once it returns.
func (x *Incremental) Uses(namespace, name string) bool {
	u := x.used.Load()
	return u == nil || u.has(types.NamespacedName{Namespace: namespace, Name: name})
}

// Compile is a full Compile that keeps its state for Routes.
func (x *Incremental) Compile(in *Input) *Output {
	c := newCompiler(in)
	c.recs = map[RouteKey]*routeRec{}
	out := compileAll(c)
	x.c, x.out = c, out
	x.used.Store(c.used)
	x.reserved = map[hostRef]bool{}
	for _, g := range c.gwOrder {
		for _, l := range g.listeners {
			if l.bind != 0 && l.hostname != "" {
				x.reserved[hostRef{l.bind, canonicalHost(l.hostname)}] = true
			}
		}
	}
	return out
}

// Ready reports whether Routes can work from a previous Compile.
func (x *Incremental) Ready() bool { return x.c != nil }

// Routes recompiles the routes named in changed, where nothing but those
// routes changed since the previous Compile or Routes: get returns each
// one's current object (*gwv1.HTTPRoute or *gwv1.GRPCRoute), nil for one
// that is gone. Its cost does not grow with the number of routes beyond
// copying maps (the Output's route statuses, the hostnames of the ports
// it touches). It returns nil before the first Compile.
func (x *Incremental) Routes(changed []RouteKey, get func(RouteKey) any) *Output {
	if x.c == nil {
		return nil
	}
	c, old := x.c, x.out
	out := &Output{
		Table:          &table.Table{Ports: maps.Clone(old.Table.Ports)},
		GatewayClasses: old.GatewayClasses,
		Gateways:       make(map[types.NamespacedName]gwv1.GatewayStatus, len(old.Gateways)),
		HTTPRoutes:     maps.Clone(old.HTTPRoutes),
		GRPCRoutes:     maps.Clone(old.GRPCRoutes),
		Ingresses:      old.Ingresses,
	}
	c.out = out
	keys := slices.SortedFunc(slices.Values(changed), compareRouteKeys)
	keys = slices.Compact(keys)

	// Undo the old versions: their counts now, their rules when the
	// hosts they were filed under are rebuilt.
	touched := map[hostRef]bool{}
	gone := make(map[string]bool, len(keys)) // Action.Route of the changed routes
	for _, k := range keys {
		if rec := c.recs[k]; rec != nil {
			for _, l := range rec.counted {
				l.attached--
			}
			for _, f := range rec.filed {
				touched[f] = true
			}
			delete(c.recs, k)
		}
		gone[string(k.Kind)+"/"+k.Namespace+"/"+k.Name] = true
	}

	// The new versions.
	c.delta = map[hostRef][]*table.Rule{}
	defer func() { c.delta = nil }()
	// Route compilation may resolve Service ports the full compile did
	// not; they are cached in c.ports, and the package memo (published by
	// the last Compile) is only read.
	c.memo.prevPorts, c.memo.prevRoutes = c.memo.ports, c.memo.routes
	c.memo.ports, c.memo.routes = map[svcPort]*portMemo{}, map[any]*routeMemo{}
	r := &route{}
	for _, k := range keys {
		o := get(k)
		if k.Kind == "HTTPRoute" {
			hr, _ := o.(*gwv1.HTTPRoute)
			recompile(c, r, k, hr, out.HTTPRoutes, httpSpec, c.httpRules, func(ps []gwv1.RouteParentStatus) gwv1.HTTPRouteStatus {
				return gwv1.HTTPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: ps}}
			})
		} else {
			gr, _ := o.(*gwv1.GRPCRoute)
			recompile(c, r, k, gr, out.GRPCRoutes, grpcSpec, c.grpcRules, func(ps []gwv1.RouteParentStatus) gwv1.GRPCRouteStatus {
				return gwv1.GRPCRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: ps}}
			})
		}
	}
	for f := range c.delta {
		touched[f] = true
	}

	// Rebuild the touched hosts in copies of their ports.
	cloned := map[int32]bool{}
	for _, f := range slices.SortedFunc(maps.Keys(touched), compareHostRefs) {
		p := out.Table.Ports[f.bind]
		if p == nil {
			continue
		}
		if !cloned[f.bind] {
			p = p.Clone()
			out.Table.Ports[f.bind] = p
			cloned[f.bind] = true
		}
		var rules []*table.Rule
		if h := p.Hosted(f.host); h != nil {
			rules = make([]*table.Rule, 0, len(h.Rules)+len(c.delta[f]))
			for _, rl := range h.Rules {
				if rl.Action == nil || !gone[rl.Action.Route] {
					rules = append(rules, rl)
				}
			}
		}
		rules = append(rules, c.delta[f]...)
		if len(rules) == 0 && !x.reserved[f] {
			p.Remove(f.host)
			continue
		}
		p.Replace(f.host, rules)
	}
	c.finishGateways()
	x.out = out
	return out
}

// recompile compiles and attaches route k's new version o into statuses,
// or drops its status when it is gone (o nil).
func recompile[T comparable, S any](c *compiler, r *route, k RouteKey, o T, statuses map[types.NamespacedName]S,
	spec func(T) (*metav1.ObjectMeta, *gwv1.CommonRouteSpec, []gwv1.Hostname), rules func(*route, T),
	status func([]gwv1.RouteParentStatus) S) {
	var none T
	if o == none {
		delete(statuses, nn(k.Namespace, k.Name))
		return
	}
	statuses[nn(k.Namespace, k.Name)] = status(compileRoute(c, r, o, k.Kind, spec, rules))
}

// RoutesIn is a get for Routes that reads the routes of in.
func RoutesIn(in *Input) func(RouteKey) any {
	m := make(map[RouteKey]any, len(in.HTTPRoutes)+len(in.GRPCRoutes))
	for _, o := range in.HTTPRoutes {
		m[RouteKey{"HTTPRoute", o.Namespace, o.Name}] = o
	}
	for _, o := range in.GRPCRoutes {
		m[RouteKey{"GRPCRoute", o.Namespace, o.Name}] = o
	}
	return func(k RouteKey) any { return m[k] }
}

func compareRouteKeys(a, b RouteKey) int {
	return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

func compareHostRefs(a, b hostRef) int {
	return cmp.Or(cmp.Compare(a.bind, b.bind), cmp.Compare(a.host, b.host))
}
