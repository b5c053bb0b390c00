package table

import (
	"crypto/tls"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// route is a test HTTPRoute: hostnames, and rules each with matches and
// the backend the rule sends to (recorded in Action.Route).
type route struct {
	key       string // namespace/name
	created   time.Time
	hostnames []string
	rules     []testRule
}

type testRule struct {
	backend string
	matches []Match // none: the default PathPrefix "/"
}

// build files every route's rules on one port, as the compiler would
// (one Rule per match, shared Action).
func build(routes ...route) *Port {
	p := NewPort(8080, 80, HTTP)
	for _, rt := range routes {
		for ri, tr := range rt.rules {
			a := &Action{Route: tr.backend}
			ms := tr.matches
			if len(ms) == 0 {
				ms = []Match{{}}
			}
			for mi, m := range ms {
				hosts := rt.hostnames
				if len(hosts) == 0 {
					hosts = []string{""}
				}
				for _, h := range hosts {
					m := m
					p.Add(h, &Rule{Match: m, Action: a, Created: rt.created, RouteKey: rt.key, RuleIndex: ri, MatchIndex: mi})
				}
			}
		}
	}
	p.Finish()
	return p
}

// serve answers with the backend of the rule matched, "404" for none.
func serve(p *Port, method, host, target string, headers ...string) string {
	r := req(method, host, target, headers...)
	rule := p.Lookup(r.Host).Match(r)
	if rule == nil {
		return "404"
	}
	return rule.Action.Route
}

type expect struct {
	host, target string
	headers      []string
	want         string
}

func check(t *testing.T, p *Port, cases []expect) {
	t.Helper()
	for _, c := range cases {
		host := c.host
		if host == "" {
			host = "gw.example"
		}
		if got := serve(p, "GET", host, c.target, c.headers...); got != c.want {
			t.Errorf("%s%s %v: got %s, want %s", host, c.target, c.headers, got, c.want)
		}
	}
}

func path(t PathType, v string) Match { return Match{Path: PathMatch{Type: t, Value: v}} }
func hdr(kv ...string) Match {
	var m Match
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, ValueMatch{Name: kv[i], Value: kv[i+1]})
	}
	return m
}
func query(kv ...string) Match {
	var m Match
	for i := 0; i+1 < len(kv); i += 2 {
		m.Query = append(m.Query, ValueMatch{Name: kv[i], Value: kv[i+1]})
	}
	return m
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// conformance tests/httproute-path-match-order.{yaml,go}
func TestConformancePathMatchOrder(t *testing.T) {
	p := build(route{key: "gateway-conformance-infra/path-matching-order", created: t0, rules: []testRule{
		{"v1", []Match{path(PathExact, "/match")}},
		{"v2", []Match{path(PathExact, "/match/exact")}},
		{"v3", []Match{path(PathExact, "/match/exact/one")}},
		{"v3", []Match{path(PathPrefix, "/match/")}},
		{"v1", []Match{path(PathPrefix, "/match/prefix/")}},
		{"v2", []Match{path(PathPrefix, "/match/prefix/one")}},
	}})
	check(t, p, []expect{
		{target: "/match/exact/one", want: "v3"},
		{target: "/match/exact", want: "v2"},
		{target: "/match", want: "v1"},
		{target: "/match/prefix/one/any", want: "v2"},
		{target: "/match/prefix/any", want: "v1"},
		{target: "/match/any", want: "v3"},
	})
}

// conformance tests/httproute-matching-across-routes.{yaml,go}
func TestConformanceMatchingAcrossRoutes(t *testing.T) {
	p := build(
		route{key: "gateway-conformance-infra/matching-part1", created: t0, hostnames: []string{"example.com", "example.net"}, rules: []testRule{
			{"v1", []Match{path(PathPrefix, "/"), hdr("version", "one")}},
		}},
		route{key: "gateway-conformance-infra/matching-part2", created: t0.Add(time.Second), hostnames: []string{"example.com"}, rules: []testRule{
			{"v2", []Match{path(PathPrefix, "/v2"), hdr("version", "two")}},
		}},
	)
	check(t, p, []expect{
		{"example.com", "/", nil, "v1"},
		{"example.com", "/example", nil, "v1"},
		{"example.net", "/example", nil, "v1"},
		{"example.com", "/example", []string{"Version", "one"}, "v1"},
		{"example.com", "/v2", nil, "v2"},
		{"example.net", "/v2", nil, "v1"},
		{"example.com", "/v2/example", nil, "v2"},
		{"example.com", "/", []string{"Version", "two"}, "v2"},
		{"example.org", "/", nil, "404"},
	})
}

// conformance tests/httproute-query-param-matching.{yaml,go}
func TestConformanceQueryParamMatching(t *testing.T) {
	pq := func(p string, kv ...string) Match {
		m := query(kv...)
		m.Path = PathMatch{Type: PathPrefix, Value: p}
		return m
	}
	hq := func(h, v string, kv ...string) Match {
		m := query(kv...)
		m.Headers = []ValueMatch{{Name: h, Value: v}}
		return m
	}
	phq := func(p, h, v string, kv ...string) Match {
		m := hq(h, v, kv...)
		m.Path = PathMatch{Type: PathPrefix, Value: p}
		return m
	}
	p := build(route{key: "gateway-conformance-infra/query-param-matching", created: t0, rules: []testRule{
		{"v1", []Match{query("animal", "whale")}},
		{"v2", []Match{query("animal", "dolphin")}},
		{"v3", []Match{query("animal", "dolphin", "color", "blue"), query("ANIMAL", "Whale")}},
		{"v1", []Match{pq("/path1", "animal", "whale")}},
		{"v2", []Match{hq("version", "one", "animal", "whale")}},
		{"v3", []Match{phq("/path2", "version", "two", "animal", "whale")}},
		{"v1", []Match{pq("/path3", "animal", "shark"), phq("/path4", "version", "three", "animal", "kraken")}},
		{"v1", []Match{path(PathPrefix, "/path5")}},
		{"v2", []Match{query("animal", "hydra")}},
		{"v3", []Match{hdr("version", "four")}},
	}})
	check(t, p, []expect{
		{"", "/?animal=whale", nil, "v1"},
		{"", "/?animal=dolphin", nil, "v2"},
		{"", "/?animal=dolphin&color=blue", nil, "v3"},
		{"", "/?ANIMAL=Whale", nil, "v3"},
		{"", "/?animal=whale&otherparam=irrelevant", nil, "v1"},
		{"", "/?animal=dolphin&color=yellow", nil, "v2"},
		{"", "/?color=blue", nil, "404"},
		{"", "/?animal=dog", nil, "404"},
		{"", "/?animal=whaledolphin", nil, "404"},
		{"", "/", nil, "404"},
		{"", "/path1?animal=whale", nil, "v1"},
		{"", "/?animal=whale", []string{"version", "one"}, "v2"},
		{"", "/path2?animal=whale", []string{"version", "two"}, "v3"},
		{"", "/path3?animal=shark", nil, "v1"},
		{"", "/path4?animal=kraken", []string{"version", "three"}, "v1"},
		{"", "/?animal=shark", nil, "404"},
		{"", "/path4?animal=kraken", nil, "404"},
		{"", "/path5?animal=hydra", nil, "v1"},
		{"", "/?animal=hydra", []string{"version", "four"}, "v3"},
	})
}

// conformance tests/httproute-header-matching.{yaml,go}
func TestConformanceHeaderMatching(t *testing.T) {
	p := build(route{key: "gateway-conformance-infra/header-matching", created: t0, rules: []testRule{
		{"v1", []Match{hdr("version", "one")}},
		{"v2", []Match{hdr("version", "two")}},
		{"v1", []Match{hdr("version", "two", "color", "orange")}},
		{"v1", []Match{hdr("color", "blue"), hdr("color", "green")}},
		{"v2", []Match{hdr("color", "red"), hdr("color", "yellow")}},
	}})
	check(t, p, []expect{
		{"", "/", []string{"Version", "one"}, "v1"},
		{"", "/", []string{"Version", "two"}, "v2"},
		{"", "/", []string{"Version", "two", "Color", "orange"}, "v1"},
		{"", "/", []string{"Version", "two", "Color", "blue"}, "v2"},
		{"", "/", []string{"Color", "orange"}, "404"},
		{"", "/", []string{"Some-Other-Header", "one"}, "404"},
		{"", "/", []string{"Color", "blue"}, "v1"},
		{"", "/", []string{"Color", "green"}, "v1"},
		{"", "/", []string{"Color", "red"}, "v2"},
		{"", "/", []string{"Color", "yellow"}, "v2"},
		{"", "/", []string{"Color", "purple"}, "404"},
	})
}

// conformance tests/httproute-method-matching.yaml, reduced: a method match
// outranks header matches on the same path.
func TestMethodOutranksHeaders(t *testing.T) {
	m := hdr("version", "one", "color", "red")
	p := build(route{key: "ns/r", created: t0, rules: []testRule{
		{"headers", []Match{m}},
		{"method", []Match{{Method: "POST"}}},
	}})
	check(t, p, []expect{{"", "/", []string{"Version", "one", "Color", "red"}, "headers"}})
	if got := serve(p, "POST", "gw.example", "/", "Version", "one", "Color", "red"); got != "method" {
		t.Errorf("POST with both: got %s, want method", got)
	}
}

func TestPrecedence(t *testing.T) {
	re := func(expr string) Match {
		return Match{Path: PathMatch{Type: PathRegex, Value: expr, Regexp: regexp.MustCompile(expr)}}
	}
	for _, tc := range []struct {
		name   string
		routes []route
		target string
		hdrs   []string
		want   string
	}{
		{"exact over longer prefix", []route{{key: "a/a", created: t0, rules: []testRule{
			{"prefix", []Match{path(PathPrefix, "/a/b/c")}}, {"exact", []Match{path(PathExact, "/a/b/c")}}}}}, "/a/b/c", nil, "exact"},
		{"longest prefix", []route{{key: "a/a", created: t0, rules: []testRule{
			{"short", []Match{path(PathPrefix, "/a")}}, {"long", []Match{path(PathPrefix, "/a/b")}}}}}, "/a/b/c", nil, "long"},
		{"prefix over method", []route{{key: "a/a", created: t0, rules: []testRule{
			{"method", []Match{{Method: "GET"}}}, {"prefix", []Match{path(PathPrefix, "/a")}}}}}, "/a", nil, "prefix"},
		{"more headers", []route{{key: "a/a", created: t0, rules: []testRule{
			{"one", []Match{hdr("a", "1")}}, {"two", []Match{hdr("a", "1", "b", "2")}}}}}, "/", []string{"a", "1", "b", "2"}, "two"},
		{"headers over queries", []route{{key: "a/a", created: t0, rules: []testRule{
			{"queries", []Match{query("a", "1", "b", "2")}}, {"header", []Match{hdr("a", "1")}}}}}, "/?a=1&b=2", []string{"a", "1"}, "header"},
		{"more queries", []route{{key: "a/a", created: t0, rules: []testRule{
			{"one", []Match{query("a", "1")}}, {"two", []Match{query("a", "1", "b", "2")}}}}}, "/?a=1&b=2", nil, "two"},
		{"older route", []route{
			{key: "a/new", created: t0.Add(time.Second), rules: []testRule{{"new", nil}}},
			{key: "z/old", created: t0, rules: []testRule{{"old", nil}}}}, "/", nil, "old"},
		{"namespace/name on equal age", []route{
			{key: "b/a", created: t0, rules: []testRule{{"b/a", nil}}},
			{key: "a/z", created: t0, rules: []testRule{{"a/z", nil}}}}, "/", nil, "a/z"},
		{"first rule in route", []route{{key: "a/a", created: t0, rules: []testRule{
			{"first", []Match{path(PathPrefix, "/x")}}, {"second", []Match{path(PathPrefix, "/x")}}}}}, "/x", nil, "first"},
		{"specificity beats age", []route{
			{key: "a/old", created: t0, rules: []testRule{{"old", []Match{path(PathPrefix, "/x")}}}},
			{key: "a/new", created: t0.Add(time.Hour), rules: []testRule{{"new", []Match{path(PathPrefix, "/x/y")}}}}}, "/x/y", nil, "new"},
		{"regex after exact", []route{{key: "a/a", created: t0, rules: []testRule{
			{"regex", []Match{re("/a/.*")}}, {"exact", []Match{path(PathExact, "/a/b")}}}}}, "/a/b", nil, "exact"},
		{"regex before a longer prefix", []route{{key: "a/a", created: t0, rules: []testRule{
			{"prefix", []Match{path(PathPrefix, "/a/b/c/d")}}, {"regex", []Match{re("/a/.*")}}}}}, "/a/b/c/d", nil, "regex"},
		{"longer regex first", []route{{key: "a/a", created: t0, rules: []testRule{
			{"short", []Match{re("/.*")}}, {"long", []Match{re("/a/[a-z]+")}}}}}, "/a/b", nil, "long"},
		{"prefix when regex misses", []route{{key: "a/a", created: t0, rules: []testRule{
			{"prefix", []Match{path(PathPrefix, "/")}}, {"regex", []Match{re("/v[0-9]")}}}}}, "/v10", nil, "prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(tc.routes...)
			if got := serve(p, "GET", "gw.example", tc.target, tc.hdrs...); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestSortTieBreakers(t *testing.T) {
	mk := func(created time.Time, key string, rule, match int) *Rule {
		return &Rule{Created: created, RouteKey: key, RuleIndex: rule, MatchIndex: match,
			Action: &Action{Route: fmt.Sprintf("%s#%d.%d@%d", key, rule, match, created.Unix()-t0.Unix())}}
	}
	rules := []*Rule{
		mk(t0.Add(time.Second), "a/a", 0, 0),
		mk(t0, "b/b", 1, 0),
		mk(t0, "b/b", 0, 1),
		mk(t0, "a/b", 3, 0),
		mk(t0, "b/b", 0, 0),
	}
	Sort(rules)
	if got, want := order(rules), "a/b#3.0@0 b/b#0.0@0 b/b#0.1@0 b/b#1.0@0 a/a#0.0@1"; got != want {
		t.Errorf("order\n %s\nwant\n %s", got, want)
	}
}

// order lists the rules' Action.Route in order.
func order(rules []*Rule) string {
	var names []string
	for _, r := range rules {
		names = append(names, r.Action.Route)
	}
	return strings.Join(names, " ")
}

func TestSortGRPC(t *testing.T) {
	anyRe := func(expr string) PathMatch {
		return PathMatch{Type: PathRegex, Value: expr, Regexp: regexp.MustCompile(expr)}
	}
	mk := func(name string, p PathMatch, headers int, created time.Time) *Rule {
		r := &Rule{Match: Match{Path: p}, Action: &Action{Route: name, GRPC: true}, Created: created, RouteKey: "ns/" + name}
		for i := range headers {
			r.Match.Headers = append(r.Match.Headers, ValueMatch{Name: fmt.Sprint("H", i), Value: "v"})
		}
		return r
	}
	rules := []*Rule{
		mk("any", PathMatch{Type: PathPrefix, Value: "/"}, 0, t0),
		mk("method-only", anyRe("/[^/]+/Echo"), 0, t0),
		mk("service-only", PathMatch{Type: PathPrefix, Value: "/pkg.Svc"}, 0, t0),
		mk("exact", PathMatch{Type: PathExact, Value: "/pkg.Svc/Echo"}, 0, t0),
		mk("exact-longer-method", PathMatch{Type: PathExact, Value: "/pkg.Svc/EchoTwo"}, 0, t0),
		mk("exact-headers", PathMatch{Type: PathExact, Value: "/pkg.Svc/Echo"}, 2, t0),
		mk("longer-service", PathMatch{Type: PathPrefix, Value: "/pkg.Service"}, 0, t0),
		mk("regex-service", anyRe("/pkg\\.S.c/[^/]+"), 0, t0.Add(time.Second)),
	}
	SortGRPC(rules)
	// Service characters, then method characters, then headers, then age.
	if got, want := order(rules), "longer-service regex-service exact-longer-method exact-headers exact service-only method-only any"; got != want {
		t.Errorf("order\n %s\nwant\n %s", got, want)
	}
	for _, tc := range []struct {
		p             PathMatch
		service, meth string
	}{
		{PathMatch{Type: PathExact, Value: "/a.B/C"}, "a.B", "C"},
		{PathMatch{Type: PathPrefix, Value: "/a.B/"}, "a.B", ""},
		{anyRe("/[^/]+/Echo"), "", "Echo"},
		{anyRe("/a\\.B/[^/]+"), "a\\.B", ""},
		{anyRe("/a[/x]b/M.*"), "a[/x]b", "M.*"},
		{anyRe("^(?:/a/b)$"), "a", "b"},
	} {
		s, m := grpcParts(&tc.p)
		if s != tc.service || m != tc.meth {
			t.Errorf("grpcParts(%s %q) = %q, %q; want %q, %q", tc.p.Type, tc.p.Value, s, m, tc.service, tc.meth)
		}
	}
}

func TestFinishSortsGRPCHostsByGRPCPrecedence(t *testing.T) {
	p := NewPort(1, 1, HTTP)
	a := &Action{Route: "service", GRPC: true}
	b := &Action{Route: "exact-method-headers", GRPC: true}
	// HTTP precedence would put the Exact path first; the GRPC one the
	// longer service.
	p.Add("", &Rule{Match: Match{Path: PathMatch{Type: PathPrefix, Value: "/pkg.LongService"}}, Action: a, RouteKey: "ns/a"})
	p.Add("", &Rule{Match: Match{Path: PathMatch{Type: PathExact, Value: "/pkg.S/M"}}, Action: b, RouteKey: "ns/b"})
	p.Finish()
	if got := p.Any.Rules[0].Action.Route; got != "service" {
		t.Errorf("first rule %s, want service", got)
	}
}

func TestLookup(t *testing.T) {
	p := NewPort(8080, 80, HTTP)
	for _, h := range []string{"foo.example.com", "*.example.com", "*.b.example.com", "Bar.Example.COM.", "", "*.com"} {
		p.Add(h, &Rule{Action: &Action{Route: h}})
	}
	p.Finish()
	for host, want := range map[string]string{
		"foo.example.com":          "foo.example.com",
		"FOO.example.com":          "foo.example.com",
		"foo.example.com:8080":     "foo.example.com",
		"foo.example.com.":         "foo.example.com",
		"foo.example.com.:80":      "foo.example.com",
		"bar.example.com":          "bar.example.com",
		"x.example.com":            "*.example.com",
		"a.x.example.com":          "*.example.com",
		"x.b.example.com":          "*.b.example.com",
		"y.x.b.example.com":        "*.b.example.com",
		"b.example.com":            "*.example.com",
		"example.com":              "*.com",
		"com":                      "",
		"other.org":                "",
		"10.0.0.1:80":              "",
		"[fd00::1]:8080":           "",
		"[fd00::1]":                "",
		"fd00::1":                  "",
		".example.com":             "",
		"":                         "",
		"x.example.com:notaport":   "*.example.com",
		"www.foo.example.com:1234": "*.example.com",
	} {
		h := p.Lookup(host)
		if h == nil {
			t.Errorf("Lookup(%q) = nil, want %q", host, want)
			continue
		}
		if got := h.Rules[0].Action.Route; !strings.EqualFold(strings.TrimSuffix(got, "."), want) {
			t.Errorf("Lookup(%q) = %q, want %q", host, got, want)
		}
	}
	if got := NewPort(1, 1, HTTP).Lookup("x"); got != nil {
		t.Errorf("empty port: Lookup = %v, want nil", got)
	}
	if got := (*Host)(nil).Match(req("GET", "x", "/")); got != nil {
		t.Errorf("nil host matched %v", got)
	}
}

// The most specific hostname decides alone: a rule under *.example.com
// does not answer for foo.example.com when foo.example.com has rules.
func TestLookupMostSpecificHostOnly(t *testing.T) {
	p := build(
		route{key: "ns/exact", created: t0, hostnames: []string{"foo.example.com"}, rules: []testRule{{"exact", []Match{path(PathPrefix, "/only")}}}},
		route{key: "ns/wild", created: t0, hostnames: []string{"*.example.com"}, rules: []testRule{{"wild", nil}}},
		route{key: "ns/any", created: t0, rules: []testRule{{"any", nil}}},
	)
	check(t, p, []expect{
		{"foo.example.com", "/only", nil, "exact"},
		{"foo.example.com", "/other", nil, "404"},
		{"bar.example.com", "/other", nil, "wild"},
		{"example.com", "/other", nil, "any"},
	})
}

// A Port assembled by hand, without Finish, still looks up and matches.
func TestHandBuiltPort(t *testing.T) {
	w := &Host{Name: "*.example.com", Rules: []*Rule{{Match: path(PathPrefix, "/"), Action: &Action{Route: "w"}}}}
	p := &Port{Wildcards: []*Host{w}}
	if got := serve(p, "GET", "a.example.com", "/x"); got != "w" {
		t.Errorf("got %s", got)
	}
	if got := serve(p, "GET", "example.com", "/x"); got != "404" {
		t.Errorf("bare domain: got %s", got)
	}
}

func TestCertificate(t *testing.T) {
	certs := map[string]*tls.Certificate{}
	cert := func(name string) Cert {
		c := &tls.Certificate{}
		certs[name] = c
		return Cert{Hostname: name, Cert: c}
	}
	full := &Port{Bind: 443, Certs: []Cert{cert("*.example.com"), cert("foo.example.com"), cert("*.b.example.com"), cert("")}}
	only := &Port{Bind: 443, Certs: []Cert{cert("only.example.com")}}
	for _, tc := range []struct {
		port       *Port
		serverName string
		want       string
		err        string
	}{
		{full, "foo.example.com", "foo.example.com", ""},
		{full, "FOO.example.com.", "foo.example.com", ""},
		{full, "bar.example.com", "*.example.com", ""},
		{full, "x.b.example.com", "*.b.example.com", ""},
		{full, "example.com", "", ""},
		{full, "other.org", "", ""},
		{full, "", "", ""},
		{only, "", "only.example.com", ""},
		{only, "other.org", "", `server name "other.org"`},
		{&Port{Bind: 443}, "", "", "without server name"},
	} {
		got, err := tc.port.Certificate(&tls.ClientHelloInfo{ServerName: tc.serverName})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want one containing %q", tc.serverName, err, tc.err)
			}
			continue
		}
		if err != nil || got != certs[tc.want] {
			t.Errorf("%q: got %p (err %v), want the %q certificate", tc.serverName, got, err, tc.want)
		}
	}
}

// Listener isolation: a listener hostname with no rules still claims its
// requests (404) instead of passing them to a less specific hostname.
func TestReserve(t *testing.T) {
	p := NewPort(8080, 80, HTTP)
	p.Add("*.example.com", &Rule{Action: &Action{Route: "wild"}})
	p.Add("", &Rule{Action: &Action{Route: "any"}})
	p.Reserve("*.foo.example.com")
	p.Reserve("Abc.Example.com")
	p.Reserve("*.example.com") // has rules: unchanged
	p.Finish()
	check(t, p, []expect{
		{"x.example.com", "/", nil, "wild"},
		{"x.foo.example.com", "/", nil, "404"},
		{"abc.example.com", "/", nil, "404"},
		{"other.org", "/", nil, "any"},
	})
	if h := p.Lookup("x.example.com"); len(h.Rules) != 1 {
		t.Errorf("*.example.com has %d rules after Reserve, want 1", len(h.Rules))
	}
}
