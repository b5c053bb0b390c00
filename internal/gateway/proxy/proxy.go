// Package proxy is flatnet gateway's HTTP data plane: it listens on every
// Port of the current *table.Table and answers each request from the table
// as it is at that moment.
//
// Design. The table is immutable; the server holds the current one in an
// atomic.Pointer and Update swaps it whole. A request resolves its port,
// host and rule once, at its start, so a request or stream that began on
// the old table finishes on it, and a route change never restarts a
// listener. Listeners follow the table's ports: Update opens the new ones,
// and closes the ones gone (they stop accepting at once, their in-flight
// requests drain in the background); the others are not touched, so their
// keep-alive connections, WebSockets and gRPC streams live on. TLS
// certificates are read from the current table at each handshake, so a
// rotated Secret is served from the next table without a restart.
//
// On clear-text ports a connection loop of our own (fastserver.go) answers
// the common request (a bodiless GET to a route that only forwards) with
// the standard library's parser and serializers, and hands the connection
// to net/http for anything else; TLS ports are net/http's alone.
//
// The hot path (handler.go) takes no lock but the balancer's: the table and
// its metric children are reached through atomics and a per-table sync.Map
// that is read-only once warm, and each request borrows one pooled
// reqState that carries the httputil.ReverseProxy with its callbacks bound,
// so nothing is built per request that the standard library does not
// build itself.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// Options configure a Server.
type Options struct {
	// BindAddress is the address every port listens on; "" for all.
	BindAddress string
	// Registry receives the metrics; nil keeps them unregistered.
	Registry prometheus.Registerer
	// AccessLog receives one JSON line per request, in batches (at
	// least every 100 ms, and at Close); nil for none.
	AccessLog io.Writer
	// Logger logs listener errors; the zero Logger discards.
	Logger klog.Logger
	// DrainTimeout bounds how long a removed port's in-flight requests may
	// run before their connections are closed (default 30 s).
	DrainTimeout time.Duration
	// DisableFastPath serves clear-text ports with net/http alone, without
	// the connection loop of fastserver.go (to compare, or to rule it out).
	DisableFastPath bool
}

// Server serves the current table. Its methods are safe for concurrent use.
type Server struct {
	o   Options
	cur atomic.Pointer[generation]
	m   *metrics

	mu        sync.Mutex // serializes Update and Close; protects listeners, closed
	listeners map[int32]*listener
	closed    bool
	draining  sync.WaitGroup

	h1, h2c *http.Transport
	fast    *fastTransport // h1's synchronous front for bodiless GETs
	bufs    bufferPool
	states  sync.Pool // *reqState
	mirrors chan struct{}
	done    chan struct{} // closed by Close
	alog    *logBuffer    // nil without an AccessLog
	errLog  *log.Logger
}

// listener is one bound port and the server behind it.
type listener struct {
	bind  int32
	proto table.Protocol
	ln    net.Listener
	srv   *http.Server
	fast  *fastPort // in front of srv on clear-text ports, unless disabled
}

// New returns a server with no table: it listens nowhere until Update.
func New(o Options) *Server {
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	s := &Server{
		o:         o,
		m:         newMetrics(o.Registry),
		listeners: map[int32]*listener{},
		h1:        newTransport(false),
		h2c:       newTransport(true),
		mirrors:   make(chan struct{}, maxMirrors),
		done:      make(chan struct{}),
		errLog:    log.New(logWriter{o.Logger}, "", 0),
	}
	s.fast = newFastTransport(s.h1)
	s.states.New = func() any { return s.newState() }
	go s.pruneMetrics()
	if o.AccessLog != nil {
		s.alog = &logBuffer{w: o.AccessLog}
		go s.alog.run(s.done)
	}
	return s
}

// pruneMetrics drops the metric series of routes and backends the
// current table no longer has, every pruneInterval.
func (s *Server) pruneMetrics() {
	t := time.NewTicker(pruneInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			if g := s.cur.Load(); g != nil {
				s.m.prune(g.t)
			}
		}
	}
}

const pruneInterval = time.Minute

// ErrClosed is returned by Update after Close.
var ErrClosed = errors.New("gateway proxy: closed")

// Update makes t the table every new request is answered from, opens a
// listener for each port that has none (or whose protocol changed) and
// closes the listeners of ports t no longer has. A port that cannot be
// bound is reported in the error, by number; the other ports serve, and the
// next Update tries it again.
func (s *Server) Update(t *table.Table) error {
	if t == nil {
		return errors.New("gateway proxy: Update with a nil table")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	// Swap first: a port's socket must not accept before its table is in
	// place, and a removed port's last requests still find the old one
	// through the generation they loaded.
	s.cur.Store(&generation{t: t})
	s.m.generation.Set(float64(t.Generation))
	s.m.updates.Inc()

	for bind, l := range s.listeners {
		if p, ok := t.Ports[bind]; !ok || p.Protocol != l.proto {
			s.drain(l)
			delete(s.listeners, bind)
		}
	}
	var errs []error
	for _, bind := range slices.Sorted(maps.Keys(t.Ports)) {
		if s.listeners[bind] != nil {
			continue
		}
		l, err := s.listen(bind, t.Ports[bind].Protocol)
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway proxy: port %d: %w", bind, err))
			continue
		}
		s.listeners[bind] = l
	}
	return errors.Join(errs...)
}

// listen binds one port and serves it in the background.
func (s *Server) listen(bind int32, proto table.Protocol) (*listener, error) {
	if bind <= 0 || bind > 65535 {
		return nil, fmt.Errorf("bind port out of range 1-65535")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.o.BindAddress, strconv.Itoa(int(bind))))
	if err != nil {
		return nil, err
	}
	l := &listener{bind: bind, proto: proto, ln: ln}
	l.srv = &http.Server{
		Handler:           &portHandler{s: s, bind: bind},
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       75 * time.Second,
		ErrorLog:          s.errLog,
		Protocols:         new(http.Protocols),
	}
	// HTTP/1.1 and HTTP/2 everywhere: over TLS by ALPN, in clear text by
	// prior knowledge (h2c, which gRPC clients speak without TLS).
	l.srv.Protocols.SetHTTP1(true)
	l.srv.Protocols.SetHTTP2(true)
	l.srv.Protocols.SetUnencryptedHTTP2(true)
	if proto == table.HTTPS {
		l.srv.TLSConfig = s.tlsConfig(bind)
	}
	if proto == table.HTTP && !s.o.DisableFastPath {
		l.fast = newFastPort(s, bind, ln.Addr())
		go l.fast.serve(ln)
	}
	go func() {
		var err error
		switch {
		case proto == table.HTTPS:
			err = l.srv.ServeTLS(ln, "", "")
		case l.fast != nil:
			err = l.srv.Serve(l.fast.handoff)
		default:
			err = l.srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.o.Logger.Error(err, "Gateway port stopped serving", "port", bind)
		}
	}()
	return l, nil
}

// drain stops l accepting now (its port is free to bind again at once) and
// lets its in-flight requests finish in the background, up to DrainTimeout.
func (s *Server) drain(l *listener) {
	l.ln.Close()
	s.draining.Add(1)
	go func() {
		defer s.draining.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.o.DrainTimeout)
		defer cancel()
		l.shutdown(ctx)
	}()
}

// shutdown stops l gracefully until ctx ends, then closes what is left.
func (l *listener) shutdown(ctx context.Context) error {
	var wg sync.WaitGroup
	if l.fast != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dl, _ := ctx.Deadline()
			l.fast.drain(dl)
		}()
	}
	err := l.srv.Shutdown(ctx)
	if err != nil {
		l.srv.Close()
	}
	wg.Wait()
	return err
}

// Close stops every listener and waits, until ctx ends, for in-flight
// requests; then it closes what is left.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	ls := s.listeners
	s.listeners = map[int32]*listener{}
	s.mu.Unlock()

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	for _, l := range ls {
		l.ln.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.shutdown(ctx); err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("gateway proxy: port %d: %w", l.bind, err))
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	done := make(chan struct{})
	go func() { s.draining.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("gateway proxy: draining removed ports: %w", ctx.Err()))
	}
	if s.alog != nil {
		s.alog.flush()
	}
	s.fast.CloseIdleConnections()
	s.h1.CloseIdleConnections()
	s.h2c.CloseIdleConnections()
	return errors.Join(errs...)
}

// HealthHandler answers /healthz: 200 once a table has been applied, 503
// before.
func (s *Server) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cur.Load() == nil {
			http.Error(w, "no routing table yet", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
}

// Table returns the table being served (nil before the first Update).
func (s *Server) Table() *table.Table {
	if g := s.cur.Load(); g != nil {
		return g.t
	}
	return nil
}

// generation is one applied table and what the hot path caches for it.
type generation struct {
	t     *table.Table
	stats sync.Map // *table.Action -> *routeStats
}

// logWriter turns net/http's log lines (TLS handshake errors, bad
// requests) into verbose log entries: they are about clients, not us.
type logWriter struct{ l klog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	if w.l.GetSink() != nil {
		w.l.V(4).Info(string(p))
	}
	return len(p), nil
}
