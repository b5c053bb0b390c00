package table

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// routes10k is what the compiler feeds a Port with 10,000 HTTPRoutes:
// each route its own hostname (a tenth under wildcards), two rules
// (an Exact path with a header, a prefix), plus a catch-all route with
// 1,000 prefixes under no hostname.
type fileRule struct {
	host string
	rule *Rule
}

func routes10k() []fileRule {
	var out []fileRule
	for i := range 10000 {
		host := fmt.Sprintf("svc-%d.apps.example.com", i)
		if i%10 == 0 {
			host = fmt.Sprintf("*.tenant-%d.example.com", i)
		}
		key := fmt.Sprintf("ns-%d/route-%d", i%100, i)
		created := t0.Add(time.Duration(i) * time.Second)
		a := &Action{Route: key}
		out = append(out,
			fileRule{host, &Rule{Match: Match{Path: PathMatch{Type: PathExact, Value: "/api/v1/status"},
				Headers: []ValueMatch{{Name: "X-Canary", Value: "true"}}}, Action: a, Created: created, RouteKey: key}},
			fileRule{host, &Rule{Match: Match{Path: PathMatch{Type: PathPrefix, Value: fmt.Sprintf("/app-%d", i%7)}},
				Action: a, Created: created, RouteKey: key, RuleIndex: 1}},
		)
		if i < 1000 {
			out = append(out, fileRule{"", &Rule{Match: Match{Path: PathMatch{Type: PathPrefix, Value: fmt.Sprintf("/shared/%d", i)}},
				Action: a, Created: created, RouteKey: key, RuleIndex: 2}})
		}
	}
	return out
}

func buildPort(rules []fileRule) *Port {
	p := NewPort(8080, 80, HTTP)
	for _, f := range rules {
		p.Add(f.host, f.rule)
	}
	p.Finish()
	return p
}

func BenchmarkBuild10kRoutes(b *testing.B) {
	rules := routes10k()
	b.ReportAllocs()
	for b.Loop() {
		buildPort(rules)
	}
}

func benchServe(b *testing.B, host, target string, want string) {
	p := buildPort(routes10k())
	r, _ := http.NewRequest("GET", "http://"+host+target, nil)
	if got := p.Lookup(r.Host).Match(r); got == nil || got.Action.Route != want {
		b.Fatalf("%s%s matched %v, want %s", host, target, got, want)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.Lookup(r.Host).Match(r)
	}
}

func BenchmarkLookupMatch10kExact(b *testing.B) {
	benchServe(b, "svc-4321.apps.example.com:8080", "/app-2/index.html", "ns-21/route-4321")
}

func BenchmarkLookupMatch10kWildcard(b *testing.B) {
	benchServe(b, "a.b.tenant-4320.example.com", "/app-1/x", "ns-20/route-4320")
}

// 1,000 prefixes under one host: the rule index at work.
func BenchmarkLookupMatch10kAnyHost1000Rules(b *testing.B) {
	benchServe(b, "unknown.example.org", "/shared/999/x/y", "ns-99/route-999")
}

func BenchmarkLookupMatch10kAnyHost1000RulesNoIndex(b *testing.B) {
	p := buildPort(routes10k())
	p.Any.index = nil
	r, _ := http.NewRequest("GET", "http://unknown.example.org/shared/999/x/y", nil)
	b.ReportAllocs()
	for b.Loop() {
		p.Lookup(r.Host).Match(r)
	}
}
