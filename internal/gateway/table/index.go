package table

import (
	"net/http"
	"strings"
)

// indexMin is the number of rules from which a Host gets a ruleIndex;
// below it a scan is as fast.
const indexMin = 16

// ruleIndex finds the first matching rule without looking at every rule:
// it files rule positions (in precedence order) by the only path each can
// match (Exact), by its prefix without the trailing slash (PathPrefix), or
// in other (regular expressions). A request can only match rules under
// its own path, under the path cut at each "/", or in other; the answer
// is the lowest position among those that match, which is what a scan in
// precedence order would find.
type ruleIndex struct {
	exact  map[string][]int32
	prefix map[string][]int32
	other  []int32
}

func newRuleIndex(rules []*Rule) *ruleIndex {
	x := &ruleIndex{exact: map[string][]int32{}, prefix: map[string][]int32{}}
	for i, r := range rules {
		switch p := &r.Match.Path; p.Type {
		case PathExact:
			x.exact[p.Value] = append(x.exact[p.Value], int32(i))
		case PathPrefix:
			k := strings.TrimSuffix(p.Value, "/")
			x.prefix[k] = append(x.prefix[k], int32(i))
		default:
			x.other = append(x.other, int32(i))
		}
	}
	return x
}

func (x *ruleIndex) match(rules []*Rule, path string, r *http.Request) *Rule {
	best := int32(len(rules))
	first := func(positions []int32) {
		for _, i := range positions {
			if i >= best {
				return
			}
			if rules[i].Match.matches(path, r) {
				best = i
				return
			}
		}
	}
	first(x.exact[path])
	first(x.prefix[path])
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			first(x.prefix[path[:i]])
		}
	}
	first(x.other)
	if int(best) == len(rules) {
		return nil
	}
	return rules[best]
}
