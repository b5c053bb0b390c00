package ipt

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// builtinChains are the chains every table starts with.
var builtinChains = map[string][]string{
	"filter":   {"INPUT", "FORWARD", "OUTPUT"},
	"nat":      {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle":   {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":      {"PREROUTING", "OUTPUT"},
	"security": {"INPUT", "FORWARD", "OUTPUT"},
}

// builtinTargets are the -j targets the fake accepts besides user chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "LOG": true,
	"DNAT": true, "SNAT": true, "MASQUERADE": true, "REDIRECT": true,
	"MARK": true, "CONNMARK": true, "NOTRACK": true, "CT": true,
}

// Fake implements Interface in memory. Restore interprets the input the
// way iptables-restore --noflush does (":chain" creates or flushes, -A, -I,
// -D, -F, -X, -N, COMMIT) and applies each table atomically: an input with
// an error changes nothing, like the kernel's commit.
type Fake struct {
	mu     sync.Mutex // protects the fields below
	tables map[Protocol]map[string]*fakeTable
	// Restores records every Restore input, applied or not.
	Restores []string
	// FailRestore, when set, makes the next Restore fail with it and
	// change nothing (for rollback tests).
	FailRestore error
}

type fakeTable struct {
	chains []string // built-ins first, then user chains in creation order
	rules  map[string][][]string
}

// NewFake returns a Fake with empty tables.
func NewFake() *Fake { return &Fake{tables: map[Protocol]map[string]*fakeTable{}} }

func newFakeTable(name string) *fakeTable {
	t := &fakeTable{rules: map[string][][]string{}}
	t.chains = append(t.chains, builtinChains[name]...)
	return t
}

func (t *fakeTable) copy() *fakeTable {
	c := &fakeTable{chains: slices.Clone(t.chains), rules: map[string][][]string{}}
	for k, v := range t.rules {
		c.rules[k] = slices.Clone(v)
	}
	return c
}

func (f *Fake) table(proto Protocol, name string) *fakeTable {
	if f.tables[proto] == nil {
		f.tables[proto] = map[string]*fakeTable{}
	}
	t := f.tables[proto][name]
	if t == nil {
		t = newFakeTable(name)
		f.tables[proto][name] = t
	}
	return t
}

// Save implements Interface.
func (f *Fake) Save(_ context.Context, proto Protocol, table string) (*Table, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := builtinChains[table]; !ok {
		return nil, fmt.Errorf("%s-save: table %q does not exist", proto, table)
	}
	return ParseSave([]byte(f.dump(proto, table)), table)
}

// Dump returns table in iptables-save format (without the dated comment
// lines): built-in chains, then user chains sorted by name, then the rules
// of each chain in that order.
func (f *Fake) Dump(proto Protocol, table string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dump(proto, table)
}

func (f *Fake) dump(proto Protocol, name string) string {
	t := f.table(proto, name)
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", name)
	builtin := builtinChains[name]
	user := slices.Clone(t.chains[len(builtin):])
	slices.Sort(user)
	order := append(slices.Clone(builtin), user...)
	for _, c := range builtin {
		fmt.Fprintf(&b, ":%s ACCEPT [0:0]\n", c)
	}
	for _, c := range user {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, c := range order {
		for _, r := range t.rules[c] {
			q := make([]string, len(r))
			for i, a := range r {
				q[i] = Quote(a)
			}
			fmt.Fprintf(&b, "-A %s %s\n", c, strings.Join(q, " "))
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// Restore implements Interface.
func (f *Fake) Restore(_ context.Context, proto Protocol, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Restores = append(f.Restores, string(data))
	if err := f.FailRestore; err != nil {
		f.FailRestore = nil
		return err
	}
	var (
		name string
		work *fakeTable
	)
	pending := map[string]*fakeTable{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		errf := func(format string, args ...any) error {
			return fmt.Errorf("%s-restore: line %d (%q): %s", proto, n+1, line, fmt.Sprintf(format, args...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case strings.HasPrefix(line, "*"):
			if work != nil {
				return errf("table %s not committed", name)
			}
			name = line[1:]
			if _, ok := builtinChains[name]; !ok {
				return errf("unknown table")
			}
			work = f.table(proto, name).copy()
			continue
		case work == nil:
			return errf("no table selected")
		case line == "COMMIT":
			pending[name] = work
			work = nil
			continue
		case strings.HasPrefix(line, ":"):
			chain, _, _ := strings.Cut(line[1:], " ")
			if slices.Contains(builtinChains[name], chain) {
				continue // policy lines: nothing to model
			}
			if slices.Contains(work.chains, chain) {
				work.rules[chain] = nil // --noflush: a declared user chain is flushed
			} else {
				work.chains = append(work.chains, chain)
			}
			continue
		}
		args, err := Split(line)
		if err != nil {
			return errf("%v", err)
		}
		if err := work.apply(name, args); err != nil {
			return errf("%v", err)
		}
	}
	if work != nil {
		return fmt.Errorf("%s-restore: table %s: no COMMIT", proto, name)
	}
	for n, t := range pending {
		f.tables[proto][n] = t
	}
	return nil
}

func (t *fakeTable) apply(table string, args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("missing chain")
	}
	cmd, chain, rest := args[0], args[1], args[2:]
	exists := slices.Contains(t.chains, chain)
	builtin := slices.Contains(builtinChains[table], chain)
	switch cmd {
	case "-N":
		if exists {
			return fmt.Errorf("chain %s already exists", chain)
		}
		t.chains = append(t.chains, chain)
		return nil
	case "-X":
		if !exists || builtin {
			return fmt.Errorf("no user chain %s", chain)
		}
		if len(t.rules[chain]) > 0 {
			return fmt.Errorf("chain %s is not empty", chain)
		}
		for c, rs := range t.rules {
			for _, r := range rs {
				if (Rule{Args: r}).Target() == chain {
					return fmt.Errorf("chain %s is referenced from %s", chain, c)
				}
			}
		}
		t.chains = slices.DeleteFunc(t.chains, func(c string) bool { return c == chain })
		delete(t.rules, chain)
		return nil
	}
	if !exists {
		return fmt.Errorf("no chain %s", chain)
	}
	switch cmd {
	case "-F":
		t.rules[chain] = nil
	case "-A":
		if err := t.checkTarget(rest); err != nil {
			return err
		}
		t.rules[chain] = append(t.rules[chain], rest)
	case "-I":
		pos := 1
		if len(rest) > 0 {
			if n, err := strconv.Atoi(rest[0]); err == nil {
				pos, rest = n, rest[1:]
			}
		}
		if pos < 1 || pos > len(t.rules[chain])+1 {
			return fmt.Errorf("index %d out of range", pos)
		}
		if err := t.checkTarget(rest); err != nil {
			return err
		}
		t.rules[chain] = slices.Insert(t.rules[chain], pos-1, rest)
	case "-D":
		i := slices.IndexFunc(t.rules[chain], func(r []string) bool { return slices.Equal(r, rest) })
		if i < 0 {
			return fmt.Errorf("bad rule (does a matching rule exist in that chain?)")
		}
		t.rules[chain] = slices.Delete(t.rules[chain], i, i+1)
	default:
		return fmt.Errorf("unsupported command %s", cmd)
	}
	return nil
}

func (t *fakeTable) checkTarget(args []string) error {
	target := Rule{Args: args}.Target()
	if target == "" || builtinTargets[target] || slices.Contains(t.chains, target) {
		return nil
	}
	return fmt.Errorf("couldn't load target %q", target)
}
