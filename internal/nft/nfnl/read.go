package nfnl

// Reads for the CNI plugins, which use knftables.Interface and
// nft.Interface beyond Run: chains, rules (chain, handle and comment, as
// nft.Runner gives them; not the rule text), and the elements of sets and
// maps decoded to the strings nft prints for them. Plus Check (a batch the
// kernel validates and aborts) and Probe (one GETGEN: is nf_tables there
// and may we use it), the cheap answer to a CNI STATUS.

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

// open checks ctx, takes r.mu and opens the socket; unlock releases r.mu.
func (r *Runner) open(ctx context.Context) (c *conn, unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	if c, err = r.dial(); err != nil {
		r.mu.Unlock()
		return nil, nil, err
	}
	return c, r.mu.Unlock, nil
}

// Probe checks that nf_tables answers over netlink in the runner's
// namespace and that we may use it (nfnetlink wants CAP_NET_ADMIN for
// every request): one GETGEN round trip, no kernel transaction.
func (r *Runner) Probe(ctx context.Context) error {
	conn, unlock, err := r.open(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if _, _, err := conn.request(unix.NFT_MSG_GETGEN, 0, r.nfproto(), nil); err != nil {
		return fmt.Errorf("nftables over netlink: %w", r.wrapErr(err))
	}
	return nil
}

// Check implements knftables.Interface: the kernel runs tx's batch and
// aborts it (a batch without its end message, as `nft --check` sends),
// reporting what it would refuse. It is as slow as nft's check (an
// aborted transaction waits for an RCU grace period): not for hot paths.
func (r *Runner) Check(ctx context.Context, tx *knftables.Transaction) error {
	text, err := render(ctx, tx)
	if err != nil || text == "" {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := compileText(string(r.family), r.table, text, r.lookupSet)
	if err != nil {
		return fmt.Errorf("compiling nftables transaction: %w", err)
	}
	conn, err := r.dial()
	if err != nil {
		return err
	}
	first, errs, err := conn.send1(r.nfproto(), c.msgs, false)
	if err != nil {
		_ = conn.close()
		r.conn = nil
		return fmt.Errorf("checking nftables transaction over netlink: %w", err)
	}
	if len(errs) > 0 {
		return r.classify(batchError(c.msgs, first, errs))
	}
	return nil
}

// List implements knftables.Interface.
func (r *Runner) List(ctx context.Context, objectType string) ([]string, error) {
	all, err := r.ListAll(ctx)
	if err != nil {
		return nil, err
	}
	return all[strings.TrimSuffix(objectType, "s")], nil
}

// ListCounters implements knftables.Interface. No table this package
// writes has named counters, so none are read.
func (r *Runner) ListCounters(context.Context) ([]*knftables.Counter, error) {
	return nil, unsupported("listing counters")
}

// ListTable implements nft.Interface: chains in the kernel's order, rules
// in chain order; nil and no error when the table is missing.
func (r *Runner) ListTable(ctx context.Context) (*nft.Table, error) {
	conn, unlock, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if ok, err := r.tableExists(conn); !ok || err != nil {
		return nil, err
	}
	chains, err := r.dump(conn, unix.NFT_MSG_GETCHAIN, unix.NFTA_CHAIN_TABLE)
	if err != nil {
		return nil, err
	}
	t := &nft.Table{}
	for _, rep := range chains {
		if name, ok := nameIn(rep.data, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, r.table); ok {
			t.Chains = append(t.Chains, name)
		}
	}
	if t.Rules, err = r.rules(conn, ""); err != nil {
		return nil, err
	}
	return t, nil
}

// ListRules implements knftables.Interface: Chain, Handle and Comment are
// filled in, Rule is not (as with nft.Runner and knftables). A missing
// chain is an error that nft.IsNotFound recognises.
func (r *Runner) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	conn, unlock, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if chain == "" {
		if ok, err := r.tableExists(conn); !ok || err != nil {
			return nil, err
		}
	} else {
		data, _ := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.NFTA_CHAIN_TABLE, Data: str(r.table)},
			{Type: unix.NFTA_CHAIN_NAME, Data: str(chain)},
		})
		if _, _, err := conn.request(unix.NFT_MSG_GETCHAIN, 0, r.nfproto(), data); err != nil {
			return nil, fmt.Errorf("reading chain %s of table %s %s: %w", chain, r.family, r.table, r.wrapErr(err))
		}
	}
	return r.rules(conn, chain)
}

func (r *Runner) tableExists(conn *conn) (bool, error) {
	tb, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: str(r.table)}})
	if _, _, err := conn.request(unix.NFT_MSG_GETTABLE, 0, r.nfproto(), tb); err != nil {
		err = r.wrapErr(err)
		if nft.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading table %s %s: %w", r.family, r.table, err)
	}
	return true, nil
}

// rules dumps the rules of chain ("": of the table).
func (r *Runner) rules(conn *conn, chain string) ([]*knftables.Rule, error) {
	attrs := []netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: str(r.table)}}
	if chain != "" {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: str(chain)})
	}
	data, _ := netlink.MarshalAttributes(attrs)
	replies, err := r.dumpWith(conn, unix.NFT_MSG_GETRULE, data)
	if err != nil {
		return nil, err
	}
	out := []*knftables.Rule{}
	for _, rep := range replies {
		rule, table, err := parseRule(rep.data)
		if err != nil {
			return nil, fmt.Errorf("reading rules of table %s %s: %w", r.family, r.table, err)
		}
		if table == r.table && (chain == "" || rule.Chain == chain) {
			out = append(out, rule)
		}
	}
	return out, nil
}

func parseRule(b []byte) (rule *knftables.Rule, table string, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, "", err
	}
	rule = &knftables.Rule{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			table = ad.String()
		case unix.NFTA_RULE_CHAIN:
			rule.Chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			if h := ad.Bytes(); len(h) == 8 {
				rule.Handle = knftables.PtrTo(int(binary.BigEndian.Uint64(h)))
			}
		case unix.NFTA_RULE_USERDATA:
			if c, ok := udataComment(ad.Bytes(), udataCommentType); ok {
				rule.Comment = &c
			}
		}
	}
	return rule, table, ad.Err()
}

// udataComment finds the comment TLV of typ in userdata.
func udataComment(b []byte, typ byte) (string, bool) {
	for len(b) >= 2 {
		t, n := b[0], int(b[1])
		if len(b) < 2+n {
			break
		}
		if t == typ {
			s, _, _ := strings.Cut(string(b[2:2+n]), "\x00")
			return s, true
		}
		b = b[2+n:]
	}
	return "", false
}

// ListElements implements knftables.Interface for the sets and maps whose
// key and value types this package encodes (addresses, ports, protocols,
// integers, marks, interface names, ether addresses, verdicts), with no
// intervals. Keys and values are written as nft prints them (interface
// names unquoted, as in nft's JSON); a missing set or map is an error
// that nft.IsNotFound recognises.
func (r *Runner) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	conn, unlock, err := r.open(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	missing := &nft.Error{Msg: fmt.Sprintf("no %s %q in table %s %s", objectType, name, r.family, r.table), Errno: syscall.ENOENT}
	data, _ := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: str(r.table)},
		{Type: unix.NFTA_SET_NAME, Data: str(name)},
	})
	replies, _, err := conn.request(unix.NFT_MSG_GETSET, 0, r.nfproto(), data)
	if err != nil {
		err = r.wrapErr(err)
		if nft.IsNotFound(err) {
			return nil, missing
		}
		return nil, fmt.Errorf("reading %s %s: %w", objectType, name, err)
	}
	if len(replies) != 1 {
		return nil, missing
	}
	flags := setFlags(replies[0].data)
	if (flags&setMap != 0) != (objectType == "map") {
		return nil, missing
	}
	_, s, err := parseSet(replies[0].data)
	if err != nil {
		return nil, err
	}
	if s == nil || flags&setInterval != 0 {
		return nil, unsupported("listing the elements of %s %s (its types or its intervals)", objectType, name)
	}
	data, _ = netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: str(r.table)},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: str(name)},
	})
	replies, err = r.dumpWith(conn, unix.NFT_MSG_GETSETELEM, data)
	if err != nil {
		return nil, err
	}
	out := []*knftables.Element{}
	for _, rep := range replies {
		es, err := parseElements(rep.data, s)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", objectType, name, err)
		}
		for _, e := range es {
			if objectType == "map" {
				e.Map = name
			} else {
				e.Set = name
			}
		}
		out = append(out, es...)
	}
	return out, nil
}

// parseElements reads a NEWSETELEM message of set s.
func parseElements(b []byte, s *setInfo) ([]*knftables.Element, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var out []*knftables.Element
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				var e *knftables.Element
				list.Nested(func(ed *netlink.AttributeDecoder) error {
					e, err = parseElement(ed, s)
					return err
				})
				if err != nil {
					return err
				}
				out = append(out, e)
			}
			return nil
		})
	}
	if err == nil {
		err = ad.Err()
	}
	return out, err
}

func parseElement(ad *netlink.AttributeDecoder, s *setInfo) (*knftables.Element, error) {
	e := &knftables.Element{}
	var err error
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_FLAGS:
			if beU32(ad.Bytes())&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
				return nil, unsupported("interval elements")
			}
		case unix.NFTA_SET_ELEM_KEY:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					if d.Type() == unix.NFTA_DATA_VALUE {
						e.Key, err = s.key.decode(d.Bytes())
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_DATA:
			ad.Nested(func(d *netlink.AttributeDecoder) error {
				for d.Next() {
					switch d.Type() {
					case unix.NFTA_DATA_VALUE:
						if s.data == nil {
							err = fmt.Errorf("data for an element of a set without data")
							continue
						}
						var v []string
						if v, err = s.data.decode(d.Bytes()); err == nil {
							e.Value = []string{strings.Join(v, " . ")}
						}
					case unix.NFTA_DATA_VERDICT:
						d.Nested(func(vd *netlink.AttributeDecoder) error {
							var v string
							v, err = parseVerdictAttrs(vd)
							e.Value = []string{v}
							return nil
						})
					}
				}
				return nil
			})
		case unix.NFTA_SET_ELEM_USERDATA:
			if c, ok := udataComment(ad.Bytes(), udataCommentType); ok {
				e.Comment = &c
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if err := ad.Err(); err != nil {
		return nil, err
	}
	if e.Key == nil {
		return nil, fmt.Errorf("element without a key")
	}
	return e, nil
}

var verdictNames = map[int32]string{1: "accept", 0: "drop", -1: "continue", -5: "return", -3: "jump", -4: "goto"}

func parseVerdictAttrs(ad *netlink.AttributeDecoder) (string, error) {
	var code int32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code = int32(beU32(ad.Bytes()))
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	name, ok := verdictNames[code]
	if !ok {
		return "", fmt.Errorf("verdict code %d", code)
	}
	if chain != "" {
		return name + " " + chain, nil
	}
	return name, ad.Err()
}
