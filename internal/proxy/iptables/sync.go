package iptables

import (
	"maps"
	"slices"
	"sort"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/proxy"
)

// Existing is what a full sync found: both tables as iptables-save
// printed them (nil: empty).
type Existing struct{ Nat, Filter *ipt.Table }

func (e *Existing) table(name string) *ipt.Table {
	if e == nil {
		return nil
	}
	if name == tableNat {
		return e.Nat
	}
	return e.Filter
}

// op is one rule command of a restore input.
type op struct {
	insert bool // -I chain 1, else -A
	chain  string
	args   rule
}

// section is one table's part of a restore input, in the order
// iptables-restore needs it: chains declared (created or flushed) before
// any rule refers to them, rules deleted, rules added, and chains deleted
// last, once nothing refers to them.
type section struct {
	declare []string
	deletes []ipt.Rule
	rules   []op
	remove  []string
}

func (s *section) lines() int {
	return len(s.declare) + len(s.deletes) + len(s.rules) + len(s.remove)
}

// Input is one sync's iptables-restore --noflush input, both tables.
type Input struct {
	sections map[string]*section
}

func newInput() *Input {
	return &Input{sections: map[string]*section{tableNat: {}, tableFilter: {}}}
}

func (in *Input) s(table string) *section { return in.sections[table] }

// Lines counts the input's commands (chain declarations included).
func (in *Input) Lines() int {
	n := 0
	for _, s := range in.sections {
		n += s.lines()
	}
	return n
}

// Bytes renders the input; tables with nothing to do are left out.
func (in *Input) Bytes() []byte {
	var out []byte
	for _, t := range tables {
		s := in.sections[t]
		if s.lines() == 0 {
			continue
		}
		b := ipt.NewBuilder(t)
		for _, c := range s.declare {
			b.DeclareChain(c)
		}
		for _, r := range s.deletes {
			b.Delete(r.Chain, r.Args...)
		}
		for _, o := range s.rules {
			if o.insert {
				b.Insert(o.chain, 1, o.args...)
			} else {
				b.Append(o.chain, o.args...)
			}
		}
		for _, c := range s.remove {
			b.DeleteChain(c)
		}
		out = append(out, b.Bytes()...)
	}
	return out
}

func (in *Input) String() string { return string(in.Bytes()) }

// addDispatch writes d: catch-alls appended, port rules inserted first.
func (in *Input) addDispatch(d dispatch) {
	in.s(d.Table).rules = append(in.s(d.Table).rules, op{insert: !d.Last, chain: d.Chain, args: d.Args})
}

// Full renders the whole ruleset and returns it with the new state.
// existing (both tables as read before) names the chains to delete and
// the jumps already in place; nil means empty tables.
func (r *Renderer) Full(services []*proxy.Service, existing *Existing) (*State, *Input) {
	next := newState()
	sorted := slices.Clone(services)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Key() < sorted[j].Key() })
	keys := make([]string, 0, len(sorted))
	for _, svc := range sorted {
		o := r.renderService(svc)
		next.claim(svc.Key(), o)
		next.services[svc.Key()] = o
		keys = append(keys, svc.Key())
	}
	// Every chain of ours with its rules: the fixed chains (the
	// services' port rules, the fixed tail, the catch-alls), then the
	// services' own.
	base := r.base()
	want := make(map[chainRef][]rule, len(base))
	for ref := range base {
		want[ref] = nil // wanted even when empty
	}
	var first, last []dispatch
	for _, key := range keys {
		o := next.services[key]
		for _, k := range sortedClaims(o.claims) {
			for _, d := range o.claims[k] {
				if d.Last {
					last = append(last, d)
				} else {
					first = append(first, d)
				}
			}
		}
		for ref, rules := range o.chains {
			want[ref] = rules
		}
	}
	for _, d := range first {
		want[d.chainRef] = append(want[d.chainRef], d.Args)
	}
	for ref, rules := range base {
		want[ref] = append(want[ref], rules...)
	}
	for _, d := range last {
		want[d.chainRef] = append(want[d.chainRef], d.Args)
	}

	in := newInput()
	saved := map[string]map[string][]ipt.Rule{}
	for _, t := range tables {
		saved[t] = map[string][]ipt.Rule{}
		if tbl := existing.table(t); tbl != nil {
			for _, c := range tbl.Chains {
				saved[t][c] = []ipt.Rule{}
			}
			for _, rl := range tbl.Rules {
				saved[t][rl.Chain] = append(saved[t][rl.Chain], rl)
			}
		}
	}
	// A chain whose saved rules are what we want is left alone (rules are
	// written as iptables-save prints them); any other is declared, which
	// creates or flushes it, and refilled.
	for _, ref := range sortedChains(want) {
		had, ok := saved[ref.Table][ref.Chain]
		if ok && slices.EqualFunc(had, want[ref], func(h ipt.Rule, w rule) bool { return slices.Equal(h.Args, w) }) {
			continue
		}
		s := in.s(ref.Table)
		s.declare = append(s.declare, ref.Chain)
		for _, rl := range want[ref] {
			s.rules = append(s.rules, op{chain: ref.Chain, args: rl})
		}
	}
	// Chains of ours nobody wants (a restart, a config change): flushed
	// by their declaration, deleted at the end, after the jumps to them
	// from other chains are deleted.
	for _, t := range tables {
		tbl := existing.table(t)
		if tbl == nil {
			continue
		}
		stale := map[string]bool{}
		for _, c := range tbl.Chains {
			if _, ok := want[chainRef{t, c}]; Ours(c) && !ok {
				stale[c] = true
			}
		}
		for _, rl := range tbl.Rules {
			if stale[rl.Target()] && !Ours(rl.Chain) {
				in.s(t).deletes = append(in.s(t).deletes, rl)
			}
		}
		for _, c := range slices.Sorted(maps.Keys(stale)) {
			in.s(t).declare = append(in.s(t).declare, c)
			in.s(t).remove = append(in.s(t).remove, c)
		}
	}
	// Jumps from the built-in chains, inserted first where missing (in
	// reverse, so that several missing ones keep their order).
	js := jumps()
	for i := len(js) - 1; i >= 0; i-- {
		j := js[i]
		present := slices.ContainsFunc(saved[j.Table][j.Chain], func(rl ipt.Rule) bool { return rl.Target() == j.target() })
		if !present {
			in.s(j.Table).rules = append(in.s(j.Table).rules, op{insert: true, chain: j.Chain, args: j.Args})
		}
	}
	return next, in
}

// Partial renders only what changed for the services named in changed
// (keys "namespace/name"; a key absent from services was deleted) since
// prev, which must come from an earlier sync whose restore ran. prev is
// updated in place (the cost follows the change, not the service count)
// and returned; if the restore then fails, the next sync must be Full.
func (r *Renderer) Partial(services []*proxy.Service, prev *State, changed map[string]bool) (*State, *Input) {
	return r.partial(prev, proxy.ChangesOf(services, changed))
}

// partial is Partial with the changed services' models at hand (the
// proxier's rounds carry them).
func (r *Renderer) partial(prev *State, changed proxy.Changes) (*State, *Input) {
	in := newInput()
	next := prev
	next.Conflicts = nil
	keys := slices.Sorted(maps.Keys(changed))
	for _, key := range keys {
		if old := prev.services[key]; old != nil {
			next.release(key, old)
		}
	}
	for _, key := range keys {
		old := prev.services[key]
		if old == nil {
			old = newObjects()
		}
		nw := newObjects()
		delete(next.services, key)
		if svc := changed[key]; svc != nil {
			nw = r.renderService(svc)
			next.claim(key, nw)
			next.services[key] = nw
		}
		for _, ref := range sortedChains(old.chains) {
			if _, ok := nw.chains[ref]; !ok {
				in.s(ref.Table).declare = append(in.s(ref.Table).declare, ref.Chain)
				in.s(ref.Table).remove = append(in.s(ref.Table).remove, ref.Chain)
			}
		}
		for _, ref := range sortedChains(nw.chains) {
			if had, ok := old.chains[ref]; ok && slices.EqualFunc(had, nw.chains[ref], slices.Equal) {
				continue
			}
			s := in.s(ref.Table)
			s.declare = append(s.declare, ref.Chain)
			for _, rl := range nw.chains[ref] {
				s.rules = append(s.rules, op{chain: ref.Chain, args: rl})
			}
		}
		// A claim's rules are replaced together when any differs: their
		// order matters (a firewall's RETURNs before its DROP), and
		// inserting them first in reverse keeps it.
		for _, k := range sortedClaims(merge(old.claims, nw.claims)) {
			was, now := old.claims[k], nw.claims[k]
			if slices.EqualFunc(was, now, func(a, b dispatch) bool { return a.id() == b.id() }) {
				continue
			}
			for _, d := range was {
				in.s(d.Table).deletes = append(in.s(d.Table).deletes, ipt.Rule{Chain: d.Chain, Args: d.Args})
			}
			for _, d := range now {
				if d.Last {
					in.addDispatch(d)
				}
			}
			for i := len(now) - 1; i >= 0; i-- {
				if !now[i].Last {
					in.addDispatch(now[i])
				}
			}
		}
	}
	return next, in
}

// merge returns the union of a's and b's keys.
func merge[V any](a, b map[claimKey]V) map[claimKey]bool {
	out := make(map[claimKey]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func setOf[T comparable](xs []T) map[T]bool {
	m := make(map[T]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}
