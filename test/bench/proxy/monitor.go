package main

import (
	"bufio"
	"context"
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
// arrive (nothing is buffered), so the pipe never backs up.
type monitor struct {
	cmd  *exec.Cmd
	done chan struct{}

	mu    sync.Mutex
	match func(line string) bool // called for each line under mu
	hit   chan time.Time

	// Distinct ClusterIPs of the benchmark's namespace added to service-ips.
	ns      string
	ports   map[string]bool
	portsAt time.Time
	want    int
	wantHit chan time.Time
}

var serviceIPsElemRE = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. \d+ : goto \S+`)

// startMonitor runs `nft monitor new what` (elements or rules) in p's
// namespace and returns once it is live: nft reads the ruleset into its
// cache first (a second or more at 20,000 chains), and a change made
// before it listens would be missed, so a probe table of the monitor's own
// is changed until the monitor reports it, then deleted.
func startMonitor(ctx context.Context, p *proxy, what string) (*monitor, error) {
	m := &monitor{done: make(chan struct{}), ports: map[string]bool{}, ns: "-" + benchNamespace + "/"}
	m.cmd = exec.Command("ip", "netns", "exec", p.node.netns, "nft", "monitor", "new", what)
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	m.cmd.Stderr = m.cmd.Stdout
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("nft monitor in %s: %w", p.node.netns, err)
	}
	go m.read(out)
	probe := map[string]string{
		"elements": "add table ip pbprobe; add set ip pbprobe s { type ipv4_addr; }; add element ip pbprobe s { 127.0.0.%d }",
		"rules":    "add table ip pbprobe; add chain ip pbprobe c; add rule ip pbprobe c meta mark 0x%x counter",
	}[what]
	if probe == "" {
		m.stop()
		return nil, fmt.Errorf("nft monitor: unknown kind %q", what)
	}
	defer func() { _, _ = p.nft("delete", "table", "ip", "pbprobe") }()
	for i := 1; ; i++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := m.waitLine(pctx, func(l string) bool { return strings.Contains(l, "pbprobe") }, func() error {
			_, err := p.nft(fmt.Sprintf(probe, i%250+1))
			return err
		})
		cancel()
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil || i >= 30 {
			m.stop()
			return nil, fmt.Errorf("nft monitor in %s not reporting changes: %w", p.node.netns, err)
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
		m.mu.Lock()
		if m.match != nil && m.match(line) {
			m.match = nil
			m.hit <- now
		}
		if strings.Contains(line, "service-ips") && strings.Contains(line, m.ns) {
			for _, e := range serviceIPsElemRE.FindAllStringSubmatch(line, -1) {
				if strings.Contains(e[0], m.ns) && !m.ports[e[1]] {
					m.ports[e[1]] = true
					m.portsAt = now
				}
			}
			if m.wantHit != nil && len(m.ports) >= m.want {
				m.wantHit <- m.portsAt
				m.wantHit = nil
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
	m.want, m.wantHit = n, hit
	m.mu.Unlock()
	select {
	case t := <-hit:
		return t, n, nil
	case <-m.done:
		return time.Time{}, m.seen(), fmt.Errorf("nft monitor exited")
	case <-ctx.Done():
		m.mu.Lock()
		m.wantHit = nil
		m.mu.Unlock()
		return time.Time{}, m.seen(), ctx.Err()
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
