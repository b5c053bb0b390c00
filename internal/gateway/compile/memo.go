package compile

import (
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// Memo. Compile runs on every change, and most of its work is turning
// each route's rules into table Rules, Actions and Backends, which depends
// only on the route itself, the Service ports it names (with their
// EndpointSlices) and the ReferenceGrants. So the previous Compile's
// results are kept, and a route whose object and dependencies are the very
// same (pointer and resourceVersion, as informers hand them out) gets its
// rules back instead of compiling them again: a one-route change costs the
// attachment pass and the table build, not 10,000 rule compilations. The
// Rules carried over are exactly those the live table holds; the table
// allows that (Finish only writes a Rule's match where it changes), and
// their balancers keep their rotation across the swap.
//
// Objects with no resourceVersion (built by hand, as in tests) are never
// memoized, so mutating one in place and compiling again is safe. The memo
// cannot change an output: a hit returns what compiling would, by value.
var memo struct {
	mu     sync.Mutex // protects the maps (replaced whole by each Compile)
	ports  map[svcPort]*portMemo
	routes map[any]*routeMemo // by the route object (a pointer)
}

// portMemo is a resolved Service port and what it was resolved from.
type portMemo struct {
	svc    *corev1.Service
	svcRV  string
	slices []*discoveryv1.EndpointSlice
	rvs    []string
	info   *servicePortInfo
}

// routeMemo is a route's compiled rules and what they were compiled from.
type routeMemo struct {
	rv     string
	grants string
	rules  compiledRules
}

// compiledRules is what compiling a route's rules gives, memoized whole.
type compiledRules struct {
	rules []*table.Rule
	// Rules with a value flatnet does not support are dropped (the spec's
	// "Drop Rule" way): with every rule dropped the route is not
	// accepted, with some it is PartiallyInvalid. notAccepted is the first
	// reason (RouteReasonUnsupportedValue, IncompatibleFilters).
	notAccepted, notAcceptedMsg string
	rulesTotal, rulesBad        int
	dropped                     []string
	// unresolved is the first reason a reference does not resolve.
	unresolved, unresolvedMsg string
	// deps are the Service ports the rules name.
	deps []*servicePortInfo
}

// clone copies the slices, which the route value reuses.
func (cr *compiledRules) clone() compiledRules {
	out := *cr
	out.rules = slices.Clone(cr.rules)
	out.dropped = slices.Clone(cr.dropped)
	out.deps = slices.Clone(cr.deps)
	return out
}

// memoState is one Compile's view of the memo: what the previous Compile
// left and what this one leaves.
type memoState struct {
	prevPorts  map[svcPort]*portMemo
	prevRoutes map[any]*routeMemo
	ports      map[svcPort]*portMemo
	routes     map[any]*routeMemo
	grants     string // ReferenceGrants' identity; "" when one has no resourceVersion
	grantsOK   bool
}

func (c *compiler) loadMemo() {
	memo.mu.Lock()
	c.memo.prevPorts, c.memo.prevRoutes = memo.ports, memo.routes
	memo.mu.Unlock()
	c.memo.ports = make(map[svcPort]*portMemo, len(c.memo.prevPorts))
	c.memo.routes = make(map[any]*routeMemo, len(c.in.HTTPRoutes)+len(c.in.GRPCRoutes))
	var sb strings.Builder
	c.memo.grantsOK = true
	for _, g := range sortedByKey(c.in.ReferenceGrants, func(g *gwv1.ReferenceGrant) *metav1.ObjectMeta { return &g.ObjectMeta }) {
		if g.ResourceVersion == "" {
			c.memo.grantsOK = false
		}
		sb.WriteString(g.Namespace + "/" + g.Name + "@" + g.ResourceVersion + ";")
	}
	c.memo.grants = sb.String()
}

func (c *compiler) saveMemo() {
	memo.mu.Lock()
	memo.ports, memo.routes = c.memo.ports, c.memo.routes
	memo.mu.Unlock()
}

// memoPort returns the previous Compile's resolution of a Service port when
// its Service and EndpointSlices are the same objects, and records it (or
// a new one, by resolve) for the next Compile.
func (c *compiler) memoPort(k svcPort, resolve func() *servicePortInfo) *servicePortInfo {
	svc := c.services[nn(k.namespace, k.name)]
	var sl []*discoveryv1.EndpointSlice
	if svc != nil {
		sl = c.slices[nn(k.namespace, k.name)]
	}
	if pm := c.memo.prevPorts[k]; pm != nil && pm.same(svc, sl) {
		c.memo.ports[k] = pm
		return pm.info
	}
	info := resolve()
	if svc != nil && svc.ResourceVersion == "" {
		return info
	}
	pm := &portMemo{svc: svc, slices: sl, info: info}
	if svc != nil {
		pm.svcRV = svc.ResourceVersion
	}
	for _, s := range sl {
		if s.ResourceVersion == "" {
			return info
		}
		pm.rvs = append(pm.rvs, s.ResourceVersion)
	}
	c.memo.ports[k] = pm
	return info
}

func (pm *portMemo) same(svc *corev1.Service, sl []*discoveryv1.EndpointSlice) bool {
	if pm.svc != svc || svc != nil && svc.ResourceVersion != pm.svcRV || len(sl) != len(pm.slices) {
		return false
	}
	for i, s := range sl {
		if s != pm.slices[i] || s.ResourceVersion != pm.rvs[i] {
			return false
		}
	}
	return true
}

// memoRoute fills r's rules from the previous Compile when the route and
// everything its rules depend on are unchanged; it reports whether it did.
func (c *compiler) memoRoute(r *route, obj any, rv string) bool {
	if rv == "" || !c.memo.grantsOK {
		return false
	}
	rm := c.memo.prevRoutes[obj]
	if rm == nil || rm.rv != rv || rm.grants != c.memo.grants {
		return false
	}
	for _, d := range rm.rules.deps {
		if c.servicePort(d.key.namespace, d.key.name, d.key.port) != d {
			return false
		}
	}
	c.memo.routes[obj] = rm
	rules, dropped := r.rules[:0], r.dropped[:0]
	r.compiledRules = rm.rules
	r.rules = append(rules, rm.rules.rules...)
	r.dropped = append(dropped, rm.rules.dropped...)
	return true
}

// keepRoute records r's freshly compiled rules for the next Compile.
func (c *compiler) keepRoute(r *route, obj any, rv string) {
	if rv == "" || !c.memo.grantsOK {
		return
	}
	c.memo.routes[obj] = &routeMemo{rv: rv, grants: c.memo.grants, rules: r.compiledRules.clone()}
}
