// Package nft is flatnet's narrow door to nftables: a lean runner for one
// table, a fake for unit tests, and naming helpers.
//
// Design. Rules are built as knftables.Transaction values (so the real
// runner and knftables.NewFake see exactly the same objects), but the real
// runner is ours, not knftables.New: that constructor runs `nft --version`
// and an `nft --check` transaction before returning, and a check is an
// aborted kernel transaction that waits for an RCU grace period (12-30 ms
// here). CNI plugins are short-lived processes that would pay it on every
// ADD and DEL. Runner costs nothing until used: Run pipes the transaction to
// one `nft -f -`, and every read is one `nft -j list table` (list.go).
//
// Runner implements both knftables.Interface (for rule writers that want
// knftables' List* calls) and this package's Interface (ListTable: chains
// and rules with handles and comments, in one read).
//
// Assumed: nft >= 1.0.1 and object comments supported (kernel >= 5.10);
// Probe checks both for a STATUS answer.
package nft

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/execx"
)

// ErrNoNFT is wrapped when the nft binary is not installed.
var ErrNoNFT = errors.New("nft binary not found in PATH")

// Interface is what flatnet's rule writers need from nftables. Runner and
// Fake implement it.
type Interface interface {
	// NewTransaction returns a transaction bound to the table.
	NewTransaction() *knftables.Transaction
	// Run applies tx atomically; an empty tx is a no-op.
	Run(ctx context.Context, tx *knftables.Transaction) error
	// ListTable reads the table's chains and rules; nil (and no error)
	// when the table does not exist.
	ListTable(ctx context.Context) (*Table, error)
}

// Table is a read of one table. Rules carry Chain, Handle and Comment, not
// the rule text (as with knftables' ListRules).
type Table struct {
	Chains []string
	Rules  []*knftables.Rule
}

// HasChain reports whether the table has a chain called name.
func (t *Table) HasChain(name string) bool {
	return t != nil && slices.Contains(t.Chains, name)
}

// RulesIn returns the rules of chain, in order.
func (t *Table) RulesIn(chain string) []*knftables.Rule {
	if t == nil {
		return nil
	}
	var out []*knftables.Rule
	for _, r := range t.Rules {
		if r.Chain == chain {
			out = append(out, r)
		}
	}
	return out
}

// Error is a failed nft run. Errno is ENOENT, EEXIST, EBUSY or EOPNOTSUPP
// when nft's first error line says so, else 0.
type Error struct {
	Msg   string
	Errno syscall.Errno
}

func (e *Error) Error() string { return e.Msg }

// Is lets errors.Is(err, syscall.ENOENT) and friends work.
func (e *Error) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && e.Errno != 0 && errno == e.Errno
}

// classify reads the errno from the first line of nft's stderr (later
// lines echo the input, which may contain anything).
func classify(stderr string) syscall.Errno {
	line, _, _ := strings.Cut(stderr, "\n")
	switch {
	case strings.Contains(line, "No such file or directory"):
		return syscall.ENOENT
	case strings.Contains(line, "File exists"):
		return syscall.EEXIST
	case strings.Contains(line, "Device or resource busy"):
		return syscall.EBUSY
	case strings.Contains(line, "not supported"):
		return syscall.EOPNOTSUPP
	}
	return 0
}

// IsNotFound reports whether err means an nftables object is missing, for
// both Runner and the fake.
func IsNotFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT)
}

// IsExists reports whether err means an nftables object (for a map: a key
// with a different value) already exists, for both Runner and the fake.
func IsExists(err error) bool {
	return knftables.IsAlreadyExists(err) || errors.Is(err, syscall.EEXIST)
}

// IsBusy reports whether err means an object is still referenced.
func IsBusy(err error) bool { return errors.Is(err, syscall.EBUSY) }

// StandardPaths are where distributions install nft: the fallback of
// callers that must find it even when PATH lacks the sbin directories (a
// container runtime starting a CNI plugin, a service manager starting the
// agent). portmap passes none: with nft not on PATH it uses iptables.
var StandardPaths = []string{"/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/usr/local/sbin/nft"}

// LookPath finds the nft binary in PATH or, failing that, at the first of
// fallback that exists.
func LookPath(fallback ...string) (string, error) {
	if p, err := exec.LookPath("nft"); err == nil {
		return p, nil
	}
	for _, p := range fallback {
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	where := ""
	if len(fallback) > 0 {
		where = " or at " + strings.Join(fallback, ", ")
	}
	return "", fmt.Errorf("%w%s: install the nftables package (apt-get install nftables)", ErrNoNFT, where)
}

// Runner implements Interface and knftables.Interface by running the nft
// binary.
type Runner struct {
	path   string
	family knftables.Family
	table  string
	// txs only makes Transactions bound to family/table: knftables has no
	// other exported way to get one, and a Fake costs nothing to build.
	txs *knftables.Fake
	// exec runs nft (swapped in tests).
	exec func(ctx context.Context, stdin string, args ...string) ([]byte, error)
	// Classify, when set, replaces every failure that nft reports (an
	// *Error): CNI plugins use it to give kernel refusals their error code.
	Classify func(*Error) error
	// Timeout bounds each nft run (0: execx.DefaultTimeout, 30 s); a
	// context deadline that comes sooner wins. A timeout is an
	// *execx.TimeoutError, not an *Error, and is not passed to Classify.
	Timeout time.Duration
}

// New returns a Runner for family/table. It only looks nft up (LookPath
// with fallback); the error wraps ErrNoNFT when nft is not found.
func New(family knftables.Family, table string, fallback ...string) (*Runner, error) {
	path, err := LookPath(fallback...)
	if err != nil {
		return nil, err
	}
	r := &Runner{path: path, family: family, table: table, txs: knftables.NewFake(family, table)}
	r.exec = r.run
	return r, nil
}

// NewTransaction implements Interface.
func (r *Runner) NewTransaction() *knftables.Transaction { return r.txs.NewTransaction() }

// Run implements Interface.
func (r *Runner) Run(ctx context.Context, tx *knftables.Transaction) error {
	return r.feed(ctx, tx, "-f", "-")
}

// Check implements knftables.Interface. It is slow (an aborted kernel
// transaction).
func (r *Runner) Check(ctx context.Context, tx *knftables.Transaction) error {
	return r.feed(ctx, tx, "--check", "-f", "-")
}

func (r *Runner) feed(ctx context.Context, tx *knftables.Transaction, args ...string) error {
	s, err := Render(tx)
	if err != nil || tx.NumOperations() == 0 {
		return err
	}
	_, err = r.exec(ctx, s, args...)
	return err
}

// Render returns tx as nft commands, or the validation error knftables
// recorded in it (which String() would otherwise render as a comment, and
// nft would then run the valid prefix).
func Render(tx *knftables.Transaction) (string, error) {
	s := tx.String()
	if i := strings.LastIndex(s, "# ERROR: "); i >= 0 && (i == 0 || s[i-1] == '\n') {
		return "", fmt.Errorf("invalid nftables transaction: %s", strings.TrimSpace(s[i+len("# ERROR: "):]))
	}
	return s, nil
}

// Probe checks that nft runs, that we may change nftables and that the
// kernel takes our table with a comment, without changing anything
// (`nft --check`). It is slow (an aborted kernel transaction): use it for
// STATUS, not on every ADD.
func (r *Runner) Probe(ctx context.Context) error {
	out, err := r.exec(ctx, "", "--version")
	if err != nil {
		return err
	}
	if v := string(out); strings.HasPrefix(v, "nftables v0.") || strings.HasPrefix(v, "nftables v1.0.0 ") {
		return fmt.Errorf("nft must be v1.0.1 or later (have %s)", strings.TrimSpace(v))
	}
	tx := r.NewTransaction()
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("probe")})
	return r.Check(ctx, tx)
}

// timeoutHint says what to look at when nft times out.
const timeoutHint = "nft is stuck (another nft, iptables-nft or netlink client holding the nftables commit lock? " +
	"`ps -C nft,iptables-restore,iptables` shows them); retry once it is gone"

func (r *Runner) run(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	c := execx.Cmd{Path: r.path, Args: args, Timeout: r.Timeout, Hint: timeoutHint}
	if stdin != "" {
		c.Stdin = strings.NewReader(stdin)
	}
	out, err := c.Output(ctx)
	var xe *execx.Error
	if !errors.As(err, &xe) {
		return out, err // success, timeout or canceled
	}
	msg := xe.Stderr
	if msg == "" {
		msg = xe.Err.Error()
	}
	e := &Error{Msg: fmt.Sprintf("nft %s: %s", strings.Join(args, " "), msg), Errno: classify(msg)}
	if r.Classify != nil {
		return nil, r.Classify(e)
	}
	return nil, e
}

// Fake is knftables' fake with ListTable, for unit tests. It counts the
// transactions that change something (Runs), so tests can check that a
// second sync with the same input runs none.
type Fake struct {
	*knftables.Fake
	runs atomic.Int64
}

// NewFake returns an empty fake for family/table.
func NewFake(family knftables.Family, table string) *Fake {
	return &Fake{Fake: knftables.NewFake(family, table)}
}

// Run implements Interface.
func (f *Fake) Run(ctx context.Context, tx *knftables.Transaction) error {
	if tx.NumOperations() > 0 {
		f.runs.Add(1)
	}
	return f.Fake.Run(ctx, tx)
}

// Runs is the number of non-empty transactions run so far.
func (f *Fake) Runs() int { return int(f.runs.Load()) }

// ListTable implements Interface. Chains are sorted by name; rules are in
// chain order.
func (f *Fake) ListTable(_ context.Context) (*Table, error) {
	f.RLock()
	defer f.RUnlock()
	if f.Table == nil {
		return nil, nil
	}
	t := &Table{}
	for name := range f.Table.Chains {
		t.Chains = append(t.Chains, name)
	}
	slices.Sort(t.Chains)
	for _, name := range t.Chains {
		for _, r := range f.Table.Chains[name].Rules {
			c := *r
			t.Rules = append(t.Rules, &c)
		}
	}
	return t, nil
}

// Comment makes s safe and short enough for an nftables comment: nft
// limits comments to 128 bytes, and knftables quotes them with %q, whose
// escapes nft does not read, so only plain printable ASCII without quotes
// or backslashes is kept.
func Comment(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			b[i] = '_'
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}
