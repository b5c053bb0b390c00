package compile

import (
	"cmp"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// portAdd files a rule under its effective hostname ("" for any).
// It stands in for the table's builder until that lands.
func portAdd(p *table.Port, hostname string, r *table.Rule) {
	var h *table.Host
	switch {
	case hostname == "":
		if p.Any == nil {
			p.Any = &table.Host{}
		}
		h = p.Any
	case strings.HasPrefix(hostname, "*."):
		i := slices.IndexFunc(p.Wildcards, func(w *table.Host) bool { return w.Name == hostname })
		if i < 0 {
			p.Wildcards = append(p.Wildcards, &table.Host{Name: hostname})
			i = len(p.Wildcards) - 1
		}
		h = p.Wildcards[i]
	default:
		if p.Exact == nil {
			p.Exact = map[string]*table.Host{}
		}
		h = p.Exact[hostname]
		if h == nil {
			h = &table.Host{Name: hostname}
			p.Exact[hostname] = h
		}
	}
	h.Rules = append(h.Rules, r)
}

// finishPort orders wildcards longest first and each host's rules by
// precedence.
func finishPort(p *table.Port) {
	slices.SortFunc(p.Wildcards, func(a, b *table.Host) int {
		return cmp.Or(cmp.Compare(len(b.Name), len(a.Name)), cmp.Compare(a.Name, b.Name))
	})
	for _, h := range p.Exact {
		sortRules(h.Rules)
	}
	for _, h := range p.Wildcards {
		sortRules(h.Rules)
	}
	if p.Any != nil {
		sortRules(p.Any.Rules)
	}
}

// sortRules orders rules by the HTTPRoute spec's precedence.
func sortRules(rules []*table.Rule) {
	rank := func(t table.PathType) int {
		switch t {
		case table.PathExact:
			return 0
		case table.PathPrefix:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(rules, func(a, b *table.Rule) int {
		return cmp.Or(
			cmp.Compare(rank(a.Match.Path.Type), rank(b.Match.Path.Type)),
			cmp.Compare(len(b.Match.Path.Value), len(a.Match.Path.Value)),
			cmp.Compare(boolInt(b.Match.Method != ""), boolInt(a.Match.Method != "")),
			cmp.Compare(len(b.Match.Headers), len(a.Match.Headers)),
			cmp.Compare(len(b.Match.Query), len(a.Match.Query)),
			a.Created.Compare(b.Created),
			cmp.Compare(a.RouteKey, b.RouteKey),
			cmp.Compare(a.RuleIndex, b.RuleIndex),
			cmp.Compare(a.MatchIndex, b.MatchIndex),
		)
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
