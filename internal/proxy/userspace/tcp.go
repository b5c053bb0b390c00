package userspace

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// frontend is what a listener serves at the moment: swapped atomically by
// a sync, so a service port's new endpoints (or a new owner of the
// address) take effect without closing the socket.
type frontend struct {
	kind kind
	pool *pool
}

// listener is one open frontend socket.
type listener interface {
	set(*frontend)
	close()
	// dead reports a socket that failed on its own; a full sync reopens it.
	dead() bool
}

// tcpListener accepts connections and splices each to an endpoint.
type tcpListener struct {
	rt     *sockets
	ln     *net.TCPListener
	fe     atomic.Pointer[frontend]
	closed atomic.Bool
	failed atomic.Bool
}

func (rt *sockets) listenTCP(addr netip.AddrPort, fe *frontend) (*tcpListener, error) {
	var ln net.Listener
	err := rt.inNS(func() (err error) {
		ln, err = rt.listenConfig().Listen(rt.ctx, "tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	l := &tcpListener{rt: rt, ln: ln.(*net.TCPListener)}
	l.fe.Store(fe)
	go l.serve()
	return l, nil
}

func (l *tcpListener) set(fe *frontend) { l.fe.Store(fe) }
func (l *tcpListener) dead() bool       { return l.failed.Load() }

func (l *tcpListener) close() {
	l.closed.Store(true)
	_ = l.ln.Close()
}

func (l *tcpListener) serve() {
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptTCP()
		if err != nil {
			if l.closed.Load() {
				return
			}
			// Out of file descriptors and the like: wait and retry, as
			// net/http does; anything else ends the listener.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			l.rt.cfg.Logger.Error(err, "Service listener failed; the next full sync reopens it", "address", l.ln.Addr())
			l.failed.Store(true)
			return
		}
		backoff = 0
		go l.rt.proxyTCP(c, l.fe.Load())
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// proxyTCP connects client c to an endpoint of fe, trying the next one on
// a connect error (len(DialTimeouts) attempts), then copies both ways
// until both sides have closed. A client nobody can serve gets a
// reset at once.
func (rt *sockets) proxyTCP(c *net.TCPConn, fe *frontend) {
	if !rt.track(c) {
		_ = c.Close()
		return
	}
	defer rt.untrack(c)
	client := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	var up *net.TCPConn
	eps := fe.pool.candidates(client, fe.kind, rt.cfg.ClusterCIDRs, len(rt.cfg.DialTimeouts))
	for i := 0; len(eps) > 0 && i < len(rt.cfg.DialTimeouts); i++ {
		// Fewer endpoints than attempts: round again, with the longer
		// timeouts (a busy endpoint's full accept queue drops SYNs).
		ep := eps[i%len(eps)]
		conn, err := rt.dialTCP(ep, rt.cfg.DialTimeouts[i])
		if err == nil {
			up = conn
			fe.pool.connected(client, ep)
			break
		}
		rt.cfg.Logger.V(2).Info("Endpoint connect failed; trying the next", "client", client, "endpoint", ep, "err", err)
	}
	if up == nil {
		reset(c)
		return
	}
	if !rt.track(up) {
		reset(c)
		_ = up.Close()
		return
	}
	defer rt.untrack(up)
	splice(c, up)
}

func (rt *sockets) dialTCP(ep netip.AddrPort, timeout time.Duration) (*net.TCPConn, error) {
	var c net.Conn
	err := rt.inNS(func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.DialContext(rt.ctx, "tcp", ep.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// reset closes c with an RST rather than a FIN, so the client fails at
// once instead of reading an empty answer.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// splice copies a to b and b to a. io.Copy between two TCP connections is
// splice(2) on Linux (TCPConn.ReadFrom), so the payload stays in the
// kernel. A side that ends cleanly (EOF) is passed on as a half-close, so
// a client that shuts down its sending side still reads the answer; an
// error on either side (a reset) resets both, as a NAT passes a reset on;
// that also leaves no TIME_WAIT socket on the node, whose ephemeral ports
// towards one endpoint are few (see docs/proxy.md).
func splice(a, b *net.TCPConn) {
	done := make(chan struct{})
	one := func(dst, src *net.TCPConn) {
		if _, err := io.Copy(dst, src); err != nil {
			reset(a)
			reset(b)
			return
		}
		_ = dst.CloseWrite()
	}
	go func() {
		one(b, a)
		close(done)
	}()
	one(a, b)
	<-done
	_ = a.Close()
	_ = b.Close()
}
