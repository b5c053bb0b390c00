package compile

import (
	"net/textproto"
	"regexp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

func (c *compiler) grpcRoutes() {
	compileRoutes(c, c.in.GRPCRoutes, "GRPCRoute", grpcSpec, c.grpcRules, func(gr *gwv1.GRPCRoute, parents []gwv1.RouteParentStatus) {
		c.out.GRPCRoutes[nn(gr.Namespace, gr.Name)] = gwv1.GRPCRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
	})
}

func grpcSpec(gr *gwv1.GRPCRoute) (*metav1.ObjectMeta, *gwv1.CommonRouteSpec, []gwv1.Hostname) {
	return &gr.ObjectMeta, &gr.Spec.CommonRouteSpec, gr.Spec.Hostnames
}

// httpFilters gives GRPCRoute filters the shape of the HTTPRoute ones they
// share (header modifiers, mirror, extensionRef).
func httpFilters(fs []gwv1.GRPCRouteFilter) []gwv1.HTTPRouteFilter {
	out := make([]gwv1.HTTPRouteFilter, 0, len(fs))
	for _, f := range fs {
		out = append(out, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterType(f.Type),
			RequestHeaderModifier: f.RequestHeaderModifier, ResponseHeaderModifier: f.ResponseHeaderModifier,
			RequestMirror: f.RequestMirror, ExtensionRef: f.ExtensionRef})
	}
	return out
}

func (c *compiler) grpcRules(r *route, gr *gwv1.GRPCRoute) {
	r.names()
	for i := range gr.Spec.Rules {
		rule := &gr.Spec.Rules[i]
		r.startRule(i)
		a := &table.Action{Route: r.kindName, RuleName: ruleName(rule.Name, i), GRPC: true}
		for _, f := range httpFilters(rule.Filters) {
			c.httpFilter(r, a, &f)
		}
		refs := make([]gwv1.HTTPBackendRef, 0, len(rule.BackendRefs))
		for _, br := range rule.BackendRefs {
			refs = append(refs, gwv1.HTTPBackendRef{BackendRef: br.BackendRef, Filters: httpFilters(br.Filters)})
		}
		c.backends(r, a, refs, true)
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []gwv1.GRPCRouteMatch{{}}
		}
		rules := make([]*table.Rule, 0, len(matches))
		for j := range matches {
			m, ok := grpcMatch(r, &matches[j])
			if !ok {
				continue
			}
			rules = append(rules, &table.Rule{Match: m, Action: a,
				Created: gr.CreationTimestamp.Time, RouteKey: r.key(), RuleIndex: i, MatchIndex: j})
		}
		r.endRule(a.RuleName, rules)
	}
}

// grpcMatch compiles a method match to a path match on /service/method.
func grpcMatch(r *route, m *gwv1.GRPCRouteMatch) (table.Match, bool) {
	out := table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: "/"}}
	if mm := m.Method; mm != nil {
		svc, method := "", ""
		if mm.Service != nil {
			svc = *mm.Service
		}
		if mm.Method != nil {
			method = *mm.Method
		}
		regex := mm.Type != nil && *mm.Type == gwv1.GRPCMethodMatchRegularExpression
		// The table's SortGRPC reads service and method back from these
		// paths: Exact "/svc/method", PathPrefix "/svc", else a regular
		// expression "/SVC/METHOD" with "[^/]+" for a part not given.
		const anyPart = "[^/]+"
		switch {
		case !regex && svc != "" && method != "":
			out.Path = table.PathMatch{Type: table.PathExact, Value: "/" + svc + "/" + method}
		case !regex && svc != "":
			out.Path = table.PathMatch{Type: table.PathPrefix, Value: "/" + svc}
		case svc != "" || method != "":
			if !regex {
				method = regexp.QuoteMeta(method)
			}
			if svc == "" {
				svc = anyPart
			}
			if method == "" {
				method = anyPart
			}
			v := "/" + svc + "/" + method
			re, ok := compileRegexp(r, v, "method")
			if !ok {
				return out, false
			}
			out.Path = table.PathMatch{Type: table.PathRegex, Value: v, Regexp: re}
		}
	}
	for _, h := range m.Headers {
		regex := h.Type != nil && *h.Type == gwv1.GRPCHeaderMatchRegularExpression
		vm, ok := valueMatch(r, textproto.CanonicalMIMEHeaderKey(string(h.Name)), h.Value, regex)
		if !ok {
			return out, false
		}
		out.Headers = append(out.Headers, vm)
	}
	return out, true
}
