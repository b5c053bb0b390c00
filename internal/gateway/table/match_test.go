package table

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
)

// req builds a request; target is "path?query", headers name/value pairs
// (a name given twice is sent twice).
func req(method, host, target string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, "http://"+host+target, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestPrefixMatches(t *testing.T) {
	for _, tc := range []struct {
		prefix, path string
		want         bool
	}{
		{"/", "/", true},
		{"/", "/anything/at/all", true},
		{"/foo", "/foo", true},
		{"/foo", "/foo/", true},
		{"/foo", "/foo/bar", true},
		{"/foo", "/foobar", false},
		{"/foo", "/fo", false},
		{"/foo", "/", false},
		{"/foo/", "/foo", true}, // the trailing slash is ignored
		{"/foo/", "/foo/bar", true},
		{"/foo/", "/foobar", false},
		{"/foo/bar", "/foo/bar/baz", true},
		{"/foo/bar", "/foo/baz", false},
		{"/foo/bar", "/foo", false},
		{"/v2", "/v2example", false},
		{"/v2", "/v2/example", true},
	} {
		if got := prefixMatches(tc.prefix, tc.path); got != tc.want {
			t.Errorf("prefix %q path %q: got %v, want %v", tc.prefix, tc.path, got, tc.want)
		}
	}
}

func TestMatchMatches(t *testing.T) {
	re := regexp.MustCompile
	for _, tc := range []struct {
		name  string
		match Match
		req   *http.Request
		want  bool
	}{
		{"exact", Match{Path: PathMatch{Type: PathExact, Value: "/a/b"}}, req("GET", "h", "/a/b"), true},
		{"exact trailing slash differs", Match{Path: PathMatch{Type: PathExact, Value: "/a/b"}}, req("GET", "h", "/a/b/"), false},
		{"exact ignores query", Match{Path: PathMatch{Type: PathExact, Value: "/a"}}, req("GET", "h", "/a?x=1"), true},
		{"exact case sensitive", Match{Path: PathMatch{Type: PathExact, Value: "/a"}}, req("GET", "h", "/A"), false},
		{"prefix element", Match{Path: PathMatch{Type: PathPrefix, Value: "/foo"}}, req("GET", "h", "/foo/bar"), true},
		{"prefix not partial element", Match{Path: PathMatch{Type: PathPrefix, Value: "/foo"}}, req("GET", "h", "/foobar"), false},
		{"empty match is everything", Match{}, req("GET", "h", "/x"), true},
		{"regex full match", Match{Path: PathMatch{Type: PathRegex, Value: "/v[0-9]+/.*", Regexp: re("/v[0-9]+/.*")}}, req("GET", "h", "/v12/x"), true},
		{"regex anchored at start", Match{Path: PathMatch{Type: PathRegex, Regexp: re("/v[0-9]+")}}, req("GET", "h", "/x/v1"), false},
		{"regex anchored at end", Match{Path: PathMatch{Type: PathRegex, Regexp: re("/v[0-9]+")}}, req("GET", "h", "/v1/x"), false},
		{"regex alternation matches whole", Match{Path: PathMatch{Type: PathRegex, Regexp: re("/a|/ab")}}, req("GET", "h", "/ab"), true},
		{"regex without Regexp never matches", Match{Path: PathMatch{Type: PathRegex, Value: "/.*"}}, req("GET", "h", "/x"), false},
		{"method", Match{Method: "POST"}, req("POST", "h", "/"), true},
		{"method other", Match{Method: "POST"}, req("GET", "h", "/"), false},
		{"header exact", Match{Headers: []ValueMatch{{Name: "Version", Value: "one"}}}, req("GET", "h", "/", "version", "one"), true},
		{"header name not canonical in match", Match{Headers: []ValueMatch{{Name: "x-version", Value: "one"}}}, req("GET", "h", "/", "X-VERSION", "one"), true},
		{"header value case sensitive", Match{Headers: []ValueMatch{{Name: "Version", Value: "one"}}}, req("GET", "h", "/", "version", "One"), false},
		{"header missing", Match{Headers: []ValueMatch{{Name: "Version", Value: "one"}}}, req("GET", "h", "/"), false},
		{"headers all required", Match{Headers: []ValueMatch{{Name: "Version", Value: "two"}, {Name: "Color", Value: "orange"}}}, req("GET", "h", "/", "version", "two"), false},
		{"headers all present", Match{Headers: []ValueMatch{{Name: "Version", Value: "two"}, {Name: "Color", Value: "orange"}}}, req("GET", "h", "/", "version", "two", "color", "orange"), true},
		{"repeated header joined", Match{Headers: []ValueMatch{{Name: "X", Value: "a,b"}}}, req("GET", "h", "/", "x", "a", "x", "b"), true},
		{"repeated header not one of them", Match{Headers: []ValueMatch{{Name: "X", Value: "a"}}}, req("GET", "h", "/", "x", "a", "x", "b"), false},
		{"header regex full", Match{Headers: []ValueMatch{{Name: "X", Regexp: re("v[0-9]")}}}, req("GET", "h", "/", "x", "v1"), true},
		{"header regex not partial", Match{Headers: []ValueMatch{{Name: "X", Regexp: re("v[0-9]")}}}, req("GET", "h", "/", "x", "v12"), false},
		{"header empty value present", Match{Headers: []ValueMatch{{Name: "X", Value: ""}}}, req("GET", "h", "/", "x", ""), true},
		{"host header", Match{Headers: []ValueMatch{{Name: "host", Value: "h.example"}}}, req("GET", "h.example", "/"), true},
		{"query exact", Match{Query: []ValueMatch{{Name: "animal", Value: "whale"}}}, req("GET", "h", "/?animal=whale"), true},
		{"query name case sensitive", Match{Query: []ValueMatch{{Name: "animal", Value: "whale"}}}, req("GET", "h", "/?ANIMAL=whale"), false},
		{"query value not prefix", Match{Query: []ValueMatch{{Name: "animal", Value: "whale"}}}, req("GET", "h", "/?animal=whaledolphin"), false},
		{"query first value", Match{Query: []ValueMatch{{Name: "a", Value: "1"}}}, req("GET", "h", "/?a=1&a=2"), true},
		{"query not second value", Match{Query: []ValueMatch{{Name: "a", Value: "2"}}}, req("GET", "h", "/?a=1&a=2"), false},
		{"query unescaped", Match{Query: []ValueMatch{{Name: "a b", Value: "c/d e"}}}, req("GET", "h", "/?a+b=c%2Fd%20e"), true},
		{"query no value", Match{Query: []ValueMatch{{Name: "a", Value: ""}}}, req("GET", "h", "/?a"), true},
		{"query missing", Match{Query: []ValueMatch{{Name: "a", Value: ""}}}, req("GET", "h", "/?b=1"), false},
		{"query regex", Match{Query: []ValueMatch{{Name: "a", Regexp: re("[0-9]+")}}}, req("GET", "h", "/?x=y&a=123"), true},
		{"query regex full", Match{Query: []ValueMatch{{Name: "a", Regexp: re("[0-9]+")}}}, req("GET", "h", "/?a=123x"), false},
		{"all conditions", Match{Path: PathMatch{Type: PathPrefix, Value: "/path2"}, Method: "GET",
			Headers: []ValueMatch{{Name: "Version", Value: "two"}}, Query: []ValueMatch{{Name: "animal", Value: "whale"}}},
			req("GET", "h", "/path2?animal=whale", "version", "two"), true},
		{"encoded unreserved decoded", Match{Path: PathMatch{Type: PathPrefix, Value: "/admin"}}, req("GET", "h", "/%61dmin/x"), true},
		{"encoded slash stays encoded", Match{Path: PathMatch{Type: PathExact, Value: "/a/b"}}, req("GET", "h", "/a%2Fb"), false},
		{"encoded slash matches encoded value", Match{Path: PathMatch{Type: PathExact, Value: "/a%2fb"}}, req("GET", "h", "/a%2Fb"), true},
		{"dot segments removed", Match{Path: PathMatch{Type: PathPrefix, Value: "/admin"}}, req("GET", "h", "/public/../admin"), true},
		{"dot segments do not escape the prefix", Match{Path: PathMatch{Type: PathPrefix, Value: "/public"}}, req("GET", "h", "/public/../admin"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.match
			m.prepare()
			if got := m.Matches(tc.req); got != tc.want {
				t.Errorf("%+v on %s %s %v: got %v, want %v", tc.match, tc.req.Method, tc.req.URL, tc.req.Header, got, tc.want)
			}
		})
	}
}

func TestCanonicalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/":                 "/",
		"/a/b":              "/a/b",
		"/%61%62c":          "/abc",
		"/%7efoo":           "/~foo",
		"/a%2fb":            "/a%2Fb",
		"/a%20b":            "/a%20b",
		"/a/./b":            "/a/b",
		"/a/../b":           "/b",
		"/../../a":          "/a",
		"/a/b/..":           "/a/",
		"/a/.":              "/a/",
		"/a/%2e%2E/b":       "/b",
		"/.well-known/x":    "/.well-known/x",
		"/a/..b/c":          "/a/..b/c",
		"/bad%zz":           "/bad%25zz",
		"/trailing%":        "/trailing%25",
		"/%%370":            "/%2570",
		"/a//b":             "/a//b",
		"*":                 "*",
		"":                  "",
		"/x/%2E%2E%2Fadmin": "/x/..%2Fadmin",
	} {
		if got := CanonicalPath(in); got != want {
			t.Errorf("CanonicalPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCanonicalPathDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { CanonicalPath("/api/v1/users/12345") }); n != 0 {
		t.Errorf("%v allocations for a clean path", n)
	}
}

func TestFirstQueryValue(t *testing.T) {
	for _, tc := range []struct {
		raw, name, want string
		ok              bool
	}{
		{"a=1", "a", "1", true},
		{"b=2&a=1&a=3", "a", "1", true},
		{"a", "a", "", true},
		{"a=", "a", "", true},
		{"", "a", "", false},
		{"ab=1", "a", "", false},
		{"x=1;a=2", "a", "", false},
		{"a=%zz&a=2", "a", "2", true},
		{"%61=1", "a", "1", true},
	} {
		got, ok := firstQueryValue(tc.raw, tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("firstQueryValue(%q, %q) = %q, %v; want %q, %v", tc.raw, tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzCanonicalPath(f *testing.F) {
	for _, s := range []string{"/", "/a/../b", "/%2e%2e/x", "/a%2Fb", "/./.", "//..//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c := CanonicalPath(p)
		if CanonicalPath(c) != c {
			t.Errorf("not idempotent: %q -> %q -> %q", p, c, CanonicalPath(c))
		}
	})
}
