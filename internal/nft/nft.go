// Package nft is flatnet's narrow door to nftables: a lean runner for one
// table, a fake for unit tests, and naming helpers.
//
// Design. Rules are built as knftables.Transaction values (so the real
// runner and knftables.NewFake see exactly the same objects), but the real
// runner is ours, not knftables.New: that constructor runs `nft --version`
// and an `nft --check` transaction before returning, and a check is an
// aborted kernel transaction that waits for an RCU grace period (13-30 ms
// here). CNI plugins are short-lived processes that would pay it on every
// ADD and DEL. Runner costs nothing until used: Run pipes the transaction to
// one `nft -f -`, ListTable reads the whole table (chains and rules with
// their handles and comments) with one `nft -j --terse list table`.
//
// Assumed: nft >= 1.0.1 and object comments supported (kernel >= 5.10);
// Probe checks both for a STATUS answer.
package nft

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// ErrNotFound is wrapped by errors for missing objects (nft said "No such
// file or directory").
var ErrNotFound = errors.New("nftables object not found")

// ErrExists is wrapped by errors for objects that already exist (nft said
// "File exists", e.g. to a create).
var ErrExists = errors.New("nftables object exists")

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

// IsNotFound reports whether err means an nftables object is missing, for
// both Runner and the fake.
func IsNotFound(err error) bool {
	return errors.Is(err, ErrNotFound) || knftables.IsNotFound(err)
}

// IsExists reports whether err means an nftables object already exists,
// for both Runner and the fake.
func IsExists(err error) bool {
	return errors.Is(err, ErrExists) || knftables.IsAlreadyExists(err)
}

// LookPath finds the nft binary.
func LookPath() (string, error) {
	p, err := exec.LookPath("nft")
	if err != nil {
		return "", fmt.Errorf("%w: install nftables (apt-get install nftables)", ErrNoNFT)
	}
	return p, nil
}

// Runner implements Interface by running the nft binary.
type Runner struct {
	path   string
	family knftables.Family
	table  string
	// txs only makes Transactions bound to family/table: knftables has no
	// other exported way to get one, and a Fake costs nothing to build.
	txs *knftables.Fake
}

// New returns a Runner for family/table. It only looks nft up in PATH.
func New(family knftables.Family, table string) (*Runner, error) {
	path, err := LookPath()
	if err != nil {
		return nil, err
	}
	return &Runner{path: path, family: family, table: table, txs: knftables.NewFake(family, table)}, nil
}

// NewTransaction implements Interface.
func (r *Runner) NewTransaction() *knftables.Transaction { return r.txs.NewTransaction() }

// Run implements Interface.
func (r *Runner) Run(ctx context.Context, tx *knftables.Transaction) error {
	s, err := Render(tx)
	if err != nil || tx.NumOperations() == 0 {
		return err
	}
	_, err = r.exec(ctx, s, "-f", "-")
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
	s, err := Render(tx)
	if err != nil {
		return err
	}
	_, err = r.exec(ctx, s, "--check", "-f", "-")
	return err
}

// ListTable implements Interface.
func (r *Runner) ListTable(ctx context.Context) (*Table, error) {
	out, err := r.exec(ctx, "", "-j", "--terse", "list", "table", string(r.family), r.table)
	if err != nil {
		if IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return ParseTableJSON(out)
}

func (r *Runner) exec(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.path, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		first, _, _ := strings.Cut(msg, "\n")
		switch {
		case strings.Contains(first, "No such file or directory"):
			return nil, fmt.Errorf("nft %s: %s: %w", strings.Join(args, " "), msg, ErrNotFound)
		case strings.Contains(first, "File exists"):
			return nil, fmt.Errorf("nft %s: %s: %w", strings.Join(args, " "), msg, ErrExists)
		}
		return nil, fmt.Errorf("nft %s: %s", strings.Join(args, " "), msg)
	}
	return stdout.Bytes(), nil
}

// ParseTableJSON reads `nft -j list table` output.
func ParseTableJSON(out []byte) (*Table, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	t := &Table{}
	for _, o := range doc.Nftables {
		if raw, ok := o["chain"]; ok {
			var c struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(raw, &c); err != nil {
				return nil, fmt.Errorf("parsing nft chain %s: %w", raw, err)
			}
			t.Chains = append(t.Chains, c.Name)
		}
		if raw, ok := o["rule"]; ok {
			var jr struct {
				Chain   string  `json:"chain"`
				Handle  int     `json:"handle"`
				Comment *string `json:"comment"`
			}
			if err := json.Unmarshal(raw, &jr); err != nil {
				return nil, fmt.Errorf("parsing nft rule %s: %w", raw, err)
			}
			t.Rules = append(t.Rules, &knftables.Rule{Chain: jr.Chain, Handle: knftables.PtrTo(jr.Handle), Comment: jr.Comment})
		}
	}
	return t, nil
}

// Fake is knftables' fake with ListTable, for unit tests.
type Fake struct {
	*knftables.Fake
}

// NewFake returns an empty fake for family/table.
func NewFake(family knftables.Family, table string) *Fake {
	return &Fake{Fake: knftables.NewFake(family, table)}
}

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
