package ipmasq

// A lean knftables.Interface for CNI plugins.
//
// knftables.New runs `nft --version` and an `nft --check` transaction
// before it returns. A check is a kernel transaction that is aborted, and an
// aborted (or deleting) nf_tables transaction waits for an RCU grace period:
// about 12-15 ms on this machine, longer than everything else a bridge ADD
// does. A CNI plugin is a short-lived process that builds one Interface per
// invocation, so that probe would be paid on every ADD. NewNFT skips it:
// transactions are written with knftables' own Transaction type (so the
// fake and the real runner see the same objects) and piped to `nft -f -`;
// List* read the table with one `nft -j list table` each. The price is that
// object comments are assumed to be supported (nft >= 0.9.7, kernel >= 5.10),
// which knftables would otherwise probe for.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// nftPaths are tried when nft is not on PATH (runtimes often start plugins
// with a minimal PATH).
var nftPaths = []string{"/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/usr/local/sbin/nft"}

// LookNFT returns the path of the nft binary, or an error with code 105
// saying how to get it.
func LookNFT() (string, error) {
	if p, err := exec.LookPath("nft"); err == nil {
		return p, nil
	}
	for _, p := range nftPaths {
		if _, err := exec.LookPath(p); err == nil {
			return p, nil
		}
	}
	return "", cnierr.New(cnierr.KernelFeatureMissing,
		"nft (nftables) not found in PATH or %s: install the nftables package (apt-get install nftables) to use ipMasq/macspoofchk", strings.Join(nftPaths, ", "))
}

// execNFT implements knftables.Interface by running the nft binary.
type execNFT struct {
	path   string
	family knftables.Family
	table  string
	// txs makes Transactions bound to family/table. knftables has no
	// exported constructor for them other than an Interface, and the fake
	// one is free to build.
	txs *knftables.Fake
	// exec runs nft (swapped in tests).
	exec func(ctx context.Context, stdin string, args ...string) ([]byte, error)
}

// NewNFT returns a knftables.Interface for family/table that costs no
// process until it is used (see the note at the top of this file). It
// fails with code 105 when nft is not installed.
func NewNFT(family knftables.Family, table string) (knftables.Interface, error) {
	path, err := LookNFT()
	if err != nil {
		return nil, err
	}
	n := &execNFT{path: path, family: family, table: table, txs: knftables.NewFake(family, table)}
	n.exec = n.run
	return n, nil
}

// NFTError is a failed nft run. Errno is ENOENT, EEXIST or EBUSY when nft's
// first error line says so, else 0.
type NFTError struct {
	Msg   string
	Errno syscall.Errno
}

func (e *NFTError) Error() string { return e.Msg }

// Is lets errors.Is(err, syscall.ENOENT) and friends work.
func (e *NFTError) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && e.Errno != 0 && errno == e.Errno
}

func classify(stderr string) syscall.Errno {
	line := stderr
	if i := strings.Index(line, "\n"); i >= 0 {
		line = line[:i]
	}
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

// IsNotFound reports whether err means an nftables object is missing,
// for both the real runner and knftables' fake.
func IsNotFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT)
}

// IsExists reports whether err means an object (for a map: a key with a
// different value) already exists.
func IsExists(err error) bool {
	return knftables.IsAlreadyExists(err) || errors.Is(err, syscall.EEXIST)
}

// IsBusy reports whether err means an object is still referenced.
func IsBusy(err error) bool { return errors.Is(err, syscall.EBUSY) }

func (n *execNFT) run(ctx context.Context, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, n.path, args...)
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
		e := &NFTError{Msg: fmt.Sprintf("nft %s: %s", strings.Join(args, " "), msg), Errno: classify(msg)}
		if e.Errno == syscall.EOPNOTSUPP {
			return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, e, "the kernel lacks an nftables feature (nf_tables, nft_nat, nft_masq?)")
		}
		return nil, e
	}
	return stdout.Bytes(), nil
}

// NewTransaction implements knftables.Interface.
func (n *execNFT) NewTransaction() *knftables.Transaction { return n.txs.NewTransaction() }

// Run implements knftables.Interface.
func (n *execNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.feed(ctx, tx, "-f", "-")
}

// Check implements knftables.Interface.
func (n *execNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return n.feed(ctx, tx, "--check", "-f", "-")
}

func (n *execNFT) feed(ctx context.Context, tx *knftables.Transaction, args ...string) error {
	s := tx.String()
	// A transaction that failed validation renders its error as a comment.
	if i := strings.Index(s, "# ERROR: "); i >= 0 {
		return fmt.Errorf("invalid nftables transaction: %s", strings.TrimSpace(s[i+len("# ERROR: "):]))
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	_, err := n.exec(ctx, s, args...)
	return err
}

type jsonObj = map[string]json.RawMessage

// listTable returns the objects of the table, grouped by type ("chain",
// "map", "rule"...). A missing table yields an empty result.
func (n *execNFT) listTable(ctx context.Context) (map[string][]jsonObj, error) {
	out, err := n.exec(ctx, "", "-j", "list", "table", string(n.family), n.table)
	if err != nil {
		if IsNotFound(err) {
			return map[string][]jsonObj{}, nil
		}
		return nil, err
	}
	return parseTableJSON(out)
}

func parseTableJSON(out []byte) (map[string][]jsonObj, error) {
	var doc struct {
		Nftables []map[string]jsonObj `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	res := map[string][]jsonObj{}
	for _, o := range doc.Nftables {
		for typ, v := range o {
			res[typ] = append(res[typ], v)
		}
	}
	return res, nil
}

func str(o jsonObj, key string) string {
	var s string
	_ = json.Unmarshal(o[key], &s)
	return s
}

// ListAll implements knftables.Interface.
func (n *execNFT) ListAll(ctx context.Context) (map[string][]string, error) {
	objs, err := n.listTable(ctx)
	if err != nil {
		return nil, err
	}
	res := map[string][]string{}
	for _, typ := range []string{"chain", "set", "map", "counter", "flowtable"} {
		for _, o := range objs[typ] {
			res[typ] = append(res[typ], str(o, "name"))
		}
	}
	return res, nil
}

// List implements knftables.Interface.
func (n *execNFT) List(ctx context.Context, objectType string) ([]string, error) {
	all, err := n.ListAll(ctx)
	if err != nil {
		return nil, err
	}
	return all[strings.TrimSuffix(objectType, "s")], nil
}

// ListRules implements knftables.Interface: Chain, Handle and Comment are
// filled in, Rule is not (as with knftables' own implementation).
func (n *execNFT) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	objs, err := n.listTable(ctx)
	if err != nil {
		return nil, err
	}
	found := chain == ""
	for _, c := range objs["chain"] {
		if str(c, "name") == chain {
			found = true
		}
	}
	if !found {
		return nil, &NFTError{Msg: fmt.Sprintf("no chain %q in table %s %s", chain, n.family, n.table), Errno: syscall.ENOENT}
	}
	var rules []*knftables.Rule
	for _, r := range objs["rule"] {
		if chain != "" && str(r, "chain") != chain {
			continue
		}
		var handle int
		_ = json.Unmarshal(r["handle"], &handle)
		rule := &knftables.Rule{Chain: str(r, "chain"), Handle: &handle}
		if c := str(r, "comment"); c != "" {
			rule.Comment = &c
		}
		rules = append(rules, rule)
	}
	return rules, nil
}

// ListElements implements knftables.Interface for sets and maps with
// simple keys and values (addresses, names, verdicts).
func (n *execNFT) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	objs, err := n.listTable(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range objs[objectType] {
		if str(o, "name") != name {
			continue
		}
		var elems []json.RawMessage
		_ = json.Unmarshal(o["elem"], &elems)
		var res []*knftables.Element
		for _, raw := range elems {
			e, err := parseElement(raw, objectType == "map")
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", objectType, name, err)
			}
			if objectType == "map" {
				e.Map = name
			} else {
				e.Set = name
			}
			res = append(res, e)
		}
		return res, nil
	}
	return nil, &NFTError{Msg: fmt.Sprintf("no %s %q in table %s %s", objectType, name, n.family, n.table), Errno: syscall.ENOENT}
}

func parseElement(raw json.RawMessage, isMap bool) (*knftables.Element, error) {
	e := &knftables.Element{}
	if !isMap {
		k, err := exprString(raw)
		if err != nil {
			return nil, err
		}
		e.Key = []string{k}
		return e, nil
	}
	var pair []json.RawMessage
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return nil, fmt.Errorf("unexpected map element %s", raw)
	}
	k, err := exprString(pair[0])
	if err != nil {
		return nil, err
	}
	v, err := exprString(pair[1])
	if err != nil {
		return nil, err
	}
	e.Key, e.Value = []string{k}, []string{v}
	return e, nil
}

// exprString renders the simple JSON expressions found in our sets and
// maps the way nft's text syntax (and knftables) spells them.
func exprString(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var num json.Number
	if json.Unmarshal(raw, &num) == nil {
		return num.String(), nil
	}
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("unexpected element %s", raw)
	}
	for k, v := range o {
		switch k {
		case "elem":
			var inner map[string]json.RawMessage
			if err := json.Unmarshal(v, &inner); err != nil {
				return "", fmt.Errorf("unexpected element %s", raw)
			}
			return exprString(inner["val"])
		case "goto", "jump":
			var t struct {
				Target string `json:"target"`
			}
			_ = json.Unmarshal(v, &t)
			return k + " " + t.Target, nil
		case "accept", "drop", "continue", "return":
			return k, nil
		case "prefix":
			var p struct {
				Addr string `json:"addr"`
				Len  int    `json:"len"`
			}
			_ = json.Unmarshal(v, &p)
			return p.Addr + "/" + strconv.Itoa(p.Len), nil
		}
	}
	return "", fmt.Errorf("unexpected element %s", raw)
}

// ListCounters implements knftables.Interface (we use no counters).
func (n *execNFT) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	return nil, nil
}
