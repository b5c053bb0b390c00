package nfnl

// Commands to netlink messages. Every message is encoded as nft 1.0 encodes
// the same command (checked with `nft --debug=netlink,mnl`), userdata
// included, so that `nft list` prints our objects exactly as it prints
// nft's own.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ErrUnsupported is wrapped by compile errors for commands outside the
// subset this package encodes; Runner then falls back to nft for the whole
// transaction.
var ErrUnsupported = errors.New("not supported by the netlink nftables compiler")

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

// Attributes x/sys/unix lacks.
const (
	nftaTableUserdata = 6
	nftaChainUserdata = 12
	nftaSetElemKeyEnd = 10
	nftaBitwiseOp     = 6

	udataCommentType = 0 // table, chain, rule and element comments
	udataSetComment  = 7
)

// msg is one message of a batch, with the command it came from.
type msg struct {
	typ   uint16 // NFT_MSG_*
	flags netlink.HeaderFlags
	data  []byte // attributes, after the nfgenmsg header
	cmd   string
}

// setInfo is what element and lookup encoding need to know of a set.
type setInfo struct {
	key     concat
	data    concat // nil for a set or a verdict map
	verdict bool
	id      uint32 // set ID when created in this batch, else 0
}

// setLookup finds a named set that exists in the kernel (for elements
// added to a set the transaction does not create).
type setLookup func(name string) (*setInfo, error)

// compiler turns one transaction into messages.
type compiler struct {
	family knftFamily
	table  string
	lookup setLookup
	sets   map[string]*setInfo // sets created earlier in this batch
	nextID uint32
	msgs   []msg
	// created records the sets this batch adds and deletes, so the
	// runner's cache follows the kernel once the batch is committed.
	created map[string]*setInfo
	deleted map[string]bool
	// binops are the bitwise expressions of binary operations (binop).
	binops map[expr.Any]bool
}

type knftFamily struct {
	name  string // "ip", "ip6", "inet", "bridge"
	proto byte   // NFPROTO_*
	// addr and desc are the network header's address type and nft's
	// protocol id of it (set userdata); zero for inet and bridge, whose
	// rules name the header per match ("ip saddr", "ip6 daddr").
	addr dtype
	desc uint32
}

var families = map[string]knftFamily{
	"ip":     {"ip", unix.NFPROTO_IPV4, tIPv4, 12},
	"ip6":    {"ip6", unix.NFPROTO_IPV6, tIPv6, 13},
	"inet":   {name: "inet", proto: unix.NFPROTO_INET},
	"bridge": {name: "bridge", proto: unix.NFPROTO_BRIDGE},
}

// l3 reports whether the table family is one network protocol (ip, ip6).
func (f knftFamily) l3() bool { return f.addr.len != 0 }

func newCompiler(family, table string, lookup setLookup) (*compiler, error) {
	f, ok := families[family]
	if !ok {
		return nil, unsupported("family %q", family)
	}
	return &compiler{family: f, table: table, lookup: lookup, sets: map[string]*setInfo{},
		created: map[string]*setInfo{}, deleted: map[string]bool{}}, nil
}

func (c *compiler) id() uint32 { c.nextID++; return c.nextID }

// compile appends the messages of one command.
func (c *compiler) compile(cmd *command) error {
	if cmd.family != c.family.name || cmd.table != c.table {
		return unsupported("command for another table: %q", cmd.line)
	}
	var err error
	switch cmd.typ {
	case "table":
		err = c.tableCmd(cmd)
	case "chain":
		err = c.chainCmd(cmd)
	case "set", "map":
		err = c.setCmd(cmd)
	case "element":
		err = c.elementCmd(cmd)
	case "rule":
		err = c.ruleCmd(cmd)
	default:
		err = unsupported("command %q", cmd.line)
	}
	if err != nil {
		if errors.Is(err, ErrUnsupported) {
			return fmt.Errorf("%w (in %q)", err, cmd.line)
		}
		return fmt.Errorf("%q: %w", cmd.line, err)
	}
	return nil
}

func (c *compiler) add(typ uint16, flags netlink.HeaderFlags, cmd *command, attrs ...netlink.Attribute) error {
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	c.msgs = append(c.msgs, msg{typ: typ, flags: netlink.Request | flags, data: b, cmd: cmd.line})
	return nil
}

// createFlags are the header flags of an add (knftables "add": idempotent)
// or a create (fails if the object exists).
func createFlags(verb string) netlink.HeaderFlags {
	if verb == "create" {
		return netlink.Create | netlink.Excl
	}
	return netlink.Create
}

func str(s string) []byte { return append([]byte(s), 0) }

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// udata appends one userdata TLV (libnftnl's format: type, length, value).
func udata(b []byte, typ byte, v []byte) []byte {
	return append(append(b, typ, byte(len(v))), v...)
}

func udataU32(b []byte, typ byte, v uint32) []byte {
	return udata(b, typ, binary.NativeEndian.AppendUint32(nil, v))
}

func commentUdata(typ byte, s string) ([]byte, error) {
	if len(s) > 128 {
		return nil, fmt.Errorf("comment longer than 128 bytes")
	}
	return udata(nil, typ, str(s)), nil
}

func (c *compiler) tableCmd(cmd *command) error {
	name := netlink.Attribute{Type: unix.NFTA_TABLE_NAME, Data: str(c.table)}
	switch cmd.verb {
	case "add", "create":
		props, err := properties(cmd.body)
		if err != nil {
			return err
		}
		attrs := []netlink.Attribute{name, {Type: unix.NFTA_TABLE_FLAGS, Data: be32(0)}}
		for k, v := range props {
			if k != "comment" {
				return unsupported("table property %q", k)
			}
			ud, err := commentUdata(udataCommentType, v)
			if err != nil {
				return err
			}
			attrs = append(attrs, netlink.Attribute{Type: nftaTableUserdata, Data: ud})
		}
		// nft sends "add table" without NLM_F_CREATE (the kernel
		// creates a missing table either way).
		flags := createFlags(cmd.verb) &^ netlink.Create
		return c.add(unix.NFT_MSG_NEWTABLE, flags, cmd, attrs...)
	case "delete":
		return c.add(unix.NFT_MSG_DELTABLE, 0, cmd, name)
	}
	return unsupported("%s table", cmd.verb)
}

var hooks = map[string]uint32{"prerouting": unix.NF_INET_PRE_ROUTING, "input": unix.NF_INET_LOCAL_IN,
	"forward": unix.NF_INET_FORWARD, "output": unix.NF_INET_LOCAL_OUT, "postrouting": unix.NF_INET_POST_ROUTING}

var priorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

// parsePriority reads "-100", "filter", "filter - 10", "dstnat + 5".
func parsePriority(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	f := strings.Fields(s)
	base, ok := priorities[f[0]]
	if !ok || (len(f) != 1 && len(f) != 3) {
		return 0, unsupported("chain priority %q", s)
	}
	if len(f) == 1 {
		return base, nil
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || (f[1] != "+" && f[1] != "-") {
		return 0, unsupported("chain priority %q", s)
	}
	if f[1] == "-" {
		n = -n
	}
	return base + n, nil
}

func (c *compiler) chainCmd(cmd *command) error {
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: str(c.table)},
		{Type: unix.NFTA_CHAIN_NAME, Data: str(cmd.name)},
	}
	switch cmd.verb {
	case "flush":
		return c.add(unix.NFT_MSG_DELRULE, 0, cmd, netlink.Attribute{Type: unix.NFTA_RULE_TABLE, Data: str(c.table)},
			netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: str(cmd.name)})
	case "delete":
		return c.add(unix.NFT_MSG_DELCHAIN, 0, cmd, attrs...)
	case "add", "create":
	default:
		return unsupported("%s chain", cmd.verb)
	}
	// "{ type nat hook prerouting priority -100 ; comment "x" ; }"
	body := cmd.body
	var typ, hook, prio, policy string
	if strings.HasPrefix(body, "type ") {
		head, rest, _ := strings.Cut(body, ";")
		f := strings.Fields(head)
		if len(f) < 6 || f[2] != "hook" || f[4] != "priority" {
			return unsupported("chain %q", body)
		}
		typ, hook, prio = f[1], f[3], strings.Join(f[5:], " ")
		body = rest
	}
	props, err := properties(body)
	if err != nil {
		return err
	}
	var ud []byte
	for k, v := range props {
		switch k {
		case "comment":
			if ud, err = commentUdata(udataCommentType, v); err != nil {
				return err
			}
		case "policy":
			policy = v
		default:
			return unsupported("chain property %q", k)
		}
	}
	if typ != "" {
		h, ok := hooks[hook]
		if !ok {
			return unsupported("hook %q", hook)
		}
		p, err := parsePriority(prio)
		if err != nil {
			return err
		}
		hk, _ := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.NFTA_HOOK_HOOKNUM, Data: be32(h)},
			{Type: unix.NFTA_HOOK_PRIORITY, Data: be32(uint32(int32(p)))},
		})
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_CHAIN_TYPE, Data: str(typ)},
			netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_CHAIN_HOOK, Data: hk})
		switch policy {
		case "":
		case "accept", "drop":
			v := uint32(1) // NF_ACCEPT
			if policy == "drop" {
				v = 0 // NF_DROP
			}
			attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_CHAIN_POLICY, Data: be32(v)})
		default:
			return unsupported("chain policy %q", policy)
		}
	} else if policy != "" {
		return unsupported("policy on a regular chain")
	}
	if ud != nil {
		attrs = append(attrs, netlink.Attribute{Type: nftaChainUserdata, Data: ud})
	}
	return c.add(unix.NFT_MSG_NEWCHAIN, createFlags(cmd.verb), cmd, attrs...)
}

// Set flags (enum nft_set_flags).
const (
	setAnonymous = unix.NFT_SET_ANONYMOUS
	setConstant  = unix.NFT_SET_CONSTANT
	setInterval  = unix.NFT_SET_INTERVAL
	setMap       = unix.NFT_SET_MAP
	setTimeout   = unix.NFT_SET_TIMEOUT
	setEval      = unix.NFT_SET_EVAL
)

func byteorder(c concat) uint32 {
	switch {
	case len(c) != 1:
		return 0 // BYTEORDER_INVALID, as nft writes for concatenations
	case c[0].host:
		return 1
	}
	return 2
}

// nft's expression types (enum expr_types) in set userdata.
const (
	typeofVerdict = 1
	typeofPayload = 7
	typeofConcat  = 13
	typeofNumgen  = 23
)

// typeofUdata is one expression as nft records it in a set's KEY_TYPEOF
// or DATA_TYPEOF userdata: its type, then its own TLVs.
func typeofUdata(kind uint32, data []byte) []byte { return udata(udataU32(nil, 0, kind), 1, data) }

// payloadTypeof records a payload field by protocol and template id.
func payloadTypeof(desc, tmpl uint32) []byte {
	return typeofUdata(typeofPayload, udataU32(udataU32(nil, 0, desc), 1, tmpl))
}

var verdictTypeof = typeofUdata(typeofVerdict, nil)

// transportDport are "tcp dport" and the like as set typeof expressions:
// nft's protocol ids, all with template 2 (dport).
var transportDport = map[string]uint32{"udp": 6, "tcp": 8, "sctp": 10}

// mapTypeof reads a map's "typeof KEY : DATA" for the forms the proxy's
// endpoint maps use, "numgen random mod N : ADDR . PROTO dport" and
// "numgen random mod N : verdict" (ADDR ip|ip6 daddr|saddr, PROTO
// tcp|udp|sctp), into the map's types and the KEY_TYPEOF and DATA_TYPEOF
// userdata nft writes for them. nft 1.0.6 refuses a rule matching
// "meta l4proto udp" that maps through a "tcp dport" map, so a caller
// wants one map per protocol.
func (c *compiler) mapTypeof(cmd *command, v string) (s *setInfo, keyUD, dataUD []byte, err error) {
	key, data, ok := strings.Cut(v, " : ")
	fail := func() (*setInfo, []byte, []byte, error) {
		return nil, nil, nil, unsupported("map typeof %q (only numgen random mod N : ADDR . tcp|udp|sctp dport, or : verdict)", v)
	}
	if !ok {
		return fail()
	}
	toks, _ := tokens(key)
	r := &ruleCompiler{c: c, cmd: cmd, toks: toks}
	if r.peek() != "numgen" {
		return fail()
	}
	kf, err := r.field()
	if err != nil || r.i != len(toks) {
		return fail()
	}
	s = &setInfo{key: concat{kf.t}}
	if data == "verdict" {
		s.verdict = true
		return s, kf.typeof, verdictTypeof, nil
	}
	toks, _ = tokens(data)
	r = &ruleCompiler{c: c, cmd: cmd, toks: toks}
	if r.peek() != c.family.name {
		return fail()
	}
	af, err := r.field()
	if err != nil || r.next() != "." || len(toks) != r.i+2 || toks[r.i+1] != "dport" {
		return fail()
	}
	desc, ok := transportDport[toks[r.i]]
	if !ok {
		return fail()
	}
	s.data = concat{af.t, tService}
	list := udata(udata(nil, 0, af.typeof), 1, payloadTypeof(desc, 2))
	return s, kf.typeof, typeofUdata(typeofConcat, list), nil
}

// namedSetUserdata is the userdata nft writes for "add set/map ... { type
// ... }" or, with keyTypeof and dataTypeof, "{ typeof ... }".
func namedSetUserdata(s *setInfo, isMap bool, keyTypeof, dataTypeof []byte, comment *string) []byte {
	b := udataU32(nil, 0, byteorder(s.key)) // NFTNL_UDATA_SET_KEYBYTEORDER
	if isMap {
		d := uint32(0)
		if !s.verdict {
			d = byteorder(s.data)
		}
		b = udataU32(b, 1, d) // DATABYTEORDER
	}
	switch {
	case keyTypeof != nil:
		b = udata(b, 3, keyTypeof)
	case len(s.key) > 1:
		// KEY_TYPEOF: nft 1.0 records a concatenation's type as an
		// expression of type 13 (concat) with no data.
		b = udata(b, 3, typeofUdata(typeofConcat, nil))
	}
	if dataTypeof != nil {
		b = udata(b, 4, dataTypeof)
	}
	if isMap {
		b = udataU32(b, 6, 0) // DATA_INTERVAL
	}
	if comment != nil {
		b = udata(b, udataSetComment, str(*comment))
	}
	return b
}

func (c *compiler) setCmd(cmd *command) error {
	name := []netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: str(c.table)}, {Type: unix.NFTA_SET_NAME, Data: str(cmd.name)}}
	switch cmd.verb {
	case "flush":
		// The set's name first, as nft sends it.
		return c.add(unix.NFT_MSG_DELSETELEM, 0, cmd, netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: str(cmd.name)},
			netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: str(c.table)})
	case "delete":
		delete(c.sets, cmd.name)
		delete(c.created, cmd.name)
		c.deleted[cmd.name] = true
		return c.add(unix.NFT_MSG_DELSET, 0, cmd, name...)
	case "add", "create":
	default:
		return unsupported("%s %s", cmd.verb, cmd.typ)
	}
	props, err := properties(cmd.body)
	if err != nil {
		return err
	}
	isMap := cmd.typ == "map"
	s := &setInfo{}
	var flags uint32
	if isMap {
		flags |= setMap
	}
	var timeout time.Duration
	var comment *string
	var keyTypeof, dataTypeof []byte
	for k, v := range props {
		switch k {
		case "typeof":
			if !isMap || props["type"] != "" {
				return unsupported("typeof on a set, or with type")
			}
			if s, keyTypeof, dataTypeof, err = c.mapTypeof(cmd, v); err != nil {
				return err
			}
		case "type":
			key, data := v, ""
			if isMap {
				var ok bool
				if key, data, ok = strings.Cut(v, " : "); !ok {
					return unsupported("map type %q", v)
				}
			}
			if s.key, err = parseConcat(key); err != nil {
				return err
			}
			if data == "verdict" {
				s.verdict = true
			} else if isMap {
				if s.data, err = parseConcat(data); err != nil {
					return err
				}
			}
		case "flags":
			for _, f := range strings.Split(v, ",") {
				switch strings.TrimSpace(f) {
				case "dynamic":
					flags |= setEval
				case "timeout":
					flags |= setTimeout
				case "constant":
					flags |= setConstant
				default:
					return unsupported("set flag %q", f)
				}
			}
		case "timeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return unsupported("set timeout %q", v)
			}
			timeout = d
		case "comment":
			comment = &v
		default:
			return unsupported("set property %q", k)
		}
	}
	if s.key == nil {
		return unsupported("set without type")
	}
	s.id = c.id()
	attrs := append(name,
		netlink.Attribute{Type: unix.NFTA_SET_FLAGS, Data: be32(flags)},
		netlink.Attribute{Type: unix.NFTA_SET_KEY_TYPE, Data: be32(s.key.id())},
		netlink.Attribute{Type: unix.NFTA_SET_KEY_LEN, Data: be32(uint32(s.key.size()))})
	if isMap {
		dt, dl := uint32(verdictType), 0
		if !s.verdict {
			dt, dl = s.data.id(), s.data.size()
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_DATA_TYPE, Data: be32(dt)},
			netlink.Attribute{Type: unix.NFTA_SET_DATA_LEN, Data: be32(uint32(dl))})
	}
	attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_ID, Data: be32(s.id)})
	if timeout > 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_TIMEOUT, Data: be64(uint64(timeout.Milliseconds()))})
	}
	attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_USERDATA, Data: namedSetUserdata(s, isMap, keyTypeof, dataTypeof, comment)})
	c.sets[cmd.name] = s
	c.created[cmd.name] = s
	delete(c.deleted, cmd.name)
	return c.add(unix.NFT_MSG_NEWSET, createFlags(cmd.verb), cmd, attrs...)
}

// set returns what is known of a named set.
func (c *compiler) set(name string) (*setInfo, error) {
	if s, ok := c.sets[name]; ok {
		return s, nil
	}
	if c.deleted[name] || c.lookup == nil {
		return nil, unsupported("set %q of unknown type", name)
	}
	s, err := c.lookup(name)
	if err != nil {
		return nil, err
	}
	cp := *s
	cp.id = 0
	c.sets[name] = &cp
	return &cp, nil
}

// element is one set element to encode.
type element struct {
	key, keyEnd []byte
	flags       uint32
	verdict     *verdict
	data        []byte
	comment     *string
}

type verdict struct {
	code  uint32
	chain string
}

var verdictCodes = map[string]int32{"accept": 1, "drop": 0, "continue": -1, "return": -5, "jump": -3, "goto": -4}

// parseVerdict reads "drop", "goto chain", "jump chain".
func parseVerdict(s string) (*verdict, error) {
	kw, chain, _ := strings.Cut(s, " ")
	code, ok := verdictCodes[kw]
	if !ok || (chain == "") != (kw != "jump" && kw != "goto") {
		return nil, unsupported("verdict %q", s)
	}
	return &verdict{code: uint32(code), chain: chain}, nil
}

func (c *compiler) elementCmd(cmd *command) error {
	s, err := c.set(cmd.name)
	if err != nil {
		return err
	}
	// "key [comment "x"] [: value]"
	body := cmd.body
	e := element{}
	keyText, value, isMapElem := strings.Cut(body, " : ")
	if i := strings.Index(keyText, ` comment "`); i >= 0 {
		cm, err := strconv.Unquote(keyText[i+len(" comment "):])
		if err != nil {
			return unsupported("element %q", body)
		}
		keyText, e.comment = keyText[:i], &cm
	}
	if e.key, err = s.key.encode(strings.Split(keyText, " . ")); err != nil {
		return err
	}
	typ := uint16(unix.NFT_MSG_NEWSETELEM)
	flags := createFlags(cmd.verb)
	switch cmd.verb {
	case "add", "create":
		isMap := s.verdict || s.data != nil
		if isMapElem != isMap {
			return unsupported("element %q for %s", body, cmd.name)
		}
		if s.verdict {
			if e.verdict, err = parseVerdict(value); err != nil {
				return err
			}
		} else if isMap {
			if e.data, err = s.data.encode(strings.Split(value, " . ")); err != nil {
				return err
			}
		}
	case "delete":
		typ, flags = unix.NFT_MSG_DELSETELEM, 0
		e.comment = nil
	default:
		return unsupported("%s element", cmd.verb)
	}
	return c.elements(typ, flags, cmd, cmd.name, s.id, []element{e})
}

// elements adds one NEWSETELEM/DELSETELEM message.
func (c *compiler) elements(typ uint16, flags netlink.HeaderFlags, cmd *command, set string, id uint32, elems []element) error {
	list := make([]netlink.Attribute, 0, len(elems))
	for i, e := range elems {
		b, err := encodeElement(e)
		if err != nil {
			return err
		}
		// libnftnl numbers the nested elements from 1 (the kernel ignores it).
		list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | uint16(i+1), Data: b})
	}
	lb, err := netlink.MarshalAttributes(list)
	if err != nil {
		return err
	}
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: str(c.table)},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: str(set)},
	}
	if id != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_SET_ID, Data: be32(id)})
	}
	attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: lb})
	return c.add(typ, flags, cmd, attrs...)
}

func dataValue(b []byte) []byte {
	out, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: b}})
	return out
}

func encodeElement(e element) ([]byte, error) {
	var attrs []netlink.Attribute
	if e.flags != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_ELEM_FLAGS, Data: be32(e.flags)})
	}
	attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: dataValue(e.key)})
	if e.keyEnd != nil {
		attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | nftaSetElemKeyEnd, Data: dataValue(e.keyEnd)})
	}
	switch {
	case e.verdict != nil:
		v := []netlink.Attribute{{Type: unix.NFTA_VERDICT_CODE, Data: be32(e.verdict.code)}}
		if e.verdict.chain != "" {
			v = append(v, netlink.Attribute{Type: unix.NFTA_VERDICT_CHAIN, Data: str(e.verdict.chain)})
		}
		vb, err := netlink.MarshalAttributes(v)
		if err != nil {
			return nil, err
		}
		db, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_DATA_VERDICT, Data: vb}})
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_DATA, Data: db})
	case e.data != nil:
		attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_DATA, Data: dataValue(e.data)})
	}
	if e.comment != nil {
		ud, err := commentUdata(udataCommentType, *e.comment)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_ELEM_USERDATA, Data: ud})
	}
	return netlink.MarshalAttributes(attrs)
}
