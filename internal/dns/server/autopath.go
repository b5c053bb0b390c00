package server

import (
	"context"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// autopath answers q in one round trip when it is the first search-path
// expansion of a name, asked by a pod: q.Name is <base>.<ns>.svc.<zone>
// with ns the pod's namespace. It tries <base> under each search domain in
// the order the pod's resolver would (<ns>.svc.<zone>, svc.<zone>, <zone>,
// the node's, then <base> alone) and returns the first answer that is not
// NXDOMAIN behind a CNAME from q.Name. ok is false when q is not such a
// query or every try was NXDOMAIN: the caller answers q as asked. local
// says the answer came from the index alone.
func (s *Server) autopath(ctx context.Context, req *dns.Msg, q dns.Question, client netip.Addr) (out *dns.Msg, ok, local bool) {
	if !s.cfg.Autopath {
		return nil, false, false
	}
	ns, ok := s.ix.NamespaceOf(client)
	if !ok {
		return nil, false, false
	}
	zone := s.ix.Zone()
	first := ns + ".svc." + zone
	qname := dns.Fqdn(q.Name)
	if len(qname) <= len(first)+1 || !strings.EqualFold(qname[len(qname)-len(first)-1:], "."+first) {
		return nil, false, false
	}
	if r := s.ix.Answer(q, client); r.Rcode != dns.RcodeNameError {
		return nil, false, false // the name itself exists: the plain answer is right
	}
	local = true
	base := qname[:len(qname)-len(first)-1]
	search := append([]string{"svc." + zone, zone}, s.cfg.Search...)
	search = append(search, "")
	for _, d := range search {
		name := base + "."
		if d != "" {
			name = base + "." + d
		}
		sub := dns.Question{Name: name, Qtype: q.Qtype, Qclass: q.Qclass}
		r := s.ix.Answer(sub, client)
		var resp *dns.Msg
		if r.NotOurs {
			local = false
			sreq := req.Copy()
			sreq.Question = []dns.Question{sub}
			resp = s.forward(ctx, sreq, new(dns.Msg))
			if resp.Rcode == dns.RcodeServerFailure {
				return nil, false, false // on failure the plain answer (CoreDNS does the same)
			}
		} else {
			resp = new(dns.Msg)
			resp.SetReply(req)
			r.Fill(resp)
			if r.Target != "" {
				local = false
				s.chase(ctx, req, resp, r.Target, q.Qtype)
			}
		}
		if resp.Rcode == dns.RcodeNameError {
			continue
		}
		cname := &dns.CNAME{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: s.ix.TTL()}, Target: name}
		out = new(dns.Msg)
		out.SetReply(req)
		out.RecursionAvailable = true
		out.Authoritative = false
		out.Rcode = resp.Rcode
		out.Answer = append([]dns.RR{cname}, resp.Answer...)
		out.Ns = resp.Ns
		out.Extra = withoutOPT(resp.Extra)
		s.m.autopathed()
		return out, true, local
	}
	return nil, false, false
}

func withoutOPT(rrs []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}
