package compile

import (
	"net/textproto"
	"regexp"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

func (c *compiler) httpRoutes() {
	compileRoutes(c, c.in.HTTPRoutes, "HTTPRoute", httpSpec, c.httpRules, func(hr *gwv1.HTTPRoute, parents []gwv1.RouteParentStatus) {
		c.out.HTTPRoutes[nn(hr.Namespace, hr.Name)] = gwv1.HTTPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
	})
}

func httpSpec(hr *gwv1.HTTPRoute) (*metav1.ObjectMeta, *gwv1.CommonRouteSpec, []gwv1.Hostname) {
	return &hr.ObjectMeta, &hr.Spec.CommonRouteSpec, hr.Spec.Hostnames
}

// compileRoutes compiles the routes of one kind: the rules of those with a
// parent of ours, then their attachments. Input order does not matter
// (so routes are not sorted: that was a tenth of a 10,000-route Compile):
// each route's status depends on it alone, the attachment counts are sums,
// and the table's Finish orders every host's rules by keys that tell any
// two rules apart (creation, namespace/name, rule and match index).
func compileRoutes[T any](c *compiler, objs []T, kind gwv1.Kind,
	spec func(T) (*metav1.ObjectMeta, *gwv1.CommonRouteSpec, []gwv1.Hostname),
	rules func(*route, T), status func(T, []gwv1.RouteParentStatus)) {
	r := &route{}
	for _, o := range objs {
		status(o, compileRoute(c, r, o, kind, spec, rules))
	}
}

// compileRoute compiles one route (reusing r's memory) and attaches it;
// when the compiler keeps records (Incremental), what it filed and counted
// is recorded under the route's key.
func compileRoute[T any](c *compiler, r *route, o T, kind gwv1.Kind,
	spec func(T) (*metav1.ObjectMeta, *gwv1.CommonRouteSpec, []gwv1.Hostname),
	rules func(*route, T)) []gwv1.RouteParentStatus {
	meta, common, hostnames := spec(o)
	r.reset(kind, meta, hostnames, common.ParentRefs)
	if c.hasOurParent(r) && !c.memoRoute(r, o, meta.ResourceVersion) {
		rules(r, o)
		c.keepRoute(r, o, meta.ResourceVersion)
	}
	if c.recs == nil {
		return c.attach(r)
	}
	c.rec = &routeRec{}
	parents := c.attach(r)
	if len(c.rec.counted) > 0 || len(c.rec.filed) > 0 {
		c.recs[RouteKey{Kind: kind, Namespace: meta.Namespace, Name: meta.Name}] = c.rec
	}
	c.rec = nil
	return parents
}

// hasOurParent reports whether any parentRef names one of our Gateways, so
// routes of other controllers cost no rule compilation.
func (c *compiler) hasOurParent(r *route) bool {
	for _, ref := range r.parentRefs {
		ns := r.namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		if c.gateway(ns, string(ref.Name)) != nil {
			return true
		}
	}
	return false
}

func (c *compiler) httpRules(r *route, hr *gwv1.HTTPRoute) {
	r.names()
	for i := range hr.Spec.Rules {
		rule := &hr.Spec.Rules[i]
		r.startRule(i)
		a := &table.Action{Route: r.kindName, RuleName: ruleName(rule.Name, i)}
		for _, f := range rule.Filters {
			c.httpFilter(r, a, &f)
		}
		if a.Redirect != nil && a.Rewrite != nil {
			r.reject(gwv1.RouteReasonIncompatibleFilters, "RequestRedirect and URLRewrite cannot be combined")
		}
		if a.Redirect == nil {
			c.backends(r, a, rule.BackendRefs, false)
		}
		if t := rule.Timeouts; t != nil {
			a.Timeout = parseDuration(r, t.Request, "timeouts.request")
			a.BackendTimeout = parseDuration(r, t.BackendRequest, "timeouts.backendRequest")
		}
		if rt := rule.Retry; rt != nil {
			a.Retry = &table.Retry{Attempts: 1}
			for _, code := range rt.Codes {
				a.Retry.Codes = append(a.Retry.Codes, int(code))
			}
			if rt.Attempts != nil {
				a.Retry.Attempts = *rt.Attempts
			}
			a.Retry.Backoff = parseDuration(r, rt.Backoff, "retry.backoff")
		}
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []gwv1.HTTPRouteMatch{{}}
		}
		slab := make([]table.Rule, len(matches)) // one allocation for the rule's matches
		rules := make([]*table.Rule, 0, len(matches))
		for j := range matches {
			m, ok := httpMatch(r, &matches[j])
			if !ok {
				continue
			}
			slab[j] = table.Rule{Match: m, Action: withPrefix(a, m.Path),
				Created: hr.CreationTimestamp.Time, RouteKey: r.key(), RuleIndex: i, MatchIndex: j}
			rules = append(rules, &slab[j])
		}
		r.endRule(a.RuleName, rules)
	}
}

func ruleName(name *gwv1.SectionName, i int) string {
	if name != nil && *name != "" {
		return string(*name)
	}
	return strconv.Itoa(i)
}

// withPrefix gives a rule whose redirect or rewrite replaces the matched
// prefix its own copy of the action, holding that prefix.
func withPrefix(a *table.Action, path table.PathMatch) *table.Action {
	needs := func(p *table.PathModifier) bool { return p != nil && !p.FullSet }
	rd := a.Redirect != nil && needs(a.Redirect.Path)
	rw := a.Rewrite != nil && needs(a.Rewrite.Path)
	if !rd && !rw {
		return a
	}
	prefixed := func(pm *table.PathModifier) *table.PathModifier {
		cp := *pm
		cp.Prefix = path.Value
		return &cp
	}
	cp := *a
	if rd {
		x := *a.Redirect
		x.Path = prefixed(x.Path)
		cp.Redirect = &x
	}
	if rw {
		x := *a.Rewrite
		x.Path = prefixed(x.Path)
		cp.Rewrite = &x
	}
	return &cp
}

func httpMatch(r *route, m *gwv1.HTTPRouteMatch) (table.Match, bool) {
	out := table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: "/"}}
	if p := m.Path; p != nil {
		if p.Value != nil {
			out.Path.Value = *p.Value
		}
		t := gwv1.PathMatchPathPrefix
		if p.Type != nil {
			t = *p.Type
		}
		switch t {
		case gwv1.PathMatchExact:
			out.Path.Type = table.PathExact
		case gwv1.PathMatchPathPrefix:
		case gwv1.PathMatchRegularExpression:
			out.Path.Type = table.PathRegex
			re, ok := compileRegexp(r, out.Path.Value, "path")
			if !ok {
				return out, false
			}
			out.Path.Regexp = re
		default:
			r.reject(gwv1.RouteReasonUnsupportedValue, "path match type %q is not supported", t)
			return out, false
		}
	}
	if m.Method != nil {
		out.Method = string(*m.Method)
	}
	for _, h := range m.Headers {
		regex := h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression
		vm, ok := valueMatch(r, textproto.CanonicalMIMEHeaderKey(string(h.Name)), h.Value, regex)
		if !ok {
			return out, false
		}
		out.Headers = append(out.Headers, vm)
	}
	for _, q := range m.QueryParams {
		regex := q.Type != nil && *q.Type == gwv1.QueryParamMatchRegularExpression
		vm, ok := valueMatch(r, string(q.Name), q.Value, regex)
		if !ok {
			return out, false
		}
		out.Query = append(out.Query, vm)
	}
	return out, true
}

func valueMatch(r *route, name, value string, regex bool) (table.ValueMatch, bool) {
	vm := table.ValueMatch{Name: name, Value: value}
	if regex {
		re, ok := compileRegexp(r, value, name)
		if !ok {
			return vm, false
		}
		vm.Regexp = re
	}
	return vm, true
}

// compileRegexp anchors a RegularExpression match: it must match the whole
// value, as Envoy-based implementations do.
func compileRegexp(r *route, expr, what string) (*regexp.Regexp, bool) {
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		r.reject(gwv1.RouteReasonUnsupportedValue, "%s regular expression %q: %v", what, expr, err)
		return nil, false
	}
	return re, true
}

func (c *compiler) httpFilter(r *route, a *table.Action, f *gwv1.HTTPRouteFilter) {
	switch f.Type {
	case gwv1.HTTPRouteFilterRequestHeaderModifier:
		if f.RequestHeaderModifier != nil {
			a.RequestHeaders = headerFilter(f.RequestHeaderModifier)
		}
	case gwv1.HTTPRouteFilterResponseHeaderModifier:
		if f.ResponseHeaderModifier != nil {
			a.ResponseHeaders = headerFilter(f.ResponseHeaderModifier)
		}
	case gwv1.HTTPRouteFilterRequestRedirect:
		if rr := f.RequestRedirect; rr != nil {
			rd := &table.Redirect{StatusCode: 302, Path: pathModifier(r, rr.Path)}
			if rr.Scheme != nil {
				rd.Scheme = *rr.Scheme
			}
			if rr.Hostname != nil {
				rd.Hostname = string(*rr.Hostname)
			}
			if rr.Port != nil {
				rd.Port = int32(*rr.Port)
			}
			if rr.StatusCode != nil {
				rd.StatusCode = *rr.StatusCode
			}
			a.Redirect = rd
		}
	case gwv1.HTTPRouteFilterURLRewrite:
		if rw := f.URLRewrite; rw != nil {
			a.Rewrite = &table.Rewrite{Path: pathModifier(r, rw.Path)}
			if rw.Hostname != nil {
				a.Rewrite.Hostname = string(*rw.Hostname)
			}
		}
	case gwv1.HTTPRouteFilterRequestMirror:
		if m := f.RequestMirror; m != nil {
			c.mirror(r, a, m)
		}
	default:
		r.reject(gwv1.RouteReasonUnsupportedValue, "filter type %q is not supported", f.Type)
	}
}

func pathModifier(r *route, p *gwv1.HTTPPathModifier) *table.PathModifier {
	if p == nil {
		return nil
	}
	switch p.Type {
	case gwv1.FullPathHTTPPathModifier:
		pm := &table.PathModifier{FullSet: true}
		if p.ReplaceFullPath != nil {
			pm.Full = *p.ReplaceFullPath
		}
		return pm
	case gwv1.PrefixMatchHTTPPathModifier:
		pm := &table.PathModifier{}
		if p.ReplacePrefixMatch != nil {
			pm.ReplacePrefix = *p.ReplacePrefixMatch
		}
		return pm
	}
	r.reject(gwv1.RouteReasonUnsupportedValue, "path modifier type %q is not supported", p.Type)
	return nil
}

func headerFilter(f *gwv1.HTTPHeaderFilter) table.HeaderFilter {
	var out table.HeaderFilter
	for _, h := range f.Set {
		out.Set = append(out.Set, table.Header{Name: textproto.CanonicalMIMEHeaderKey(string(h.Name)), Value: h.Value})
	}
	for _, h := range f.Add {
		out.Add = append(out.Add, table.Header{Name: textproto.CanonicalMIMEHeaderKey(string(h.Name)), Value: h.Value})
	}
	for _, n := range f.Remove {
		out.Remove = append(out.Remove, textproto.CanonicalMIMEHeaderKey(n))
	}
	return out
}

// parseDuration reads a Gateway API duration (GEP-2257, a subset of Go's).
func parseDuration(r *route, d *gwv1.Duration, what string) time.Duration {
	if d == nil {
		return 0
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil || v < 0 {
		r.reject(gwv1.RouteReasonUnsupportedValue, "%s %q is not a duration", what, *d)
		return 0
	}
	return v
}
