package records

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// Result is the answer to one question. NotOurs means the name is outside
// every zone this index serves: the server forwards it. Otherwise the
// answer is authoritative, and a negative one (NXDOMAIN, or NODATA: NOERROR
// with no answer) carries the zone's SOA in Ns.
type Result struct {
	NotOurs       bool
	Rcode         int
	Authoritative bool
	Answer        []dns.RR
	Ns            []dns.RR
	Extra         []dns.RR
	// Target is set when Answer ends in a CNAME to a name outside the
	// cluster zone (an ExternalName Service) and the question was for
	// another type: the server resolves Target upstream and appends it.
	Target string
}

// Fill copies r into a reply message.
func (r *Result) Fill(m *dns.Msg) {
	m.Rcode = r.Rcode
	m.Authoritative = r.Authoritative
	m.Answer = append(m.Answer, r.Answer...)
	m.Ns = append(m.Ns, r.Ns...)
	m.Extra = append(m.Extra, r.Extra...)
}

// maxChase bounds CNAME chains inside the zone (ExternalName Services
// pointing at each other).
const maxChase = 8

// Answer answers q. client is the asker's address; it is unused for now
// and is where namespace-aware answers (autopath) will come from.
// Returned records are shared: do not modify them.
func (ix *Index) Answer(q dns.Question, client netip.Addr) Result {
	_ = client
	qname := dns.Fqdn(q.Name)
	name := strings.ToLower(qname)
	var r Result
	switch {
	case name == ix.zone || strings.HasSuffix(name, "."+ix.zone):
		if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
			return Result{Rcode: dns.RcodeRefused}
		}
		ix.mu.RLock()
		r = ix.zoneAnswer(name, q.Qtype)
		ix.mu.RUnlock()
	case strings.HasSuffix(name, ".in-addr.arpa.") || strings.HasSuffix(name, ".ip6.arpa."):
		if q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY {
			return Result{NotOurs: true}
		}
		ix.mu.RLock()
		r = ix.reverseAnswer(name, q.Qtype)
		ix.mu.RUnlock()
	default:
		return Result{NotOurs: true}
	}
	if qname != name {
		r.Answer = withOwner(r.Answer, name, qname)
	}
	return r
}

// withOwner gives the records owned by name the asker's spelling of it
// (copies: the index's records are shared).
func withOwner(rrs []dns.RR, name, qname string) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		if rr.Header().Name == name {
			rr = dns.Copy(rr)
			rr.Header().Name = qname
		}
		out[i] = rr
	}
	return out
}

func (ix *Index) negative(rcode int) Result {
	return Result{Rcode: rcode, Authoritative: true, Ns: ix.soaNs}
}

func (ix *Index) positive(answer []dns.RR) Result {
	return Result{Authoritative: true, Answer: answer[:len(answer):len(answer)]}
}

// zoneAnswer answers a lower-case name inside the cluster zone. Callers
// hold the read lock.
func (ix *Index) zoneAnswer(name string, qtype uint16) Result {
	rel := strings.TrimSuffix(name, ix.zone) // "" at the apex, else "a.b."
	switch {
	case rel == "":
		if qtype == dns.TypeSOA || qtype == dns.TypeANY {
			return ix.positive([]dns.RR{ix.soa})
		}
		return ix.negative(dns.RcodeSuccess)
	case rel == "dns-version.":
		if qtype == dns.TypeTXT || qtype == dns.TypeANY {
			return ix.positive([]dns.RR{ix.version})
		}
		return ix.negative(dns.RcodeSuccess)
	case rel == "svc." || rel == "pod.":
		return ix.negative(dns.RcodeSuccess)
	case strings.HasSuffix(rel, ".svc."):
		return ix.serviceAnswer(name, rel, qtype)
	case strings.HasSuffix(rel, ".pod."):
		return ix.podAnswer(strings.TrimSuffix(rel, ".pod."), qtype)
	}
	return ix.negative(dns.RcodeNameError)
}

func (ix *Index) serviceAnswer(name, rel string, qtype uint16) Result {
	var answer []dns.RR
	for range maxChase {
		sets, ok := ix.names[name]
		if !ok {
			// <ns>.svc.<zone> exists while the namespace has a Service
			// with records.
			ns := strings.TrimSuffix(rel, ".svc.")
			rcode := dns.RcodeNameError
			if !strings.Contains(ns, ".") && ix.nsCount[ns] > 0 {
				rcode = dns.RcodeSuccess
			}
			r := ix.negative(rcode)
			r.Answer = answer
			return r
		}
		if rrs := sets.get(qtype); len(rrs) > 0 {
			if answer != nil {
				rrs = append(answer, rrs...)
			}
			r := ix.positive(rrs)
			if qtype == dns.TypeSRV {
				r.Extra = ix.srvExtra(rrs)
			}
			return r
		}
		if qtype == dns.TypeANY && len(sets) > 0 {
			for _, set := range sets { // in type order
				answer = append(answer, set.rrs...)
			}
			return ix.positive(answer)
		}
		cn := sets.get(dns.TypeCNAME)
		if len(cn) == 0 {
			r := ix.negative(dns.RcodeSuccess)
			r.Answer = answer
			return r
		}
		answer = append(answer, cn...)
		target := cn[0].(*dns.CNAME).Target
		if target != ix.zone && !strings.HasSuffix(target, "."+ix.zone) {
			r := ix.positive(answer)
			r.Target = target
			return r
		}
		if !strings.HasSuffix(target, "."+ix.svcZone) { // no CNAMEs there
			r := ix.zoneAnswer(target, qtype)
			r.Answer = append(answer, r.Answer...)
			return r
		}
		if slices.ContainsFunc(answer, func(rr dns.RR) bool { return rr.Header().Name == target }) {
			break // a loop: answer the chain once
		}
		name, rel = target, strings.TrimSuffix(target, ix.zone)
	}
	return ix.positive(answer)
}

// srvExtra is the address records of SRV targets, for the Additional
// section.
func (ix *Index) srvExtra(srvs []dns.RR) []dns.RR {
	var extra []dns.RR
	for _, rr := range srvs {
		sets := ix.names[rr.(*dns.SRV).Target]
		extra = append(extra, sets.get(dns.TypeA)...)
		extra = append(extra, sets.get(dns.TypeAAAA)...)
	}
	return extra
}

// podAnswer answers <ip>.<ns> (rel, without ".pod.") as the pod mode says.
func (ix *Index) podAnswer(rel string, qtype uint16) Result {
	if ix.pods == PodsDisabled {
		return ix.negative(dns.RcodeNameError)
	}
	if ix.pods == PodsVerified && ix.podsPending.Load() {
		return Result{Rcode: dns.RcodeServerFailure} // AwaitPods
	}
	label, ns, ok := strings.Cut(rel, ".")
	if !ok { // <ns>.pod.<zone>
		if ix.pods == PodsInsecure || len(ix.podAddrs[label]) > 0 {
			return ix.negative(dns.RcodeSuccess)
		}
		return ix.negative(dns.RcodeNameError)
	}
	if strings.Contains(ns, ".") {
		return ix.negative(dns.RcodeNameError)
	}
	a, ok := undash(label)
	if !ok || (ix.pods == PodsVerified && ix.podAddrs[ns][a] == 0) {
		return ix.negative(dns.RcodeNameError)
	}
	rr := ix.addrRR(label+"."+ns+"."+ix.podZone, a)
	if qtype == rr.Header().Rrtype || qtype == dns.TypeANY {
		return ix.positive([]dns.RR{rr})
	}
	return ix.negative(dns.RcodeSuccess)
}

// undash reads a pod label: 10-1-2-3 or fd00--1.
func undash(label string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", ".")); err == nil && a.Is4() {
		return a, true
	}
	if a, err := netip.ParseAddr(strings.ReplaceAll(label, "-", ":")); err == nil && a.Is6() && !a.Is4In6() && a.Zone() == "" {
		return a, true
	}
	return netip.Addr{}, false
}

// reverseAnswer answers a lower-case in-addr.arpa or ip6.arpa name.
func (ix *Index) reverseAnswer(name string, qtype uint16) Result {
	p, ok := parseReverse(name)
	if !ok {
		return Result{NotOurs: true}
	}
	zone, served := ix.reverseZone(p)
	if p.IsSingleIP() {
		if ks := ix.ptrs[p.Addr()]; len(ks) > 0 {
			if qtype != dns.TypePTR && qtype != dns.TypeANY {
				return ix.reverseNegative(zone, dns.RcodeSuccess)
			}
			var answer []dns.RR
			for _, x := range ks { // in Service order
				answer = append(answer, x.rrs...)
			}
			return ix.positive(answer)
		}
		if !served {
			return Result{NotOurs: true}
		}
		return ix.reverseNegative(zone, dns.RcodeNameError)
	}
	if !served {
		return Result{NotOurs: true}
	}
	// A partial name is an empty non-terminal when an address under it
	// has a PTR.
	for a := range ix.ptrs {
		if p.Contains(a) {
			return ix.reverseNegative(zone, dns.RcodeSuccess)
		}
	}
	return ix.reverseNegative(zone, dns.RcodeNameError)
}

// reverseZone finds the ReverseCIDR covering p and names the reverse zone
// its answer is under: the CIDR rounded up to a label boundary (a /12 is
// served as sixteen /16 zones).
func (ix *Index) reverseZone(p netip.Prefix) (string, bool) {
	for _, c := range ix.reverse {
		if !c.Contains(p.Addr()) || p.Bits() < c.Bits() || c.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		step := 4
		if c.Addr().Is4() {
			step = 8
		}
		bits := (c.Bits() + step - 1) / step * step
		full, _ := dns.ReverseAddr(p.Addr().String())
		labels := dns.SplitDomainName(full)
		// Keep the zone's labels and in-addr.arpa / ip6.arpa.
		return dns.Fqdn(strings.Join(labels[len(labels)-2-bits/step:], ".")), true
	}
	return "", false
}

func (ix *Index) reverseNegative(zone string, rcode int) Result {
	r := ix.negative(rcode)
	if zone != "" {
		soa := *ix.soa
		soa.Hdr.Name = zone
		r.Ns = []dns.RR{&soa}
	}
	return r
}

// parseReverse reads a reverse name as the prefix it names: a full name
// is a single address, a shorter one a prefix on a label boundary.
func parseReverse(name string) (netip.Prefix, bool) {
	if v4, ok := strings.CutSuffix(name, ".in-addr.arpa."); ok {
		labels := strings.Split(v4, ".")
		if len(labels) > 4 {
			return netip.Prefix{}, false
		}
		var b [4]byte
		for i, l := range labels {
			n, ok := decimalOctet(l)
			if !ok {
				return netip.Prefix{}, false
			}
			b[len(labels)-1-i] = n
		}
		return netip.PrefixFrom(netip.AddrFrom4(b), 8*len(labels)), true
	}
	v6, _ := strings.CutSuffix(name, ".ip6.arpa.")
	labels := strings.Split(v6, ".")
	if len(labels) > 32 {
		return netip.Prefix{}, false
	}
	var b [16]byte
	for i, l := range labels {
		if len(l) != 1 {
			return netip.Prefix{}, false
		}
		n := strings.IndexByte("0123456789abcdef", l[0])
		if n < 0 {
			return netip.Prefix{}, false
		}
		pos := len(labels) - 1 - i // nibble index from the top
		if pos%2 == 0 {
			b[pos/2] |= byte(n) << 4
		} else {
			b[pos/2] |= byte(n)
		}
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), 4*len(labels)), true
}

func decimalOctet(s string) (byte, bool) {
	if s == "" || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return byte(n), n <= 255
}
