package table

import (
	"net/http"
	"net/textproto"
	"net/url"
	"regexp"
	"strings"
)

// Matching a request against one HTTPRouteMatch.
//
// The path. Go's r.URL.Path is decoded, so "/a%2Fb" would look like
// "/a/b" and match rules the client never asked for; matching the raw
// path instead would let "/%61dmin" slip past a rule for "/admin". We
// match CanonicalPath(r.URL.EscapedPath()): the path as received, with
// percent-encoded unreserved characters decoded, other escapes in upper
// case and dot segments removed (RFC 3986 6.2.2 and 5.2.4; what Envoy's
// normalize_path does). Route values are written in the same encoded
// form (the CRD allows only unreserved characters and %XX in them).
// The proxy should forward the same canonical path so the backend sees
// what was routed.
//
// Regular expressions (RE2) must match the whole path, header value or
// query value, as in Envoy: prepare anchors them.
//
// A header sent several times is matched as one value, its field values
// joined with "," (RFC 9110 5.3, which the spec points to). A query
// parameter sent several times is matched on its first value, as the
// spec recommends.

// Matches reports whether r satisfies every condition of m.
func (m *Match) Matches(r *http.Request) bool {
	return m.matches(CanonicalPath(r.URL.EscapedPath()), r)
}

func (m *Match) matches(path string, r *http.Request) bool {
	return m.Path.matches(path) &&
		(m.Method == "" || m.Method == r.Method) &&
		headersMatch(m.Headers, r) &&
		queryMatch(m.Query, r.URL.RawQuery)
}

func (p *PathMatch) matches(path string) bool {
	switch p.Type {
	case PathExact:
		return path == p.Value
	case PathRegex:
		return p.Regexp != nil && p.Regexp.MatchString(path)
	default: // PathPrefix, and "" (no path condition) like "/"
		return prefixMatches(p.Value, path)
	}
}

// prefixMatches is the element-wise prefix match: "/foo" (or "/foo/")
// matches "/foo", "/foo/" and "/foo/bar", not "/foobar"; "/" matches
// every path.
func prefixMatches(prefix, path string) bool {
	prefix = strings.TrimSuffix(prefix, "/")
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || path[len(prefix)] == '/'
}

func headersMatch(ms []ValueMatch, r *http.Request) bool {
	for i := range ms {
		m := &ms[i]
		var v string
		if m.Name == "Host" { // net/http moves it out of r.Header
			v = r.Host
		} else {
			vs, ok := r.Header[m.Name]
			if !ok {
				return false
			}
			if len(vs) == 1 {
				v = vs[0]
			} else {
				v = strings.Join(vs, ",")
			}
		}
		if !m.matches(v) {
			return false
		}
	}
	return true
}

func queryMatch(ms []ValueMatch, raw string) bool {
	for i := range ms {
		v, ok := firstQueryValue(raw, ms[i].Name)
		if !ok || !ms[i].matches(v) {
			return false
		}
	}
	return true
}

func (m *ValueMatch) matches(v string) bool {
	if m.Regexp != nil {
		return m.Regexp.MatchString(v)
	}
	return v == m.Value
}

// firstQueryValue returns the first value of name in a raw query string
// (names compared exactly, after unescaping, as url.ParseQuery would),
// without building the whole url.Values.
func firstQueryValue(raw, name string) (string, bool) {
	for raw != "" {
		var kv string
		kv, raw, _ = strings.Cut(raw, "&")
		if kv == "" || strings.Contains(kv, ";") {
			continue // url.ParseQuery rejects ';' too
		}
		k, v, _ := strings.Cut(kv, "=")
		if strings.ContainsAny(k, "%+") {
			var err error
			if k, err = url.QueryUnescape(k); err != nil {
				continue
			}
		}
		if k != name {
			continue
		}
		if strings.ContainsAny(v, "%+") {
			var err error
			if v, err = url.QueryUnescape(v); err != nil {
				continue
			}
		}
		return v, true
	}
	return "", false
}

// prepare puts m in the form matching relies on: header names canonical,
// regular expressions anchored, an empty path type the default prefix.
func (m *Match) prepare() {
	// Only write what changes: a Rule the compiler carries over from the
	// previous table may be read by requests right now.
	if m.Path.Type == "" {
		m.Path.Type = PathPrefix
	}
	if m.Path.Type == PathPrefix && m.Path.Value == "" {
		m.Path.Value = "/"
	}
	if m.Path.Type != PathRegex {
		if v := CanonicalPath(m.Path.Value); v != m.Path.Value {
			m.Path.Value = v
		}
	}
	anchorIn(&m.Path.Regexp)
	for i := range m.Headers {
		if n := textproto.CanonicalMIMEHeaderKey(m.Headers[i].Name); n != m.Headers[i].Name {
			m.Headers[i].Name = n
		}
		anchorIn(&m.Headers[i].Regexp)
	}
	for i := range m.Query {
		anchorIn(&m.Query[i].Regexp)
	}
}

func anchorIn(re **regexp.Regexp) {
	if a := anchor(*re); a != *re {
		*re = a
	}
}

// anchor returns re made to match whole strings only. The compiler can
// save the recompilation by passing "^(?:expr)$" itself.
func anchor(re *regexp.Regexp) *regexp.Regexp {
	if re == nil {
		return nil
	}
	s := re.String()
	if strings.HasPrefix(s, "^(?:") && strings.HasSuffix(s, ")$") {
		return re
	}
	// A valid expression stays valid inside a group.
	return regexp.MustCompile("^(?:" + s + ")$")
}

// CanonicalPath normalizes an escaped URL path for matching: percent
// escapes of unreserved characters decoded, the others in upper case,
// "." and ".." segments removed, a stray "%" escaped. A path that needs none of it is
// returned as is, without allocating.
func CanonicalPath(p string) string {
	if !strings.Contains(p, "%") && !strings.Contains(p, "/.") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			d := unhex(p[i+1])<<4 | unhex(p[i+2])
			if isUnreserved(d) {
				b.WriteByte(d)
			} else {
				b.WriteByte('%')
				b.WriteByte(upper(p[i+1]))
				b.WriteByte(upper(p[i+2]))
			}
			i += 2
			continue
		}
		if c == '%' { // not an escape: escape it, so a decoded byte cannot complete it
			b.WriteString("%25")
			continue
		}
		b.WriteByte(c)
	}
	return removeDotSegments(b.String())
}

// removeDotSegments is RFC 3986 5.2.4 for an absolute path.
func removeDotSegments(p string) string {
	if !strings.Contains(p, "/.") {
		return p
	}
	var out []string // segments written so far, each with its leading "/"
	in := p
	for in != "" {
		switch {
		case strings.HasPrefix(in, "/./"):
			in = in[2:]
		case in == "/.":
			in = "/"
		case strings.HasPrefix(in, "/../"):
			in = in[3:]
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case in == "/..":
			in = "/"
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case in == "." || in == "..":
			in = ""
		default:
			i := strings.IndexByte(in[1:], '/')
			if i < 0 {
				out = append(out, in)
				in = ""
			} else {
				out = append(out, in[:i+1])
				in = in[i+1:]
			}
		}
	}
	return strings.Join(out, "")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}
