package userspace

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// udpListener relays datagrams between clients and endpoints. Each client
// address gets a session: a socket connected to one endpoint, whose
// replies go back to the client from the listener's own socket (so from
// the service address and port the client sent to). A session ends after
// IdleTimeout without a datagram either way, when the endpoint answers
// with an ICMP error, or when its endpoint is no longer one of the
// service's (the kernel modes' conntrack cleanup, so a client that keeps
// its source port is not blackholed by a removed endpoint).
type udpListener struct {
	rt     *runtime
	pc     *net.UDPConn
	fe     atomic.Pointer[frontend]
	closed atomic.Bool
	failed atomic.Bool

	mu       sync.Mutex // protects sessions
	sessions map[netip.AddrPort]*udpSession
}

type udpSession struct {
	client netip.AddrPort
	ep     netip.AddrPort
	pool   *pool
	up     *net.UDPConn
	last   atomic.Int64 // unix nanoseconds of the last datagram either way
}

func (rt *runtime) listenUDP(addr netip.AddrPort, fe *frontend) (*udpListener, error) {
	var pc net.PacketConn
	err := rt.inNS(func() (err error) {
		pc, err = rt.listenConfig().ListenPacket(rt.ctx, "udp", addr.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	l := &udpListener{rt: rt, pc: pc.(*net.UDPConn), sessions: map[netip.AddrPort]*udpSession{}}
	l.fe.Store(fe)
	go l.serve()
	return l, nil
}

func (l *udpListener) set(fe *frontend) { l.fe.Store(fe) }
func (l *udpListener) dead() bool       { return l.failed.Load() }

func (l *udpListener) close() {
	l.closed.Store(true)
	_ = l.pc.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.sessions {
		_ = s.up.Close()
	}
}

func (l *udpListener) serve() {
	buf := make([]byte, 64<<10)
	for {
		n, client, err := l.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if l.closed.Load() {
				return
			}
			if isTemporary(err) {
				continue
			}
			l.rt.cfg.Logger.Error(err, "Service listener failed; the next full sync reopens it", "address", l.pc.LocalAddr())
			l.failed.Store(true)
			return
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		s := l.session(client)
		if s == nil {
			continue // refused: dropped, as the kernel modes drop
		}
		s.last.Store(time.Now().UnixNano())
		// A write error (the endpoint's ICMP error from an earlier
		// datagram) also ends the session's relay.
		_, _ = s.up.Write(buf[:n])
	}
}

// session returns client's live session, opening one when there is none
// or its endpoint has gone; nil when the datagram is to be dropped.
func (l *udpListener) session(client netip.AddrPort) *udpSession {
	fe := l.fe.Load()
	l.mu.Lock()
	s := l.sessions[client]
	l.mu.Unlock()
	if s != nil && s.pool == fe.pool && fe.pool.has(s.ep) {
		return s
	}
	if s != nil {
		l.end(s)
	}
	eps := fe.pool.candidates(client.Addr(), fe.kind, l.rt.cfg.ClusterCIDRs, 1)
	if len(eps) == 0 {
		return nil
	}
	var up net.Conn
	err := l.rt.inNS(func() (err error) {
		up, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(eps[0]))
		return err
	})
	if err != nil {
		l.rt.cfg.Logger.V(2).Info("UDP session not opened", "client", client, "endpoint", eps[0], "err", err)
		return nil
	}
	fe.pool.connected(client.Addr(), eps[0])
	s = &udpSession{client: client, ep: eps[0], pool: fe.pool, up: up.(*net.UDPConn)}
	s.last.Store(time.Now().UnixNano())
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		_ = s.up.Close()
		return nil
	}
	l.sessions[client] = s
	l.mu.Unlock()
	go l.relay(s)
	return s
}

// relay copies the endpoint's replies to the client until the session
// idles out or fails.
func (l *udpListener) relay(s *udpSession) {
	defer l.end(s)
	idle := l.rt.cfg.UDPIdleTimeout
	buf := make([]byte, 64<<10)
	for {
		_ = s.up.SetReadDeadline(time.Unix(0, s.last.Load()).Add(idle))
		n, err := s.up.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, s.last.Load())) < idle {
				continue // the client sent meanwhile
			}
			return
		}
		s.last.Store(time.Now().UnixNano())
		if _, err := l.pc.WriteToUDPAddrPort(buf[:n], s.client); err != nil && l.closed.Load() {
			return
		}
	}
}

// end closes s and forgets it (unless a newer session replaced it).
func (l *udpListener) end(s *udpSession) {
	_ = s.up.Close()
	l.mu.Lock()
	if l.sessions[s.client] == s {
		delete(l.sessions, s.client)
	}
	l.mu.Unlock()
}
