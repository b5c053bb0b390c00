package table

import (
	"cmp"
	"slices"
	"strings"
)

// Sort orders rules by the HTTPRoute precedence (gateway-api v1.6.3,
// HTTPRouteRule.Matches), first wins:
//
//  1. an Exact path, then a RegularExpression path, then a PathPrefix;
//  2. the longer path value (characters as written; for a regular
//     expression, of the expression);
//  3. a method match;
//  4. more header matches;
//  5. more query parameter matches;
//  6. the older route (Created);
//  7. the route first by "namespace/name" (RouteKey);
//  8. the earlier rule, then the earlier match, within the route.
//
// Where regular expressions go is left to implementations; Envoy
// Gateway puts them between Exact and PathPrefix, and so do we: a
// regular expression is written for the paths it names, while a prefix,
// "/" above all, is the usual catch-all.
func Sort(rules []*Rule) {
	slices.SortStableFunc(rules, compareHTTP)
}

func compareHTTP(a, b *Rule) int {
	x, y := &a.Match, &b.Match
	if c := cmp.Compare(pathRank(x.Path.Type), pathRank(y.Path.Type)); c != 0 {
		return c
	}
	if c := cmp.Compare(pathLen(&y.Path), pathLen(&x.Path)); c != 0 {
		return c
	}
	if c := cmp.Compare(boolRank(x.Method != ""), boolRank(y.Method != "")); c != 0 {
		return c
	}
	if c := cmp.Compare(len(y.Headers), len(x.Headers)); c != 0 {
		return c
	}
	if c := cmp.Compare(len(y.Query), len(x.Query)); c != 0 {
		return c
	}
	return compareRoute(a, b)
}

// SortGRPC orders GRPCRoute rules by their precedence (gateway-api
// v1.6.3, GRPCRouteRule.Matches): more characters in the service, then
// in the method, then more header matches, then the route and rule order
// as in Sort. (The hostname criteria are Port.Lookup's.)
//
// The compiler turns a method match into a path: service and method
// exact as Exact "/svc/method"; a service alone as PathPrefix "/svc";
// anything else as a RegularExpression "/SVC/METHOD", each part a regular
// expression or "[^/]+" for a part not given. SortGRPC reads the
// service and the method back from that path; "[^/]+" counts as no
// characters.
func SortGRPC(rules []*Rule) {
	slices.SortStableFunc(rules, func(a, b *Rule) int {
		as, am := grpcParts(&a.Match.Path)
		bs, bm := grpcParts(&b.Match.Path)
		if c := cmp.Compare(len(bs), len(as)); c != 0 {
			return c
		}
		if c := cmp.Compare(len(bm), len(am)); c != 0 {
			return c
		}
		if c := cmp.Compare(len(b.Match.Headers), len(a.Match.Headers)); c != 0 {
			return c
		}
		return compareRoute(a, b)
	})
}

// compareRoute breaks ties between equally specific matches: oldest
// route, then namespace/name, then rule and match order.
func compareRoute(a, b *Rule) int {
	if c := a.Created.Compare(b.Created); c != 0 {
		return c
	}
	if c := strings.Compare(a.RouteKey, b.RouteKey); c != 0 {
		return c
	}
	if c := cmp.Compare(a.RuleIndex, b.RuleIndex); c != 0 {
		return c
	}
	return cmp.Compare(a.MatchIndex, b.MatchIndex)
}

func pathRank(t PathType) int {
	switch t {
	case PathExact:
		return 0
	case PathRegex:
		return 1
	}
	return 2
}

func pathLen(p *PathMatch) int {
	if p.Type == PathRegex && p.Regexp != nil && p.Value == "" {
		return len(p.Regexp.String())
	}
	if p.Type == "" && p.Value == "" {
		return 1 // the default "/"
	}
	return len(p.Value)
}

func boolRank(b bool) int {
	if b {
		return 0
	}
	return 1
}

// anyPart is what the compiler writes for a service or method not given.
const anyPart = "[^/]+"

// grpcParts reads service and method back from a compiled GRPC path.
func grpcParts(p *PathMatch) (service, method string) {
	v := p.Value
	if p.Type == PathRegex && v == "" && p.Regexp != nil {
		v = p.Regexp.String()
	}
	switch p.Type {
	case PathExact:
		service, method, _ = strings.Cut(strings.TrimPrefix(v, "/"), "/")
		return service, method
	case PathRegex:
		v = strings.TrimSuffix(strings.TrimPrefix(v, "^"), "$")
		if strings.HasPrefix(v, "(?:") && strings.HasSuffix(v, ")") {
			v = v[3 : len(v)-1]
		}
		v = strings.TrimPrefix(v, "/")
		// The separator is the last "/" outside a bracket expression.
		sep, depth := -1, 0
		for i := 0; i < len(v); i++ {
			switch v[i] {
			case '\\':
				i++
			case '[':
				depth++
			case ']':
				if depth > 0 {
					depth--
				}
			case '/':
				if depth == 0 {
					sep = i
				}
			}
		}
		if sep < 0 {
			return v, ""
		}
		service, method = v[:sep], v[sep+1:]
		if service == anyPart {
			service = ""
		}
		if method == anyPart {
			method = ""
		}
		return service, method
	}
	return strings.Trim(v, "/"), ""
}
