package netexec

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// A tiny authoritative DNS server (--dns-port): the zone --dns-zone and
// every name under it have one A (or AAAA) record, --dns-answer; anything
// else is REFUSED (it is nobody's recursive resolver). The lab's external
// host runs it as the "internet's" DNS, the upstream the cluster DNS
// forwards to, so lab tests see forwarding without leaving the machine.

// startDNS opens the DNS sockets; serving starts in Start.
func (s *Server) startDNS() error {
	cfg := s.cfg
	answer, err := netip.ParseAddr(cfg.DNSAnswer)
	if err != nil {
		return fmt.Errorf("netexec: --dns-answer %q: %w (the address the zone's names resolve to)", cfg.DNSAnswer, err)
	}
	zone := dns.Fqdn(strings.ToLower(cfg.DNSZone))
	if _, ok := dns.IsDomainName(zone); !ok || zone == "." {
		return fmt.Errorf("netexec: --dns-zone %q is not a domain name", cfg.DNSZone)
	}
	addr := net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.DNSPort))
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("netexec: DNS port %d/udp: %w", cfg.DNSPort, err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return fmt.Errorf("netexec: DNS port %d/tcp: %w", cfg.DNSPort, err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
			w.WriteMsg(m) //nolint:errcheck
			return
		}
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		if name != zone && !strings.HasSuffix(name, "."+zone) {
			m.Rcode = dns.RcodeRefused
			w.WriteMsg(m) //nolint:errcheck
			return
		}
		m.Authoritative = true
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 30}
		switch {
		case q.Qtype == dns.TypeA && answer.Is4():
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: answer.AsSlice()})
		case q.Qtype == dns.TypeAAAA && answer.Is6():
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: answer.AsSlice()})
		}
		s.log.Printf("dns %s %s from %s: %d answers", dns.TypeToString[q.Qtype], q.Name, w.RemoteAddr(), len(m.Answer))
		w.WriteMsg(m) //nolint:errcheck
	})
	s.dnsUDP = &dns.Server{PacketConn: pc, Handler: h}
	s.dnsTCP = &dns.Server{Listener: ln, Handler: h}
	return nil
}

// DNSAddr is the bound DNS address (UDP and TCP; "" when off).
func (s *Server) DNSAddr() string {
	if s.dnsUDP == nil {
		return ""
	}
	return s.dnsUDP.PacketConn.LocalAddr().String()
}
