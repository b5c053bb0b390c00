package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func run(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// proxy is one measured proxy: its namespace, how to start it, and where
// its rules and metrics are.
type proxy struct {
	label        string // kind-mode, e.g. "kube-proxy-nftables"
	kind         string // "kube-proxy" or "flatnet"
	mode         string // its KubeProxyConfiguration mode: nftables, iptables, userspace
	nodeName     string // the Node it is (hostnameOverride)
	table        string // nftables modes: its table (family ip)
	metricPrefix string // "kubeproxy_" or "flatnet_"
	argv         func(config string) []string
	dir          string // config and logs
	pidDir       string // one file per running process, for the script's cleanup

	// unavailable is set when the binary refused the mode: the error, and
	// the proxy is skipped for the rest of the run.
	unavailable string

	site    *site    // where it runs now
	n       int      // at how many Services
	mon     *monitor // its kernel modes' monitor there
	cmd     *exec.Cmd
	done    chan struct{}
	started time.Time
	logs    int
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
	args := append([]string{"netns", "exec", p.site.node}, p.argv(config)...)
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

// in runs argv in the proxy's namespace.
func (p *proxy) in(argv ...string) (string, error) {
	return run(append([]string{"ip", "netns", "exec", p.site.node}, argv...)...)
}

func (p *proxy) nft(args ...string) (string, error) { return p.in(append([]string{"nft"}, args...)...) }

// lastLogLine is the last non-empty line of the proxy's current log (why
// it exited).
func (p *proxy) lastLogLine() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, fmt.Sprintf("%s-%d.log", p.label, p.logs)))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// tableSize counts the proxy's IPv4 table: chains, rules, map and set
// elements (from nft -j) and the lines and bytes of `nft list table`.
type tableSize struct {
	Chains, Rules, Elements, Lines, Bytes int
}

// rules counts what the proxy installed for its Services: nftables
// rules of its table, iptables rules (nat and filter, both proxies'
// chains and the built-in ones), or listening sockets (userspace).
func (p *proxy) rules() (int, error) {
	switch p.mode {
	case "nftables":
		s, err := p.tableSize()
		return s.Rules, err
	case "iptables":
		out, err := p.in("iptables-save")
		return strings.Count(out, "\n-A "), err
	default:
		out, err := p.in("ss", "-Hltn")
		return strings.Count(strings.TrimSpace(out), "\n") + 1, err
	}
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
	out, err := p.in("curl", "-sf", "--max-time", "5", "http://"+addr+"/metrics")
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

// procStats are a process's CPU seconds (user+system, its own and its
// waited-for children's: kube-proxy's nft and iptables-restore, whose
// work, parsing and the kernel's commit, is done in the process that sends
// the transaction), resident memory and its peak so far (VmHWM).
func procStats(pid int) (st procStat, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return st, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	// Fields after the command: state is f[0]; utime, stime are fields 14, 15 (f[11], f[12]).
	const hz = 100                            // USER_HZ on Linux
	for _, i := range []int{11, 12, 13, 14} { // utime stime cutime cstime
		v, _ := strconv.ParseFloat(f[i], 64)
		st.cpu += v / hz
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		var dst *float64
		switch {
		case strings.HasPrefix(l, "VmRSS:"):
			dst = &st.rssMiB
		case strings.HasPrefix(l, "VmHWM:"):
			dst = &st.peakMiB
		default:
			continue
		}
		kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
		*dst = kb / 1024
	}
	return st, nil
}

type procStat struct{ cpu, rssMiB, peakMiB float64 }

// settledStats is procStats once pid has no child left (at most 5 s on),
// so that the CPU of a child that did the work just measured, and has
// exited, is in it; the note says when a child was still running.
func settledStats(pid int) (procStat, string) {
	deadline := time.Now().Add(5 * time.Second)
	for hasChildren(pid) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	st, _ := procStats(pid)
	if hasChildren(pid) {
		return st, "a child process was still running 5 s on; its CPU is not in the figure"
	}
	return st, ""
}

// hasChildren reports whether pid has a child process (any thread's).
func hasChildren(pid int) bool {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return true
		}
	}
	return false
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
