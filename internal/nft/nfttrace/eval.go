package nfttrace

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

type outcome int

const (
	outNone   outcome = iota // fell off the end or return: continue in caller
	outAccept                // ends the base chain, packet goes on
	outDrop
	outReject
)

// maxDepth bounds jump nesting (the kernel allows 16 levels).
const maxDepth = 16

type state struct {
	t     *Tracer
	p     Packet
	res   Result
	hook  knftables.BaseChainHook
	table *knftables.FakeTable
	nat   bool
}

func (s *state) src() netip.Addr { return s.p.Src }
func (s *state) dst() netip.Addr { return s.res.Dst.Addr() }

func (s *state) runChain(name string, depth int) (outcome, error) {
	if depth > maxDepth {
		return outDrop, fmt.Errorf("chain %s: jumps nested deeper than %d", name, maxDepth)
	}
	ch := s.table.Chains[name]
	if ch == nil {
		return outDrop, fmt.Errorf("table %s: no chain %q", s.table.Name, name)
	}
	for _, r := range ch.Rules {
		v, err := s.rule(r.Rule, depth)
		if err != nil {
			return outDrop, fmt.Errorf("%s %s/%s: rule %q: %w", s.hook, s.table.Name, name, r.Rule, err)
		}
		if v.matched {
			s.res.Trace = append(s.res.Trace, fmt.Sprintf("%s %s/%s: %s", s.hook, s.table.Name, name, r.Rule))
		}
		switch v.kind {
		case "":
			continue
		case "return":
			return outNone, nil
		case "jump", "goto":
			out, err := s.runChain(v.target, depth+1)
			if err != nil {
				return outDrop, err
			}
			if v.kind == "goto" || out != outNone {
				return out, nil
			}
		case "accept":
			return outAccept, nil
		case "drop":
			s.res.Verdict = Drop
			return outDrop, nil
		case "reject":
			s.res.Verdict = Reject
			return outReject, nil
		}
	}
	return outNone, nil
}

// verdict is a rule's effect: kind "" means go on with the next rule.
type verdict struct {
	matched bool
	kind    string // "", accept, drop, reject, return, jump, goto
	target  string
}

func tokenize(rule string) []string {
	r := strings.NewReplacer("{", " { ", "}", " } ", ",", " , ")
	return strings.Fields(r.Replace(rule))
}

// rule evaluates one rule.
func (s *state) rule(text string, depth int) (verdict, error) {
	tk := tokenize(text)
	i := 0
	peek := func(n int) string {
		if i+n < len(tk) {
			return tk[i+n]
		}
		return ""
	}
	for i < len(tk) {
		switch tok := tk[i]; {
		case tok == "counter":
			i++
			switch peek(0) {
			case "packets":
				i += 4
			case "name": // a named counter object
				i += 2
			}
		case tok == "ct" && peek(1) == "state":
			// The traced packet opens a new connection.
			vals, n, neg := valueList(tk[i+2:])
			i += 2 + n
			ok := contains(vals, "new")
			if ok == neg {
				return verdict{}, nil
			}
		case tok == "tcp" && peek(1) == "flags":
			// tcp flags [& (f|...)] [==|!=] f|...: the traced packet opens
			// a connection, so a TCP one has syn alone (nothing else
			// matches tcp flags).
			j, mask := i+2, uint8(0xff)
			if peek(2) == "&" {
				m, err := tcpFlags(peek(3))
				if err != nil {
					return verdict{}, err
				}
				j, mask = i+4, m
			}
			neg := false
			if j < len(tk) && (tk[j] == "==" || tk[j] == "!=") {
				neg = tk[j] == "!="
				j++
			}
			if j >= len(tk) {
				return verdict{}, fmt.Errorf("tcp flags without a value")
			}
			want, err := tcpFlags(tk[j])
			if err != nil {
				return verdict{}, err
			}
			i = j + 1
			if s.p.Proto != "tcp" || (tcpSYN&mask == want) == neg {
				return verdict{}, nil
			}
		case tok == "ct" && peek(1) == "status":
			vals, n, neg := valueList(tk[i+2:])
			i += 2 + n
			ok := contains(vals, "dnat") && s.res.DNAT
			if ok == neg {
				return verdict{}, nil
			}
		case tok == "fib":
			// fib daddr|saddr type local
			if peek(2) != "type" {
				return verdict{}, fmt.Errorf("unsupported fib expression")
			}
			addr := s.src()
			if peek(1) == "daddr" {
				addr = s.dst()
			}
			vals, n, neg := valueList(tk[i+3:])
			i += 3 + n
			want := contains(vals, "local")
			if (s.t.isLocal(addr) == want) == neg {
				return verdict{}, nil
			}
		case tok == "numgen":
			// numgen random mod N [offset K] vmap { k : verdict, ... } | @m
			v, n, err := s.numgenPick(tk[i:], "vmap")
			if err != nil {
				return verdict{}, err
			}
			i += n
			if v == "" {
				return verdict{}, nil
			}
			return s.exec(v, depth)
		case tok == "mark" || (tok == "meta" && peek(1) == "mark"):
			if tok == "meta" {
				i++
			}
			switch {
			case peek(1) == "set":
				// mark set mark or|xor|and X, or mark set X
				if peek(2) == "mark" {
					x, err := parseUint(peek(4))
					if err != nil {
						return verdict{}, err
					}
					switch peek(3) {
					case "or":
						s.res.Mark |= x
					case "xor":
						s.res.Mark ^= x
					case "and":
						s.res.Mark &= x
					default:
						return verdict{}, fmt.Errorf("unsupported mark operation %q", peek(3))
					}
					i += 5
				} else {
					x, err := parseUint(peek(2))
					if err != nil {
						return verdict{}, err
					}
					s.res.Mark = x
					i += 3
				}
			case peek(1) == "and":
				// mark and X ==|!= Y
				x, err1 := parseUint(peek(2))
				y, err2 := parseUint(peek(4))
				if err1 != nil || err2 != nil {
					return verdict{}, fmt.Errorf("bad mark match")
				}
				eq := s.res.Mark&x == y
				switch peek(3) {
				case "==":
				case "!=":
					eq = !eq
				default:
					return verdict{}, fmt.Errorf("unsupported mark comparison %q", peek(3))
				}
				i += 5
				if !eq {
					return verdict{}, nil
				}
			default:
				vals, n, neg := valueList(tk[i+1:])
				i += 1 + n
				ok := false
				for _, v := range vals {
					if x, err := parseUint(v); err == nil && x == s.res.Mark {
						ok = true
					}
				}
				if ok == neg {
					return verdict{}, nil
				}
			}
		case tok == "update" || tok == "add":
			// update @set { ip saddr }
			if !strings.HasPrefix(peek(1), "@") || peek(2) != "{" {
				return verdict{}, fmt.Errorf("unsupported set update")
			}
			set := peek(1)[1:]
			end := indexFrom(tk, i+3, "}")
			if end < 0 {
				return verdict{}, fmt.Errorf("unterminated set update")
			}
			key, err := s.concat(tk[i+3 : end])
			if err != nil {
				return verdict{}, err
			}
			k := s.dynKey(set)
			if s.t.dyn[k] == nil {
				s.t.dyn[k] = map[string]bool{}
			}
			s.t.dyn[k][strings.Join(key, " . ")] = true
			i = end + 1
		case tok == "dnat":
			// dnat [ip|ip6] to ADDR[:PORT], or
			// dnat ip|ip6 addr . port to numgen random mod N [offset K] map { K : ADDR . PORT , ... } | @m
			i++
			if peek(0) == "ip" || peek(0) == "ip6" {
				i++
			}
			if peek(0) == "addr" && peek(1) == "." && peek(2) == "port" && peek(3) == "to" {
				i += 4
				ap, err := s.numgenMapTarget(tk[i:])
				if err != nil {
					return verdict{}, err
				}
				s.res.Dst, s.res.DNAT = ap, true
				return verdict{matched: true, kind: "accept"}, nil
			}
			if peek(0) != "to" {
				return verdict{}, fmt.Errorf("unsupported dnat form")
			}
			to := peek(1)
			ap, err := netip.ParseAddrPort(to)
			if err != nil {
				a, err2 := netip.ParseAddr(to)
				if err2 != nil {
					return verdict{}, fmt.Errorf("bad dnat target %q", to)
				}
				ap = netip.AddrPortFrom(a, s.res.Dst.Port())
			}
			s.res.Dst, s.res.DNAT = ap, true
			return verdict{matched: true, kind: "accept"}, nil
		case tok == "masquerade":
			s.res.Masqueraded = true
			return verdict{matched: true, kind: "accept"}, nil
		case tok == "reject":
			with := "icmp port-unreachable"
			if s.p.Dst.Is6() {
				with = "icmpv6 port-unreachable"
			}
			if peek(1) == "with" {
				with = strings.Join(tk[i+2:], " ")
			}
			s.res.RejectWith = with
			return verdict{matched: true, kind: "reject"}, nil
		case tok == "accept" || tok == "drop" || tok == "return":
			return verdict{matched: true, kind: tok}, nil
		case tok == "jump" || tok == "goto":
			return verdict{matched: true, kind: tok, target: peek(1)}, nil
		case tok == "comment":
			i = len(tk)
		default:
			// selector ("." selector)* followed by a comparison or lookup.
			end := i
			for end < len(tk) {
				_, n := selector(tk[end:])
				if n == 0 {
					break
				}
				end += n
				if end < len(tk) && tk[end] == "." {
					end++
					continue
				}
				break
			}
			if end == i {
				return verdict{}, fmt.Errorf("unsupported expression at %q", strings.Join(tk[i:], " "))
			}
			key, err := s.concat(tk[i:end])
			if err != nil {
				return verdict{}, err
			}
			i = end
			switch {
			case peek(0) == "vmap" && strings.HasPrefix(peek(1), "@"):
				m := s.table.Maps[peek(1)[1:]]
				if m == nil {
					return verdict{}, fmt.Errorf("no map %s", peek(1))
				}
				for _, e := range m.Elements {
					if keyMatches(e.Key, key) {
						return s.exec(strings.Join(e.Value, " "), depth)
					}
				}
				return verdict{}, nil
			case peek(0) == "vmap" && peek(1) == "{":
				arms, n, err := anonMap(tk[i+1:])
				if err != nil {
					return verdict{}, err
				}
				i += 1 + n
				for _, a := range arms {
					if keyMatches(a.key, key) {
						return s.exec(a.value, depth)
					}
				}
				return verdict{}, nil
			default:
				neg := false
				if peek(0) == "!=" {
					neg, i = true, i+1
				} else if peek(0) == "==" {
					i++
				}
				if strings.HasPrefix(peek(0), "@") {
					ok, err := s.inSet(peek(0)[1:], key)
					if err != nil {
						return verdict{}, err
					}
					i++
					if ok == neg {
						return verdict{}, nil
					}
					continue
				}
				vals, n, _ := valueList(tk[i:])
				if n == 0 {
					return verdict{}, fmt.Errorf("missing value after %q", strings.Join(tk[:i], " "))
				}
				i += n
				ok := false
				for _, v := range vals {
					if len(key) == 1 && valueMatches(v, key[0]) {
						ok = true
					}
				}
				if ok == neg {
					return verdict{}, nil
				}
			}
		}
	}
	return verdict{matched: true}, nil
}

// numgenMapTarget evaluates "numgen random mod N [offset K] map { K : ADDR . PORT , ... }"
// (or "map @m", a named map) with the tracer's Rand and returns the chosen
// address and port.
func (s *state) numgenMapTarget(tk []string) (netip.AddrPort, error) {
	v, _, err := s.numgenPick(tk, "map")
	if err != nil {
		return netip.AddrPort{}, err
	}
	if v == "" {
		return netip.AddrPort{}, fmt.Errorf("numgen chose a key that is in no map element (%q)", strings.Join(tk, " "))
	}
	f := strings.Fields(v)
	if len(f) != 3 || f[1] != "." {
		return netip.AddrPort{}, fmt.Errorf("bad dnat map value %q", v)
	}
	addr, err := netip.ParseAddr(f[0])
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad dnat map address %q", f[0])
	}
	port, err := strconv.ParseUint(f[2], 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad dnat map port %q", f[2])
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// numgenPick evaluates "numgen random mod N [offset K] KW { k : v , ... }"
// or "... KW @m" (KW is map or vmap): the tracer's Rand picks in [0, N),
// plus K, and the element with that key gives the value ("" when none
// has it, which the kernel treats as no match). n is the tokens read.
func (s *state) numgenPick(tk []string, kw string) (v string, n int, err error) {
	if len(tk) < 6 || tk[0] != "numgen" || tk[1] != "random" || tk[2] != "mod" {
		return "", 0, fmt.Errorf("unsupported numgen expression %q", strings.Join(tk, " "))
	}
	mod, err := strconv.Atoi(tk[3])
	if err != nil || mod <= 0 {
		return "", 0, fmt.Errorf("bad numgen modulus %q", tk[3])
	}
	n, off := 4, 0
	if tk[n] == "offset" {
		if off, err = strconv.Atoi(tk[n+1]); err != nil || off < 0 {
			return "", 0, fmt.Errorf("bad numgen offset %q", tk[n+1])
		}
		n += 2
	}
	if n+1 >= len(tk) || tk[n] != kw {
		return "", 0, fmt.Errorf("unsupported numgen expression %q: want %s after it", strings.Join(tk, " "), kw)
	}
	n++
	var arms []arm
	if name, ok := strings.CutPrefix(tk[n], "@"); ok {
		m := s.table.Maps[name]
		if m == nil {
			return "", 0, fmt.Errorf("no map %s", tk[n])
		}
		for _, e := range m.Elements {
			arms = append(arms, arm{e.Key, strings.Join(e.Value, " ")})
		}
		n++
	} else {
		a, used, err := anonMap(tk[n:])
		if err != nil {
			return "", 0, err
		}
		arms, n = a, n+used
	}
	pick := strconv.Itoa(s.t.Rand(mod) + off)
	for _, a := range arms {
		if len(a.key) == 1 && strings.TrimSpace(a.key[0]) == pick {
			return a.value, n, nil
		}
	}
	return "", n, nil
}

// exec runs a verdict string from a map ("goto x", "jump x", "drop", ...).
func (s *state) exec(v string, depth int) (verdict, error) {
	f := strings.Fields(v)
	if len(f) == 0 {
		return verdict{}, fmt.Errorf("empty verdict")
	}
	switch f[0] {
	case "jump", "goto":
		if len(f) != 2 {
			return verdict{}, fmt.Errorf("bad verdict %q", v)
		}
		return verdict{matched: true, kind: f[0], target: f[1]}, nil
	case "accept", "drop", "return":
		return verdict{matched: true, kind: f[0]}, nil
	}
	return verdict{}, fmt.Errorf("unsupported verdict %q", v)
}

func (s *state) dynKey(set string) string {
	return string(s.table.Family) + " " + s.table.Name + " " + set
}

func (s *state) inSet(name string, key []string) (bool, error) {
	set := s.table.Sets[name]
	if set == nil {
		return false, fmt.Errorf("no set @%s", name)
	}
	for _, e := range set.Elements {
		if keyMatches(e.Key, key) {
			return true, nil
		}
	}
	return s.t.dyn[s.dynKey(name)][strings.Join(key, " . ")], nil
}

// selector recognises one packet selector and returns its length in tokens.
func selector(tk []string) (string, int) {
	if len(tk) >= 2 {
		two := tk[0] + " " + tk[1]
		switch two {
		case "ip saddr", "ip daddr", "ip6 saddr", "ip6 daddr", "meta l4proto", "th dport",
			"tcp dport", "udp dport", "sctp dport", "meta nfproto", "ip protocol", "ip6 nexthdr":
			return two, 2
		}
	}
	return "", 0
}

// concat evaluates "sel . sel . sel" for the packet.
func (s *state) concat(tk []string) ([]string, error) {
	var out []string
	for i := 0; i < len(tk); {
		sel, n := selector(tk[i:])
		if n == 0 {
			return nil, fmt.Errorf("unsupported selector at %q", strings.Join(tk[i:], " "))
		}
		v, err := s.value(sel)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		i += n
		if i < len(tk) {
			if tk[i] != "." {
				return nil, fmt.Errorf("expected '.' at %q", strings.Join(tk[i:], " "))
			}
			i++
		}
	}
	return out, nil
}

// noValue is a selector value that matches nothing (ip saddr on an IPv6
// packet: nft adds an implicit family check).
const noValue = "\x00"

func (s *state) value(sel string) (string, error) {
	v4 := s.p.Dst.Is4()
	switch sel {
	case "ip saddr", "ip6 saddr", "ip daddr", "ip6 daddr":
		if strings.HasPrefix(sel, "ip6") == v4 {
			return noValue, nil
		}
		if strings.HasSuffix(sel, "saddr") {
			return s.src().String(), nil
		}
		return s.dst().String(), nil
	case "meta l4proto", "ip protocol", "ip6 nexthdr":
		return s.p.Proto, nil
	case "meta nfproto":
		if v4 {
			return "ipv4", nil
		}
		return "ipv6", nil
	case "th dport":
		return strconv.Itoa(int(s.res.Dst.Port())), nil
	case "tcp dport", "udp dport", "sctp dport":
		if strings.TrimSuffix(sel, " dport") != s.p.Proto {
			return noValue, nil
		}
		return strconv.Itoa(int(s.res.Dst.Port())), nil
	}
	return "", fmt.Errorf("unsupported selector %q", sel)
}

// valueList reads "X" or "{ X , Y }", with an optional leading "!=".
func valueList(tk []string) (vals []string, n int, neg bool) {
	if len(tk) > 0 && tk[0] == "!=" {
		neg, n = true, 1
	} else if len(tk) > 0 && tk[0] == "==" {
		n = 1
	}
	if n >= len(tk) {
		return nil, 0, neg
	}
	if tk[n] != "{" {
		// "a , b" (tokenized from "a,b")
		j := n
		vals = append(vals, tk[j])
		for j+2 < len(tk) && tk[j+1] == "," {
			vals = append(vals, tk[j+2])
			j += 2
		}
		return vals, j + 1, neg
	}
	for j := n + 1; j < len(tk); j++ {
		if tk[j] == "}" {
			return vals, j + 1, neg
		}
		if tk[j] != "," {
			vals = append(vals, tk[j])
		}
	}
	return vals, len(tk), neg
}

type arm struct {
	key   []string
	value string
}

// anonMap reads "{ k . k : verdict , ... }" and returns its arms.
func anonMap(tk []string) ([]arm, int, error) {
	if len(tk) == 0 || tk[0] != "{" {
		return nil, 0, fmt.Errorf("expected '{'")
	}
	var arms []arm
	var cur []string
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		c := indexFrom(cur, 0, ":")
		if c < 0 {
			return fmt.Errorf("map element without ':' in %q", strings.Join(cur, " "))
		}
		var key []string
		for _, t := range cur[:c] {
			if t != "." {
				key = append(key, t)
			}
		}
		arms = append(arms, arm{key: key, value: strings.Join(cur[c+1:], " ")})
		cur = nil
		return nil
	}
	for j := 1; j < len(tk); j++ {
		switch tk[j] {
		case "}":
			return arms, j + 1, flush()
		case ",":
			if err := flush(); err != nil {
				return nil, 0, err
			}
		default:
			cur = append(cur, tk[j])
		}
	}
	return nil, 0, fmt.Errorf("unterminated map")
}

// keyMatches compares an element key with the packet's values field by field.
func keyMatches(elem, pkt []string) bool {
	if len(elem) != len(pkt) {
		return false
	}
	for i := range elem {
		if !valueMatches(strings.TrimSpace(elem[i]), pkt[i]) {
			return false
		}
	}
	return true
}

var protoNumbers = map[string]string{"6": "tcp", "17": "udp", "132": "sctp", "1": "icmp", "58": "ipv6-icmp"}

var protoByName = func() map[string]string {
	m := map[string]string{}
	for n, name := range protoNumbers {
		m[name] = n
	}
	return m
}()

// valueMatches compares one written value (address, prefix, range, number,
// name) with a packet value.
func valueMatches(written, pkt string) bool {
	if pkt == noValue {
		return false
	}
	if written == pkt {
		return true
	}
	if p, ok := protoNumbers[written]; ok && p == pkt {
		return true
	}
	if a, err := netip.ParseAddr(pkt); err == nil {
		if w, err := netip.ParseAddr(written); err == nil {
			return w == a
		}
		if pr, err := netip.ParsePrefix(written); err == nil {
			return pr.Contains(a)
		}
		if lo, hi, ok := strings.Cut(written, "-"); ok {
			l, err1 := netip.ParseAddr(lo)
			h, err2 := netip.ParseAddr(hi)
			return err1 == nil && err2 == nil && l.Compare(a) <= 0 && a.Compare(h) <= 0
		}
		return false
	}
	// A protocol name against a number or a range of numbers
	// (`meta l4proto` in a concatenated interval set: "0-255").
	if num, ok := protoByName[pkt]; ok {
		pkt = num
	}
	if n, err := strconv.Atoi(pkt); err == nil {
		if w, err := strconv.Atoi(written); err == nil {
			return w == n
		}
		if lo, hi, ok := strings.Cut(written, "-"); ok {
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			return err1 == nil && err2 == nil && l <= n && n <= h
		}
	}
	return false
}

func parseUint(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return uint32(n), nil
}

func contains(vals []string, v string) bool {
	for _, x := range vals {
		if x == v {
			return true
		}
	}
	return false
}

func indexFrom(tk []string, from int, v string) int {
	for j := from; j < len(tk); j++ {
		if tk[j] == v {
			return j
		}
	}
	return -1
}

const tcpSYN = 0x02

// tcpFlags parses "syn", "(fin|syn|rst|ack)" or "0" into TCP flag bits.
func tcpFlags(v string) (uint8, error) {
	bits := map[string]uint8{"fin": 0x01, "syn": 0x02, "rst": 0x04, "psh": 0x08, "ack": 0x10, "urg": 0x20, "ecn": 0x40, "cwr": 0x80, "0": 0}
	var out uint8
	for f := range strings.SplitSeq(strings.Trim(v, "()"), "|") {
		b, ok := bits[f]
		if !ok {
			return 0, fmt.Errorf("unsupported tcp flag %q in %q", f, v)
		}
		out |= b
	}
	return out, nil
}
