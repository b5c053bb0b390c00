package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
)

// packet is what the evaluator walks through a saved filter table.
type packet struct {
	src, dst    netip.Addr
	proto       netpol.Protocol
	port        uint16
	established bool
}

func (p packet) String() string {
	return fmt.Sprintf("%s -> %s %s/%d est=%v", p.src, p.dst, p.proto, p.port, p.established)
}

// evaluate walks p through FORWARD the way the kernel does, understanding
// only the matches the renderer writes (anything else is an error, so a
// rule it cannot read never passes silently). It reports whether FORWARD
// lets p through (its policy is ACCEPT here).
func evaluate(t *ipt.Table, p packet) (bool, error) {
	v, _, err := walk(t, Forward, p, 0)
	return v != "DROP", err
}

// walk runs chain: the verdict (ACCEPT/DROP) if one was reached, or
// returned=true when the chain returned (RETURN or its end).
func walk(t *ipt.Table, chain string, p packet, depth int) (verdict string, returned bool, err error) {
	if depth > 10 {
		return "", false, fmt.Errorf("chain %s: too deep", chain)
	}
	for _, r := range t.RulesIn(chain) {
		ok, target, isGoto, err := matchRule(r.Args, p)
		if err != nil {
			return "", false, fmt.Errorf("chain %s rule %q: %w", chain, r.Args, err)
		}
		if !ok {
			continue
		}
		switch target {
		case "ACCEPT", "DROP":
			return target, false, nil
		case "RETURN":
			return "", true, nil
		case "":
			continue
		}
		if !t.HasChain(target) {
			return "", false, fmt.Errorf("chain %s: no chain %s", chain, target)
		}
		v, _, err := walk(t, target, p, depth+1)
		if err != nil || v != "" {
			return v, false, err
		}
		if isGoto { // the callee's return is ours
			return "", true, nil
		}
	}
	return "", true, nil
}

var protoNames = map[string]netpol.Protocol{"tcp": netpol.ProtoTCP, "udp": netpol.ProtoUDP, "sctp": netpol.ProtoSCTP}

func matchRule(args []string, p packet) (ok bool, target string, isGoto bool, err error) {
	ok = true
	protoSeen := false
	for i := 0; i < len(args); i++ {
		next := func() (string, error) {
			i++
			if i >= len(args) {
				return "", fmt.Errorf("%s needs an argument", args[i-1])
			}
			return args[i], nil
		}
		a := args[i]
		v, err := next()
		if err != nil {
			return false, "", false, err
		}
		switch a {
		case "-s", "-d":
			pfx, err := netip.ParsePrefix(v)
			if err != nil {
				return false, "", false, err
			}
			addr := p.src
			if a == "-d" {
				addr = p.dst
			}
			ok = ok && pfx.Contains(addr)
		case "-p":
			want, known := protoNames[v]
			if !known {
				n, err := strconv.Atoi(v)
				if err != nil {
					return false, "", false, fmt.Errorf("protocol %q", v)
				}
				want = netpol.Protocol(n)
			}
			protoSeen = true
			ok = ok && p.proto == want
		case "-m":
			switch v {
			case "tcp", "udp", "sctp":
				if !protoSeen || args[i-2] != v {
					return false, "", false, fmt.Errorf("-m %s without -p %s just before", v, v)
				}
				o, err := next()
				if err == nil && v == "tcp" && o == "!" {
					// ! --tcp-flags FIN,SYN,RST,ACK SYN: not a lone SYN (a new
					// flow's first packet is one; an established one's is not).
					f, err1 := next()
					mask, err2 := next()
					want, err3 := next()
					if err1 != nil || err2 != nil || err3 != nil || f != "--tcp-flags" || mask != "FIN,SYN,RST,ACK" || want != "SYN" {
						return false, "", false, fmt.Errorf("-m tcp !: want --tcp-flags FIN,SYN,RST,ACK SYN")
					}
					ok = ok && p.established
					continue
				}
				if err != nil || o != "--dport" {
					return false, "", false, fmt.Errorf("-m %s: want --dport, got %q %v", v, o, err)
				}
				r, err := next()
				if err != nil {
					return false, "", false, err
				}
				lo, hi, _ := strings.Cut(r, ":")
				if hi == "" {
					hi = lo
				}
				from, err1 := strconv.ParseUint(lo, 10, 16)
				to, err2 := strconv.ParseUint(hi, 10, 16)
				if err1 != nil || err2 != nil || from > to {
					return false, "", false, fmt.Errorf("bad port range %q", r)
				}
				ok = ok && uint64(p.port) >= from && uint64(p.port) <= to
			case "comment":
				if o, err := next(); err != nil || o != "--comment" {
					return false, "", false, fmt.Errorf("-m comment: want --comment, got %q", o)
				}
				if _, err := next(); err != nil {
					return false, "", false, err
				}
			case "conntrack":
				if o, err := next(); err != nil || o != "--ctstate" {
					return false, "", false, fmt.Errorf("-m conntrack: want --ctstate, got %q", o)
				}
				states, err := next()
				if err != nil {
					return false, "", false, err
				}
				want := "NEW"
				if p.established {
					want = "ESTABLISHED"
				}
				ok = ok && slices.Contains(strings.Split(states, ","), want)
			default:
				return false, "", false, fmt.Errorf("unknown match -m %s", v)
			}
		case "-j", "-g":
			if i != len(args)-1 {
				return false, "", false, fmt.Errorf("arguments after the target")
			}
			return ok, v, a == "-g", nil
		default:
			return false, "", false, fmt.Errorf("unknown argument %q", a)
		}
	}
	return ok, "", false, nil
}
