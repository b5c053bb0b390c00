package table

import (
	"maps"
	"slices"
	"strings"
)

// Copy-on-write edits of a finished Port, for the incremental compiler:
// the Port the proxy serves is read concurrently and never changes, so a
// route change clones it (Clone: the host maps and the wildcard list,
// not the Hosts or Rules) and replaces only the Hosts the change touched
// (Replace, Remove) in the clone. Every untouched *Host is shared by both
// tables; the cost is O(hostnames on the port) map copying plus the
// touched hosts' sorting, never O(rules).

// Clone returns a copy of p that shares p's Hosts, Rules and Certs.
func (p *Port) Clone() *Port {
	cp := *p
	cp.Exact = maps.Clone(p.Exact)
	if cp.Exact == nil {
		cp.Exact = map[string]*Host{}
	}
	cp.Wildcards = slices.Clone(p.Wildcards)
	cp.wild = make(map[string]*Host, len(p.Wildcards))
	for _, h := range p.Wildcards {
		cp.wild[h.Name[1:]] = h
	}
	return &cp
}

// Hosted returns the Host filed under hostname itself ("" for Any), not
// the one a request for it would find; nil when there is none.
func (p *Port) Hosted(hostname string) *Host {
	name := canonicalHost(hostname)
	switch {
	case name == "":
		return p.Any
	case strings.HasPrefix(name, "*."):
		for _, h := range p.Wildcards {
			if h.Name == name {
				return h
			}
		}
		return nil
	}
	return p.Exact[name]
}

// Replace files a new Host holding rules (in any order: it sorts them
// and builds the index, as Finish does) under hostname, in place of the
// one there. Call it on a Clone only. rules may be empty: a listener's
// hostname keeps an empty Host (see Reserve).
func (p *Port) Replace(hostname string, rules []*Rule) {
	name := canonicalHost(hostname)
	h := &Host{Name: name, Rules: rules}
	h.finish()
	p.set(name, h)
}

// Remove drops the Host filed under hostname, if any. Call it on a Clone
// only.
func (p *Port) Remove(hostname string) {
	p.set(canonicalHost(hostname), nil)
}

// set files h (nil: nothing) under the canonical name, keeping Wildcards
// in Finish's order and the suffix index in step.
func (p *Port) set(name string, h *Host) {
	switch {
	case name == "":
		p.Any = h
	case strings.HasPrefix(name, "*."):
		p.Wildcards = slices.DeleteFunc(p.Wildcards, func(x *Host) bool { return x.Name == name })
		if p.wild == nil {
			p.wild = map[string]*Host{}
		}
		delete(p.wild, name[1:])
		if h != nil {
			p.Wildcards = append(p.Wildcards, h)
			p.wild[name[1:]] = h
			slices.SortFunc(p.Wildcards, compareWildcards)
		}
	case h == nil:
		delete(p.Exact, name)
	default:
		p.Exact[name] = h
	}
}
