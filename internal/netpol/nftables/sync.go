package nftables

// Syncs. The Syncer keeps the Ruleset its last transaction committed and
// sends only the difference: element adds and deletes, and a flush and
// rewrite of each chain whose rules changed (an Admin rule added, removed
// or reordered). A full sync (the first, one after any failure, and
// whenever the caller asks, periodically) deletes and rebuilds the table
// in one transaction: packets see the old or the new rules, never none,
// and whatever else is in the table (an older version's objects, a hand
// edit) is gone. A sync with nothing to change runs no transaction.

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// NFT is what the Syncer needs from nftables: nft.Runner and nft.Fake,
// bound to the inet family and the table, implement it.
type NFT interface {
	NewTransaction() *knftables.Transaction
	Run(ctx context.Context, tx *knftables.Transaction) error
}

// Syncer applies Rulesets to one table.
type Syncer struct {
	nft NFT
	// last is what the last successful transaction left in the table;
	// nil (at start, after a failure) forces a full sync.
	last *Ruleset
}

// NewSyncer returns a Syncer over nft.
func NewSyncer(nft NFT) *Syncer { return &Syncer{nft: nft} }

// Result describes one sync.
type Result struct {
	Full       bool
	Operations int // in the transaction; 0: nothing to change, none ran
}

// Sync makes the table hold want, incrementally unless full (or the
// table's state is unknown). want must not change afterwards.
func (s *Syncer) Sync(ctx context.Context, want *Ruleset, full bool) (Result, error) {
	tx := s.nft.NewTransaction()
	full = full || s.last == nil
	if full {
		writeFull(tx, want)
	} else {
		writeDiff(tx, s.last, want)
	}
	res := Result{Full: full, Operations: tx.NumOperations()}
	if res.Operations == 0 {
		return res, nil
	}
	s.last = nil
	if err := s.nft.Run(ctx, tx); err != nil {
		return res, fmt.Errorf("syncing network policy rules (full=%v, %d operations): %w", full, res.Operations, err)
	}
	s.last = want
	return res, nil
}

// Forget makes the next sync full (the table was changed behind our back).
func (s *Syncer) Forget() { s.last = nil }

func writeFull(tx *knftables.Transaction, want *Ruleset) {
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet network policy")})
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		tx.Add(setObject(name, want.Sets[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Counters)) {
		tx.Add(counterObject(name, want.Counters[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Chains)) {
		tx.Add(chainObject(name))
	}
	for _, name := range slices.Sorted(maps.Keys(want.Chains)) {
		addRules(tx, name, want.Chains[name])
	}
	for _, name := range slices.Sorted(maps.Keys(want.Elements)) {
		byAddr := want.Elements[name]
		for _, a := range slices.SortedFunc(maps.Keys(byAddr), netip.Addr.Compare) {
			for _, k := range byAddr[a] {
				tx.Add(element(name, k))
			}
		}
	}
}

// writeDiff writes what turns last into want, in an order the kernel
// takes: a set is deleted only once no rule names it (its chain flushed),
// and added, like a chain, before a rule names it.
func writeDiff(tx *knftables.Transaction, last, want *Ruleset) {
	sameSet := func(name string) bool {
		a, ok1 := last.Sets[name]
		b, ok2 := want.Sets[name]
		return ok1 && ok2 && a == b
	}
	for _, name := range slices.Sorted(maps.Keys(last.Elements)) {
		if !sameSet(name) {
			continue
		}
		for _, k := range missing(last.Elements[name], want.Elements[name]) {
			tx.Delete(element(name, k))
		}
	}
	changed := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(last.Chains)) {
		if rules, ok := want.Chains[name]; !ok || !slices.Equal(rules, last.Chains[name]) {
			changed[name] = true
			tx.Flush(chainObject(name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(last.Sets)) {
		if !sameSet(name) {
			tx.Delete(&knftables.Set{Name: name})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		if !sameSet(name) {
			tx.Add(setObject(name, want.Sets[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Counters)) {
		// A name stands for one pod or one rule, so its comment is fixed.
		if _, ok := last.Counters[name]; !ok {
			tx.Add(counterObject(name, want.Counters[name]))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Chains)) {
		if _, ok := last.Chains[name]; !ok {
			changed[name] = true
			tx.Add(chainObject(name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Chains)) {
		if changed[name] {
			addRules(tx, name, want.Chains[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.Elements)) {
		var had map[netip.Addr][]string
		if sameSet(name) {
			had = last.Elements[name]
		}
		for _, k := range missing(want.Elements[name], had) {
			tx.Add(element(name, k))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(last.Chains)) {
		if _, ok := want.Chains[name]; !ok {
			tx.Delete(&knftables.Chain{Name: name})
		}
	}
	// Last: no rule names a counter that is gone (its chain was flushed
	// or rewritten above).
	for _, name := range slices.Sorted(maps.Keys(last.Counters)) {
		if _, ok := want.Counters[name]; !ok {
			tx.Delete(&knftables.Counter{Name: name})
		}
	}
}

func chainObject(name string) *knftables.Chain {
	if name == ChainForward {
		return &knftables.Chain{Name: name, Type: knftables.PtrTo(knftables.FilterType),
			Hook: knftables.PtrTo(knftables.ForwardHook), Priority: knftables.PtrTo(knftables.FilterPriority)}
	}
	return &knftables.Chain{Name: name}
}

func counterObject(name string, c Counter) *knftables.Counter {
	return &knftables.Counter{Name: name, Comment: knftables.PtrTo(c.comment())}
}

func setObject(name string, s Set) *knftables.Set {
	o := &knftables.Set{Name: name, Type: s.Type}
	if s.Interval {
		o.Flags = []knftables.SetFlag{knftables.IntervalFlag}
	}
	return o
}

func addRules(tx *knftables.Transaction, chain string, rules []Rule) {
	for _, r := range rules {
		o := &knftables.Rule{Chain: chain, Rule: r.Rule}
		if r.Comment != "" {
			o.Comment = knftables.PtrTo(r.Comment)
		}
		tx.Add(o)
	}
}

func element(set, key string) *knftables.Element {
	return &knftables.Element{Set: set, Key: strings.Split(key, " . ")}
}

// missing returns the elements of a that b lacks, sorted. Addresses whose
// elements are the same slice (from the Renderer's memory) or equal are
// skipped without building a set of them.
func missing(a, b map[netip.Addr][]string) []string {
	var out []string
	for addr, keys := range a {
		other := b[addr]
		if len(keys) == len(other) && (len(keys) == 0 || &keys[0] == &other[0] || slices.Equal(keys, other)) {
			continue
		}
		has := make(map[string]bool, len(other))
		for _, k := range other {
			has[k] = true
		}
		for _, k := range keys {
			if !has[k] {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}
