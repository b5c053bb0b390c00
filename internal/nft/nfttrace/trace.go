// Package nfttrace walks a virtual packet through the ruleset held by a
// knftables.Fake and reports what the kernel would do with the first packet
// of that connection: the endpoint it is DNATed to, reject, drop or accept,
// and whether it leaves masqueraded.
//
// It is an interpreter for the subset of nft syntax flatnet writes (matches
// on addresses, l4proto, ports, marks, fib type local and ct state; verdict
// maps, numgen, jump/goto/return, dnat, masquerade, mark, reject, dynamic set
// updates), not a model of netfilter. A rule it does not understand is an
// error, never a silent non-match, so a test cannot pass by accident.
//
// Hooks are visited in the order a new connection's first packet meets them:
// forwarded or inbound: prerouting, then input (destination is a node
// address after DNAT) or forward and postrouting; locally generated: output,
// postrouting and, for a node address, input. Within a hook, base chains of
// every table of a matching family run by priority. NAT statements end their
// base chain (the kernel treats them as accept), as do accept and falling off
// the end; drop and reject end the packet.
package nfttrace

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// Packet is the first packet of a connection.
type Packet struct {
	Src   netip.Addr
	Dst   netip.Addr
	Proto string // tcp, udp, sctp, icmp
	DPort uint16
	// Local marks a packet generated on the node itself (output path).
	Local bool
}

// Verdict is the final fate of the packet.
type Verdict string

// Verdicts.
const (
	Accept Verdict = "accept"
	Drop   Verdict = "drop"
	Reject Verdict = "reject"
)

// Result is what happened to the packet.
type Result struct {
	Verdict Verdict
	// RejectWith is "tcp reset" or "icmp port-unreachable" etc. for Reject.
	RejectWith string
	// Dst is the destination after DNAT (the original one when not DNATed).
	Dst  netip.AddrPort
	DNAT bool
	// Masqueraded is true when a masquerade statement ran.
	Masqueraded bool
	Mark        uint32
	// Trace lists "hook table/chain: rule" for every rule that matched.
	Trace []string
}

// Endpoint returns "ip:port" of the final destination.
func (r Result) Endpoint() string { return r.Dst.String() }

// Tracer traces packets through a fake. Dynamic sets updated by rules (session
// affinity) keep their elements across Trace calls, as in the kernel
// (timeouts are not simulated).
type Tracer struct {
	fake    *knftables.Fake
	nodeIPs []netip.Addr
	// Rand returns a number in [0, n) for numgen random; tests may fix it.
	Rand func(n int) int
	dyn  map[string]map[string]bool // "family table set" -> elements added by rules
}

// New returns a tracer over fake for a node with the given addresses (used
// by fib ... type local; loopback addresses are always local).
func New(fake *knftables.Fake, nodeIPs ...netip.Addr) *Tracer {
	return &Tracer{fake: fake, nodeIPs: nodeIPs, Rand: rand.IntN, dyn: map[string]map[string]bool{}}
}

// ResetDynamic forgets elements that rules added to dynamic sets.
func (t *Tracer) ResetDynamic() { t.dyn = map[string]map[string]bool{} }

func (t *Tracer) isLocal(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	for _, n := range t.nodeIPs {
		if n == a {
			return true
		}
	}
	return false
}

type baseChain struct {
	table *knftables.FakeTable
	chain *knftables.FakeChain
	prio  int
}

// Trace walks p through the ruleset.
func (t *Tracer) Trace(p Packet) (Result, error) {
	t.fake.RLock()
	defer t.fake.RUnlock()
	st := &state{t: t, p: p, res: Result{Verdict: Accept, Dst: netip.AddrPortFrom(p.Dst, p.DPort)}}
	var hooks []knftables.BaseChainHook
	if p.Local {
		hooks = []knftables.BaseChainHook{knftables.OutputHook, knftables.PostroutingHook, knftables.InputHook}
	} else {
		hooks = []knftables.BaseChainHook{knftables.PreroutingHook, knftables.ForwardHook, knftables.PostroutingHook, knftables.InputHook}
	}
	for _, hook := range hooks {
		local := t.isLocal(st.res.Dst.Addr())
		switch {
		case !p.Local && hook == knftables.ForwardHook && local,
			!p.Local && hook == knftables.PostroutingHook && local,
			hook == knftables.InputHook && !local:
			continue
		}
		chains, err := t.baseChains(hook, p.Dst.Is4())
		if err != nil {
			return st.res, err
		}
		for _, bc := range chains {
			st.hook, st.table, st.nat = hook, bc.table, bc.chain.Type != nil && *bc.chain.Type == knftables.NATType
			out, err := st.runChain(bc.chain.Name, 0)
			if err != nil {
				return st.res, err
			}
			if out == outDrop || out == outReject {
				return st.res, nil
			}
		}
	}
	return st.res, nil
}

func (t *Tracer) baseChains(hook knftables.BaseChainHook, v4 bool) ([]baseChain, error) {
	var out []baseChain
	for fam, tables := range t.fake.Tables {
		if fam != knftables.InetFamily && (fam == knftables.IPv4Family) != v4 {
			continue
		}
		if fam != knftables.InetFamily && fam != knftables.IPv4Family && fam != knftables.IPv6Family {
			continue
		}
		for _, tbl := range tables {
			for _, ch := range tbl.Chains {
				if ch.Hook == nil || *ch.Hook != hook {
					continue
				}
				prio := 0
				if ch.Priority != nil {
					var err error
					if prio, err = ParsePriority(string(*ch.Priority)); err != nil {
						return nil, fmt.Errorf("chain %s %s: %w", tbl.Name, ch.Name, err)
					}
				}
				out = append(out, baseChain{table: tbl, chain: ch, prio: prio})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].prio != out[j].prio {
			return out[i].prio < out[j].prio
		}
		if out[i].table.Name != out[j].table.Name {
			return out[i].table.Name < out[j].table.Name
		}
		return out[i].chain.Name < out[j].chain.Name
	})
	return out, nil
}

var namedPriorities = map[string]int{
	"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100,
}

// ParsePriority turns "dstnat - 10", "filter", "-110" into a number.
func ParsePriority(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("empty priority")
	}
	base, ok := namedPriorities[f[0]]
	if !ok {
		n, err := strconv.Atoi(f[0])
		if err != nil {
			return 0, fmt.Errorf("unknown priority %q", s)
		}
		base = n
	}
	if len(f) == 1 {
		return base, nil
	}
	if len(f) != 3 || (f[1] != "+" && f[1] != "-") {
		return 0, fmt.Errorf("unknown priority %q", s)
	}
	n, err := strconv.Atoi(f[2])
	if err != nil {
		return 0, fmt.Errorf("unknown priority %q", s)
	}
	if f[1] == "-" {
		n = -n
	}
	return base + n, nil
}

// String is a one-line summary, e.g. "dnat 10.244.1.5:8080 masqueraded".
func (r Result) String() string {
	var b strings.Builder
	switch {
	case r.Verdict == Reject:
		b.WriteString("reject with " + r.RejectWith)
	case r.Verdict == Drop:
		b.WriteString("drop")
	case r.DNAT:
		b.WriteString("dnat " + r.Dst.String())
	default:
		b.WriteString("accept " + r.Dst.String())
	}
	if r.Masqueraded {
		b.WriteString(" masqueraded")
	}
	return b.String()
}
