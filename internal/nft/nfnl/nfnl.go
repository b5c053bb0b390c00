// Package nfnl programs one nftables table over netlink, in process: the
// same knftables.Transaction values as nft.Runner runs, committed as one
// netlink batch (one atomic kernel transaction) with no nft process and no
// text for nft to parse.
//
// Design. Rule writers keep building knftables transactions (so the packet
// tracer tests check exactly what is sent). knftables keeps a transaction's
// operations unexported, so Run reads its text form (nft.Render), which our
// own code writes from a few templates, and compiles that subset to netlink
// messages (parse.go, compile.go, rule.go), encoding every object the way
// nft 1.0 does, userdata included, so `nft list` shows the same table either
// way. A command outside the subset fails with ErrUnsupported and Run hands
// the whole transaction to Options.Fallback (the nft text path) instead.
// The expression encoders come from github.com/google/nftables/expr; the
// batch, its error handling and the reads are ours (conn.go), because
// google/nftables' Conn acks every message (100,000 acks overflow the
// socket at 10,000 Services) and cannot write table or chain comments.
//
// Set elements must be encoded with their set's key type: Run learns the
// types from the sets a transaction adds and from ListAll, and asks the
// kernel (GETSET) for any other.
//
// Users: the Service proxy (ip and ip6 tables; NewTransaction, Run,
// ListAll) and the CNI plugins' tables (inet flatnet-cni-masq, bridge
// flatnet-cni-spoofchk, inet flatnet-portmap; ipmasq.NewNFT), which also
// read chains, rules and map elements (read.go) and probe nf_tables for
// STATUS with one GETGEN. In inet tables the compiler inserts the
// protocol matches nft inserts ("meta nfproto ipv4" before "ip saddr"),
// so the kernel holds the same expressions whichever wrote them.
package nfnl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

// Options configure a Runner.
type Options struct {
	// NetNS is the path of the network namespace to program; "" is the
	// caller's own (the socket is opened in it once and kept).
	NetNS string
	// Fallback runs a transaction the compiler does not cover (usually
	// an nft.Runner's Run, see ExecFallback); nil makes such a
	// transaction fail.
	Fallback func(ctx context.Context, tx *knftables.Transaction) error
	// Classify, when set, replaces every failure the kernel reports (an
	// *nft.Error carrying the errno, a socket that cannot be opened
	// included), as nft.Runner's Classify does: CNI plugins give
	// "not supported" its error code.
	Classify func(*nft.Error) error
}

// Runner programs family/table over netlink. It implements
// knftables.Interface (what the proxy's nftables backend needs:
// NewTransaction, Run and ListAll; and the reads the CNI plugins use,
// read.go) and nft.Interface.
type Runner struct {
	family knftables.Family
	table  string
	opts   Options
	// txs only makes transactions bound to family/table.
	txs *knftables.Fake

	mu   sync.Mutex // protects conn and sets, and serialises commits
	conn *conn
	sets map[string]*setInfo // key types of the table's named sets

	fellBack atomic.Bool // logged the first fallback
}

// New returns a Runner for family/table. Nothing is opened until used.
func New(family knftables.Family, table string, opts Options) *Runner {
	return &Runner{family: family, table: table, opts: opts, txs: knftables.NewFake(family, table), sets: map[string]*setInfo{}}
}

// NewTransaction returns a transaction bound to the table.
func (r *Runner) NewTransaction() *knftables.Transaction { return r.txs.NewTransaction() }

// Close releases the socket.
func (r *Runner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return nil
	}
	err := r.conn.close()
	r.conn = nil
	return err
}

func (r *Runner) dial() (*conn, error) {
	if r.conn == nil {
		c, err := dial(r.opts.NetNS)
		if err != nil {
			e := &nft.Error{Msg: fmt.Sprintf("opening an nftables netlink socket: %v", err)}
			var errno syscall.Errno
			if errors.As(err, &errno) {
				e.Errno = errno
			}
			return nil, r.classify(e)
		}
		r.conn = c
	}
	return r.conn, nil
}

// family byte of the table
func (r *Runner) nfproto() byte { return families[string(r.family)].proto }

func compileText(family, table, text string, lookup setLookup) (*compiler, error) {
	c, err := newCompiler(family, table, lookup)
	if err != nil {
		return nil, err
	}
	c.msgs = make([]msg, 0, strings.Count(text, "\n")+1)
	err = eachLine(text, func(line string) error {
		cmd, err := parseLine(line)
		if err != nil {
			return err
		}
		return c.compile(&cmd)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Run applies tx atomically in one netlink batch; an empty tx is a no-op.
// A refused batch changes nothing and returns an *nft.Error carrying the
// errno (so nft.IsNotFound and nft.IsExists classify it) and the command.
func (r *Runner) Run(ctx context.Context, tx *knftables.Transaction) error {
	text, err := render(ctx, tx)
	if err != nil || text == "" {
		return err
	}
	r.mu.Lock()
	c, err := compileText(string(r.family), r.table, text, r.lookupSet)
	if errors.Is(err, ErrUnsupported) && r.opts.Fallback != nil {
		// The fallback may change any set: forget what we knew.
		r.sets = map[string]*setInfo{}
		r.mu.Unlock()
		if !r.fellBack.Swap(true) {
			// Not V(2): nft is much slower on big transactions (and is
			// killed after 30 s), so this is worth seeing.
			klog.FromContext(ctx).Info("WARNING: running an nftables transaction through nft: the netlink compiler does not cover it (logged once)",
				"table", r.table, "family", r.family, "reason", err.Error())
		}
		return r.opts.Fallback(ctx, tx)
	}
	defer r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("compiling nftables transaction: %w", err)
	}
	conn, err := r.dial()
	if err != nil {
		return err
	}
	first, errs, err := conn.commit(r.nfproto(), c.msgs)
	if err != nil {
		// The socket's state is unknown (a partial read): start afresh.
		_ = conn.close()
		r.conn = nil
		r.sets = map[string]*setInfo{}
		return fmt.Errorf("committing nftables transaction over netlink: %w", err)
	}
	if len(errs) > 0 {
		r.sets = map[string]*setInfo{}
		return r.classify(batchError(c.msgs, first, errs))
	}
	for name := range c.deleted {
		delete(r.sets, name)
	}
	for name, s := range c.created {
		cp := *s
		cp.id = 0
		// The name is a piece of the transaction's text: a copy, or the
		// cache would keep the whole text (megabytes at 10,000 Services)
		// alive until the set is next created.
		r.sets[strings.Clone(name)] = &cp
	}
	return nil
}

// render is tx's text ("" for an empty tx), or why it cannot run.
func render(ctx context.Context, tx *knftables.Transaction) (string, error) {
	text, err := nft.Render(tx)
	if err != nil || tx.NumOperations() == 0 {
		return "", err
	}
	return text, ctx.Err()
}

// classify applies Options.Classify.
func (r *Runner) classify(e *nft.Error) error {
	if r.opts.Classify != nil {
		return r.opts.Classify(e)
	}
	return e
}

// batchError names the first refused command.
func batchError(msgs []msg, first uint32, errs []opError) *nft.Error {
	e := errs[0]
	cmd := "batch"
	if i := int(e.seq) - int(first); i >= 0 && i < len(msgs) {
		cmd = fmt.Sprintf("%q", msgs[i].cmd)
	}
	more := ""
	if len(errs) > 1 {
		more = fmt.Sprintf(" (and %d more)", len(errs)-1)
	}
	return &nft.Error{Msg: fmt.Sprintf("nftables over netlink: %s: %v%s", cmd, &e, more), Errno: e.errno}
}

// lookupSet asks the kernel for a set's types (r.mu held).
func (r *Runner) lookupSet(name string) (*setInfo, error) {
	if s, ok := r.sets[name]; ok {
		return s, nil
	}
	conn, err := r.dial()
	if err != nil {
		return nil, err
	}
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: str(r.table)},
		{Type: unix.NFTA_SET_NAME, Data: str(name)},
	})
	replies, _, err := conn.request(unix.NFT_MSG_GETSET, 0, r.nfproto(), data)
	if err != nil {
		return nil, fmt.Errorf("reading set %s: %w", name, r.wrapErr(err))
	}
	for _, rep := range replies {
		if _, s, err := parseSet(rep.data); err == nil && s != nil {
			r.sets[strings.Clone(name)] = s
			return s, nil
		} else if err != nil {
			return nil, err
		}
	}
	return nil, &nft.Error{Msg: fmt.Sprintf("no set %q in table %s %s", name, r.family, r.table), Errno: syscall.ENOENT}
}

func (r *Runner) wrapErr(err error) error {
	var oe *opError
	if errors.As(err, &oe) {
		return r.classify(&nft.Error{Msg: fmt.Sprintf("nftables over netlink: %v", oe), Errno: oe.errno})
	}
	return err
}

// parseSet reads a NEWSET message: its name and, when its types are ones
// we encode, its setInfo (nil for anonymous sets).
func parseSet(b []byte) (name string, s *setInfo, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", nil, err
	}
	var flags, keyType, keyLen, dataType, dataLen uint32
	var table string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_TABLE:
			table = ad.String()
		case unix.NFTA_SET_NAME:
			name = ad.String()
		case unix.NFTA_SET_FLAGS:
			flags = beU32(ad.Bytes())
		case unix.NFTA_SET_KEY_TYPE:
			keyType = beU32(ad.Bytes())
		case unix.NFTA_SET_KEY_LEN:
			keyLen = beU32(ad.Bytes())
		case unix.NFTA_SET_DATA_TYPE:
			dataType = beU32(ad.Bytes())
		case unix.NFTA_SET_DATA_LEN:
			dataLen = beU32(ad.Bytes())
		}
	}
	_ = table
	if err := ad.Err(); err != nil {
		return "", nil, err
	}
	if flags&setAnonymous != 0 {
		return name, nil, nil
	}
	s = &setInfo{}
	if s.key, err = concatFromID(keyType, int(keyLen)); err != nil {
		return name, nil, nil // a set we do not encode elements for
	}
	if flags&setMap != 0 {
		if dataType == verdictType {
			s.verdict = true
		} else if s.data, err = concatFromID(dataType, int(dataLen)); err != nil {
			return name, nil, nil
		}
	}
	return name, s, nil
}

func beU32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// ListAll names the table's chains, sets and maps (anonymous sets left
// out), read over netlink; nil and no error when the table is missing.
func (r *Runner) ListAll(ctx context.Context) (map[string][]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	conn, err := r.dial()
	if err != nil {
		return nil, err
	}
	tb, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: str(r.table)}})
	if _, _, err := conn.request(unix.NFT_MSG_GETTABLE, 0, r.nfproto(), tb); err != nil {
		err = r.wrapErr(err)
		if nft.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading table %s %s: %w", r.family, r.table, err)
	}
	out := map[string][]string{}
	chains, err := r.dump(conn, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE)
	if err != nil {
		return nil, err
	}
	for _, rep := range chains {
		if name, ok := nameIn(rep.data, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, r.table); ok {
			out["chain"] = append(out["chain"], name)
		}
	}
	sets, err := r.dump(conn, unix.NFT_MSG_GETSET, unix.NFTA_SET_TABLE)
	if err != nil {
		return nil, err
	}
	for _, rep := range sets {
		name, ok := nameIn(rep.data, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, r.table)
		if !ok {
			continue
		}
		_, s, err := parseSet(rep.data)
		if err != nil {
			return nil, err
		}
		flags := setFlags(rep.data)
		if flags&setAnonymous != 0 {
			continue
		}
		typ := "set"
		if flags&setMap != 0 {
			typ = "map"
		}
		out[typ] = append(out[typ], name)
		if s != nil {
			r.sets[strings.Clone(name)] = s
		}
	}
	return out, nil
}

// dump lists objects of the table, retrying an interrupted dump.
func (r *Runner) dump(conn *conn, typ uint16, tableAttr uint16) ([]reply, error) {
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: tableAttr, Data: str(r.table)}})
	return r.dumpWith(conn, typ, data)
}

// dumpWith sends a dump request with the attributes data, retrying an
// interrupted dump.
func (r *Runner) dumpWith(conn *conn, typ uint16, data []byte) ([]reply, error) {
	for attempt := 0; ; attempt++ {
		replies, _, err := conn.request(typ, netlink.Dump, r.nfproto(), data)
		if errors.Is(err, errDumpInterrupted) && attempt < 10 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing table %s %s: %w", r.family, r.table, r.wrapErr(err))
		}
		return replies, nil
	}
}

func nameIn(b []byte, tableAttr, nameAttr uint16, table string) (string, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", false
	}
	var t, name string
	for ad.Next() {
		switch ad.Type() {
		case tableAttr:
			t = ad.String()
		case nameAttr:
			name = ad.String()
		}
	}
	return name, t == table && name != ""
}

func setFlags(b []byte) uint32 {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return 0
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_SET_FLAGS {
			return beU32(ad.Bytes())
		}
	}
	return 0
}

// ExecFallback returns an Options.Fallback that runs a transaction with
// the nft binary (nft.Runner, its Classify set to classify), found in
// PATH or at paths only when a transaction first falls back: a Runner
// needs no nft installed for what it compiles itself. nft runs in the
// caller's network namespace (for a Runner without Options.NetNS).
func ExecFallback(family knftables.Family, table string, classify func(*nft.Error) error, paths ...string) func(context.Context, *knftables.Transaction) error {
	return func(ctx context.Context, tx *knftables.Transaction) error {
		r, err := nft.New(family, table, paths...)
		if err != nil {
			return fmt.Errorf("this nftables transaction needs the nft binary (the netlink compiler does not cover it): %w", err)
		}
		r.Classify = classify
		return r.Run(ctx, tx)
	}
}
