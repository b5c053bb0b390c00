package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// node is one of the run's namespaces with its veth on the lab's bridge.
type node struct {
	netns    string // under /run/netns
	hostVeth string
	ip       netip.Addr
	name     string // the Node name the proxy is told (hostnameOverride)
}

func run(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// createNode makes the namespace and its veth on bridge; remove undoes it.
func createNode(n *node, bridge string, prefixLen int, serviceCIDR netip.Prefix) error {
	steps := [][]string{
		{"ip", "netns", "add", n.netns},
		{"ip", "link", "add", n.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", n.netns},
		{"ip", "link", "set", n.hostVeth, "master", bridge, "up"},
		{"ip", "-n", n.netns, "link", "set", "lo", "up"},
		{"ip", "-n", n.netns, "addr", "add", netip.PrefixFrom(n.ip, prefixLen).String(), "dev", "eth0"},
		{"ip", "-n", n.netns, "link", "set", "eth0", "up"},
		// As the lab's nodes have it: the service range on-link.
		{"ip", "-n", n.netns, "route", "add", serviceCIDR.String(), "dev", "eth0"},
	}
	for _, s := range steps {
		if _, err := run(s...); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) remove() {
	_ = exec.Command("ip", "link", "del", n.hostVeth).Run()
	_ = exec.Command("ip", "netns", "del", n.netns).Run()
}

// proxy is one measured proxy: its namespace, how to start it, and where
// its rules and metrics are.
type proxy struct {
	label        string // "kube-proxy" or "flatnet"
	node         *node
	table        string // its nftables table (family ip)
	metricPrefix string // "kubeproxy_" or "flatnet_"
	argv         func(config string) []string
	dir          string // config and logs
	pidDir       string // one file per running process, for the script's cleanup

	cmd     *exec.Cmd
	done    chan struct{}
	started time.Time
	logs    int
}

// deleteTables removes the proxy's tables in its namespace, so that a
// cold start programs from nothing.
func (p *proxy) deleteTables() {
	for _, fam := range []string{"ip", "ip6"} {
		_, _ = p.nft("delete", "table", fam, p.table)
	}
}

// start starts the proxy with the configuration given.
func (p *proxy) start(config string) error {
	if p.cmd != nil {
		return fmt.Errorf("%s already running", p.label)
	}
	p.logs++
	logPath := filepath.Join(p.dir, fmt.Sprintf("%s-%d.log", p.label, p.logs))
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"netns", "exec", p.node.netns}, p.argv(config)...)
	cmd := exec.Command("ip", args...) // ip execs the proxy: same PID
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.label, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	_ = os.WriteFile(filepath.Join(p.pidDir, p.label+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	go func() { _ = cmd.Wait(); close(p.done) }()
	return nil
}

func (p *proxy) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the proxy's PID, SIGKILL after 10 s.
func (p *proxy) stop() {
	if p.cmd == nil {
		return
	}
	if p.running() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.Remove(filepath.Join(p.pidDir, p.label+".pid"))
	p.cmd = nil
}

func (p *proxy) pid() int { return p.cmd.Process.Pid }

func (p *proxy) nft(args ...string) (string, error) {
	return run(append([]string{"ip", "netns", "exec", p.node.netns, "nft"}, args...)...)
}

// servicePorts counts the elements of the proxy's service-ips map that
// lead to a chain of a Service in namespace ns: every chain name carries
// namespace/name/protocol/port, in kube-proxy's tables and flatnet's.
func (p *proxy) servicePorts(ns string) (int, error) {
	out, err := p.nft("list", "map", "ip", p.table, "service-ips")
	if err != nil {
		return 0, err
	}
	return strings.Count(out, "-"+ns+"/"), nil
}

var gotoRE = regexp.MustCompile(`goto ([^ ,}\n]+)`)

// serviceChain is the chain service-ips sends ip:port/tcp to.
func (p *proxy) serviceChain(ip string, port int32) (string, error) {
	out, err := p.nft("get", "element", "ip", p.table, "service-ips", fmt.Sprintf("{ %s . tcp . %d }", ip, port))
	if err != nil {
		return "", err
	}
	m := gotoRE.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s: no goto in service-ips element for %s: %s", p.label, ip, out)
	}
	return m[1], nil
}

// chainHasEndpoint reports whether chain dispatches to endpoint ip:port:
// through an endpoint chain (both proxies name it ...__<ip>/<port>) or, as
// kube-proxy v1.37 does when no endpoint needs rules of its own, with a
// dnat map straight from the service chain (`0 : <ip> . <port>`).
func (p *proxy) chainHasEndpoint(chain, ip string, port int32) (bool, error) {
	out, err := p.nft("list", "chain", "ip", p.table, chain)
	if err != nil {
		return false, err
	}
	return hasEndpoint(out, ip, port), nil
}

func hasEndpoint(listing, ip string, port int32) bool {
	re := regexp.MustCompile(fmt.Sprintf(`(__|\s)%s(/| \. )%d\b`, regexp.QuoteMeta(ip), port))
	return re.MatchString(listing)
}

// tableSize counts the proxy's IPv4 table: chains, rules, map and set
// elements (from nft -j) and the lines and bytes of `nft list table`.
type tableSize struct {
	Chains, Rules, Elements, Lines, Bytes int
}

func (p *proxy) tableSize() (tableSize, error) {
	var s tableSize
	text, err := p.nft("list", "table", "ip", p.table)
	if err != nil {
		return s, err
	}
	s.Bytes = len(text)
	s.Lines = strings.Count(text, "\n")
	js, err := p.nft("-j", "list", "table", "ip", p.table)
	if err != nil {
		return s, err
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		return s, fmt.Errorf("nft -j list table ip %s: %w", p.table, err)
	}
	for _, o := range doc.Nftables {
		for k, v := range o {
			switch k {
			case "chain":
				s.Chains++
			case "rule":
				s.Rules++
			case "map", "set":
				var m struct {
					Elem []json.RawMessage `json:"elem"`
				}
				if err := json.Unmarshal(v, &m); err != nil {
					return s, err
				}
				s.Elements += len(m.Elem)
			}
		}
	}
	return s, nil
}

// histogram is the IPv4 (or unlabelled) sum and count of one histogram.
type histogram struct{ Sum, Count float64 }

// metrics scrapes the proxy's /metrics inside its namespace and returns
// every _sum and _count of the histograms named (without prefix).
func (p *proxy) metrics(addr string, names ...string) (map[string]histogram, error) {
	out, err := run("ip", "netns", "exec", p.node.netns, "curl", "-sf", "--max-time", "5", "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	return parseHistograms(out, p.metricPrefix, names...), nil
}

// parseHistograms reads prefix+name_sum and _count for each name from a
// Prometheus text exposition, skipping IPv6 series (the proxies keep one
// series per family; the benchmark's Services are IPv4).
func parseHistograms(text, prefix string, names ...string) map[string]histogram {
	res := map[string]histogram{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.Contains(line, `ip_family="IPv6"`) {
			continue
		}
		for _, n := range names {
			for _, suf := range []string{"_sum", "_count"} {
				full := prefix + n + suf
				if !strings.HasPrefix(line, full) {
					continue
				}
				rest := line[len(full):]
				if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
					continue
				}
				f := strings.Fields(rest)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					continue
				}
				h := res[n]
				if suf == "_sum" {
					h.Sum += v
				} else {
					h.Count += v
				}
				res[n] = h
			}
		}
	}
	return res
}

// procStats are a process's CPU seconds (user+system) and resident memory.
func procStats(pid int) (cpu float64, rssMiB float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	// Fields after the command: state is f[0]; utime, stime are fields 14, 15 (f[11], f[12]).
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	const hz = 100 // USER_HZ on Linux
	cpu = (ut + st) / hz
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return cpu, 0, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			rssMiB = kb / 1024
		}
	}
	return cpu, rssMiB, nil
}

// poll calls cond until it returns true, an error, or ctx ends.
func poll(ctx context.Context, every time.Duration, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
