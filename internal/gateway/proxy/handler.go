package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// portHandler answers the requests of one bound port.
type portHandler struct {
	s    *Server
	bind int32
}

// reqState is everything one request needs, pooled: the ReverseProxy's
// callbacks are bound to it once, when the pool makes it.
type reqState struct {
	s  *Server
	rp httputil.ReverseProxy
	rw respWriter

	start   time.Time
	a       *table.Action
	rs      *routeStats
	bi      int // index of b in a.Backends; len(a.Backends) for none
	b       *table.Backend
	ep      string
	tr      http.RoundTripper // s.fast or s.h2c
	inCtx   context.Context   // the inbound request's context, with its Timeout
	upgrade bool

	logBuf []byte
}

func (s *Server) newState() *reqState {
	st := &reqState{s: s}
	st.rp = httputil.ReverseProxy{
		Rewrite:        st.rewrite,
		Transport:      st, // RoundTrip: endpoint, per-try timeout, retries
		ErrorHandler:   st.proxyError,
		ModifyResponse: st.modifyResp,
		BufferPool:     &s.bufs,
		ErrorLog:       s.errLog,
	}
	return st
}

func (st *reqState) reset() {
	st.rw = respWriter{}
	st.a, st.rs, st.b, st.ep, st.tr, st.inCtx = nil, nil, nil, "", nil, nil
	st.upgrade = false
}

func (h *portHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	st := s.states.Get().(*reqState)
	st.start = time.Now()
	st.rw.ResponseWriter = w
	g := s.cur.Load()
	defer st.finish(g, r)

	var p *table.Port
	if g != nil {
		p = g.t.Ports[h.bind]
	}
	if p == nil {
		// The port left the table while this connection was open.
		w.Header()["Connection"] = closeValue
		st.answer(r, http.StatusNotFound)
		return
	}
	if r.TLS != nil && r.TLS.ServerName != "" && len(p.Certs) > 1 &&
		p.Listener(r.TLS.ServerName) != p.Listener(hostOnly(r.Host)) {
		// The connection was made for another listener (an HTTP/2
		// client reusing it for a name the certificate also covers).
		st.answer(r, http.StatusMisdirectedRequest)
		return
	}
	if r.Method == http.MethodConnect {
		// No route describes a tunnel: the gateway is not a forward proxy.
		st.answer(r, http.StatusMethodNotAllowed)
		return
	}
	var rule *table.Rule
	if host := p.Lookup(r.Host); host != nil {
		rule = host.Match(r)
	}
	if rule == nil {
		st.answer(r, http.StatusNotFound)
		return
	}
	a := rule.Action
	st.a = a
	st.rs = g.routeStats(s.m, a)
	st.bi = len(a.Backends)

	switch {
	case a.Redirect != nil:
		applyHeaders(w.Header(), &a.ResponseHeaders)
		redirect(&st.rw, r, p, a.Redirect)
		return
	case a.Direct != 0:
		applyHeaders(w.Header(), &a.ResponseHeaders)
		st.answer(r, a.Direct)
		return
	case a.Balancer == nil || len(a.Backends) == 0:
		st.answer(r, http.StatusInternalServerError)
		return
	}
	st.bi = a.Balancer.Pick()
	b := a.Backends[st.bi]
	st.b = b
	if b.Invalid {
		st.answer(r, http.StatusInternalServerError)
		return
	}
	if st.ep = b.Endpoint(); st.ep == "" {
		st.answer(r, http.StatusServiceUnavailable)
		return
	}
	st.upgrade = len(r.Header["Upgrade"]) > 0
	if len(a.Mirrors) > 0 && !st.upgrade {
		r = s.mirror(r, a)
	}

	st.tr = s.fast
	if (b.Protocol == table.H2C || a.GRPC) && !st.upgrade {
		st.tr = s.h2c
	}
	st.rp.FlushInterval = 0 // bodies of unknown length are flushed as they come anyway
	if a.GRPC {
		st.rp.FlushInterval = -1
	}
	// A WebSocket outlives any request timeout: Timeout bounds requests.
	if a.Timeout > 0 && !st.upgrade {
		ctx, cancel := context.WithTimeout(r.Context(), a.Timeout)
		defer cancel()
		r = r.WithContext(ctx)
	}
	st.inCtx = r.Context()
	st.rp.ServeHTTP(&st.rw, r)
}

// finish records the request's metrics and access log line and returns st
// to the pool.
func (st *reqState) finish(g *generation, r *http.Request) {
	s := st.s
	code := st.rw.status
	if code == 0 {
		code = http.StatusOK // the server answers 200 for a handler that wrote nothing
	}
	if st.rs == nil && g != nil {
		st.rs = g.routeStats(s.m, nil) // answered before a rule matched
	}
	if rs := st.rs; rs != nil {
		bi := len(rs.byBackend) - 1
		if st.b != nil && st.bi < bi {
			bi = st.bi
		}
		rs.byBackend[bi].inc(s.m, rs.route, code)
		rs.dur.Observe(time.Since(st.start).Seconds())
	}
	if s.alog != nil {
		st.accessLog(r, code)
	}
	st.reset()
	s.states.Put(st)
}

var (
	closeValue     = []string{"close"}
	textPlainValue = []string{"text/plain; charset=utf-8"}
	nosniffValue   = []string{"nosniff"}
)

// answer writes an answer of the proxy's own: a status with its text, or
// for a gRPC request a gRPC status in trailers-only form (gRPC clients
// read HTTP error bodies as protocol errors).
func (st *reqState) answer(r *http.Request, code int) {
	w := &st.rw
	if (st.a != nil && st.a.GRPC) || isGRPC(r) {
		writeGRPCStatus(w, code)
		w.status = code // metrics and logs count what it stands for
		return
	}
	h := w.Header()
	h["Content-Type"] = textPlainValue
	h["X-Content-Type-Options"] = nosniffValue
	w.WriteHeader(code)
	io.WriteString(w, http.StatusText(code))
	io.WriteString(w, "\n")
}

// rewrite makes the outbound request: to the picked endpoint, with the
// client's Host (or the URLRewrite's), X-Forwarded-*, the rule's and the
// backend's request header filters.
func (st *reqState) rewrite(pr *httputil.ProxyRequest) {
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = st.ep
	pr.SetXForwarded()
	a := st.a
	if rw := a.Rewrite; rw != nil {
		if rw.Hostname != "" {
			out.Host = rw.Hostname
		}
		if rw.Path != nil {
			out.URL.Path = modifyPath(pr.In.URL.Path, rw.Path)
			out.URL.RawPath = ""
		}
	}
	applyHeaders(out.Header, &a.RequestHeaders)
	applyHeaders(out.Header, &st.b.RequestHeaders)
}

// modifyResp applies the response header filters. (A streamed answer,
// of no length, has its headers flushed at once by ReverseProxy.)
func (st *reqState) modifyResp(resp *http.Response) error {
	applyHeaders(resp.Header, &st.a.ResponseHeaders)
	applyHeaders(resp.Header, &st.b.ResponseHeaders)
	return nil
}

// RoundTrip sends one outbound request: each try bounded by
// BackendTimeout, tried again on the Retry's codes (and on errors that got
// no answer) while tries are left and the request has no body to replay;
// a retry goes to the backend's next endpoint.
func (st *reqState) RoundTrip(req *http.Request) (*http.Response, error) {
	a := st.a
	tries := 1
	if a.Retry != nil && req.Body == nil && !st.upgrade {
		tries += a.Retry.Attempts
	}
	redials := 0
	for try := 1; ; try++ {
		rq := req
		var cancel context.CancelFunc
		if a.BackendTimeout > 0 && !st.upgrade {
			var ctx context.Context
			ctx, cancel = context.WithTimeout(req.Context(), a.BackendTimeout)
			rq = req.WithContext(ctx)
		}
		resp, err := st.tr.RoundTrip(rq)
		if req.Body == nil && req.Context().Err() == nil && st.redial(err, rq.Context(), req, redials) {
			redials++
			if cancel != nil {
				cancel()
			}
			req.URL.Host = st.ep
			try--
			continue
		}
		if try < tries && req.Context().Err() == nil && retryable(a.Retry, resp, err) {
			if err != nil {
				st.s.m.upstreamErrors.WithLabelValues(st.b.Name, errorReason(err)).Inc()
			} else {
				io.CopyN(io.Discard, resp.Body, 4<<10) // lets a small answer's connection be reused
				resp.Body.Close()
			}
			if cancel != nil {
				cancel()
			}
			if !sleepCtx(req.Context(), a.Retry.Backoff) {
				return nil, req.Context().Err()
			}
			if ep := st.b.Endpoint(); ep != "" {
				st.ep = ep
				req.URL.Host = ep
			}
			continue
		}
		if cancel != nil {
			if err != nil {
				cancel()
			} else {
				resp.Body = &cancelBody{resp.Body, cancel}
			}
		}
		return resp, err
	}
}

// redial reports whether a try of req that failed with err, after
// redials such tries, goes to another endpoint of the backend, and moves
// st there: when the connection was never made (it carried nothing), or
// when an idempotent request got no answer (a connection reset or closed
// before the response). nginx's default proxy_next_upstream (error) does
// the same. A pod that has just stopped refuses or resets connections
// until every gateway has its EndpointSlice change, and each of those
// moments cost a 502 (TestLab/Gateway/EndpointRemoval). The caller checks
// that req can be sent again (no body).
//
// A connection that timed out while the try's own context (tryCtx) had
// time left is a connect failure too (the dialer's timeout: a pod whose
// address answers nothing any more): it goes elsewhere as well.
func (st *reqState) redial(err error, tryCtx context.Context, req *http.Request, redials int) bool {
	if err == nil || redials >= len(st.b.Endpoints)-1 {
		return false
	}
	reason := errorReason(err)
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial" && tryCtx.Err() == nil:
		reason = "connect"
	case reason == "reset" && (req.Method == http.MethodGet || req.Method == http.MethodHead || req.Method == http.MethodOptions):
	default:
		return false
	}
	st.s.m.upstreamErrors.WithLabelValues(st.b.Name, reason).Inc()
	ep := st.b.EndpointOtherThan(st.ep)
	if ep == "" {
		return false
	}
	st.ep = ep
	return true
}

func retryable(rt *table.Retry, resp *http.Response, err error) bool {
	if err != nil {
		return true
	}
	for _, c := range rt.Codes {
		if resp.StatusCode == c {
			return true
		}
	}
	return false
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// cancelBody ends a try's BackendTimeout context once its answer is read.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// proxyError answers a request the backend did not: 504 when the route's
// Timeout or a try's BackendTimeout ran out, 502 otherwise; nothing when
// the client is gone.
func (st *reqState) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	reason := errorReason(err)
	code := http.StatusBadGateway
	switch {
	case st.inCtx != nil && expired(st.inCtx):
		reason, code = "timeout", http.StatusGatewayTimeout
	case st.inCtx != nil && st.inCtx.Err() != nil:
		reason, code = "canceled", 499 // nginx's "client closed request", for logs only
	case reason == "backend_timeout":
		code = http.StatusGatewayTimeout
	}
	name := ""
	if st.b != nil {
		name = st.b.Name
	}
	st.s.m.upstreamErrors.WithLabelValues(name, reason).Inc()
	if code == 499 {
		st.rw.status = code
		return
	}
	if st.rw.status != 0 {
		return // too late for an error answer
	}
	st.answer(r, code)
}

// expired reports whether ctx's deadline has passed, also in the moment
// before its timer marks it done (a connection deadline can fire first).
func expired(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

func errorReason(err error) string {
	var op *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "backend_timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &op) && op.Op == "dial":
		return "connect"
	default:
		return "reset"
	}
}

// respWriter records the status and size of the answer for metrics and
// the access log, and passes flushing and hijacking through.
type respWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *respWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code) // informational: the final one follows
		return
	}
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *respWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *respWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

func (w *respWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hostOnly strips the port from a Host header ("a.example:8080",
// "[::1]:80").
func hostOnly(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h[i:], ']') < 0 {
		h = h[:i]
	}
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	return h
}

// mirror sends a copy of r to each of a's mirrors (by its Percent) and
// forgets it. The copy carries the body only when it is small and of known
// length; r's body is then read here once and replayed for both.
func (s *Server) mirror(r *http.Request, a *table.Action) *http.Request {
	var body []byte
	hasBody := r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	if hasBody && r.ContentLength > 0 && r.ContentLength <= maxMirrorBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxMirrorBody))
		if err == nil {
			body = b
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
	}
	for _, m := range a.Mirrors {
		b := m.Backend
		if b == nil || b.Invalid || (m.Percent < 100 && rand.Float64()*100 >= m.Percent) {
			continue
		}
		if hasBody && body == nil {
			continue // a body we cannot copy: mirror nothing rather than a lie
		}
		ep := b.Endpoint()
		if ep == "" {
			continue
		}
		select {
		case s.mirrors <- struct{}{}:
		default:
			continue // too many mirrors in flight: drop, never slow the request
		}
		mr := r.Clone(context.Background())
		mr.RequestURI = ""
		mr.URL.Scheme, mr.URL.Host = "http", ep
		if rw := a.Rewrite; rw != nil {
			if rw.Hostname != "" {
				mr.Host = rw.Hostname
			}
			if rw.Path != nil {
				mr.URL.Path, mr.URL.RawPath = modifyPath(r.URL.Path, rw.Path), ""
			}
		}
		applyHeaders(mr.Header, &a.RequestHeaders)
		applyHeaders(mr.Header, &b.RequestHeaders)
		mr.Body, mr.GetBody = http.NoBody, nil
		if body != nil {
			mr.Body = io.NopCloser(bytes.NewReader(body))
		}
		tr := s.h1
		if b.Protocol == table.H2C || a.GRPC {
			tr = s.h2c
		}
		go func() {
			defer func() { <-s.mirrors }()
			ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
			defer cancel()
			resp, err := tr.RoundTrip(mr.WithContext(ctx))
			if err != nil {
				s.m.seen("", b.Name)
				s.m.upstreamErrors.WithLabelValues(b.Name, "mirror_"+errorReason(err)).Inc()
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	return r
}

const (
	maxMirrors    = 1024
	maxMirrorBody = 64 << 10
	mirrorTimeout = 30 * time.Second
)
