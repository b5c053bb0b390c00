package iptables

// Syncs. One iptables-restore --noflush per family, which the kernel
// commits atomically: packets see the old rules or the new, never none.
// A chain declaration flushes the chain, so a chain is rewritten whole
// without reading it. A full sync (the first, one after any failure, and
// whenever the caller asks, periodically) reads the table (iptables-save),
// rewrites every chain of ours, deletes the chains of ours it does not
// want (an older version's, a hand-made one) and puts the FORWARD jump
// back first if it is missing, moved or duplicated. An incremental sync
// reads nothing and rewrites only the chains whose rules changed since the
// last commit, as kube-proxy's partial syncs do; with nothing changed it
// runs no restore.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/ipt"
)

// Syncer applies Rulesets to the filter table of its families.
type Syncer struct {
	ipt      ipt.Interface
	families []ipt.Protocol
	// last is what the last successful sync left, per family; nil (at
	// start, after a failure) forces a full sync.
	last map[ipt.Protocol]Chains
}

// NewSyncer returns a Syncer writing the families given (the cluster's;
// both when none).
func NewSyncer(i ipt.Interface, families ...ipt.Protocol) *Syncer {
	if len(families) == 0 {
		families = Families
	}
	return &Syncer{ipt: i, families: families}
}

// Result describes one sync.
type Result struct {
	Full bool
	// Restores run, and lines (chain declarations and rule commands) they
	// held; 0: nothing to change.
	Restores, Lines int
}

// Sync makes our chains hold want, writing only what changed unless full
// (or the kernel's state is unknown). want must not change afterwards.
func (s *Syncer) Sync(ctx context.Context, want *Ruleset, full bool) (Result, error) {
	last := s.last
	full = full || last == nil
	res := Result{Full: full}
	s.last = nil
	next := map[ipt.Protocol]Chains{}
	for _, f := range s.families {
		w := want.Families[f]
		var b *builder
		if full {
			t, err := s.ipt.Save(ctx, f, Table)
			if err != nil {
				return res, fmt.Errorf("reading the %s %s table: %w", f, Table, err)
			}
			b = writeFull(t, w)
		} else {
			b = writeDiff(last[f], w)
		}
		if n := b.lines(); n > 0 {
			if err := s.ipt.Restore(ctx, f, b.bytes()); err != nil {
				return res, fmt.Errorf("syncing network policy rules (%s, full=%v, %d lines): %w", f, full, n, err)
			}
			res.Restores++
			res.Lines += n
		}
		next[f] = w
	}
	s.last = next
	return res, nil
}

// Forget makes the next sync full (the table was changed behind our back).
func (s *Syncer) Forget() { s.last = nil }

// builder orders one restore's lines: chain declarations, then rules,
// then chain deletions (a chain is deleted once nothing refers to it).
type builder struct{ declare, rules, remove []string }

// line renders one restore line's arguments.
func line(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = ipt.Quote(a)
	}
	return strings.Join(q, " ")
}

// chain declares name (creating or flushing it) and fills it with rules.
func (b *builder) chain(name string, rules []Rule) {
	b.declare = append(b.declare, ":"+name+" - [0:0]")
	for _, r := range rules {
		b.rules = append(b.rules, line(append([]string{"-A", name}, r...)...))
	}
}

// drop flushes and deletes name.
func (b *builder) drop(name string) {
	b.declare = append(b.declare, ":"+name+" - [0:0]")
	b.remove = append(b.remove, line("-X", name))
}

func (b *builder) lines() int { return len(b.declare) + len(b.rules) + len(b.remove) }

func (b *builder) bytes() []byte {
	var out strings.Builder
	out.WriteString("*" + Table + "\n")
	for _, l := range slices.Concat(b.declare, b.rules, b.remove) {
		out.WriteString(l + "\n")
	}
	out.WriteString("COMMIT\n")
	return []byte(out.String())
}

func writeFull(t *ipt.Table, want Chains) *builder {
	b := &builder{}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		b.chain(name, want[name])
	}
	for _, name := range t.Chains {
		if _, ok := want[name]; Ours(name) && !ok {
			b.drop(name)
		}
	}
	fwd := t.RulesIn(Forward)
	var jumps []ipt.Rule
	for _, r := range fwd {
		if Ours(r.Target()) { // ours, or an older version's jump to a chain deleted below
			jumps = append(jumps, r)
		}
	}
	if len(jumps) != 1 || !slices.Equal(fwd[0].Args, JumpRule) {
		for _, r := range jumps {
			b.rules = append(b.rules, line(append([]string{"-D", Forward}, r.Args...)...))
		}
		b.rules = append(b.rules, line(append([]string{"-I", Forward, "1"}, JumpRule...)...))
	}
	return b
}

func writeDiff(last, want Chains) *builder {
	b := &builder{}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if had, ok := last[name]; !ok || !slices.EqualFunc(had, want[name], slices.Equal) {
			b.chain(name, want[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(last)) {
		if _, ok := want[name]; !ok {
			b.drop(name)
		}
	}
	return b
}

// Cleanup removes the FORWARD jump and every chain of ours from the
// families' filter tables (both when none given); a family whose
// binaries are missing has nothing to remove. It reports whether it
// removed anything.
func Cleanup(ctx context.Context, i ipt.Interface, families ...ipt.Protocol) (bool, error) {
	if len(families) == 0 {
		families = Families
	}
	removed := false
	var errs []error
	for _, f := range families {
		t, err := i.Save(ctx, f, Table)
		if errors.Is(err, ipt.ErrNoIPTables) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the %s %s table: %w", f, Table, err))
			continue
		}
		b := &builder{}
		for _, r := range t.RulesIn(Forward) {
			if Ours(r.Target()) {
				b.rules = append(b.rules, line(append([]string{"-D", Forward}, r.Args...)...))
			}
		}
		for _, name := range t.Chains {
			if Ours(name) {
				b.drop(name)
			}
		}
		if b.lines() == 0 {
			continue
		}
		if err := i.Restore(ctx, f, b.bytes()); err != nil {
			errs = append(errs, fmt.Errorf("removing the network policy chains (%s): %w", f, err))
			continue
		}
		removed = true
	}
	return removed, errors.Join(errs...)
}
