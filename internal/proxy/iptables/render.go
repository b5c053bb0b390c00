// Package iptables is the proxy's iptables mode: it renders the same model
// as proxy/nftables (proxy.Service) into iptables rules with kube-proxy's
// iptables-mode layout, and loads them with one iptables-restore --noflush
// per sync (through internal/ipt), for nodes without nf_tables.
//
// Design. The nat table does the work, the filter table refuses what nat
// could not serve (nat cannot drop or reject):
//
//	nat PREROUTING, OUTPUT  -j FLATNET-SERVICES
//	  FLATNET-SERVICES    one rule per ClusterIP, externalIP and LB IP port:
//	                      -d IP -p P --dport N -j FLATNET-SVC-|SVL-|EXT-|FW-<hash>
//	                      last: ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j FLATNET-NODEPORTS
//	  FLATNET-NODEPORTS   -p P --dport NODEPORT -j FLATNET-EXT-<hash>
//	  FLATNET-SVC-<hash>  (policy Cluster) [off-cluster masquerade], then
//	                      -m statistic --mode random --probability 1/(n-i) -j FLATNET-SEP-<hash>
//	                      (with ClientIP affinity first -m recent --rcheck -j FLATNET-SEP-, per endpoint)
//	  FLATNET-SVL-<hash>  the same over the node's own endpoints (traffic policy Local)
//	  FLATNET-SEP-<hash>  -s EP -j FLATNET-MARK-MASQ (hairpin), [-m recent --set] -j DNAT
//	  FLATNET-EXT-<hash>  NodePorts, externalIPs, LB IPs: mark for masquerade, -j SVC (Cluster),
//	                      or pod short-circuit, local masquerade, -j SVL (Local)
//	  FLATNET-FW-<hash>   -s <loadBalancerSourceRanges> -j FLATNET-EXT-<hash>
//	nat POSTROUTING -j FLATNET-POSTROUTING: masquerade what carries the mark
//	filter INPUT, FORWARD, OUTPUT (ctstate NEW)
//	  -j FLATNET-PROXY-FIREWALL     LB IP ports the FW chain did not pass: DROP
//	  -j FLATNET-SERVICES           (FORWARD, OUTPUT) ClusterIP ports without endpoints: REJECT,
//	                                policy Local with endpoints elsewhere: DROP; last, per ClusterIP,
//	                                any other port: REJECT
//	  -j FLATNET-EXTERNAL-SERVICES  externalIP, LB IP and NodePorts without endpoints: REJECT,
//	                                policy Local without a local one: DROP
//
// At the filter hooks a served packet has been DNATed already, so whatever
// is still addressed to a service address was not served.
//
// Syncs. Per service the renderer keeps what it wrote (its chains and its
// rules in the dispatch chains). A partial sync redeclares (flushes) and
// refills only the changed services' chains whose rules differ, deletes
// their chains nobody wants after the references are gone, and edits the
// dispatch chains rule by rule: -D the old rule (with the arguments it was
// added with), -I 1 the new one (catch-alls -A, so they stay behind the
// port rules; the NodePorts jump stays last). So a sync's input follows
// the change, not the service count (kube-proxy rewrites its dispatch
// chains whole every sync). A full sync reads both tables, declares and
// refills every chain of ours whose saved rules differ from what it wants
// (rules are written as iptables-save prints them, so an untouched chain
// reads back equal and a second full sync restores nothing), deletes the
// proxy chains nobody wants (after a restart) and puts the jumps from the
// built-in chains back where they are missing. Jumps are inserted first in the built-in chains, once:
// only when missing, never moved (other writers, e.g. network policy, also
// want to be first).
package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/proxy"
)

// Chain names. Every chain of the proxy is one of the fixed names or
// starts with one of chainPrefixes (see Ours); the other FLATNET- chains
// (network policy's FLATNET-NP, portmap's FLATNET-HOSTPORT-, FLATNET-DN-)
// are not ours.
const (
	ChainServices         = "FLATNET-SERVICES" // nat and filter
	ChainNodePorts        = "FLATNET-NODEPORTS"
	ChainPostrouting      = "FLATNET-POSTROUTING"
	ChainMarkMasq         = "FLATNET-MARK-MASQ"
	ChainNonPodMasq       = "FLATNET-NON-POD-MASQ" // only with several cluster CIDRs
	ChainExternalServices = "FLATNET-EXTERNAL-SERVICES"
	ChainFirewall         = "FLATNET-PROXY-FIREWALL"

	prefixSvc = "FLATNET-SVC-"
	prefixSvl = "FLATNET-SVL-"
	prefixSep = "FLATNET-SEP-"
	prefixExt = "FLATNET-EXT-"
	prefixFw  = "FLATNET-FW-"

	tableNat    = "nat"
	tableFilter = "filter"

	// DefaultMasqueradeMark is the packet mark bit asking for masquerade
	// (kube-proxy's).
	DefaultMasqueradeMark = 0x4000
)

var (
	fixedChains   = []string{ChainServices, ChainNodePorts, ChainPostrouting, ChainMarkMasq, ChainNonPodMasq, ChainExternalServices, ChainFirewall}
	chainPrefixes = []string{prefixSvc, prefixSvl, prefixSep, prefixExt, prefixFw}
	tables        = []string{tableNat, tableFilter}
)

// Ours reports whether chain is one of the proxy's.
func Ours(chain string) bool {
	if slices.Contains(fixedChains, chain) {
		return true
	}
	for _, p := range chainPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Config says how to render. A dual-stack node runs one backend per
// family, as kube-proxy does.
type Config struct {
	Family   ipt.Protocol // ipt.IPv4 (iptables) or ipt.IPv6 (ip6tables)
	NodeName string       // for traffic policy Local
	// ClusterCIDRs are the pod networks: pod traffic to an
	// externalTrafficPolicy Local address is short-circuited to the
	// internal endpoints, and ClusterIP traffic from elsewhere is
	// masqueraded.
	ClusterCIDRs   []netip.Prefix
	MasqueradeMark uint32 // DefaultMasqueradeMark when zero
	// NodePortAddresses limits NodePorts to the node's addresses in these
	// prefixes; without a prefix of this family: every local address but
	// loopback.
	NodePortAddresses []netip.Prefix
}

func (c Config) withDefaults() Config {
	if c.MasqueradeMark == 0 {
		c.MasqueradeMark = DefaultMasqueradeMark
	}
	return c
}

func (c Config) v6() bool { return c.Family == ipt.IPv6 }

func (c Config) wantAddr(a netip.Addr) bool { return a.IsValid() && (a.Is4() || a.Is4In6()) != c.v6() }

func (c Config) wantPrefix(p netip.Prefix) bool { return p.IsValid() && p.Addr().Is4() != c.v6() }

// host renders a as a one-address prefix (-d 10.96.0.1/32), as
// iptables-save prints it.
func host(a netip.Addr) string {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()).String()
}

// rule is one rule's arguments after "-A chain".
type rule []string

// chainRef names a chain in a table.
type chainRef struct{ Table, Chain string }

// dispatch is a rule of a shared dispatch chain (FLATNET-SERVICES,
// -NODEPORTS, ...). Rules of one claim key are added and deleted one by
// one; last ones are appended (they must stay behind the others), the
// rest inserted first.
type dispatch struct {
	chainRef
	Last bool
	Args rule
}

func (d dispatch) id() string { return d.Table + " " + d.Chain + " " + strings.Join(d.Args, "\x00") }

// claimKey is what one service may hold alone: an address . protocol .
// port, a NodePort (protocol . port), or a ClusterIP's catch-all.
type claimKey struct{ Kind, Key string }

// objects are what one service owns.
type objects struct {
	chains map[chainRef][]rule
	claims map[claimKey][]dispatch
}

func newObjects() *objects {
	return &objects{chains: map[chainRef][]rule{}, claims: map[claimKey][]dispatch{}}
}

// State is what the previous sync wrote, per service key.
type State struct {
	services map[string]*objects
	// owners maps each claim key to the service holding it: two services
	// claiming one key would have two rules for one packet, so the first
	// claim wins.
	owners map[claimKey]string
	// Conflicts lists what the last sync left out for that reason.
	Conflicts []error
}

func newState() *State {
	return &State{services: map[string]*objects{}, owners: map[claimKey]string{}}
}

func sortedClaims[V any](m map[claimKey]V) []claimKey {
	return slices.SortedFunc(maps.Keys(m), func(a, b claimKey) int {
		if a.Kind != b.Kind {
			return strings.Compare(a.Kind, b.Kind)
		}
		return strings.Compare(a.Key, b.Key)
	})
}

func sortedChains[V any](m map[chainRef]V) []chainRef {
	return slices.SortedFunc(maps.Keys(m), func(a, b chainRef) int {
		if a.Table != b.Table {
			return strings.Compare(a.Table, b.Table)
		}
		return strings.Compare(a.Chain, b.Chain)
	})
}

// claim drops from o the keys another service owns and records o's own.
func (s *State) claim(key string, o *objects) {
	for _, k := range sortedClaims(o.claims) {
		if owner, ok := s.owners[k]; ok && owner != key {
			s.Conflicts = append(s.Conflicts, &proxy.ConflictError{Service: key, Owner: owner, What: k.Kind, Key: k.Key})
			delete(o.claims, k)
			continue
		}
		s.owners[k] = key
	}
}

// release forgets o's keys.
func (s *State) release(key string, o *objects) {
	for k := range o.claims {
		if s.owners[k] == key {
			delete(s.owners, k)
		}
	}
}

// Renderer renders Services into iptables-restore inputs.
type Renderer struct {
	cfg Config
}

// New returns a renderer for cfg.
func New(cfg Config) *Renderer { return &Renderer{cfg: cfg.withDefaults()} }

// Config returns the effective configuration.
func (r *Renderer) Config() Config { return r.cfg }

func (r *Renderer) mark() string { return fmt.Sprintf("0x%x", r.cfg.MasqueradeMark) }

// clusterCIDRs are the configured pod networks of the family.
func (r *Renderer) clusterCIDRs() []string {
	var out []string
	for _, p := range r.cfg.ClusterCIDRs {
		if r.cfg.wantPrefix(p) {
			out = append(out, p.Masked().String())
		}
	}
	return out
}

// nodePortDsts are the destination matches of "a NodePort address": not
// loopback (kube-proxy's nftables mode does not serve NodePorts on
// 127.0.0.1 either, and iptables would need route_localnet), or one per
// nodePortAddresses prefix.
func (r *Renderer) nodePortDsts() []rule {
	var out []rule
	for _, p := range r.cfg.NodePortAddresses {
		if r.cfg.wantPrefix(p) {
			out = append(out, rule{"-d", p.Masked().String()})
		}
	}
	if len(out) > 0 {
		return out
	}
	if r.cfg.v6() {
		return []rule{{"!", "-d", "::1/128"}}
	}
	return []rule{{"!", "-d", "127.0.0.0/8"}}
}

// builtinJump is a rule of ours in a built-in chain.
type builtinJump struct {
	chainRef // the built-in chain
	Args     rule
}

func (j builtinJump) target() string { return ipt.Rule{Args: j.Args}.Target() }

// jumps are the rules from the built-in chains into ours, in the order
// they should appear (each is inserted first when missing).
func jumps() []builtinJump {
	newConn := rule{"-m", "conntrack", "--ctstate", "NEW"}
	j := func(table, chain string, args ...string) builtinJump {
		return builtinJump{chainRef{table, chain}, args}
	}
	var out []builtinJump
	for _, c := range []string{"PREROUTING", "OUTPUT"} {
		out = append(out, j(tableNat, c, "-m", "comment", "--comment", "flatnet service portals", "-j", ChainServices))
	}
	out = append(out, j(tableNat, "POSTROUTING", "-m", "comment", "--comment", "flatnet postrouting rules", "-j", ChainPostrouting))
	for _, c := range []string{"INPUT", "FORWARD", "OUTPUT"} {
		out = append(out, j(tableFilter, c, append(slices.Clone(newConn), "-m", "comment", "--comment", "flatnet load balancer firewall", "-j", ChainFirewall)...))
		if c != "INPUT" {
			out = append(out, j(tableFilter, c, append(slices.Clone(newConn), "-m", "comment", "--comment", "flatnet service portals", "-j", ChainServices)...))
		}
		out = append(out, j(tableFilter, c, append(slices.Clone(newConn), "-m", "comment", "--comment", "flatnet external services", "-j", ChainExternalServices)...))
	}
	return out
}

// base returns the fixed chains and their rules, the dispatch chains'
// fixed tail included (service rules come before it).
func (r *Renderer) base() map[chainRef][]rule {
	mark := r.mark()
	b := map[chainRef][]rule{
		{tableNat, ChainServices}:            nil,
		{tableNat, ChainNodePorts}:           nil,
		{tableNat, ChainMarkMasq}:            {{"-j", "MARK", "--set-xmark", mark + "/" + mark}},
		{tableFilter, ChainServices}:         nil,
		{tableFilter, ChainExternalServices}: nil,
		{tableFilter, ChainFirewall}:         nil,
		{tableNat, ChainPostrouting}: {
			{"-m", "mark", "!", "--mark", mark + "/" + mark, "-j", "RETURN"},
			{"-j", "MARK", "--set-xmark", mark + "/0x0"},
			{"-m", "comment", "--comment", "flatnet service traffic requiring SNAT", "-j", "MASQUERADE", "--random-fully"},
		},
	}
	for _, dst := range r.nodePortDsts() {
		b[chainRef{tableNat, ChainServices}] = append(b[chainRef{tableNat, ChainServices}], slices.Concat(dst,
			rule{"-m", "comment", "--comment", "flatnet service nodeports; NOTE: this must be the last rule in this chain",
				"-m", "addrtype", "--dst-type", "LOCAL", "-j", ChainNodePorts}))
	}
	if cidrs := r.clusterCIDRs(); len(cidrs) > 1 {
		// "! -s" takes one prefix: with several pod networks the
		// off-cluster masquerade returns for each, then marks.
		var rules []rule
		for _, c := range cidrs {
			rules = append(rules, rule{"-s", c, "-j", "RETURN"})
		}
		b[chainRef{tableNat, ChainNonPodMasq}] = append(rules, rule{"-j", ChainMarkMasq})
	}
	return b
}

// Rules are written in the form iptables-save prints them back (mark
// targets as --set-xmark, recent with its defaults, REJECT with its type,
// the probability as the kernel keeps it), so that a full sync finds an
// untouched chain equal to what it wants and leaves it alone.

// probability is 1/n as iptables-save prints it: the kernel keeps a
// fraction of 2^31, printed with 11 decimals.
func probability(n int) string {
	u := math.Round(float64(1<<31) / float64(n))
	return fmt.Sprintf("%0.11f", u/float64(1<<31))
}

// hostMask is xt_recent's default --mask (the whole source address).
func (r *Renderer) hostMask() string {
	if r.cfg.v6() {
		return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	return "255.255.255.255"
}

// rejectWith is REJECT's default type (ICMP port unreachable).
func (r *Renderer) rejectWith() string {
	if r.cfg.v6() {
		return "icmp6-port-unreachable"
	}
	return "icmp-port-unreachable"
}

// verdictArgs are the options iptables-save prints after -j verdict.
func (r *Renderer) verdictArgs(verdict string) rule {
	if verdict == "REJECT" {
		return rule{"--reject-with", r.rejectWith()}
	}
	return nil
}

// chainName is prefix + 16 characters of a hash of parts: iptables chain
// names are at most 28 characters, and FLATNET-SVC- is 12.
func chainName(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "/")))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:28-len(prefix)]
}

func (r *Renderer) family(eps []proxy.Endpoint) []proxy.Endpoint {
	out := eps[:0:0]
	for _, ep := range eps {
		if r.cfg.wantAddr(ep.IP) && ep.Port != 0 {
			out = append(out, ep)
		}
	}
	return out
}

// renderService computes one service's chains and dispatch rules.
func (r *Renderer) renderService(svc *proxy.Service) *objects {
	o := newObjects()
	if !r.cfg.wantAddr(svc.ClusterIP) {
		// Headless (left to DNS) or another family's service.
		return o
	}
	cip := host(svc.ClusterIP)
	var extAddrs, lbIPs []netip.Addr
	for _, a := range svc.ExternalIPs {
		if r.cfg.wantAddr(a) {
			extAddrs = append(extAddrs, a)
		}
	}
	for _, a := range svc.LoadBalancerIPs {
		if r.cfg.wantAddr(a) {
			lbIPs = append(lbIPs, a)
		}
	}
	firewall := len(lbIPs) > 0 && svc.Type == proxy.LoadBalancer && svc.Firewall
	cidrs := r.clusterCIDRs()
	nat := func(c string) chainRef { return chainRef{tableNat, c} }
	add := func(k claimKey, table, chain string, last bool, args ...string) {
		o.claims[k] = append(o.claims[k], dispatch{chainRef{table, chain}, last, args})
	}

	for i := range svc.Ports {
		sp := &svc.Ports[i]
		portName := sp.Name
		if portName == "" {
			portName = strconv.Itoa(int(sp.Port))
		}
		proto := string(sp.Protocol)
		port := strconv.Itoa(int(sp.Port))
		label := svc.Namespace + "/" + svc.Name + ":" + portName // kube-proxy's comments
		id := []string{svc.Namespace, svc.Name, proto, portName}
		svcChain, localChain := chainName(prefixSvc, id...), chainName(prefixSvl, id...)
		extChain, fwChain := chainName(prefixExt, id...), chainName(prefixFw, id...)

		hasNodePort := sp.NodePort != 0 && (svc.Type == proxy.NodePort || svc.Type == proxy.LoadBalancer)
		hasExternal := hasNodePort || len(extAddrs) > 0 || len(lbIPs) > 0
		pe := proxy.SplitEndpoints(svc, sp, r.cfg.NodeName, hasExternal, func(eps []proxy.Endpoint, node string) []proxy.Endpoint {
			return r.family(proxy.Usable(eps, node))
		})
		all, local, internalEPs := pe.All, pe.Local, pe.Internal
		needAll, needLocal := pe.NeedAll, pe.NeedLocal
		internalChain := svcChain
		if svc.InternalLocal {
			internalChain = localChain
		}

		// One FLATNET-SEP- chain per endpoint: hairpin mark, affinity
		// record, DNAT. Shared by the SVC and SVL chains.
		sep := func(ep proxy.Endpoint) string {
			ap := netip.AddrPortFrom(ep.IP.Unmap(), ep.Port)
			c := chainName(prefixSep, append(slices.Clone(id), ap.String())...)
			if _, ok := o.chains[nat(c)]; ok {
				return c
			}
			dnat := rule{"-p", proto, "-m", "comment", "--comment", label}
			if svc.AffinityTimeout > 0 {
				dnat = append(dnat, "-m", "recent", "--set", "--name", c, "--mask", r.hostMask(), "--rsource")
			}
			o.chains[nat(c)] = []rule{
				{"-s", host(ep.IP), "-m", "comment", "--comment", label, "-j", ChainMarkMasq},
				append(dnat, "-m", proto, "-j", "DNAT", "--to-destination", ap.String()),
			}
			return c
		}
		// pick fills a service chain: off-cluster masquerade for the
		// internal chain, affinity checks, then a random choice.
		pick := func(chain string, eps []proxy.Endpoint) {
			var rules []rule
			if chain == internalChain && len(cidrs) > 0 {
				// ClusterIP traffic from outside the pod network (the
				// node, a router sending the service CIDR here) is
				// masqueraded so the reply comes back through this
				// node; the -d match leaves external traffic alone.
				m := rule{"-d", cip, "-p", proto, "-m", "comment", "--comment", label + " cluster IP", "-m", proto, "--dport", port}
				if len(cidrs) == 1 {
					rules = append(rules, slices.Concat(rule{"!", "-s", cidrs[0]}, m, rule{"-j", ChainMarkMasq}))
				} else {
					rules = append(rules, append(m, "-j", ChainNonPodMasq))
				}
			}
			seps := make([]string, len(eps))
			for i, ep := range eps {
				seps[i] = sep(ep)
			}
			if svc.AffinityTimeout > 0 {
				secs := strconv.Itoa(max(1, int(svc.AffinityTimeout/time.Second)))
				for i, ep := range eps {
					rules = append(rules, rule{"-m", "comment", "--comment", label + " -> " + netip.AddrPortFrom(ep.IP.Unmap(), ep.Port).String(),
						"-m", "recent", "--rcheck", "--seconds", secs, "--reap", "--name", seps[i], "--mask", r.hostMask(), "--rsource", "-j", seps[i]})
				}
			}
			for i, ep := range eps {
				rl := rule{"-m", "comment", "--comment", label + " -> " + netip.AddrPortFrom(ep.IP.Unmap(), ep.Port).String()}
				if n := len(eps) - i; n > 1 {
					rl = append(rl, "-m", "statistic", "--mode", "random", "--probability", probability(n))
				}
				rules = append(rules, append(rl, "-j", seps[i]))
			}
			o.chains[nat(chain)] = rules
		}
		if needAll {
			pick(svcChain, all)
		}
		if needLocal {
			pick(localChain, local)
		}

		// extReachable: the external entry has somewhere to send some
		// packets (see proxy/nftables). With policy Local and no
		// endpoint on this node, pod traffic is short-circuited and the
		// rest falls through to the filter table's DROP.
		extReachable := pe.ExtReachable
		if hasExternal && extReachable {
			var rules []rule
			if svc.ExternalLocal {
				if len(internalEPs) > 0 {
					for _, c := range cidrs {
						rules = append(rules, rule{"-s", c, "-m", "comment", "--comment", "pod traffic for " + label + " external destinations", "-j", internalChain})
					}
				}
				if len(local) > 0 {
					rules = append(rules,
						rule{"-m", "comment", "--comment", "masquerade LOCAL traffic for " + label + " external destinations", "-m", "addrtype", "--src-type", "LOCAL", "-j", ChainMarkMasq},
						rule{"-j", localChain})
				}
			} else {
				rules = append(rules,
					rule{"-m", "comment", "--comment", "masquerade traffic for " + label + " external destinations", "-j", ChainMarkMasq},
					rule{"-j", svcChain})
			}
			o.chains[nat(extChain)] = rules
		}
		// noLocal: external traffic left unserved for policy Local.
		noLocal := svc.ExternalLocal && len(local) == 0

		// The ClusterIP.
		ck := claimKey{"address", svc.ClusterIP.Unmap().String() + " " + proto + " " + port}
		dst := rule{"-d", cip, "-p", proto}
		switch {
		case len(internalEPs) > 0:
			add(ck, tableNat, ChainServices, false, slices.Concat(dst, rule{"-m", "comment", "--comment", label + " cluster IP", "-m", proto, "--dport", port, "-j", internalChain})...)
		case len(all) > 0:
			// internalTrafficPolicy Local with endpoints only on other
			// nodes: dropped, as kube-proxy does.
			add(ck, tableFilter, ChainServices, false, slices.Concat(dst, rule{"-m", "comment", "--comment", label + " has no local endpoints", "-m", proto, "--dport", port, "-j", "DROP"})...)
		default:
			add(ck, tableFilter, ChainServices, false, slices.Concat(dst, rule{"-m", "comment", "--comment", label + " has no endpoints", "-m", proto, "--dport", port, "-j", "REJECT", "--reject-with", r.rejectWith()})...)
		}

		// externalIPs and load-balancer IPs.
		external := func(a netip.Addr, what, target string) {
			k := claimKey{"address", a.Unmap().String() + " " + proto + " " + port}
			d := rule{"-d", host(a), "-p", proto}
			switch {
			case !extReachable:
				add(k, tableFilter, ChainExternalServices, false, slices.Concat(d, rule{"-m", "comment", "--comment", label + " has no endpoints", "-m", proto, "--dport", port, "-j", "REJECT", "--reject-with", r.rejectWith()})...)
				return
			case noLocal:
				add(k, tableFilter, ChainExternalServices, false, slices.Concat(d, rule{"-m", "comment", "--comment", label + " has no local endpoints", "-m", proto, "--dport", port, "-j", "DROP"})...)
			}
			add(k, tableNat, ChainServices, false, slices.Concat(d, rule{"-m", "comment", "--comment", label + " " + what, "-m", proto, "--dport", port, "-j", target})...)
		}
		for _, a := range extAddrs {
			external(a, "external IP", extChain)
		}
		for _, a := range lbIPs {
			target := extChain
			if firewall {
				target = fwChain
				k := claimKey{"address", a.Unmap().String() + " " + proto + " " + port}
				// Not DNATed: still addressed to the LB IP at the filter
				// hooks. From an allowed source it goes on to the
				// reject (no endpoints) or drop (no local endpoint) of
				// FLATNET-EXTERNAL-SERVICES; from any other, dropped.
				d := rule{"-d", host(a), "-p", proto}
				for _, p := range svc.SourceRanges {
					if r.cfg.wantPrefix(p) {
						add(k, tableFilter, ChainFirewall, false, slices.Concat(rule{"-s", p.Masked().String()}, d, rule{"-m", "comment", "--comment", label + " loadbalancer IP", "-m", proto, "--dport", port, "-j", "RETURN"})...)
					}
				}
				add(k, tableFilter, ChainFirewall, false, slices.Concat(d, rule{"-m", "comment", "--comment", label + " traffic not accepted by " + fwChain, "-m", proto, "--dport", port, "-j", "DROP"})...)
			}
			external(a, "loadbalancer IP", target)
		}
		if firewall && extReachable {
			var rules []rule
			for _, p := range svc.SourceRanges {
				if r.cfg.wantPrefix(p) {
					rules = append(rules, rule{"-s", p.Masked().String(), "-m", "comment", "--comment", label + " loadbalancer IP", "-j", extChain})
				}
			}
			o.chains[nat(fwChain)] = rules
		}

		// The NodePort.
		if hasNodePort {
			np := strconv.Itoa(int(sp.NodePort))
			k := claimKey{"nodeport", proto + " " + np}
			refuse := func(verdict, why string) {
				for _, d := range r.nodePortDsts() {
					add(k, tableFilter, ChainExternalServices, false, slices.Concat(d, rule{"-p", proto, "-m", "addrtype", "--dst-type", "LOCAL",
						"-m", "comment", "--comment", label + why, "-m", proto, "--dport", np, "-j", verdict}, r.verdictArgs(verdict))...)
				}
			}
			switch {
			case !extReachable:
				refuse("REJECT", " has no endpoints")
			default:
				if noLocal {
					refuse("DROP", " has no local endpoints")
				}
				add(k, tableNat, ChainNodePorts, false, "-p", proto, "-m", "comment", "--comment", label, "-m", proto, "--dport", np, "-j", extChain)
			}
		}
	}
	// Any other port of the ClusterIP: refused at once, as kube-proxy's
	// nftables mode does, instead of routed to nowhere. Last in the chain,
	// behind the port rules (a DROP there must win).
	add(claimKey{"cluster IP", svc.ClusterIP.Unmap().String()}, tableFilter, ChainServices, true,
		"-d", cip, "-m", "comment", "--comment", svc.Namespace+"/"+svc.Name+" cluster IP, other ports", "-j", "REJECT", "--reject-with", r.rejectWith())
	return o
}
