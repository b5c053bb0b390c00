package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// monitor follows the kernel's nftables notifications in a proxy's
// namespace through `proxybench watch` (watch.go): each address comes
// stamped with when its commit was announced, without polling rule
// listings, which at 10,000 Services take seconds of CPU per call and
// would compete with the proxies for the machine's two cores, and without
// `nft monitor`'s formatting lag. iptables here is iptables-nft (the run
// checks), so the iptables modes' rules are nftables objects too.
type monitor struct {
	cmd   *exec.Cmd
	done  chan struct{}
	ready chan struct{}
	// lost is closed when the kernel dropped notifications (the socket
	// overran); waits then end with errLost and the runner falls back to
	// listing.
	lost     chan struct{}
	lostOnce sync.Once
	want     map[string]bool // ClusterIPs counted (constant)
	// set, when not empty, is the only set whose elements count as a
	// Service programmed: service-ips in the nftables modes, the last
	// object of a Service a proxy adds (in whichever transaction); any
	// rule or element otherwise (iptables-nft's restores are one
	// transaction per table).
	set string

	mu sync.Mutex
	// ClusterIPs in want seen in a new rule or element.
	ports   map[string]bool
	portsAt time.Time
	wantN   int
	wantHit chan time.Time

	// Endpoint addresses awaited (waitEndpoints).
	pending    map[string]bool
	pendingHit chan time.Time
}

var (
	// Where a listing (the fallback) shows a Service programmed: a
	// service-ips element (nftables modes), a rule matching its address
	// and port 80 (iptables modes, as nft lists iptables-nft's rules).
	nftSvcRE = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. 80 : goto \S+`)
	iptSvcRE = regexp.MustCompile(`ip daddr (\d+\.\d+\.\d+\.\d+) [^\n]*?\bdport 80\b`)
	// An endpoint in a listing: kube-proxy's dnat map ("10.246.0.9 .
	// 8080"), an endpoint chain's name ("__10.246.0.9/8080"), a DNAT
	// ("dnat to 10.246.0.9:8080").
	endpointRE = regexp.MustCompile(fmt.Sprintf(`(\d+\.\d+\.\d+\.\d+)(?:/| \. |:)%d\b`, endpointPort))
)

// startMonitor runs self's watch in namespace netns, reporting addresses
// of the endpoints' range and serviceCIDR, counting the ClusterIPs in
// want, and returns once it is subscribed.
func startMonitor(ctx context.Context, self, netns string, serviceCIDR netip.Prefix, want map[string]bool, set string) (*monitor, error) {
	m := &monitor{done: make(chan struct{}), ready: make(chan struct{}), lost: make(chan struct{}), ports: map[string]bool{}, want: want, set: set}
	m.cmd = exec.Command("ip", "netns", "exec", netns, self, "watch", "-prefixes", endpointsRange+","+serviceCIDR.String())
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	m.cmd.Stderr = os.Stderr
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("watch in %s: %w", netns, err)
	}
	go m.read(out)
	select {
	case <-m.ready:
		return m, nil
	case <-m.done:
		return nil, fmt.Errorf("watch in %s exited before it was ready", netns)
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	m.stop()
	return nil, fmt.Errorf("watch in %s: not ready after 10 s", netns)
}

func (m *monitor) read(r io.Reader) {
	defer close(m.done)
	sc := bufio.NewScanner(r)
	var readyOnce sync.Once
	for sc.Scan() {
		line := sc.Text()
		switch line {
		case "ready":
			readyOnce.Do(func() { close(m.ready) })
			continue
		case "lost":
			m.lostOnce.Do(func() { close(m.lost) })
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		at, ip := time.Unix(0, ns), f[1]
		m.mu.Lock()
		if m.want[ip] && !m.ports[ip] && (m.set == "" || f[2] == m.set) {
			m.ports[ip] = true
			m.portsAt = at
			if m.wantHit != nil && len(m.ports) >= m.wantN {
				m.wantHit <- m.portsAt
				m.wantHit = nil
			}
		}
		if m.pending[ip] {
			delete(m.pending, ip)
			if len(m.pending) == 0 && m.pendingHit != nil {
				m.pendingHit <- at
				m.pendingHit = nil
			}
		}
		m.mu.Unlock()
	}
}

// waitPorts waits until n of the ClusterIPs in want have been seen since
// the monitor started, and returns when the n-th was.
func (m *monitor) waitPorts(ctx context.Context, n int) (time.Time, int, error) {
	hit := make(chan time.Time, 1)
	m.mu.Lock()
	if len(m.ports) >= n {
		at := m.portsAt
		m.mu.Unlock()
		return at, n, nil
	}
	m.wantN, m.wantHit = n, hit
	m.mu.Unlock()
	select {
	case t := <-hit:
		return t, n, nil
	case <-m.lost:
		return time.Time{}, m.seen(), errLost
	case <-m.done:
		return time.Time{}, m.seen(), fmt.Errorf("watch exited")
	case <-ctx.Done():
		m.mu.Lock()
		m.wantHit = nil
		m.mu.Unlock()
		return time.Time{}, m.seen(), ctx.Err()
	}
}

// waitEndpoints runs during (which makes the changes) and waits until
// every address in ips has appeared in a new rule or element; it returns
// when the last one did. Addresses are never reused, so a message naming
// one is the transaction that programmed it.
func (m *monitor) waitEndpoints(ctx context.Context, ips []string, during func() error) (time.Time, error) {
	hit := make(chan time.Time, 1)
	m.mu.Lock()
	m.pending = make(map[string]bool, len(ips))
	for _, ip := range ips {
		m.pending[ip] = true
	}
	m.pendingHit = hit
	m.mu.Unlock()
	reset := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := len(m.pending)
		m.pending, m.pendingHit = nil, nil
		return n
	}
	if err := during(); err != nil {
		reset()
		return time.Time{}, err
	}
	select {
	case t := <-hit:
		return t, nil
	case <-m.lost:
		reset()
		return time.Time{}, errLost
	case <-m.done:
		return time.Time{}, fmt.Errorf("watch exited with %d of %d endpoints not seen", reset(), len(ips))
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%d of %d new endpoints not seen in the kernel: %w", reset(), len(ips), ctx.Err())
	}
}

var errLost = errors.New("the kernel dropped nftables notifications")

// isLost reports whether the monitor lost events (it must be replaced).
func (m *monitor) isLost() bool {
	select {
	case <-m.lost:
		return true
	default:
		return false
	}
}

func (m *monitor) seen() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ports)
}

func (m *monitor) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(5 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	_ = m.cmd.Wait()
}
