package proxy

// The clear-text front: a connection loop that answers the common request
// itself and hands everything else to net/http.
//
// Why. On one core, net/http's server side costs a proxied request about
// as much CPU as nginx spends on the whole request: per request it starts
// a goroutine for a background read (one more read(2) that finds nothing),
// sets deadlines two or three times and goes through ResponseWriter's
// chunk writer; httputil.ReverseProxy then clones the request and builds
// a client trace. For the request most traffic is (GET, HEAD or OPTIONS,
// HTTP/1.1, no body, no upgrade) to a route that only forwards (no
// redirect, mirror, retry, timeout; HTTP/1.1 backends) this loop parses
// the request with http.ReadRequest, routes it through the same table,
// sends it with the synchronous upstream client (upstream.go) and writes
// the answer with http.Response.Write: the standard library's parser and
// serializers, none of its per-request machinery. Measured with wrk
// through the proxy on one core to a loopback nginx: 30-41 µs of proxy
// CPU per request with the loop, 43-49 µs without (nginx as the same
// proxy: 20-28 µs on the same, busy, machine).
//
// Only while a request waits more than watchAfter for its backend does
// the loop watch the client's socket (peeking, so a pipelined request
// stays put) and cancel the backend's request when the client is gone.
//
// Anything else is not an error but a hand-over: the request's header
// block is parsed from a copy while the bytes stay in the connection's
// reader, so the connection can be given, unread, to the port's
// http.Server (through handoverListener), which serves it from then on:
// bodies, upgrades (WebSocket), h2c, HTTP/1.0, malformed requests (net/http
// writes the 400s), redirects, gRPC, and every route feature. A connection
// is handed over at most once.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// fastPort is the front of one clear-text port.
type fastPort struct {
	s       *Server
	bind    int32
	handoff *handoverListener

	closing atomic.Bool
	mu      sync.Mutex // protects conns
	conns   map[*fastConn]struct{}
	active  sync.WaitGroup
}

const (
	// fastBufSize bounds the header block the loop serves (a larger one is
	// handed over) and is what an open connection holds, as with net/http.
	fastBufSize     = 4 << 10
	fastIdleTimeout = 75 * time.Second // as the http.Server's IdleTimeout
)

func newFastPort(s *Server, bind int32, addr net.Addr) *fastPort {
	return &fastPort{s: s, bind: bind, handoff: newHandoverListener(addr), conns: map[*fastConn]struct{}{}}
}

// serve accepts on ln until it is closed.
func (fp *fastPort) serve(ln net.Listener) {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or the like: wait, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			time.Sleep(delay)
			continue
		}
		delay = 0
		c := &fastConn{fp: fp, nc: nc, remote: nc.RemoteAddr().String()}
		fp.mu.Lock()
		if fp.closing.Load() {
			fp.mu.Unlock()
			nc.Close()
			return
		}
		fp.conns[c] = struct{}{}
		fp.active.Add(1)
		fp.mu.Unlock()
		go c.serve()
	}
}

// drain makes every connection close once its request in flight (if any)
// is answered, and waits for that, until deadline.
func (fp *fastPort) drain(deadline time.Time) {
	fp.mu.Lock()
	fp.closing.Store(true)
	for c := range fp.conns {
		c.nc.SetReadDeadline(time.Now()) // wakes the idle ones
	}
	fp.mu.Unlock()
	done := make(chan struct{})
	go func() { fp.active.Wait(); close(done) }()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-done:
	case <-timeout:
		fp.mu.Lock()
		for c := range fp.conns {
			c.nc.Close()
		}
		fp.mu.Unlock()
	}
}

func (fp *fastPort) forget(c *fastConn) {
	fp.mu.Lock()
	delete(fp.conns, c)
	fp.mu.Unlock()
	fp.active.Done()
}

// fastConn is one client connection served by the loop.
type fastConn struct {
	fp     *fastPort
	nc     net.Conn
	remote string
	br     *bufio.Reader
	bw     *bufio.Writer
	hdr    bytes.Reader // the header block being parsed
	body   countingBody
	fw     flushWriter
	xff    [1]string // X-Forwarded-For of the request in flight
	xfh    [1]string // X-Forwarded-Host

	// ctx is canceled when the client is found gone while its request is
	// with a backend (watch), which ends the backend's request.
	ctx       context.Context
	cancel    context.CancelFunc
	watchT    *time.Timer
	watchDone chan struct{}
}

// watchAfter is how long a request waits for its backend before the loop
// starts watching for the client going away: net/http watches every
// request, for a read(2) and a goroutine each; most are answered sooner.
const watchAfter = 500 * time.Millisecond

// watchClient arms the watch for the request about to go to a backend.
func (c *fastConn) watchClient() {
	if c.watchT == nil {
		c.ctx, c.cancel = context.WithCancel(context.Background())
		c.watchDone = make(chan struct{}, 1)
		c.watchT = time.AfterFunc(watchAfter, c.watch)
		return
	}
	c.watchT.Reset(watchAfter)
}

// stopWatching ends the watch, waiting for it if it started.
func (c *fastConn) stopWatching() {
	if c.watchT.Stop() {
		return
	}
	c.nc.SetReadDeadline(aLongTimeAgo) // ends a wait for readability
	<-c.watchDone
}

// watch waits until the client's socket is readable and peeks: end of
// stream means the client is gone (cancel its request); data is a
// pipelined request, left where it is.
func (c *fastConn) watch() {
	defer func() { c.watchDone <- struct{}{} }()
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	gone := false
	var b [1]byte
	rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			return false // wait until readable
		}
		gone = n == 0 || err != nil
		return true
	})
	if gone {
		c.cancel()
	}
}

var (
	fastBufs = sync.Pool{New: func() any {
		return &fastBuffers{br: bufio.NewReaderSize(nil, fastBufSize), bw: bufio.NewWriterSize(nil, fastBufSize)}
	}}
	// parseReaders read header blocks for http.ReadRequest, one a parse.
	parseReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, fastBufSize) }}
)

type fastBuffers struct {
	br *bufio.Reader
	bw *bufio.Writer
}

func (c *fastConn) serve() {
	bufs := fastBufs.Get().(*fastBuffers)
	bufs.br.Reset(c.nc)
	bufs.bw.Reset(c.nc)
	c.br, c.bw = bufs.br, bufs.bw
	c.fw.w = c.bw
	handedOver := false
	defer func() {
		if c.cancel != nil {
			c.cancel()
		}
		if !handedOver {
			c.nc.Close()
		}
		c.fp.forget(c)
		bufs.br.Reset(nil)
		bufs.bw.Reset(nil)
		fastBufs.Put(bufs)
	}()
	for {
		c.nc.SetReadDeadline(time.Now().Add(fastIdleTimeout))
		if c.fp.closing.Load() {
			return
		}
		n, ok := c.headerLen()
		if n < 0 {
			return // closed, timed out, or garbage before any request
		}
		var req *http.Request
		if ok {
			req = c.parse(n)
		}
		if req == nil {
			handedOver = c.handOver()
			return
		}
		switch c.fp.s.serveFast(c, req) {
		case fastHandOver:
			handedOver = c.handOver()
			return
		case fastClose:
			return
		}
		c.br.Discard(n)
		if req.Close || c.ctx != nil && c.ctx.Err() != nil {
			return
		}
	}
}

// headerLen waits for a whole header block in the reader's buffer and
// returns its length; ok is false when it does not fit (or uses bare
// LFs), n < 0 when the connection ended first.
func (c *fastConn) headerLen() (n int, ok bool) {
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		i, j := bytes.Index(buf, crlfcrlf), bytes.Index(buf, lflf)
		switch {
		case j >= 0 && (i < 0 || j < i):
			return 0, false // bare LF line ends: net/http's to judge
		case i >= 0:
			return i + 4, true
		}
		if c.br.Buffered() == c.br.Size() {
			return 0, false
		}
		if _, err := c.br.Peek(c.br.Buffered() + 1); err != nil {
			if c.br.Buffered() > 0 && !errors.Is(err, io.EOF) {
				return 0, false // let net/http answer what it can
			}
			return -1, false
		}
	}
}

var crlfcrlf, lflf = []byte("\r\n\r\n"), []byte("\n\n")

// parse reads the request of the header block's first n bytes, without
// consuming them; nil when it is not one this loop serves.
func (c *fastConn) parse(n int) *http.Request {
	buf, _ := c.br.Peek(n)
	c.hdr.Reset(buf)
	pr := parseReaders.Get().(*bufio.Reader)
	pr.Reset(&c.hdr)
	req, err := http.ReadRequest(pr)
	pr.Reset(nil)
	parseReaders.Put(pr)
	if err != nil || req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.Body != http.NoBody {
		return nil
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return nil
	}
	// What the server checks (and answers 400 for) before its handler.
	if req.Host == "" || !httpguts.ValidHostHeader(req.Host) || len(req.Header["Upgrade"]) > 0 || len(req.Header["Expect"]) > 0 {
		return nil
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil
			}
		}
	}
	// ReverseProxy drops query parameters it cannot parse (a ';' is
	// one): leave those requests to it.
	if isGRPC(req) || strings.IndexByte(req.URL.RawQuery, ';') >= 0 {
		return nil
	}
	req.RemoteAddr = c.remote
	return req
}

// handOver gives the connection, with what it has buffered, to the
// port's http.Server; false when that server is gone (then it is closed).
func (c *fastConn) handOver() bool {
	var pending []byte
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		pending = bytes.Clone(b)
	}
	c.nc.SetReadDeadline(time.Time{})
	return c.fp.handoff.give(&replayConn{Conn: c.nc, pending: pending})
}

// fastOutcome says what the loop does after serveFast.
type fastOutcome int

const (
	fastServed   fastOutcome = iota // answered; the connection lives on
	fastHandOver                    // not answered; hand the connection over
	fastClose                       // answered or failed; close the connection
)

// serveFast answers req if its route only forwards to HTTP/1.1 backends.
func (s *Server) serveFast(c *fastConn, req *http.Request) fastOutcome {
	g := s.cur.Load()
	if g == nil {
		return fastHandOver
	}
	p := g.t.Ports[c.fp.bind]
	if p == nil || p.Protocol != table.HTTP {
		return fastHandOver
	}
	host := p.Lookup(req.Host)
	if host == nil {
		return fastHandOver
	}
	rule := host.Match(req)
	if rule == nil || !forwardsOnly(rule.Action) {
		return fastHandOver
	}

	a := rule.Action
	st := s.states.Get().(*reqState)
	st.start = time.Now()
	st.a, st.rs = a, g.routeStats(s.m, a)
	st.bi = a.Balancer.Pick()
	st.b = a.Backends[st.bi]
	defer st.finish(g, req)
	switch {
	case st.b.Invalid:
		return c.writeStatus(st, req, http.StatusInternalServerError)
	case len(st.b.Endpoints) == 0:
		return c.writeStatus(st, req, http.StatusServiceUnavailable)
	}
	st.ep = st.b.Endpoint()

	origHost, origPath := req.Host, req.URL.Path
	out := c.forward(st, req)
	req.Host, req.URL.Path = origHost, origPath // the access log has the client's
	return out
}

// forward sends req to st's endpoint and passes the answer on. The
// outbound request is req itself (it is ours): it gets what Rewrite does
// on the net/http path.
func (c *fastConn) forward(st *reqState, req *http.Request) fastOutcome {
	a := st.a
	wantClose := req.Close
	req.Close = false
	trailers := httpguts.HeaderValuesContainsToken(req.Header["Te"], "trailers")
	removeHopHeaders(req.Header)
	if trailers {
		req.Header["Te"] = trailersValue // the client reads trailers: say so, as ReverseProxy does
	}
	c.setXForwarded(req)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = emptyValue // Request.Write would add Go's
	}
	inPath := req.URL.Path
	req.URL.Scheme, req.URL.Host = "http", st.ep
	if rw := a.Rewrite; rw != nil {
		if rw.Hostname != "" {
			req.Host = rw.Hostname
		}
		if rw.Path != nil {
			req.URL.Path, req.URL.RawPath = modifyPath(inPath, rw.Path), ""
		}
	}
	applyHeaders(req.Header, &a.RequestHeaders)
	applyHeaders(req.Header, &st.b.RequestHeaders)

	c.watchClient()
	defer c.stopWatching()
	resp, err := c.fp.s.fast.roundTrip(c.ctx, req)
	for redials := 0; c.ctx.Err() == nil && st.redial(err, c.ctx, req, redials); redials++ {
		req.URL.Host = st.ep // bodiless: safe to send again
		resp, err = c.fp.s.fast.roundTrip(c.ctx, req)
	}
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body.Close() // a switch nobody asked for
		err = errors.New("backend switched protocols unasked")
	}
	if err != nil {
		st.s.m.upstreamErrors.WithLabelValues(st.b.Name, errorReason(err)).Inc()
		req.Close = wantClose
		return c.writeStatus(st, req, http.StatusBadGateway)
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	applyHeaders(resp.Header, &a.ResponseHeaders)
	applyHeaders(resp.Header, &st.b.ResponseHeaders)
	// A body that ends when the backend closes can only end the same way
	// for the client.
	closeAfter := wantClose || resp.ContentLength < 0 && len(resp.TransferEncoding) == 0
	resp.Close = closeAfter
	resp.ProtoMajor, resp.ProtoMinor = 1, 1
	c.body = countingBody{r: resp.Body}
	resp.Body = &c.body
	// A body of unknown length is passed on as it comes (streams, events);
	// one of known length in as few writes as the buffer allows.
	var w io.Writer = c.bw
	if resp.ContentLength < 0 {
		w = &c.fw
	}
	st.rw.status = resp.StatusCode
	err = resp.Write(w)
	if err == nil {
		err = c.bw.Flush()
	}
	st.rw.bytes = c.body.n
	if err != nil || closeAfter {
		return fastClose
	}
	return fastServed
}

// forwardsOnly reports whether a's answers come from its backends with
// nothing the fast loop leaves to the net/http path.
func forwardsOnly(a *table.Action) bool {
	if a.Redirect != nil || a.Direct != 0 || a.Balancer == nil || len(a.Backends) == 0 || len(a.Mirrors) > 0 ||
		a.Retry != nil || a.Timeout > 0 || a.BackendTimeout > 0 || a.GRPC {
		return false
	}
	for _, b := range a.Backends {
		if b.Protocol != table.HTTP1 && b.Protocol != table.WS {
			return false
		}
	}
	return true
}

// writeStatus answers with the proxy's own status and its text.
func (c *fastConn) writeStatus(st *reqState, req *http.Request, code int) fastOutcome {
	text := http.StatusText(code)
	st.rw.status = code
	resp := http.Response{StatusCode: code, ProtoMajor: 1, ProtoMinor: 1, Request: req, Close: req.Close,
		Header:        http.Header{"Content-Type": textPlainValue, "X-Content-Type-Options": nosniffValue},
		ContentLength: int64(len(text) + 1), Body: io.NopCloser(strings.NewReader(text + "\n"))}
	if resp.Write(c.bw) != nil || c.bw.Flush() != nil || req.Close {
		return fastClose
	}
	st.rw.bytes = resp.ContentLength
	return fastServed
}

var emptyValue = []string{""}

// hopHeaders are the connection's, not the message's (RFC 9110 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopHeaders drops the hop-by-hop headers and those Connection
// names, as ReverseProxy does.
func removeHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = strings.TrimSpace(sf); sf != "" {
				delete(h, http.CanonicalHeaderKey(sf))
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
}

// setXForwarded sets X-Forwarded-For (appending to the client's),
// X-Forwarded-Host and X-Forwarded-Proto, and drops Forwarded, as
// ProxyRequest.SetXForwarded after Rewrite's stripping. The values live
// in c: req is gone before the next request.
func (c *fastConn) setXForwarded(req *http.Request) {
	ip, _, err := net.SplitHostPort(c.remote)
	if err != nil {
		ip = c.remote
	}
	if prior := req.Header["X-Forwarded-For"]; len(prior) > 0 {
		ip = strings.Join(prior, ", ") + ", " + ip
	}
	delete(req.Header, "Forwarded")
	c.xff[0], c.xfh[0] = ip, req.Host
	req.Header["X-Forwarded-For"] = c.xff[:]
	req.Header["X-Forwarded-Host"] = c.xfh[:]
	req.Header["X-Forwarded-Proto"] = httpValue
}

var (
	httpValue     = []string{"http"}
	trailersValue = []string{"trailers"}
)

// countingBody counts the body bytes passed on, for metrics and logs.
type countingBody struct {
	r io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countingBody) Close() error { return b.r.Close() }

// flushWriter flushes after every write: a streamed answer reaches the
// client as the backend sends it.
type flushWriter struct{ w *bufio.Writer }

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.w.Flush()
	}
	return n, err
}

// handoverListener is the net.Listener of a clear-text port's http.Server:
// it accepts only the connections the fast loop gives it.
type handoverListener struct {
	addr   net.Addr
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoverListener(addr net.Addr) *handoverListener {
	return &handoverListener{addr: addr, ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *handoverListener) give(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		c.Close()
		return false
	}
}

func (l *handoverListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handoverListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *handoverListener) Addr() net.Addr { return l.addr }

// replayConn reads what the fast loop had buffered before the connection.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
