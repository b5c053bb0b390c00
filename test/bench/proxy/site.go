package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// A site is where one proxy is measured once (one proxy, one size): three
// network namespaces of this run, made fresh for it and removed after, so
// that no proxy inherits another's rules, addresses or conntrack entries.
//
//	lab bridge -- <prefix>n = eth0 [node: the proxy] c0 = eth0 [client]
//	                                                 e0 = eth0 [endpoints]
//
// The node (<prefix>-n) runs the proxy; its eth0 on the lab's underlay
// reaches the apiserver, and it forwards between client and endpoints.
// The client (<prefix>-c) is a pod-like namespace, 10.245.255.2 (inside
// the cluster CIDR the proxies are given, so no masquerade), default route
// via the node; the prober (probe.go) runs here for the whole site, so
// every connection the harness makes to a ClusterIP leaves from here and
// is DNATed (or, in userspace mode, accepted) in the node. In the
// endpoints (<prefix>-e) every endpoint address the harness hands out
// (endpointsRange) is local through one AnyIP route, and one server on
// *:8080 answers each connection with the address it was reached at: a
// connection says which endpoint it got.
//
// Only the uplink veth is in the root namespace.
type site struct {
	node, client, ep string // netns names
	hostVeth         string
	ip               netip.Addr // node's underlay address
	pidDir           string

	server *exec.Cmd
	prober *prober
}

const (
	clientIP = "10.245.255.2"
	clientGW = "10.245.255.1"
	epLinkGW = "10.248.255.1" // node's side of the endpoint link (outside the cluster CIDR)
	epLinkIP = "10.248.255.2"
)

func newSite(prefix string, ip netip.Addr, pidDir string) *site {
	return &site{node: prefix + "-n", client: prefix + "-c", ep: prefix + "-e", hostVeth: prefix + "n", ip: ip, pidDir: pidDir}
}

// create makes the namespaces and links and starts the endpoint server and
// the prober; remove undoes it (also after a partial create).
func (s *site) create(bridge string, prefixLen int, serviceCIDR netip.Prefix, self, logDir string) error {
	ns := func(n string, args ...string) []string { return append([]string{"ip", "-n", n}, args...) }
	sysctl := func(n, kv string) []string { return []string{"ip", "netns", "exec", n, "sysctl", "-q", "-w", kv} }
	steps := [][]string{
		{"ip", "netns", "add", s.node},
		{"ip", "netns", "add", s.client},
		{"ip", "netns", "add", s.ep},
		{"ip", "link", "add", s.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", s.node},
		{"ip", "link", "set", s.hostVeth, "master", bridge, "up"},
		ns(s.node, "link", "add", "c0", "type", "veth", "peer", "name", "eth0", "netns", s.client),
		ns(s.node, "link", "add", "e0", "type", "veth", "peer", "name", "eth0", "netns", s.ep),
		ns(s.node, "addr", "add", netip.PrefixFrom(s.ip, prefixLen).String(), "dev", "eth0"),
		ns(s.node, "addr", "add", clientGW+"/24", "dev", "c0"),
		ns(s.node, "addr", "add", epLinkGW+"/30", "dev", "e0"),
		ns(s.client, "addr", "add", clientIP+"/24", "dev", "eth0"),
		ns(s.ep, "addr", "add", epLinkIP+"/30", "dev", "eth0"),
	}
	for _, n := range []string{s.node, s.client, s.ep} {
		steps = append(steps, ns(n, "link", "set", "lo", "up"), ns(n, "link", "set", "eth0", "up"))
	}
	steps = append(steps,
		ns(s.node, "link", "set", "c0", "up"),
		ns(s.node, "link", "set", "e0", "up"),
		// As the lab's nodes have it: the service range on-link.
		ns(s.node, "route", "add", serviceCIDR.String(), "dev", "eth0"),
		ns(s.node, "route", "add", endpointsRange, "via", epLinkIP),
		ns(s.client, "route", "add", "default", "via", clientGW),
		ns(s.ep, "route", "add", "default", "via", epLinkGW),
		ns(s.ep, "route", "add", "local", endpointsRange, "dev", "lo"),
		sysctl(s.node, "net.ipv4.ip_forward=1"),
		sysctl(s.client, "net.ipv4.ip_local_port_range=1024 65535"),
	)
	for _, st := range steps {
		if _, err := run(st...); err != nil {
			return err
		}
	}
	var err error
	if s.server, err = s.startIn(s.ep, "server", logDir, nil, self, "serve", "-port", strconv.Itoa(endpointPort)); err != nil {
		return err
	}
	s.prober, err = startProber(s, self, logDir)
	return err
}

// startIn starts argv in namespace n (ip execs it: same PID), its stderr
// (and without prep its stdout) to a log, recording its PID for the
// script's cleanup; prep sets up pipes before the start.
func (s *site) startIn(n, name, logDir string, prep func(*exec.Cmd) error, argv ...string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(logDir, s.node+"-"+name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n}, argv...)...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if prep == nil {
		cmd.Stdout = logf
	} else if err := prep(cmd); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s in %s: %w", name, n, err)
	}
	_ = os.WriteFile(s.pidFile(name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	return cmd, nil
}

func (s *site) pidFile(name string) string { return filepath.Join(s.pidDir, s.node+"-"+name+".pid") }

func (s *site) remove() {
	if s.prober != nil {
		s.prober.stop()
	}
	if s.server != nil && s.server.Process != nil {
		_ = s.server.Process.Kill()
		_ = s.server.Wait()
		_ = os.Remove(s.pidFile("server"))
	}
	_ = exec.Command("ip", "link", "del", s.hostVeth).Run()
	for _, n := range []string{s.node, s.client, s.ep} {
		_ = exec.Command("ip", "netns", "del", n).Run()
	}
}

// prober is the client namespace's prober process: requests and answers
// as JSON lines on its stdin and stdout, one at a time.
type prober struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	pidF string
}

func startProber(s *site, self, logDir string) (*prober, error) {
	p := &prober{pidF: s.pidFile("prober")}
	cmd, err := s.startIn(s.client, "prober", logDir, func(cmd *exec.Cmd) error {
		var err error
		if p.in, err = cmd.StdinPipe(); err != nil {
			return err
		}
		out, err := cmd.StdoutPipe()
		p.out = bufio.NewScanner(out)
		return err
	}, self, "prober")
	if err != nil {
		return nil, err
	}
	p.cmd = cmd
	p.out.Buffer(make([]byte, 1<<20), 1<<20)
	return p, nil
}

// do sends one request and waits for its answer.
func (p *prober) do(req probeReq) (probeResp, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return probeResp{}, fmt.Errorf("prober: %w", err)
	}
	if !p.out.Scan() {
		return probeResp{}, fmt.Errorf("prober exited: %v", p.out.Err())
	}
	var resp probeResp
	if err := json.Unmarshal(p.out.Bytes(), &resp); err != nil {
		return resp, fmt.Errorf("prober answer %q: %w", p.out.Text(), err)
	}
	if resp.Err != "" {
		return resp, fmt.Errorf("%s", resp.Err)
	}
	return resp, nil
}

func (p *prober) stop() {
	_ = p.in.Close() // the prober exits at EOF
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	_ = os.Remove(p.pidF)
}
