package main

// The data path's load and the endpoint server on blocking system calls,
// one OS thread per worker.
//
// Why not the net package: a Go connect is a nonblocking connect, an
// epoll registration, a park and a wake-up of the goroutine, then
// getsockopt, getsockname and getpeername; an accept is much the same.
// On this 2-core machine that costs the load generator and the server
// more CPU per connection than the kernel spends on the connection
// itself (the handshake across two veths, conntrack and the DNAT), so a
// proxy's own cost per new connection, which is what the data path
// compares, drowned in the harness's. Here a connection is socket,
// setsockopt (reset on close, a 1-s connect timeout), connect (which
// blocks until the handshake is done) and close; the server's is accept,
// getsockname, write and close.

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// serveRaw accepts on 0.0.0.0:port with two blocking acceptors, answers
// each connection with the local address it came to and a newline, and
// closes it. It returns only on a listen error.
func serveRaw(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("SO_REUSEADDR: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port}); err != nil {
		return fmt.Errorf("bind 0.0.0.0:%d: %w", port, err)
	}
	if err := syscall.Listen(fd, 4096); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			runtime.LockOSThread()
			for {
				c, _, err := syscall.Accept4(fd, syscall.SOCK_CLOEXEC)
				if err != nil {
					if errors.Is(err, syscall.EBADF) || errors.Is(err, syscall.EINVAL) {
						return
					}
					continue // EINTR, ECONNABORTED, EMFILE: try again
				}
				answer(c)
			}
		})
	}
	wg.Wait()
	return errors.New("listening socket closed")
}

// answer writes the address c was reached at and closes c.
func answer(c int) {
	defer syscall.Close(c)
	sa, err := syscall.Getsockname(c)
	if err != nil {
		return
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		return
	}
	// A peer that never reads cannot hold this thread: 1 s, as before.
	_ = syscall.SetsockoptTimeval(c, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &syscall.Timeval{Sec: 1})
	_, _ = syscall.Write(c, []byte(netip.AddrFrom4(in.Addr).String()+"\n"))
}

// loadRaw opens new connections to req.Addr, req.Conc at a time, until
// req.Duration has passed or req.Max connections were tried, and closes
// each with a reset (no TIME_WAIT on either side, no port reuse trouble).
func loadRaw(req probeReq) probeResp {
	ap, err := netip.ParseAddrPort(req.Addr)
	if err != nil || !ap.Addr().Is4() {
		return probeResp{Err: fmt.Sprintf("load: address %q: want IPv4:port", req.Addr)}
	}
	sa := &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	deadline := time.Now().Add(req.Duration)
	var left atomic.Int64
	left.Store(int64(req.Max))
	var errCount atomic.Int64
	lats := make([][]float64, max(req.Conc, 1))
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range lats {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for left.Add(-1) >= 0 && time.Now().Before(deadline) {
				s := time.Now()
				if err := connectOnce(sa); err != nil {
					errCount.Add(1)
					continue
				}
				lats[w] = append(lats[w], time.Since(s).Seconds())
			}
		})
	}
	wg.Wait()
	el := time.Since(t0).Seconds()
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	sort.Float64s(all)
	return probeResp{N: len(all), Errors: int(errCount.Load()), Seconds: el, P50: percentile(all, 50), P99: percentile(all, 99)}
}

// connectOnce makes one connection to sa and resets it.
func connectOnce(sa *syscall.SockaddrInet4) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0}); err != nil {
		return err
	}
	// A blocking connect waits at most SO_SNDTIMEO (then EINPROGRESS).
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &syscall.Timeval{Sec: 1}); err != nil {
		return err
	}
	err = syscall.Connect(fd, sa)
	// A signal (the Go runtime's preemption) interrupts the wait with
	// EINTR while the handshake goes on; connecting again waits for it,
	// or says it is done.
	for tries := 0; errors.Is(err, syscall.EINTR) && tries < 100; tries++ {
		if err = syscall.Connect(fd, sa); errors.Is(err, syscall.EISCONN) {
			err = nil
		}
	}
	return err
}
