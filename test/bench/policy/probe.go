package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netns"
)

// dialer opens TCP connections from inside the client pod's network
// namespace. A socket belongs to the namespace it was created in, whatever
// thread later uses it, so one goroutine kept inside the namespace (by
// netns.Do, for the dialer's life) only creates sockets; connecting,
// waiting and closing happen on any goroutine. The probe is what a client
// in the pod sees: its source address is the pod's, its path the pod's.
type dialer struct {
	reqs chan chan sockResult
	done chan error
}

type sockResult struct {
	fd  int
	err error
}

func newDialer(path string) (*dialer, error) {
	d := &dialer{reqs: make(chan chan sockResult), done: make(chan error, 1)}
	go func() {
		d.done <- netns.Do(path, func() error {
			for r := range d.reqs {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				r <- sockResult{fd, err}
			}
			return nil
		})
	}()
	// The first socket says whether the namespace could be entered.
	fd, err := d.socket()
	if err != nil {
		return nil, err
	}
	unix.Close(fd)
	return d, nil
}

func (d *dialer) socket() (int, error) {
	r := make(chan sockResult, 1)
	select {
	case d.reqs <- r:
	case err := <-d.done:
		return -1, fmt.Errorf("client namespace: %w", err)
	}
	s := <-r
	return s.fd, s.err
}

func (d *dialer) close() { close(d.reqs) }

// connect opens one TCP connection to addr, waiting at most timeout for
// the handshake, and closes it with a reset (SO_LINGER 0), so the client
// keeps no TIME_WAIT and a long run never runs out of ports. nil means the
// handshake completed.
func (d *dialer) connect(addr netip.AddrPort, timeout time.Duration) error {
	fd, err := d.socket()
	if err != nil {
		return err
	}
	defer func() {
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		unix.Close(fd)
	}()
	err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINPROGRESS) {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return errTimeout
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errTimeout
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soerr != 0 {
			return unix.Errno(soerr)
		}
		return nil
	}
}

var errTimeout = errors.New("connect timed out")

// probeResult is one probe: when it started and whether it connected.
type probeResult struct {
	start time.Time
	ok    bool
}

// waitFor starts a probe every interval (each a new connection, waiting
// at most timeout) until the outcome is want for stable probes in a row,
// counted in the order they started, and returns the start of the first
// of them: the first new connection that saw the new state, to within
// interval. A deny shows as a probe that times out (or is refused), which
// is why probes overlap instead of waiting for each other.
func (d *dialer) waitFor(ctx context.Context, addr netip.AddrPort, want bool, interval, timeout time.Duration, stable int, limit time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var (
		mu      sync.Mutex
		results []*probeResult
		pending = map[*probeResult]bool{}
		found   = make(chan time.Time, 1)
		wg      sync.WaitGroup
	)
	check := func() {
		// The last probe with the old outcome, among finished ones.
		last := -1
		for i, r := range results {
			if !pending[r] && r.ok != want {
				last = i
			}
		}
		run := 0
		for _, r := range results[last+1:] {
			if pending[r] {
				break
			}
			run++
		}
		if run >= stable {
			select {
			case found <- results[last+1].start:
			default:
			}
		}
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	defer wg.Wait()
	for {
		r := &probeResult{start: time.Now()}
		mu.Lock()
		results = append(results, r)
		pending[r] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.connect(addr, timeout)
			mu.Lock()
			r.ok = err == nil
			delete(pending, r)
			check()
			mu.Unlock()
		}()
		select {
		case t := <-found:
			return t, nil
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s still %s after %s", addr, map[bool]string{true: "denied", false: "allowed"}[want], limit)
		case <-tick.C:
		}
	}
}

// rate opens and closes connections to addr with workers in parallel for
// d and returns the completed connections per second and the failures.
func (d *dialer) rate(addr netip.AddrPort, workers int, dur time.Duration) (float64, int64) {
	var ok, failed atomic.Int64
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if d.connect(addr, time.Second) == nil {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(ok.Load()) / time.Since(start).Seconds(), failed.Load()
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	k := int(float64(len(s))*p/100+0.999999) - 1
	if k < 0 {
		k = 0
	}
	if k >= len(s) {
		k = len(s) - 1
	}
	return s[k]
}
