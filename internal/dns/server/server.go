// Package server is flatnet's cluster DNS server: the wire side of the
// records index (internal/dns/records) and the forwarder
// (internal/dns/forward), on UDP and TCP sockets the caller opens.
//
// Design note.
//   - Two paths. The fast path reads a plain query's question bytes without
//     unpacking the message (parseQuery) and, when the packed reply to that
//     exact question is cached for the index's current generation, copies
//     it and patches the ID and the RD/CD bits: no allocation, no lock
//     beyond a read lock, inline in the socket's read loop. Everything
//     else takes the slow path in a goroutine of its own (it may wait on an
//     upstream resolver): unpack with miekg/dns, answer, pack, and cache
//     the packed reply when the index alone produced it.
//   - What is cached: replies built only from the index (cluster names,
//     their NXDOMAIN/NODATA, reverse names we own), untruncated. The index
//     bumps its generation whenever an answer may change, which makes every
//     entry stale at once; a Service created or deleted is answered from the
//     next query on. Forwarded answers are cached by the forwarder (their
//     TTLs count down there); their packed copies live here for one second
//     at most (ForwardedReplyTTL), within the TTL's own granularity.
//   - Sizes. Over UDP a reply fits the client's EDNS0 buffer (512 bytes
//     without EDNS0): miekg/dns's Truncate drops what does not fit and sets
//     TC, so the client retries over TCP. Replies are compressed. Replies
//     carry an OPT record when the query did (our size: AdvertisedUDPSize).
//   - Autopath (optional): a query for the first search-path expansion of a
//     name from a pod (its namespace known from its source address) is
//     followed through the rest of the search path here, as CoreDNS's
//     autopath: the first reply that is not NXDOMAIN is returned behind a
//     CNAME from the asked name. A ClusterFirst pod's lookup of an external
//     name then costs one round trip instead of up to five.
//   - Sockets are bound to specific addresses by the caller, so a reply
//     leaves from the address the query came to without IP_PKTINFO.
package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/dns/records"
)

// AdvertisedUDPSize is the EDNS0 payload size in our replies' OPT record
// (the DNS Flag Day 2020 value).
const AdvertisedUDPSize = 1232

// Defaults.
const (
	// DefaultCacheEntries bounds the packed-reply cache: about 5 MB of
	// live heap (an entry is about 250 bytes), CoreDNS's cache capacity.
	DefaultCacheEntries = 20_000
	// QueryTimeout bounds the work on one query, upstream tries included
	// (glibc gives a server 5 s before it retries).
	QueryTimeout = 5 * time.Second
	tcpIdle      = 10 * time.Second
)

// Forwarder answers names outside the cluster zone (forward.Forwarder).
type Forwarder interface {
	Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error)
}

// Config configures a Server.
type Config struct {
	Index *records.Index
	// Forwarder answers every name the index does not own; nil answers
	// them SERVFAIL.
	Forwarder Forwarder
	// Autopath follows pods' search paths here (see the design note).
	Autopath bool
	// Search are search domains after the cluster ones in pods'
	// resolv.conf (the node's, which ClusterFirst pods inherit); autopath
	// tries them before the bare name.
	Search []string
	// CacheEntries bounds the packed-reply cache; 0 is
	// DefaultCacheEntries, negative turns it off.
	CacheEntries int
	Metrics      *Metrics  // nil: none
	QueryLog     io.Writer // nil: no query log
}

// Server answers DNS queries. Create it with New, run it with Serve.
type Server struct {
	cfg   Config
	ix    *records.Index
	cache *replyCache // nil when off
	m     *Metrics

	slowSlots chan struct{} // see MaxSlowQueries

	logMu sync.Mutex
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Index == nil {
		return nil, errors.New("dns server: no records index")
	}
	s := &Server{cfg: cfg, ix: cfg.Index, m: cfg.Metrics, slowSlots: make(chan struct{}, MaxSlowQueries)}
	if cfg.CacheEntries >= 0 {
		n := cfg.CacheEntries
		if n == 0 {
			n = DefaultCacheEntries
		}
		s.cache = newReplyCache(n)
	}
	s.cfg.Search = nil
	for _, d := range cfg.Search {
		s.cfg.Search = append(s.cfg.Search, dns.Fqdn(strings.ToLower(d)))
	}
	return s, nil
}

// Serve answers on every socket until ctx ends, then closes them.
func (s *Server) Serve(ctx context.Context, udp []net.PacketConn, tcp []net.Listener) error {
	if len(udp) == 0 && len(tcp) == 0 {
		return errors.New("dns server: no socket to serve")
	}
	ucs := make([]*net.UDPConn, 0, len(udp))
	for _, c := range udp {
		uc, ok := c.(*net.UDPConn)
		if !ok {
			return fmt.Errorf("dns server: %T on %s is not a UDP socket", c, c.LocalAddr())
		}
		ucs = append(ucs, uc)
	}
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() {
		for _, c := range udp {
			c.Close()
		}
		for _, l := range tcp {
			l.Close()
		}
	})
	defer stop()
	for _, c := range ucs {
		setReadBuffer(c, UDPReadBuffer)
		// One reader per CPU: a read loop answers cache hits inline.
		for range runtime.GOMAXPROCS(0) {
			wg.Go(func() { s.serveUDPBatch(ctx, c) })
		}
	}
	for _, l := range tcp {
		wg.Go(func() { s.serveTCP(ctx, l, &wg) })
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// UDPReadBuffer is the receive buffer of the UDP sockets. The default
// (net.core.rmem_default, 208 KiB here) holds about 270 queries: a burst
// of a thousand pods' parallel A+AAAA lookups overflows it and the kernel
// drops queries, which glibc retries only after 5 s.
const UDPReadBuffer = 8 << 20

// setReadBuffer sets c's receive buffer to n bytes: SO_RCVBUFFORCE (root,
// past net.core.rmem_max), else SO_RCVBUF up to rmem_max.
func setReadBuffer(c *net.UDPConn, n int) {
	if rc, err := c.SyscallConn(); err == nil {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
		}); err == nil && serr == nil {
			return
		}
	}
	_ = c.SetReadBuffer(n) // capped by rmem_max; best effort
}

// MaxSlowQueries bounds the UDP queries on the slow path at once (waiting
// on an upstream, mostly). Beyond it a query is dropped, as a full socket
// buffer would drop it, and the client retries: a flood of unique names
// cannot grow the goroutines and upstream sockets without bound.
const MaxSlowQueries = 2048

// goSlow answers the UDP query b on the slow path in a goroutine of its own
// (it may wait on an upstream) and hands the reply to send; b is copied.
func (s *Server) goSlow(ctx context.Context, b []byte, from netip.AddrPort, start time.Time, send func([]byte)) {
	select {
	case s.slowSlots <- struct{}{}:
	default:
		s.m.dropped()
		return
	}
	q := append([]byte(nil), b...)
	go func() {
		defer func() { <-s.slowSlots }()
		if r := s.slow(ctx, q, from, false, start); r != nil {
			send(r)
		}
	}()
}

// addrPort is a TCP peer's address.
func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

func (s *Server) serveTCP(ctx context.Context, l net.Listener, wg *sync.WaitGroup) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		wg.Go(func() { s.serveConn(ctx, conn) })
	}
}

// serveConn answers the length-prefixed queries of one TCP connection in
// order, until the client closes it or idles.
func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	from := addrPort(conn.RemoteAddr())
	var lenBuf [2]byte
	out := make([]byte, 0, 4096)
	key := make([]byte, 0, 300)
	for {
		conn.SetReadDeadline(time.Now().Add(tcpIdle)) //nolint:errcheck
		if _, err := io.ReadFull(conn, lenBuf[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(conn, q); err != nil {
			return
		}
		start := time.Now()
		var reply []byte
		if reply, key = s.fast(out, key, q, from, true, start); reply == nil {
			if reply = s.slow(ctx, q, from, true, start); reply == nil {
				return // not a query we answer: drop the connection
			}
		}
		msg := make([]byte, 2+len(reply))
		binary.BigEndian.PutUint16(msg, uint16(len(reply)))
		copy(msg[2:], reply)
		conn.SetWriteDeadline(time.Now().Add(tcpIdle)) //nolint:errcheck
		if _, err := conn.Write(msg); err != nil {
			return
		}
	}
}

// fast answers b from the packed-reply cache into out, or returns nil.
// key is scratch space, returned for reuse.
func (s *Server) fast(out, key, b []byte, from netip.AddrPort, tcp bool, start time.Time) ([]byte, []byte) {
	client := from.Addr()
	if s.cache == nil {
		return nil, key
	}
	q, ok := parseQuery(b)
	if !ok {
		return nil, key
	}
	key = cacheKey(key[:0], b, q, s.clientNamespace(client))
	e, ok := s.cache.get(key, s.ix.Generation(), start)
	ok = ok && (tcp || len(e.wire) <= q.maxSize()) // too big for this client: the slow path truncates
	s.m.hit(ok)
	if !ok {
		return nil, key
	}
	if e.autopath {
		s.m.autopathed()
	}
	reply := fromCache(out, e.wire, b)
	qtype := binary.BigEndian.Uint16(b[q.qEnd-4:])
	rcode := int(reply[3] & 0x0F)
	s.m.observe(tcp, client.Is6() && !client.Is4In6(), qtype, rcode, time.Since(start).Seconds())
	if s.cfg.QueryLog != nil {
		name, _, _ := dns.UnpackDomainName(b, 12)
		s.logQuery(from, binary.BigEndian.Uint16(b), name, qtype, tcp, len(b), q, reply, start)
	}
	return reply, key
}

// clientNamespace is the asker's namespace when answers depend on it
// (autopath), else "".
func (s *Server) clientNamespace(client netip.Addr) string {
	if !s.cfg.Autopath {
		return ""
	}
	ns, _ := s.ix.NamespaceOf(client)
	return ns
}

// slow answers the query in b, or returns nil when it gets no answer at all
// (not a query, or too broken to reply to).
func (s *Server) slow(ctx context.Context, b []byte, from netip.AddrPort, tcp bool, start time.Time) []byte {
	ctx, cancel := context.WithTimeout(ctx, QueryTimeout)
	defer cancel()
	req := new(dns.Msg)
	if err := req.Unpack(b); err != nil {
		return formErr(b)
	}
	if req.Response {
		return nil // never answer answers
	}
	gen := s.ix.Generation()
	resp, cache, autopathed := s.answer(ctx, req, from.Addr())
	opt := req.IsEdns0()
	if opt != nil {
		resp.SetEdns0(AdvertisedUDPSize, opt.Do())
	}
	resp.Compress = true
	full, err := resp.Pack()
	if err != nil {
		resp = servFail(req, opt)
		cache = uncacheable
		if full, err = resp.Pack(); err != nil {
			return nil
		}
	}
	if q, ok := parseQuery(b); ok && cache != uncacheable && s.cache != nil {
		e := cached{gen: gen, autopath: autopathed}
		ttl := minTTL(resp)
		if cache == forwarded {
			e.expires = time.Now().Add(min(ForwardedReplyTTL, time.Duration(ttl)*time.Second))
		}
		if cache == fromIndex || ttl > 0 { // TTL 0 or no record: not to be kept
			s.cache.put(cacheKey(nil, b, q, s.clientNamespace(from.Addr())), e, full)
		}
	}
	reply := full
	if !tcp {
		size := dns.MinMsgSize
		if opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
		if len(full) > size {
			resp.Truncate(size)
			if reply, err = resp.Pack(); err != nil {
				return nil
			}
		}
	}
	qtype := uint16(0)
	name := ""
	if len(req.Question) > 0 {
		qtype, name = req.Question[0].Qtype, req.Question[0].Name
	}
	s.m.observe(tcp, from.Addr().Is6() && !from.Addr().Is4In6(), qtype, resp.Rcode, time.Since(start).Seconds())
	if s.cfg.QueryLog != nil {
		var qi query
		if opt != nil {
			qi = query{edns: true, do: opt.Do(), udpSize: opt.UDPSize()}
		}
		s.logQuery(from, req.Id, name, qtype, tcp, len(b), qi, reply, start)
	}
	return reply
}

// How long a reply may be kept in the reply cache.
type cacheability int

const (
	uncacheable cacheability = iota
	// fromIndex: until the index's generation moves.
	fromIndex
	// forwarded: for ForwardedReplyTTL at most (the forwarder's own
	// cache counts TTLs down; a packed copy cannot, so it lives one
	// second, within the TTL's own granularity).
	forwarded
)

// ForwardedReplyTTL is how long a packed forwarded reply is served as it is.
const ForwardedReplyTTL = time.Second

// answer builds the reply to req (without OPT and before truncation) and
// says how it may be cached and whether autopath made it.
func (s *Server) answer(ctx context.Context, req *dns.Msg, client netip.Addr) (resp *dns.Msg, cache cacheability, autopathed bool) {
	resp = new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	switch {
	case req.Opcode != dns.OpcodeQuery:
		resp.SetRcode(req, dns.RcodeNotImplemented)
		resp.Question = nil
		return resp, uncacheable, false
	case len(req.Question) != 1:
		resp.SetRcode(req, dns.RcodeFormatError)
		return resp, uncacheable, false
	}
	if opt := req.IsEdns0(); opt != nil && opt.Version() != 0 {
		resp.Rcode = dns.RcodeBadVers
		return resp, uncacheable, false
	}
	q := req.Question[0]
	if ap, ok, local := s.autopath(ctx, req, q, client); ok {
		if local {
			return ap, fromIndex, true
		}
		return ap, uncacheable, true
	}
	r := s.ix.Answer(q, client)
	if r.NotOurs {
		fr := s.forward(ctx, req, resp)
		if fr.Rcode == dns.RcodeSuccess || fr.Rcode == dns.RcodeNameError {
			return fr, forwarded, false
		}
		return fr, uncacheable, false
	}
	r.Fill(resp)
	if r.Target == "" {
		return resp, fromIndex, false
	}
	// An ExternalName Service: its CNAME's target is outside the zone.
	s.chase(ctx, req, resp, r.Target, q.Qtype)
	return resp, uncacheable, false
}

// chase appends to resp the upstream's answer for target (an ExternalName
// Service's out-of-zone CNAME target). When upstream fails, the CNAME alone
// is the answer and the client's resolver follows it itself.
func (s *Server) chase(ctx context.Context, req, resp *dns.Msg, target string, qtype uint16) {
	if s.cfg.Forwarder == nil {
		return
	}
	tq := new(dns.Msg)
	tq.SetQuestion(target, qtype)
	tq.RecursionDesired = true
	if opt := req.IsEdns0(); opt != nil && opt.Do() {
		tq.SetEdns0(AdvertisedUDPSize, true)
	}
	tr, err := s.cfg.Forwarder.Exchange(ctx, tq)
	if err != nil {
		return
	}
	resp.Answer = append(resp.Answer, tr.Answer...)
	if tr.Rcode == dns.RcodeNameError {
		resp.Rcode = dns.RcodeNameError // RFC 6604: the rcode of the chain's end
		resp.Ns = tr.Ns
	}
}

// forward answers a name outside the cluster zone from upstream.
func (s *Server) forward(ctx context.Context, req, resp *dns.Msg) *dns.Msg {
	if s.cfg.Forwarder == nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	fq := req.Copy()
	fq.Extra = nil // our OPT (if any) is added to the reply; the forwarder adds its own upstream
	if opt := req.IsEdns0(); opt != nil && opt.Do() {
		fq.SetEdns0(AdvertisedUDPSize, true)
	}
	fr, err := s.cfg.Forwarder.Exchange(ctx, fq)
	if err != nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	fr.Id = req.Id
	fr.Response = true
	fr.RecursionDesired = req.RecursionDesired
	fr.CheckingDisabled = req.CheckingDisabled
	fr.RecursionAvailable = true
	fr.Question = req.Question
	fr.Truncated = false // a truncated upstream UDP answer was retried over TCP
	return fr
}

func servFail(req *dns.Msg, opt *dns.OPT) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	m.RecursionAvailable = true
	if opt != nil {
		m.SetEdns0(AdvertisedUDPSize, opt.Do())
	}
	return m
}

// formErr is the FORMERR reply to a query miekg/dns cannot unpack: its ID
// and opcode, nothing else. A packet too short for a header, or one with
// QR set, gets nothing.
func formErr(b []byte) []byte {
	if len(b) < 12 || b[2]&0x80 != 0 {
		return nil
	}
	r := make([]byte, 12)
	copy(r, b[:2])
	r[2] = 0x80 | b[2]&0x79 // QR, opcode, RD
	r[3] = dns.RcodeFormatError
	return r
}

// minTTL is the smallest TTL of m's records (OPT aside); 0 when there are
// none (a negative answer without SOA must not be cached: RFC 2308).
func minTTL(m *dns.Msg) uint32 {
	t, any := uint32(1<<31), false
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				t, any = min(t, h.Ttl), true
			}
		}
	}
	if !any {
		return 0
	}
	return t
}

// logQuery writes one line in the format of CoreDNS's log plugin:
// [INFO] client:port - id "type class name proto size do bufsize" rcode flags rsize duration.
func (s *Server) logQuery(from netip.AddrPort, id uint16, name string, qtype uint16, tcp bool, size int, q query, reply []byte, start time.Time) {
	proto := "udp"
	if tcp {
		proto = "tcp"
	}
	buf := 512
	if q.edns {
		buf = int(q.udpSize)
	}
	rcode, flags := 0, ""
	if len(reply) >= 4 {
		rcode = int(reply[3] & 0x0F)
		for _, f := range []struct {
			set  bool
			name string
		}{{reply[2]&0x80 != 0, "qr"}, {reply[2]&0x04 != 0, "aa"}, {reply[2]&0x02 != 0, "tc"}, {reply[2]&flagRD != 0, "rd"},
			{reply[3]&0x80 != 0, "ra"}, {reply[3]&0x20 != 0, "ad"}, {reply[3]&flagCD != 0, "cd"}} {
			if f.set {
				flags += "," + f.name
			}
		}
	}
	line := fmt.Sprintf("[INFO] %s - %d \"%s IN %s %s %d %t %d\" %s %s %d %.9fs\n", from, id, dns.Type(qtype), name, proto, size, q.do, buf,
		dns.RcodeToString[rcode], strings.TrimPrefix(flags, ","), len(reply), time.Since(start).Seconds())
	s.logMu.Lock()
	defer s.logMu.Unlock()
	io.WriteString(s.cfg.QueryLog, line) //nolint:errcheck // best effort
}
