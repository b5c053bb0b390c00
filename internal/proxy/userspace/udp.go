package userspace

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
	rt     *sockets
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

func (rt *sockets) listenUDP(addr netip.AddrPort, fe *frontend) (*udpListener, error) {
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
	rc, err := l.pc.SyscallConn()
	if err != nil {
		l.failed.Store(true)
		return
	}
	for {
		err := readDatagram(rc, func(b []byte, from netip.AddrPort) {
			s := l.session(from)
			if s == nil {
				return // refused: dropped, as the kernel modes drop
			}
			s.last.Store(time.Now().UnixNano())
			// A write error (the endpoint's ICMP error from an earlier
			// datagram) also ends the session's relay.
			_, _ = s.up.Write(b)
		})
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
	}
}

// bufs are datagram buffers, held only while a datagram is relayed: a
// buffer per socket would be 64 KiB for each UDP service port and each
// session, most of them idle.
var bufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// readDatagram waits until rc has a datagram, reads it into a pooled
// buffer and hands it and its source to deliver, which must not keep the
// buffer. It honours rc's read deadline.
func readDatagram(rc syscall.RawConn, deliver func(b []byte, from netip.AddrPort)) error {
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		for {
			n, sa, err := unix.Recvfrom(int(fd), *bp, unix.MSG_DONTWAIT)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return false // wait until readable
			case err != nil:
				rerr = err
				return true
			}
			deliver((*bp)[:n], sockaddrAddrPort(sa))
			return true
		}
	})
	return errors.Join(err, rerr)
}

func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
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
	rc, err := s.up.SyscallConn()
	if err != nil {
		return
	}
	for {
		_ = s.up.SetReadDeadline(time.Unix(0, s.last.Load()).Add(idle))
		var werr error
		err := readDatagram(rc, func(b []byte, _ netip.AddrPort) {
			s.last.Store(time.Now().UnixNano())
			_, werr = l.pc.WriteToUDPAddrPort(b, s.client)
		})
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, s.last.Load())) < idle {
				continue // the client sent meanwhile
			}
			return
		}
		if werr != nil && l.closed.Load() {
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
