package nfnl

// Rule text to expressions, for the statements flatnet's renderers write:
//
//	SELECTOR [. SELECTOR]... (vmap @m | vmap { k : v , ... } | @s | != @s | [!=] VALUE | [!=] { PREFIX , ... })
//	ct state|status VALUE, mark and V != 0, fib saddr|daddr type local
//	jump|goto CHAIN, drop, accept, return, counter, masquerade [fully-random],
//	reject [with tcp reset], mark set mark or|xor|and V, update @s { SELECTOR },
//	dnat to ADDR[:PORT], dnat ip addr . port to numgen random mod N map { i : ADDR . PORT , ... } | @m
//
// where SELECTOR is ip|ip6 saddr|daddr, meta l4proto, th sport|dport,
// numgen random mod N [offset K]; and, for the CNI plugins' inet and bridge
// tables, meta nfproto ipv4|ipv6, tcp|udp|sctp sport|dport, iifname|oifname
// (against a set or map), ether saddr|daddr (bridge), meta mark & V == V,
// meta mark set meta mark | V, dnat ip|ip6 to ADDR[:PORT], and
// { PREFIX|ADDR , ... } with at least one prefix. In an inet table "ip
// saddr" depends on "meta nfproto ipv4" and "tcp dport" on "meta l4proto
// tcp": nft inserts those matches unless the rule made them already, and
// so do we. Registers are assigned as nft assigns them: a
// concatenation's fields in consecutive 32-bit registers, each named by its
// 128-bit register (1-4) when it starts one, else by its 32-bit one (8-23);
// so "ip daddr . meta l4proto . th dport" loads into 1, 9 and 10.

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// field is one selector: how to load it and what it yields.
type field struct {
	t    dtype
	load func(reg uint32) expr.Any
	// payload fields can be compared on a prefix (fewer bytes).
	payload *expr.Payload
	// typeof is how nft records the expression in a set's userdata
	// (typeofUdata); nil for those we never put there.
	typeof []byte
	// bits: ct state/status and marks match with a mask, not equality.
	bits bool
}

// reg names the register at 32-bit offset off, as nft does.
func reg(off int) uint32 {
	if off%4 == 0 {
		return uint32(1 + off/4)
	}
	return uint32(8 + off)
}

type ruleCompiler struct {
	c     *compiler
	cmd   *command
	toks  []string
	i     int
	exprs []expr.Any
	// nfproto and l4proto are what the rule has matched so far (0: not
	// yet), so that a dependency is inserted once, as nft does.
	nfproto, l4proto byte
}

// needNfproto inserts "meta nfproto P" before a network header match in
// an inet table, unless the rule already holds it.
func (r *ruleCompiler) needNfproto(kw string) error {
	want := families[kw]
	switch fam := r.c.family; {
	case fam.l3():
		if kw != fam.name {
			return unsupported("%s match in a %s table", kw, fam.name)
		}
		return nil
	case fam.proto != unix.NFPROTO_INET:
		return unsupported("%s match in a %s table", kw, fam.name)
	}
	if r.nfproto == want.proto {
		return nil
	}
	if r.nfproto != 0 {
		return unsupported("rule %q matches two network protocols", r.cmd.body)
	}
	r.emit(&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{want.proto}})
	r.nfproto = want.proto
	return nil
}

// needL4proto inserts "meta l4proto P" before a transport header match,
// unless the rule already holds it.
func (r *ruleCompiler) needL4proto(p byte) error {
	if r.l4proto == p {
		return nil
	}
	if r.l4proto != 0 {
		return unsupported("rule %q matches two transport protocols", r.cmd.body)
	}
	r.emit(&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}})
	r.l4proto = p
	return nil
}

func (r *ruleCompiler) peek() string {
	if r.i < len(r.toks) {
		return r.toks[r.i]
	}
	return ""
}

func (r *ruleCompiler) next() string { t := r.peek(); r.i++; return t }

func (r *ruleCompiler) expect(want ...string) error {
	for _, w := range want {
		if t := r.next(); t != w {
			return unsupported("rule %q: %q where %q was expected", r.cmd.body, t, w)
		}
	}
	return nil
}

func (r *ruleCompiler) bad() error {
	return unsupported("rule %q at %q", r.cmd.body, strings.Join(r.toks[min(r.i, len(r.toks)):], " "))
}

func (c *compiler) ruleCmd(cmd *command) error {
	if cmd.verb == "delete" {
		h, _ := strconv.ParseUint(cmd.body, 10, 64)
		return c.add(unix.NFT_MSG_DELRULE, 0, cmd,
			netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: str(c.table)},
			netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: str(cmd.name)},
			netlink.Attribute{Type: unix.NFTA_RULE_HANDLE, Data: be64(h)})
	}
	if cmd.verb != "add" {
		return unsupported("%s rule", cmd.verb)
	}
	exprs, err := c.ruleExprs(cmd)
	if err != nil {
		return err
	}
	list := make([]netlink.Attribute, 0, len(exprs))
	for _, e := range exprs {
		b, err := marshalExpr(c.family.proto, e, c.binops[e])
		if err != nil {
			return err
		}
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: b})
	}
	lb, err := netlink.MarshalAttributes(list)
	if err != nil {
		return err
	}
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: str(c.table)},
		{Type: unix.NFTA_RULE_CHAIN, Data: str(cmd.name)},
		{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: lb},
	}
	if cmd.comment != nil {
		ud, err := commentUdata(udataCommentType, *cmd.comment)
		if err != nil {
			return err
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_RULE_USERDATA, Data: ud})
	}
	return c.add(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, cmd, attrs...)
}

// binop records b as the bitwise of a binary operation ("mark & V",
// "mark set mark | V"), for which nft names the operation; it does not
// for the masks of prefixes and flags.
func (c *compiler) binop(b *expr.Bitwise) *expr.Bitwise {
	if c.binops == nil {
		c.binops = map[expr.Any]bool{}
	}
	c.binops[b] = true
	return b
}

// marshalExpr encodes e as nft does. google/nftables orders the
// attributes of bitwise and fib otherwise than libnftnl and never names
// bitwise's operation (boolean, the kernel's default), which nft does for
// a binary operation (withOp): equivalent, but these two are written here
// so the bytes are nft's own.
func marshalExpr(fam byte, e expr.Any, withOp bool) ([]byte, error) {
	var name string
	var attrs []netlink.Attribute
	switch e := e.(type) {
	case *expr.Bitwise:
		if e.Len == 0 || len(e.Mask) != int(e.Len) || len(e.Xor) != int(e.Len) {
			return expr.Marshal(fam, e)
		}
		name = "bitwise"
		attrs = []netlink.Attribute{
			{Type: unix.NFTA_BITWISE_SREG, Data: be32(e.SourceRegister)},
			{Type: unix.NFTA_BITWISE_DREG, Data: be32(e.DestRegister)},
		}
		if withOp {
			attrs = append(attrs, netlink.Attribute{Type: nftaBitwiseOp, Data: be32(0)}) // NFT_BITWISE_BOOL
		}
		attrs = append(attrs,
			netlink.Attribute{Type: unix.NFTA_BITWISE_LEN, Data: be32(e.Len)},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_BITWISE_MASK, Data: dataValue(e.Mask)},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_BITWISE_XOR, Data: dataValue(e.Xor)})
	case *expr.Fib:
		var flags, result uint32
		for _, f := range []struct {
			on  bool
			bit uint32
		}{{e.FlagSADDR, unix.NFTA_FIB_F_SADDR}, {e.FlagDADDR, unix.NFTA_FIB_F_DADDR}, {e.FlagMARK, unix.NFTA_FIB_F_MARK},
			{e.FlagIIF, unix.NFTA_FIB_F_IIF}, {e.FlagOIF, unix.NFTA_FIB_F_OIF}, {e.FlagPRESENT, unix.NFTA_FIB_F_PRESENT}} {
			if f.on {
				flags |= f.bit
			}
		}
		switch {
		case e.ResultADDRTYPE && !e.ResultOIF && !e.ResultOIFNAME:
			result = unix.NFT_FIB_RESULT_ADDRTYPE
		default:
			return expr.Marshal(fam, e)
		}
		name = "fib"
		attrs = []netlink.Attribute{
			{Type: unix.NFTA_FIB_FLAGS, Data: be32(flags)},
			{Type: unix.NFTA_FIB_RESULT, Data: be32(result)},
			{Type: unix.NFTA_FIB_DREG, Data: be32(e.Register)},
		}
	default:
		return expr.Marshal(fam, e)
	}
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: str(name)},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}

// ruleExprs compiles a rule's text (adding the messages of its anonymous
// sets to c).
func (c *compiler) ruleExprs(cmd *command) ([]expr.Any, error) {
	toks, err := tokens(cmd.body)
	if err != nil {
		return nil, err
	}
	r := &ruleCompiler{c: c, cmd: cmd, toks: toks}
	for r.i < len(r.toks) {
		if err := r.statement(); err != nil {
			return nil, err
		}
	}
	return r.exprs, nil
}

func (r *ruleCompiler) emit(e ...expr.Any) { r.exprs = append(r.exprs, e...) }

func (r *ruleCompiler) statement() error {
	switch t := r.peek(); t {
	case "jump", "goto":
		r.next()
		chain := r.next()
		if chain == "" {
			return r.bad()
		}
		kind := expr.VerdictJump
		if t == "goto" {
			kind = expr.VerdictGoto
		}
		r.emit(&expr.Verdict{Kind: kind, Chain: chain})
	case "drop", "accept", "return", "continue":
		r.next()
		r.emit(&expr.Verdict{Kind: map[string]expr.VerdictKind{"drop": expr.VerdictDrop, "accept": expr.VerdictAccept,
			"return": expr.VerdictReturn, "continue": expr.VerdictContinue}[t]})
	case "counter":
		r.next()
		r.emit(&expr.Counter{})
	case "masquerade":
		r.next()
		m := &expr.Masq{}
		for r.peek() == "fully-random" || r.peek() == "random" || r.peek() == "persistent" {
			switch r.next() {
			case "fully-random":
				m.FullyRandom = true
			case "random":
				m.Random = true
			case "persistent":
				m.Persistent = true
			}
		}
		r.emit(m)
	case "reject":
		return r.reject()
	case "update", "add":
		return r.dynset()
	case "dnat":
		return r.dnat()
	case "mark", "meta":
		if t == "meta" && (r.i+1 >= len(r.toks) || r.toks[r.i+1] != "mark") {
			return r.match()
		}
		if t == "meta" {
			r.next()
		}
		if r.i+1 < len(r.toks) && r.toks[r.i+1] == "set" {
			return r.markSet()
		}
		return r.match()
	default:
		return r.match()
	}
	return nil
}

// selector parses one or more fields joined by ".".
func (r *ruleCompiler) selector() ([]field, error) {
	var fs []field
	for {
		f, err := r.field()
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
		if r.peek() != "." {
			return fs, nil
		}
		r.next()
	}
}

func payload(base expr.PayloadBase, off, n uint32) *expr.Payload {
	return &expr.Payload{OperationType: expr.PayloadLoad, Base: base, Offset: off, Len: n}
}

// payloadField is a payload selector; desc and tmpl are nft's protocol
// and template ids of it (for set userdata), desc 0 for none.
func payloadField(t dtype, p *expr.Payload, desc, tmpl uint32) field {
	var ud []byte
	if desc != 0 {
		ud = payloadTypeof(desc, tmpl)
	}
	return field{t: t, payload: p, typeof: ud, load: func(reg uint32) expr.Any {
		cp := *p
		cp.DestRegister = reg
		return &cp
	}}
}

func (r *ruleCompiler) field() (field, error) {
	fam := r.c.family
	switch t := r.next(); t {
	case "ip", "ip6":
		if err := r.needNfproto(t); err != nil {
			return field{}, err
		}
		fam := families[t]
		n := uint32(fam.addr.len)
		var off, tmpl uint32
		switch w := r.next(); {
		case w == "saddr" && t == "ip":
			off, tmpl = 12, 11
		case w == "daddr" && t == "ip":
			off, tmpl = 16, 12
		case w == "saddr":
			off, tmpl = 8, 8
		case w == "daddr":
			off, tmpl = 24, 9
		default:
			return field{}, r.bad()
		}
		return payloadField(fam.addr, payload(expr.PayloadBaseNetworkHeader, off, n), fam.desc, tmpl), nil
	case "tcp", "udp", "sctp":
		off := map[string]uint32{"sport": 0, "dport": 2}
		o, ok := off[r.next()]
		if !ok {
			return field{}, r.bad()
		}
		if err := r.needL4proto(protoNums[t]); err != nil {
			return field{}, err
		}
		return payloadField(tService, payload(expr.PayloadBaseTransportHeader, o, 2), 0, 0), nil
	case "iifname", "oifname":
		return ifnameField(t), nil
	case "ether":
		if fam.proto != unix.NFPROTO_BRIDGE {
			return field{}, unsupported("ether match in a %s table", fam.name)
		}
		off := map[string]uint32{"daddr": 0, "saddr": 6}
		o, ok := off[r.next()]
		if !ok {
			return field{}, r.bad()
		}
		return payloadField(tEther, payload(expr.PayloadBaseLLHeader, o, 6), 0, 0), nil
	case "th":
		off := map[string]uint32{"sport": 0, "dport": 2}
		w := r.next()
		o, ok := off[w]
		if !ok {
			return field{}, r.bad()
		}
		return payloadField(tService, payload(expr.PayloadBaseTransportHeader, o, 2), 0, 0), nil
	case "meta":
		switch r.next() {
		case "l4proto":
			return field{t: tProto, load: func(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }}, nil
		case "mark":
			return markField(), nil
		case "nfproto":
			if fam.proto != unix.NFPROTO_INET {
				return field{}, unsupported("meta nfproto in a %s table", fam.name)
			}
			return field{t: tNfproto, load: func(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg} }}, nil
		case "iifname", "oifname":
			r.i--
			return ifnameField(r.next()), nil
		}
		return field{}, r.bad()
	case "mark":
		return markField(), nil
	case "ct":
		keys := map[string]struct {
			k expr.CtKey
			t dtype
		}{"state": {expr.CtKeySTATE, tCtState}, "status": {expr.CtKeySTATUS, tCtStatus}}
		k, ok := keys[r.next()]
		if !ok {
			return field{}, r.bad()
		}
		return field{t: k.t, bits: true, load: func(reg uint32) expr.Any { return &expr.Ct{Key: k.k, Register: reg} }}, nil
	case "fib":
		f := &expr.Fib{ResultADDRTYPE: true}
		switch r.next() {
		case "saddr":
			f.FlagSADDR = true
		case "daddr":
			f.FlagDADDR = true
		default:
			return field{}, r.bad()
		}
		if err := r.expect("type"); err != nil {
			return field{}, err
		}
		return field{t: tFibType, load: func(reg uint32) expr.Any { cp := *f; cp.Register = reg; return &cp }}, nil
	case "numgen":
		if err := r.expect("random", "mod"); err != nil {
			return field{}, err
		}
		n, err := strconv.ParseUint(r.next(), 10, 32)
		if err != nil || n == 0 {
			return field{}, r.bad()
		}
		var off uint64
		if r.peek() == "offset" {
			r.next()
			if off, err = strconv.ParseUint(r.next(), 10, 32); err != nil {
				return field{}, r.bad()
			}
		}
		ud := typeofUdata(typeofNumgen, udataU32(udataU32(udataU32(nil, 0, unix.NFT_NG_RANDOM), 1, uint32(n)), 2, uint32(off)))
		return field{t: tInteger, typeof: ud, load: func(reg uint32) expr.Any {
			return &expr.Numgen{Register: reg, Modulus: uint32(n), Offset: uint32(off), Type: unix.NFT_NG_RANDOM}
		}}, nil
	}
	r.i--
	return field{}, r.bad()
}

func ifnameField(kw string) field {
	key := expr.MetaKeyIIFNAME
	if kw == "oifname" {
		key = expr.MetaKeyOIFNAME
	}
	return field{t: tIfname, load: func(reg uint32) expr.Any { return &expr.Meta{Key: key, Register: reg} }}
}

func markField() field {
	return field{t: tMark, load: func(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyMARK, Register: reg} }}
}

// load emits the loads of fs into consecutive registers from 1.
func (r *ruleCompiler) load(fs []field) {
	off := 0
	for _, f := range fs {
		r.emit(f.load(reg(off)))
		off += pad4(f.t.len) / 4
	}
}

func keyOf(fs []field) concat {
	c := make(concat, len(fs))
	for i, f := range fs {
		c[i] = f.t
	}
	return c
}

// match parses a selector and what it is matched against.
func (r *ruleCompiler) match() error {
	fs, err := r.selector()
	if err != nil {
		return err
	}
	key := keyOf(fs)
	switch t := r.peek(); {
	case t == "vmap":
		r.next()
		r.load(fs)
		if strings.HasPrefix(r.peek(), "@") {
			return r.lookupNamed(r.next()[1:], false, true)
		}
		return r.anonMap(key, nil, 0)
	case strings.HasPrefix(t, "@"):
		r.load(fs)
		return r.lookupNamed(r.next()[1:], false, false)
	}
	if len(fs) != 1 {
		return r.bad()
	}
	f := fs[0]
	if f.t == tMark && (r.peek() == "and" || r.peek() == "&") {
		// mark and V != 0, meta mark & V == V
		r.next()
		mask, err := tMark.encode(r.next())
		if err != nil {
			return err
		}
		op := r.next()
		v, err := tMark.encode(r.next())
		if err != nil || (op != "!=" && op != "==") {
			return r.bad()
		}
		r.load(fs)
		r.emit(r.c.binop(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)}))
		r.emit(&expr.Cmp{Op: cmpOp(op == "!="), Register: 1, Data: v})
		return nil
	}
	neq := false
	if r.peek() == "!=" {
		r.next()
		neq = true
	}
	switch t := r.peek(); {
	case strings.HasPrefix(t, "@"):
		r.load(fs)
		return r.lookupNamed(r.next()[1:], neq, false)
	case t == "{":
		if f.payload == nil || !isAddr(f.t) {
			return unsupported("anonymous set of %s in %q", f.t.name, r.cmd.body)
		}
		r.load(fs)
		return r.prefixSet(f, neq)
	case t == "":
		return r.bad()
	}
	v := r.next()
	if f.t == tIfname {
		// nft compares names of any length, with wildcards: not ours.
		return unsupported("interface name match %q", r.cmd.body)
	}
	if f.bits {
		if neq {
			return r.bad()
		}
		b, err := f.t.encode(v)
		if err != nil {
			return err
		}
		r.load(fs)
		r.emit(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: b, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
		return nil
	}
	if f.payload != nil && isAddr(f.t) && strings.Contains(v, "/") {
		return r.prefixCmp(f, v, neq)
	}
	b, err := f.t.encode(v)
	if err != nil {
		return err
	}
	r.load(fs)
	r.emit(&expr.Cmp{Op: cmpOp(neq), Register: 1, Data: b})
	if !neq {
		switch {
		case f.t == tNfproto:
			r.nfproto = b[0]
		case f.t == tProto && r.l4proto == 0:
			r.l4proto = b[0]
		}
	}
	return nil
}

func isAddr(t dtype) bool { return t == tIPv4 || t == tIPv6 }

func cmpOp(neq bool) expr.CmpOp {
	if neq {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// prefixCmp matches an address against a prefix as nft does: a
// byte-aligned prefix loads and compares only its bytes; any other loads
// the whole address and masks it (a /0 too: with a zero mask, as nft does;
// nodePortAddresses ["0.0.0.0/0"] renders one).
func (r *ruleCompiler) prefixCmp(f field, v string, neq bool) error {
	p, err := netip.ParsePrefix(v)
	if err != nil || p.Addr().Is4() != (f.t == tIPv4) {
		return unsupported("prefix %q", v)
	}
	p = p.Masked()
	addr := p.Addr().AsSlice()
	pl := *f.payload
	pl.DestRegister = 1
	if p.Bits()%8 == 0 && p.Bits() > 0 {
		n := p.Bits() / 8
		pl.Len = uint32(n)
		r.emit(&pl, &expr.Cmp{Op: cmpOp(neq), Register: 1, Data: addr[:n]})
		return nil
	}
	mask := make([]byte, len(addr))
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	r.emit(&pl, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: cmpOp(neq), Register: 1, Data: addr})
	return nil
}

func (r *ruleCompiler) lookupNamed(name string, invert, verdictMap bool) error {
	s, err := r.c.set(name)
	if err != nil {
		return err
	}
	if verdictMap != s.verdict {
		return unsupported("%s used as a verdict map: %t", name, verdictMap)
	}
	r.emit(&expr.Lookup{SourceRegister: 1, SetName: name, SetID: s.id, Invert: invert, IsDestRegSet: verdictMap})
	return nil
}

// setItems reads "{ a , b , c }" into its items (each a token list).
func (r *ruleCompiler) setItems() ([][]string, error) {
	if err := r.expect("{"); err != nil {
		return nil, err
	}
	var items [][]string
	var cur []string
	for {
		t := r.next()
		switch t {
		case "":
			return nil, r.bad()
		case ",", "}":
			if len(cur) == 0 {
				return nil, r.bad()
			}
			items = append(items, cur)
			cur = nil
			if t == "}" {
				return items, nil
			}
		default:
			// "{ a, b }": knftables writes what it is given, and
			// nft reads "a," as "a ,".
			if v, ok := strings.CutSuffix(t, ","); ok && v != "" {
				items = append(items, append(cur, v))
				cur = nil
				continue
			}
			cur = append(cur, t)
		}
	}
}

// anonSet adds an anonymous constant set (or map) with its elements and
// returns its name and id for the lookup.
func (r *ruleCompiler) anonSet(flags uint32, key concat, data *concat, ud []byte, elems []element) (string, uint32, error) {
	c := r.c
	id := c.id()
	const name = "__set%d"
	mname := name
	if flags&setMap != 0 {
		mname = "__map%d"
	}
	desc, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_SET_DESC_SIZE, Data: be32(uint32(len(elems)))}})
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: str(c.table)},
		{Type: unix.NFTA_SET_NAME, Data: str(mname)},
		{Type: unix.NFTA_SET_FLAGS, Data: be32(flags)},
		{Type: unix.NFTA_SET_KEY_TYPE, Data: be32(key.id())},
		{Type: unix.NFTA_SET_KEY_LEN, Data: be32(uint32(key.size()))},
	}
	if data != nil {
		dt, dl := uint32(verdictType), 0
		if *data != nil {
			dt, dl = data.id(), data.size()
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_DATA_TYPE, Data: be32(dt)},
			netlink.Attribute{Type: unix.NFTA_SET_DATA_LEN, Data: be32(uint32(dl))})
	}
	attrs = append(attrs,
		netlink.Attribute{Type: unix.NFTA_SET_ID, Data: be32(id)},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_DESC, Data: desc},
		netlink.Attribute{Type: unix.NFTA_SET_USERDATA, Data: ud})
	if err := c.add(unix.NFT_MSG_NEWSET, netlink.Create, r.cmd, attrs...); err != nil {
		return "", 0, err
	}
	if err := c.elements(unix.NFT_MSG_NEWSETELEM, netlink.Create, r.cmd, mname, id, elems); err != nil {
		return "", 0, err
	}
	return mname, id, nil
}

// prefixSet matches f against "{ PREFIX , ... }": an anonymous interval
// set, encoded as nft encodes one (ranges merged, a leading interval end
// at zero, each range as start and end+1).
func (r *ruleCompiler) prefixSet(f field, invert bool) error {
	items, err := r.setItems()
	if err != nil {
		return err
	}
	type rng struct{ lo, end netip.Addr } // end: first address after; invalid at the top
	var rs []rng
	prefixes := 0
	for _, it := range items {
		if len(it) != 1 {
			return r.bad()
		}
		p, err := netip.ParsePrefix(it[0])
		if err == nil {
			prefixes++
		} else if a, aerr := netip.ParseAddr(it[0]); aerr == nil {
			// An address among prefixes is a one-address range.
			p = netip.PrefixFrom(a, a.BitLen())
		} else {
			return unsupported("set element %q (only prefixes and addresses)", it[0])
		}
		if p.Addr().Is4() != (f.t == tIPv4) {
			return unsupported("set element %q", it[0])
		}
		p = p.Masked()
		rs = append(rs, rng{p.Addr(), afterPrefix(p)})
	}
	if prefixes == 0 {
		// nft makes a set of addresses alone a plain (not interval) set.
		return unsupported("set of addresses without a prefix in %q", r.cmd.body)
	}
	sortRanges := func(a, b rng) int { return a.lo.Compare(b.lo) }
	slices.SortFunc(rs, sortRanges)
	var merged []rng
	for _, x := range rs {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if !last.end.IsValid() || x.lo.Compare(last.end) <= 0 {
				if last.end.IsValid() && (!x.end.IsValid() || x.end.Compare(last.end) > 0) {
					last.end = x.end
				}
				continue
			}
		}
		merged = append(merged, x)
	}
	var elems []element
	zero := make([]byte, f.t.len)
	if !merged[0].lo.IsUnspecified() {
		elems = append(elems, element{key: zero, flags: unix.NFT_SET_ELEM_INTERVAL_END})
	}
	for _, x := range merged {
		elems = append(elems, element{key: x.lo.AsSlice()})
		if x.end.IsValid() {
			elems = append(elems, element{key: x.end.AsSlice(), flags: unix.NFT_SET_ELEM_INTERVAL_END})
		}
	}
	ud := udata(udataU32(udataU32(nil, 0, 2), 2, 1), 3, f.typeof)
	name, id, err := r.anonSet(setAnonymous|setConstant|setInterval, concat{f.t}, nil, ud, elems)
	if err != nil {
		return err
	}
	r.emit(&expr.Lookup{SourceRegister: 1, SetName: name, SetID: id, Invert: invert})
	return nil
}

// afterPrefix is the first address after p; invalid when p ends the
// address space.
func afterPrefix(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bit := p.Bits() - 1 // add 1 at the prefix's last bit, carrying left
	for ; bit >= 0; bit-- {
		m := byte(0x80 >> (bit % 8))
		if b[bit/8]&m == 0 {
			b[bit/8] |= m
			break
		}
		b[bit/8] &^= m
	}
	if bit < 0 {
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// anonMap reads "{ k : v , ... }" after a loaded key and looks it up:
// a verdict map when data is nil, else a data map into dreg.
func (r *ruleCompiler) anonMap(key concat, data concat, dreg uint32) error {
	if len(key) != 1 || key[0] != tInteger {
		return unsupported("anonymous map keyed by %s in %q", key[0].name, r.cmd.body)
	}
	items, err := r.setItems()
	if err != nil {
		return err
	}
	var elems []element
	for _, it := range items {
		s := strings.Join(it, " ")
		k, v, ok := strings.Cut(s, " : ")
		if !ok {
			return r.bad()
		}
		e := element{}
		if e.key, err = key.encode([]string{k}); err != nil {
			return err
		}
		if data == nil {
			if e.verdict, err = parseVerdict(v); err != nil {
				return err
			}
		} else if e.data, err = data.encode(strings.Split(v, " . ")); err != nil {
			return err
		}
		elems = append(elems, e)
	}
	// KEYBYTEORDER host, DATABYTEORDER invalid, [DATA_TYPEOF verdict],
	// DATA_INTERVAL 0: as nft writes them.
	ud := udataU32(udataU32(nil, 0, 1), 1, 0)
	if data == nil {
		ud = udata(ud, 4, verdictTypeof)
	}
	ud = udataU32(ud, 6, 0)
	name, id, err := r.anonSet(setAnonymous|setConstant|setMap, key, &data, ud, elems)
	if err != nil {
		return err
	}
	r.emit(&expr.Lookup{SourceRegister: 1, SetName: name, SetID: id, IsDestRegSet: true, DestRegister: dreg})
	return nil
}

func (r *ruleCompiler) reject() error {
	r.next()
	if !r.c.family.l3() {
		return unsupported("reject in a %s table", r.c.family.name)
	}
	v6 := r.c.family.proto == unix.NFPROTO_IPV6
	code := uint8(3) // port-unreachable
	if v6 {
		code = 4
	}
	if r.peek() != "with" {
		r.emit(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
		return nil
	}
	r.next()
	switch kind := r.next(); kind {
	case "tcp":
		if err := r.expect("reset"); err != nil {
			return err
		}
		r.emit(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
		return nil
	case "icmp", "icmpv6":
		if (kind == "icmpv6") != v6 {
			return r.bad()
		}
		if r.peek() == "type" {
			r.next()
		}
		codes := map[string]uint8{"port-unreachable": 3, "host-unreachable": 1, "net-unreachable": 0, "admin-prohibited": 13, "host-prohibited": 10}
		if v6 {
			codes = map[string]uint8{"port-unreachable": 4, "no-route": 0, "admin-prohibited": 1, "addr-unreachable": 3}
		}
		c, ok := codes[r.next()]
		if !ok {
			return r.bad()
		}
		r.emit(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: c})
		return nil
	}
	return r.bad()
}

// markSet: "mark set mark or|xor|and V" (or | ^ &) or "mark set V".
func (r *ruleCompiler) markSet() error {
	r.next() // mark
	r.next() // set
	if r.peek() == "mark" || r.peek() == "meta" {
		if r.next() == "meta" {
			if err := r.expect("mark"); err != nil {
				return err
			}
		}
		op := r.next()
		v, err := tMark.encode(r.next())
		if err != nil {
			return err
		}
		n := binary.NativeEndian.Uint32(v)
		var mask, xor uint32
		switch op {
		case "or", "|":
			mask, xor = ^n, n
		case "xor", "^":
			mask, xor = 0xffffffff, n
		case "and", "&":
			mask, xor = n, 0
		default:
			return r.bad()
		}
		r.emit(&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			r.c.binop(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, mask), Xor: binary.NativeEndian.AppendUint32(nil, xor)}))
	} else {
		v, err := tMark.encode(r.next())
		if err != nil {
			return err
		}
		r.emit(&expr.Immediate{Register: 1, Data: v})
	}
	r.emit(&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
	return nil
}

// dynset: "update @set { SELECTOR }" (or add).
func (r *ruleCompiler) dynset() error {
	op := uint32(unix.NFT_DYNSET_OP_UPDATE)
	if r.next() == "add" {
		op = unix.NFT_DYNSET_OP_ADD
	}
	name := r.next()
	if !strings.HasPrefix(name, "@") {
		return r.bad()
	}
	name = name[1:]
	if err := r.expect("{"); err != nil {
		return err
	}
	fs, err := r.selector()
	if err != nil {
		return err
	}
	if err := r.expect("}"); err != nil {
		return err
	}
	s, err := r.c.set(name)
	if err != nil {
		return err
	}
	if s.verdict || s.data != nil || s.key.id() != keyOf(fs).id() {
		return unsupported("update of %s with a %s key", name, keyOf(fs)[0].name)
	}
	r.load(fs)
	r.emit(&expr.Dynset{SrcRegKey: 1, SetName: name, SetID: s.id, Operation: op})
	return nil
}

// dnat: "dnat [ip|ip6] to ADDR[:PORT]" or
// "dnat ip addr . port to SELECTOR map { i : ADDR . PORT , ... }" or
// "dnat ip addr . port to SELECTOR map @m" (these two in ip and ip6 tables).
func (r *ruleCompiler) dnat() error {
	r.next()
	fam := r.c.family
	if kw := r.peek(); (kw == "ip" || kw == "ip6") && r.i+1 < len(r.toks) && r.toks[r.i+1] == "to" {
		// The family named, as an inet table needs it: the rule must
		// have matched it already (nft would insert nothing here).
		r.next()
		switch {
		case fam.l3() && kw != fam.name:
			return unsupported("dnat %s in a %s table", kw, fam.name)
		case !fam.l3() && (fam.proto != unix.NFPROTO_INET || r.nfproto != families[kw].proto):
			return unsupported("dnat %s in a %s table without a match on meta nfproto or %s", kw, fam.name, kw)
		}
		fam = families[kw]
	} else if !fam.l3() {
		return unsupported("dnat without ip or ip6 in a %s table", fam.name)
	}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(fam.proto), RegAddrMin: 1}
	if r.peek() == "to" {
		r.next()
		v := r.next()
		var addr netip.Addr
		var port uint16
		if ap, err := netip.ParseAddrPort(v); err == nil {
			addr, port = ap.Addr(), ap.Port()
		} else if a, err := netip.ParseAddr(v); err == nil {
			addr = a
		} else {
			return unsupported("dnat target %q", v)
		}
		if addr.Is4() != (fam.addr.id == tIPv4.id) {
			return unsupported("dnat target %q in a %s table", v, fam.name)
		}
		r.emit(&expr.Immediate{Register: 1, Data: addr.AsSlice()})
		if port != 0 {
			r.emit(&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)})
			nat.RegProtoMin, nat.Specified = 2, true
		}
		r.emit(nat)
		return nil
	}
	if err := r.expect(fam.name, "addr", ".", "port", "to"); err != nil {
		return err
	}
	fs, err := r.selector()
	if err != nil {
		return err
	}
	if err := r.expect("map"); err != nil {
		return err
	}
	r.load(fs)
	data := concat{fam.addr, tService}
	if strings.HasPrefix(r.peek(), "@") {
		name := r.next()[1:]
		s, err := r.c.set(name)
		if err != nil {
			return err
		}
		if !slices.Equal(s.key, keyOf(fs)) || !slices.Equal(s.data, data) {
			return unsupported("dnat through map %s: not a map of %s to %s . %s", name, keyOf(fs)[0].name, fam.addr.name, tService.name)
		}
		r.emit(&expr.Lookup{SourceRegister: 1, SetName: name, SetID: s.id, IsDestRegSet: true, DestRegister: 1})
	} else if err := r.anonMap(keyOf(fs), data, 1); err != nil {
		return err
	}
	nat.RegProtoMin = reg(pad4(fam.addr.len) / 4)
	r.emit(nat)
	return nil
}
