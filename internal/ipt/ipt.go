// Package ipt is flatnet's one door to iptables: it reads a table with
// iptables-save, writes changes as one iptables-restore --noflush input,
// and has a fake that interprets that input so rule writers are unit
// tested without root.
//
// Design. A writer reads the table once (Save), computes what to add and
// delete as data, renders it with a Builder and applies it in one Restore,
// which the kernel commits atomically per table. Under --noflush, a chain
// declaration (":NAME - [0:0]") creates a user chain or, if it exists,
// flushes it: that is how a writer replaces its own chain's rules without
// reading them, and why it must never declare a chain it shares with other
// writers unless it means to rewrite all of it. Rules in built-in and shared
// chains are added with -A/-I only when Save shows them missing, and
// removed with -D using the arguments Save printed.
package ipt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/execx"
	"github.com/flatnet/flatnet/internal/netns"
)

// Protocol selects iptables (IPv4) or ip6tables (IPv6).
type Protocol int

const (
	IPv4 Protocol = iota
	IPv6
)

func (p Protocol) String() string {
	if p == IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// ErrNoIPTables is wrapped when the iptables binaries are not installed.
var ErrNoIPTables = errors.New("iptables binaries not found in PATH")

// Interface reads and writes iptables tables. Runner and Fake implement it.
type Interface interface {
	// Save returns the current contents of table.
	Save(ctx context.Context, proto Protocol, table string) (*Table, error)
	// Restore applies an iptables-restore input with --noflush.
	Restore(ctx context.Context, proto Protocol, data []byte) error
}

// Table is one table as iptables-save prints it.
type Table struct {
	Name   string
	Chains []string // every chain, built-in ones included, in save order
	Rules  []Rule   // in save order (grouped by chain)
	// Policies are the built-in chains' policies ("ACCEPT", "DROP").
	Policies map[string]string
}

// Rule is one "-A CHAIN args..." line of a save.
type Rule struct {
	Chain string
	Args  []string
}

// Target returns the rule's -j/--jump argument, or "".
func (r Rule) Target() string {
	for i := 0; i+1 < len(r.Args); i++ {
		if r.Args[i] == "-j" || r.Args[i] == "--jump" {
			return r.Args[i+1]
		}
	}
	return ""
}

// Comment returns the rule's --comment argument, or "".
func (r Rule) Comment() string {
	for i := 0; i+1 < len(r.Args); i++ {
		if r.Args[i] == "--comment" {
			return r.Args[i+1]
		}
	}
	return ""
}

// HasChain reports whether the table has a chain called name.
func (t *Table) HasChain(name string) bool { return t != nil && slices.Contains(t.Chains, name) }

// RulesIn returns the rules of chain, in order.
func (t *Table) RulesIn(chain string) []Rule {
	if t == nil {
		return nil
	}
	var out []Rule
	for _, r := range t.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// ParseSave reads iptables-save output and returns the named table (an
// empty table when the output does not contain it).
func ParseSave(data []byte, table string) (*Table, error) {
	t := &Table{Name: table, Policies: map[string]string{}}
	in := false
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			in = line[1:] == table
		case !in:
		case line == "COMMIT":
			in = false
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) == 0 {
				return nil, fmt.Errorf("save line %d: unexpected %q", n+1, line)
			}
			t.Chains = append(t.Chains, f[0])
			if len(f) > 1 && f[1] != "-" {
				t.Policies[f[0]] = f[1]
			}
		default:
			args, err := Split(line)
			if err != nil {
				return nil, fmt.Errorf("save line %d: %w", n+1, err)
			}
			if len(args) < 2 || (args[0] != "-A" && args[0] != "--append") {
				return nil, fmt.Errorf("save line %d: unexpected %q", n+1, line)
			}
			t.Rules = append(t.Rules, Rule{Chain: args[1], Args: args[2:]})
		}
	}
	return t, nil
}

// Split splits one iptables-restore/-save line into arguments the way
// iptables does: words are separated by blanks; a double-quoted string is
// one argument (possibly empty), and inside it a backslash escapes the next
// character.
func Split(line string) ([]string, error) {
	var (
		args   []string
		cur    strings.Builder
		inWord bool
		quoted bool
	)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case quoted && c == '"':
			// iptables ends the argument at the closing quote.
			args = append(args, cur.String())
			cur.Reset()
			quoted, inWord = false, false
		case quoted:
			cur.WriteByte(c)
		case c == '"':
			quoted, inWord = true, true
		case c == ' ' || c == '\t':
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args, nil
}

// Quote renders one argument for an iptables-restore line.
func Quote(arg string) string {
	if arg != "" && !strings.ContainsAny(arg, " \t\"\\'") {
		return arg
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(arg); i++ {
		if arg[i] == '"' || arg[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(arg[i])
	}
	b.WriteByte('"')
	return b.String()
}

// Builder accumulates one table's iptables-restore input.
type Builder struct {
	table string
	lines []string
}

// NewBuilder starts an input for table.
func NewBuilder(table string) *Builder { return &Builder{table: table} }

func (b *Builder) add(parts ...string) {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = Quote(p)
	}
	b.lines = append(b.lines, strings.Join(q, " "))
}

// DeclareChain creates a user chain, or flushes it if it exists.
func (b *Builder) DeclareChain(name string) {
	b.lines = append(b.lines, ":"+name+" - [0:0]")
}

// Append adds "-A chain args...".
func (b *Builder) Append(chain string, args ...string) {
	b.add(append([]string{"-A", chain}, args...)...)
}

// Insert adds "-I chain pos args...".
func (b *Builder) Insert(chain string, pos int, args ...string) {
	b.add(append([]string{"-I", chain, fmt.Sprint(pos)}, args...)...)
}

// Delete adds "-D chain args...": the rule must exist when restored.
func (b *Builder) Delete(chain string, args ...string) {
	b.add(append([]string{"-D", chain}, args...)...)
}

// DeleteChain adds "-X chain": it must exist, be empty and unreferenced.
func (b *Builder) DeleteChain(name string) { b.add("-X", name) }

// FlushChain adds "-F chain".
func (b *Builder) FlushChain(name string) { b.add("-F", name) }

// Empty reports whether nothing was added.
func (b *Builder) Empty() bool { return len(b.lines) == 0 }

// Bytes renders the input: "*table", the lines, "COMMIT".
func (b *Builder) Bytes() []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%s\n", b.table)
	for _, l := range b.lines {
		buf.WriteString(l)
		buf.WriteByte('\n')
	}
	buf.WriteString("COMMIT\n")
	return buf.Bytes()
}

// Runner implements Interface with the iptables-save/-restore binaries. It
// acts in the network namespace of the calling thread.
type Runner struct {
	// Timeout bounds each run (0: execx.DefaultTimeout, 30 s); a context
	// deadline that comes sooner wins. iptables-restore -w waits for the
	// xtables lock with no limit of its own, so without this one process
	// holding the lock would hang every CNI ADD and DEL on the node.
	Timeout time.Duration
}

// New returns a Runner.
func New() *Runner { return &Runner{} }

func binary(proto Protocol, verb string) string { return proto.String() + "-" + verb }

// Available reports whether the save and restore binaries for proto exist.
func Available(proto Protocol) error {
	for _, verb := range []string{"save", "restore"} {
		if _, err := exec.LookPath(binary(proto, verb)); err != nil {
			return fmt.Errorf("%w: %s (install the iptables package)", ErrNoIPTables, binary(proto, verb))
		}
	}
	return nil
}

// Save implements Interface.
func (r *Runner) Save(ctx context.Context, proto Protocol, table string) (*Table, error) {
	out, err := r.run(ctx, nil, binary(proto, "save"), "-t", table)
	if err != nil {
		// iptables-legacy before the table's module is loaded: nothing in it.
		if strings.Contains(err.Error(), "does not exist") && !errors.Is(err, ErrNoIPTables) {
			return &Table{Name: table}, nil
		}
		return nil, err
	}
	return ParseSave(out, table)
}

// Restore implements Interface.
func (r *Runner) Restore(ctx context.Context, proto Protocol, data []byte) error {
	_, err := r.run(ctx, data, binary(proto, "restore"), "--noflush", "-w")
	if err != nil {
		return fmt.Errorf("%w\ninput was:\n%s", err, data)
	}
	return nil
}

// timeoutHint says what to look at when a run times out.
const timeoutHint = "another process may be holding the xtables lock (/run/xtables.lock: `fuser -v /run/xtables.lock` names it), " +
	"or iptables is stuck; retry once it is released"

func (r *Runner) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNoIPTables, name)
	}
	c := execx.Cmd{Path: path, Args: args, Timeout: r.Timeout, Hint: timeoutHint}
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	return c.Output(ctx)
}

// InNetNS implements Interface with Runner inside the network namespace
// at Path (the exec'd binaries inherit the locked thread's namespace): a
// test's namespace, or a lab node's.
type InNetNS struct {
	Path   string
	Runner *Runner
}

// Save implements Interface.
func (n InNetNS) Save(ctx context.Context, proto Protocol, table string) (t *Table, err error) {
	err = netns.Do(n.Path, func() error {
		t, err = n.Runner.Save(ctx, proto, table)
		return err
	})
	return t, err
}

// Restore implements Interface.
func (n InNetNS) Restore(ctx context.Context, proto Protocol, data []byte) error {
	return netns.Do(n.Path, func() error { return n.Runner.Restore(ctx, proto, data) })
}
