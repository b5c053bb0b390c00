package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/ipt"
)

// tracer walks a virtual packet through the nat and filter tables of a
// fake the way the kernel would for a new connection: nat PREROUTING (or
// OUTPUT for the node's own packets), filter INPUT/FORWARD/OUTPUT, nat
// POSTROUTING. It understands only the matches and targets the renderer
// writes; anything else is an error, so a rule it cannot read never
// passes silently.
type tracer struct {
	nat, filter *ipt.Table
	local       []netip.Addr // the node's addresses (loopback included)
	// choice picks the random branch: the choice-th statistic rule a
	// packet meets matches (the ones before it do not).
	choice int
	// recent are the xt_recent lists (affinity), kept across traces.
	recent map[string]map[netip.Addr]bool
}

func newTracer(fake *ipt.Fake, fam ipt.Protocol, local ...netip.Addr) *tracer {
	nat, _ := fake.Save(context.Background(), fam, "nat")
	filter, _ := fake.Save(context.Background(), fam, "filter")
	return &tracer{nat: nat, filter: filter, local: local, recent: map[string]map[netip.Addr]bool{}}
}

type packet struct {
	src, dst  netip.Addr
	proto     string
	port      uint16
	fromLocal bool // sent by the node itself (OUTPUT path)
}

type result struct {
	verdict  string // ACCEPT, DROP, REJECT
	endpoint string // ip:port when DNATed
	masq     bool
}

func (r result) String() string {
	s := r.verdict
	if r.endpoint != "" {
		s = r.endpoint
	}
	if r.masq {
		s += " (masq)"
	}
	return s
}

// walkState is one packet in flight.
type walkState struct {
	packet
	mark  uint32
	dnat  string
	stats int
}

func (t *tracer) isLocal(a netip.Addr) bool { return slices.Contains(t.local, a) || a.IsLoopback() }

func (t *tracer) trace(p packet) (result, error) {
	w := &walkState{packet: p}
	natHook, filterHook := "PREROUTING", "FORWARD"
	if p.fromLocal {
		natHook, filterHook = "OUTPUT", "OUTPUT"
	}
	v, err := t.walk(t.nat, natHook, w, 0)
	if err != nil {
		return result{}, err
	}
	if v != "" && v != "ACCEPT" {
		return result{}, fmt.Errorf("nat %s ended in %s", natHook, v)
	}
	if !p.fromLocal && t.isLocal(w.dst) {
		filterHook = "INPUT"
	}
	v, err = t.walk(t.filter, filterHook, w, 0)
	if err != nil {
		return result{}, err
	}
	res := result{verdict: "ACCEPT", endpoint: w.dnat}
	if v == "DROP" || v == "REJECT" {
		return result{verdict: v}, nil
	}
	before := w.mark
	if v, err = t.walk(t.nat, "POSTROUTING", w, 0); err != nil {
		return result{}, err
	}
	res.masq = v == "MASQUERADE" && before != 0
	return res, nil
}

// walk runs chain and returns a terminal verdict, or "" when it returned.
func (t *tracer) walk(tbl *ipt.Table, chain string, w *walkState, depth int) (string, error) {
	if depth > 10 {
		return "", fmt.Errorf("chain %s: too deep", chain)
	}
	if chain != "PREROUTING" && chain != "OUTPUT" && chain != "INPUT" && chain != "FORWARD" && chain != "POSTROUTING" && !tbl.HasChain(chain) {
		return "", fmt.Errorf("no chain %s", chain)
	}
	for _, r := range tbl.RulesIn(chain) {
		ok, target, opts, err := t.match(r.Args, w)
		if err != nil {
			return "", fmt.Errorf("chain %s rule %q: %w", chain, r.Args, err)
		}
		if !ok {
			continue
		}
		switch target {
		case "":
		case "ACCEPT", "DROP", "REJECT", "MASQUERADE":
			return target, nil
		case "RETURN":
			return "", nil
		case "DNAT":
			to, err := netip.ParseAddrPort(opts["--to-destination"])
			if err != nil {
				return "", fmt.Errorf("chain %s: DNAT: %w", chain, err)
			}
			w.dnat, w.dst, w.port = to.String(), to.Addr(), to.Port()
			return "ACCEPT", nil
		case "MARK":
			if v, m, ok := strings.Cut(opts["--set-xmark"], "/"); ok {
				w.mark = (w.mark &^ parseMark(m)) ^ parseMark(v)
			} else {
				return "", fmt.Errorf("chain %s: MARK %v", chain, opts)
			}
		default:
			v, err := t.walk(tbl, target, w, depth+1)
			if v != "" || err != nil {
				return v, err
			}
		}
	}
	return "", nil
}

func parseMark(s string) uint32 {
	v, _ := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 32)
	return uint32(v)
}

// match evaluates a rule's matches on w and returns its target and the
// target's options.
func (t *tracer) match(args []string, w *walkState) (bool, string, map[string]string, error) {
	ok, neg := true, false
	check := func(b bool) {
		if b == neg {
			ok = false
		}
		neg = false
	}
	opts := map[string]string{}
	target := ""
	// -m recent's options come in any order: checked at the end.
	var (
		recentName  string
		rcheck, set bool
	)
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() string {
			i++
			if i < len(args) {
				return args[i]
			}
			return ""
		}
		switch a {
		case "!":
			neg = true
		case "-s", "-d":
			p, err := netip.ParsePrefix(next())
			if err != nil {
				return false, "", nil, err
			}
			addr := w.src
			if a == "-d" {
				addr = w.dst
			}
			check(p.Contains(addr))
		case "-p":
			check(next() == w.proto)
		case "-m":
			next() // the module's own options follow
		case "--dport":
			check(next() == strconv.Itoa(int(w.port)))
		case "--comment", "--mode", "--seconds", "--mask":
			next()
		case "--reap", "--rsource":
		case "--dst-type", "--src-type":
			addr := w.dst
			if a == "--src-type" {
				addr = w.src
			}
			if v := next(); v != "LOCAL" {
				return false, "", nil, fmt.Errorf("addrtype %s", v)
			}
			check(t.isLocal(addr))
		case "--ctstate":
			check(next() == "NEW")
		case "--probability":
			next()
			check(w.stats == t.choice)
			w.stats++
		case "--name":
			recentName = next()
		case "--rcheck":
			rcheck = true
		case "--set":
			set = true
		case "--mark":
			v, m, _ := strings.Cut(next(), "/")
			check(w.mark&parseMark(m) == parseMark(v))
		case "-j":
			target = next()
			for i+1 < len(args) {
				k := next()
				if k == "--random-fully" {
					opts[k] = ""
					continue
				}
				opts[k] = next()
			}
		default:
			return false, "", nil, fmt.Errorf("unknown argument %q", a)
		}
	}
	if rcheck && !t.recent[recentName][w.src] {
		ok = false
	}
	if set && ok {
		if t.recent[recentName] == nil {
			t.recent[recentName] = map[netip.Addr]bool{}
		}
		t.recent[recentName][w.src] = true
	}
	return ok, target, opts, nil
}
