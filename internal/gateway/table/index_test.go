package table

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// randomRules makes n rules over a small vocabulary so that many overlap.
func randomRules(rng *rand.Rand, n int) []*Rule {
	segs := []string{"a", "b", "ab", "c"}
	randPath := func() string {
		var b strings.Builder
		for range rng.IntN(4) {
			b.WriteString("/" + segs[rng.IntN(len(segs))])
		}
		if b.Len() == 0 || rng.IntN(4) == 0 {
			b.WriteString("/")
		}
		return b.String()
	}
	var rules []*Rule
	for i := range n {
		var m Match
		switch rng.IntN(5) {
		case 0:
			m.Path = PathMatch{Type: PathExact, Value: randPath()}
		case 1:
			expr := randPath() + ".*"
			m.Path = PathMatch{Type: PathRegex, Value: expr, Regexp: regexp.MustCompile(expr)}
		default:
			m.Path = PathMatch{Type: PathPrefix, Value: randPath()}
		}
		if rng.IntN(4) == 0 {
			m.Method = "POST"
		}
		if rng.IntN(3) == 0 {
			m.Headers = []ValueMatch{{Name: "X", Value: fmt.Sprint(rng.IntN(2))}}
		}
		if rng.IntN(3) == 0 {
			m.Query = []ValueMatch{{Name: "q", Value: fmt.Sprint(rng.IntN(2))}}
		}
		rules = append(rules, &Rule{Match: m, Action: &Action{Route: fmt.Sprint(i)},
			Created: t0.Add(time.Duration(rng.IntN(3)) * time.Second), RouteKey: fmt.Sprint("ns/r", rng.IntN(5)), RuleIndex: i})
	}
	return rules
}

// The index must pick exactly what a scan in precedence order picks.
func TestIndexAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	paths := []string{"/", "/a", "/a/", "/a/b", "/ab", "/ab/c/a", "/b/a/b", "/c", "/a/b/c/d", "/x", ""}
	for round := range 50 {
		h := &Host{Rules: randomRules(rng, indexMin+rng.IntN(100))}
		h.finish()
		if h.index == nil {
			t.Fatal("no index built")
		}
		scan := &Host{Rules: h.Rules}
		for _, p := range paths {
			for _, method := range []string{"GET", "POST"} {
				for _, hv := range []string{"", "0", "1"} {
					r, _ := http.NewRequest(method, "http://h"+p+"?q="+hv, nil)
					if p == "" {
						r.URL.Path = ""
					}
					if hv != "" {
						r.Header.Set("X", hv)
					}
					got, want := h.Match(r), scan.Match(r)
					if got != want {
						t.Fatalf("round %d %s %q x=%s: index picked %v, scan %v", round, method, p, hv, name(got), name(want))
					}
				}
			}
		}
	}
}

func name(r *Rule) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%s(%+v)", r.Action.Route, r.Match.Path)
}

// FuzzMatch: any request target and Host give no panic, and the index
// picks what a scan picks.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/a//b/", "/%2e%2e/a", "/ab?q=1", "*", "/a/./b/../c"} {
		f.Add(s, "x.example.com:80", "1")
	}
	rules := randomRules(rand.New(rand.NewPCG(3, 4)), 200)
	h := &Host{Rules: rules}
	h.finish()
	scan := &Host{Rules: h.Rules}
	p := NewPort(1, 1, HTTP)
	p.Add("*.example.com", &Rule{})
	p.Finish()
	f.Fuzz(func(t *testing.T, target, host, x string) {
		p.Lookup(host)
		r, err := http.NewRequest("POST", "http://h", nil)
		if err != nil {
			t.Fatal(err)
		}
		u, err := r.URL.Parse(target)
		if err != nil {
			return
		}
		r.URL = u
		r.Header.Set("X", x)
		if got, want := h.Match(r), scan.Match(r); got != want {
			t.Fatalf("%q: index picked %v, scan %v", target, name(got), name(want))
		}
	})
}
