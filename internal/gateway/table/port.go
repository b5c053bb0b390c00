package table

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Building a Port. The compiler calls NewPort, Add for every Rule under
// its effective hostname, then Finish once; after Finish the Port is
// read-only and safe for concurrent Lookups. Finish also builds two
// indexes (unexported, so a Port or Host written by hand in a test still
// works, only slower): wildcards by suffix, so Lookup costs one map probe
// per label of the request's host, and, on hosts with many rules, rules
// by path, so Match looks at the few rules that can match the path rather
// than all of them (10,000 prefixes under one hostname is a real setup).

// NewPort returns an empty Port ready for Add.
func NewPort(bind, listen int32, protocol Protocol) *Port {
	return &Port{Bind: bind, Listen: listen, Protocol: protocol, Exact: map[string]*Host{}}
}

// Add files r under hostname: "" (no hostname: Any), "*.example.com"
// (a wildcard) or an exact name; case and a trailing dot do not matter.
func (p *Port) Add(hostname string, r *Rule) {
	h := p.host(canonicalHost(hostname))
	h.Rules = append(h.Rules, r)
}

// Reserve files an empty Host under hostname (a listener's hostname) if it
// has none, so a request for it is answered from that hostname's rules
// only, none meaning 404, and never falls through to a less specific
// wildcard or to Any. That is listener isolation for a listener that no
// route (or no route hostname) reaches: with listeners "*.example.com"
// and "*.foo.example.com", a request for a.foo.example.com belongs to the
// second even when only the first has routes.
func (p *Port) Reserve(hostname string) {
	p.host(canonicalHost(hostname))
}

func (p *Port) host(name string) *Host {
	switch {
	case name == "":
		if p.Any == nil {
			p.Any = &Host{}
		}
		return p.Any
	case strings.HasPrefix(name, "*."):
		h, added := hostIn(&p.wild, name[1:], name)
		if added {
			p.Wildcards = append(p.Wildcards, h)
		}
		return h
	default:
		h, _ := hostIn(&p.Exact, name, name)
		return h
	}
}

// hostIn returns the Host filed under key in *m, adding one named name.
func hostIn(m *map[string]*Host, key, name string) (h *Host, added bool) {
	if h = (*m)[key]; h != nil {
		return h, false
	}
	if *m == nil {
		*m = map[string]*Host{}
	}
	h = &Host{Name: name}
	(*m)[key] = h
	return h, true
}

// Finish sorts every Host's rules by precedence (SortGRPC when the
// rules are GRPCRoute rules), orders Wildcards longest suffix first and
// builds the indexes.
func (p *Port) Finish() {
	p.wild = make(map[string]*Host, len(p.Wildcards))
	for _, h := range p.Wildcards {
		p.wild[h.Name[1:]] = h
	}
	slices.SortFunc(p.Wildcards, compareWildcards)
	for _, h := range p.Exact {
		h.finish()
	}
	for _, h := range p.Wildcards {
		h.finish()
	}
	if p.Any != nil {
		p.Any.finish()
	}
}

// compareWildcards orders wildcard Hosts longest suffix first.
func compareWildcards(a, b *Host) int {
	if len(a.Name) != len(b.Name) {
		return len(b.Name) - len(a.Name)
	}
	return strings.Compare(a.Name, b.Name)
}

func (h *Host) finish() {
	for _, r := range h.Rules {
		r.Match.prepare()
	}
	if isGRPC(h.Rules) {
		SortGRPC(h.Rules)
	} else {
		Sort(h.Rules)
	}
	h.index = nil
	if len(h.Rules) >= indexMin {
		h.index = newRuleIndex(h.Rules)
	}
}

// isGRPC: a hostname holds either GRPCRoute or HTTPRoute rules in
// practice; the spec forbids merging the two, so when both are present
// the HTTP precedence orders them.
func isGRPC(rules []*Rule) bool {
	if len(rules) == 0 {
		return false
	}
	for _, r := range rules {
		if r.Action == nil || !r.Action.GRPC {
			return false
		}
	}
	return true
}

// Lookup returns the Host for a request's Host header or :authority
// (port, brackets of an IPv6 literal, case and a trailing dot do not
// matter): the exact hostname, else the longest wildcard that matches,
// else Any. Only that Host is considered, as the spec orders (a request
// for a.example.com that matches none of a.example.com's rules is a 404
// even when *.example.com has a rule that would match). nil means 404.
func (p *Port) Lookup(host string) *Host {
	host = canonicalHost(stripPort(host))
	if h := p.Exact[host]; h != nil {
		return h
	}
	if p.wild != nil {
		// Longest suffix first: every label boundary after the first
		// label, left to right ("*" stands for one label or more).
		for i := strings.IndexByte(host, '.'); i > 0 && i < len(host)-1; {
			if h := p.wild[host[i:]]; h != nil {
				return h
			}
			j := strings.IndexByte(host[i+1:], '.')
			if j < 0 {
				break
			}
			i += 1 + j
		}
	} else {
		for _, h := range p.Wildcards {
			if wildcardMatches(h.Name, host) {
				return h
			}
		}
	}
	return p.Any
}

// wildcardMatches reports whether "*.example.com" covers host: one label
// or more before ".example.com", never example.com itself.
func wildcardMatches(wildcard, host string) bool {
	suffix := wildcard[1:]
	return len(host) > len(suffix) && strings.HasSuffix(host, suffix) && host[0] != '.'
}

// stripPort removes ":port" and the brackets of an IPv6 literal.
func stripPort(host string) string {
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			return host[1:i]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.IndexByte(host, ':') == i {
		return host[:i]
	}
	return host
}

// canonicalHost lower-cases and drops a trailing dot, without allocating
// for a name that is already canonical.
func canonicalHost(host string) string {
	host = strings.TrimSuffix(host, ".")
	for i := 0; i < len(host); i++ {
		if c := host[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(host)
		}
	}
	return host
}

// Match returns the first Rule, in precedence order, whose Match matches
// r; nil means 404.
func (h *Host) Match(r *http.Request) *Rule {
	if h == nil {
		return nil
	}
	path := CanonicalPath(r.URL.EscapedPath())
	if h.index != nil {
		return h.index.match(h.Rules, path, r)
	}
	for _, rule := range h.Rules {
		if rule.Match.matches(path, r) {
			return rule
		}
	}
	return nil
}

// Certificate picks the listener certificate for a TLS handshake: the
// listener whose hostname equals the server name, else the most specific
// wildcard that covers it, else the listener with no hostname. Without
// SNI (a client dialing an IP) it is the no-hostname certificate, else
// the first one.
func (p *Port) Certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := canonicalHost(hello.ServerName)
	if c := p.Listener(name); c != nil {
		return c.Cert, nil
	}
	if name == "" && len(p.Certs) > 0 {
		return p.Certs[0].Cert, nil
	}
	if name == "" {
		return nil, fmt.Errorf("no certificate on port %d for a client without server name", p.Bind)
	}
	return nil, fmt.Errorf("no certificate on port %d for server name %q", p.Bind, name)
}

// Listener returns the Cert of the HTTPS listener that serves name (a
// server name or a Host, any case): the one whose hostname equals it,
// else the most specific wildcard covering it, else the one with no
// hostname; nil when none does. The proxy answers 421 to a request whose
// Host another listener than its TLS server name's serves.
func (p *Port) Listener(name string) *Cert {
	name = canonicalHost(name)
	var wild, any *Cert
	wildLen := 0
	for i := range p.Certs {
		c := &p.Certs[i]
		h := canonicalHost(c.Hostname)
		switch {
		case h == "":
			if any == nil {
				any = c
			}
		case name == "":
		case h == name:
			return c
		case strings.HasPrefix(h, "*.") && wildcardMatches(h, name):
			if len(h) > wildLen {
				wild, wildLen = c, len(h)
			}
		}
	}
	if wild != nil {
		return wild
	}
	return any
}
