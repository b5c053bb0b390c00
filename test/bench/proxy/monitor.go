package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// monitor follows `nft monitor new <what>` inside a proxy's namespace:
// the kernel announces each committed change, so the time a line is read
// is when the change is in the kernel, without polling `nft list`, which
// at 5,000 Services takes about a second of CPU per call and would compete
// with the proxies for the machine's two cores. Lines are matched as they
// arrive (nothing is buffered), so the pipe never backs up. iptables here
// is iptables-nft (the run checks), so the iptables modes' rules are
// nftables rules too and the same monitor sees them, as nft prints them
// ("ip daddr 10.96.0.7 tcp dport 80 ... jump KUBE-SVC-...", "dnat to
// 10.246.0.9:8080").
type monitor struct {
	cmd  *exec.Cmd
	done chan struct{}
	// lost is closed when nft reports lost events (its socket buffer
	// overran: a transaction of 100,000 rules can do that); waits then
	// end with errLost and the runner falls back to listing.
	lost     chan struct{}
	lostOnce sync.Once

	mu    sync.Mutex
	match func(line string) bool // called for each line under mu
	hit   chan time.Time

	// ClusterIPs in want seen programmed (by svc's pattern).
	svc     svcPattern
	want    map[string]bool
	ports   map[string]bool
	portsAt time.Time
	wantN   int
	wantHit chan time.Time

	// Endpoint addresses awaited in any rule line (waitEndpoints).
	pending    map[string]bool
	pendingHit chan time.Time
}

// svcPattern says which monitor lines program a service port and where
// its ClusterIP is: service-ips map elements (nftables modes), or rules
// matching the address and port 80 (iptables modes).
type svcPattern struct {
	what   string // nft monitor new <what>
	filter string // a line must contain it ("" for any)
	re     *regexp.Regexp
}

var (
	nftSvc = svcPattern{"elements", "service-ips", regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. 80 : goto \S+`)}
	iptSvc = svcPattern{"rules", "ip daddr", regexp.MustCompile(`ip daddr (\d+\.\d+\.\d+\.\d+) [^\n]*?\bdport 80\b`)}
	// nftChanges sees endpoint changes in the nftables modes: every new
	// object (rules, and map elements should a renderer put endpoints in
	// a map), no service pattern (after the cold start only endpoints are
	// awaited).
	nftChanges = svcPattern{}
	// An endpoint in a rule: kube-proxy's dnat map ("10.246.0.9 . 8080"),
	// an endpoint chain's name ("__10.246.0.9/8080"), an iptables DNAT
	// ("dnat to 10.246.0.9:8080").
	endpointRE = regexp.MustCompile(fmt.Sprintf(`(\d+\.\d+\.\d+\.\d+)(?:/| \. |:)%d\b`, endpointPort))
)

// startMonitor runs `nft monitor new svc.what` in namespace netns,
// counting the ClusterIPs in want that lines matching svc program, and
// returns once it is live: nft reads the ruleset into its cache first (a
// second or more at 20,000 chains), and a change made before it listens
// would be missed, so a probe table of the monitor's own is changed until
// the monitor reports it, then deleted.
func startMonitor(ctx context.Context, netns string, svc svcPattern, want map[string]bool) (*monitor, error) {
	m := &monitor{done: make(chan struct{}), lost: make(chan struct{}), ports: map[string]bool{}, svc: svc, want: want}
	argv := []string{"ip", "netns", "exec", netns, "nft", "monitor", "new"}
	if svc.what != "" {
		argv = append(argv, svc.what)
	}
	m.cmd = exec.Command(argv[0], argv[1:]...)
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	m.cmd.Stderr = m.cmd.Stdout
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("nft monitor in %s: %w", netns, err)
	}
	go m.read(out)
	probe := map[string]string{
		"elements": "add table ip pbprobe; add set ip pbprobe s { type ipv4_addr; }; add element ip pbprobe s { 127.0.0.%d }",
		"rules":    "add table ip pbprobe; add chain ip pbprobe c; add rule ip pbprobe c meta mark 0x%x counter",
		"":         "add table ip pbprobe; add chain ip pbprobe c; add rule ip pbprobe c meta mark 0x%x counter",
	}[svc.what]
	if probe == "" {
		m.stop()
		return nil, fmt.Errorf("nft monitor: unknown kind %q", svc.what)
	}
	nft := func(args ...string) (string, error) {
		return run(append([]string{"ip", "netns", "exec", netns, "nft"}, args...)...)
	}
	defer func() { _, _ = nft("delete", "table", "ip", "pbprobe") }()
	for i := 1; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := m.waitLine(pctx, func(l string) bool { return strings.Contains(l, "pbprobe") }, func() error {
			_, err := nft(fmt.Sprintf(probe, i%250+1))
			return err
		})
		cancel()
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil || i >= 30 {
			m.stop()
			return nil, fmt.Errorf("nft monitor in %s not reporting changes: %w", netns, err)
		}
	}
}

func (m *monitor) read(r io.Reader) {
	defer close(m.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		if strings.Contains(line, "lost some netlink events") {
			m.lostOnce.Do(func() { close(m.lost) })
		}
		m.mu.Lock()
		if m.match != nil && m.match(line) {
			m.match = nil
			m.hit <- now
		}
		if m.svc.re != nil && strings.Contains(line, m.svc.filter) {
			for _, e := range m.svc.re.FindAllStringSubmatch(line, -1) {
				if m.want[e[1]] && !m.ports[e[1]] {
					m.ports[e[1]] = true
					m.portsAt = now
				}
			}
			if m.wantHit != nil && len(m.ports) >= m.wantN {
				m.wantHit <- m.portsAt
				m.wantHit = nil
			}
		}
		if len(m.pending) > 0 {
			for _, e := range endpointRE.FindAllStringSubmatch(line, -1) {
				delete(m.pending, e[1])
			}
			if len(m.pending) == 0 && m.pendingHit != nil {
				m.pendingHit <- now
				m.pendingHit = nil
			}
		}
		m.mu.Unlock()
	}
}

// waitLine waits for the first line after this call for which match holds.
func (m *monitor) waitLine(ctx context.Context, match func(string) bool, during func() error) (time.Time, error) {
	hit := make(chan time.Time, 1)
	m.mu.Lock()
	m.match, m.hit = match, hit
	m.mu.Unlock()
	if during != nil {
		if err := during(); err != nil {
			return time.Time{}, err
		}
	}
	select {
	case t := <-hit:
		return t, nil
	case <-m.done:
		return time.Time{}, fmt.Errorf("nft monitor exited")
	case <-ctx.Done():
		m.mu.Lock()
		m.match = nil
		m.mu.Unlock()
		return time.Time{}, ctx.Err()
	}
}

// waitPorts waits until n distinct service ports of the benchmark's
// namespace have been added to service-ips since the monitor started, and
// returns when the n-th was.
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
		return time.Time{}, m.seen(), fmt.Errorf("nft monitor exited")
	case <-ctx.Done():
		m.mu.Lock()
		m.wantHit = nil
		m.mu.Unlock()
		return time.Time{}, m.seen(), ctx.Err()
	}
}

// waitEndpoints runs during (which makes the changes) and waits until
// every address in ips has appeared as an endpoint in a rule line; it
// returns when the last one did. Addresses are never reused, so a line
// naming one is the transaction that programmed it.
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
		return time.Time{}, fmt.Errorf("nft monitor exited with %d of %d endpoints not seen", reset(), len(ips))
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%d of %d new endpoints not seen in the kernel: %w", reset(), len(ips), ctx.Err())
	}
}

var errLost = errors.New("nft monitor lost events")

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
