package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	discovery "k8s.io/api/discovery/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/proc"
)

// The KubeProxyConfiguration every proxy reads; only mode and
// hostnameOverride differ. Both the iptables and the nftables sections
// carry the same periods, whichever mode reads them. conntrack's zeros
// leave the namespace's sysctls as they are (kube-proxy would set them
// inside its namespace otherwise; flatnet ignores the section).
// nodePortAddresses 0.0.0.0/0: every address for both (flatnet's default;
// kube-proxy's nftables default, the node's primary IPs, is one flatnet
// refuses); no NodePorts are measured.
const configTemplate = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
hostnameOverride: %s
clusterCIDR: %s
mode: %s
iptables:
  minSyncPeriod: %s
  syncPeriod: 30s
nftables:
  minSyncPeriod: %s
  syncPeriod: 30s
metricsBindAddress: 127.0.0.1:%d
healthzBindAddress: 127.0.0.1:%d
nodePortAddresses: ["0.0.0.0/0"]
detectLocalMode: ClusterCIDR
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

const (
	metricsPort = 10249
	healthzPort = 10256
	// clusterCIDR covers the lab's pods, the client (10.245.255.2) and
	// the endpoints (10.246.0.0/15).
	clusterCIDR = "10.244.0.0/14"
)

// allModes are the proxies -modes chooses from, in table order.
var allModes = []string{"kube-proxy-nftables", "kube-proxy-iptables", "flatnet-nftables", "flatnet-iptables", "flatnet-userspace"}

var histograms = []string{
	"sync_proxy_rules_duration_seconds",
	"sync_full_proxy_rules_duration_seconds",
	"sync_partial_proxy_rules_duration_seconds",
	"network_programming_duration_seconds",
}

type runner struct {
	ctx     context.Context
	lab     *lab.Spec
	objs    *objects
	proxies []*proxy
	configs map[*proxy]string
	self    string // this binary, for the site's helpers
	prefix  string
	nodeIP  netip.Addr
	dir     string
	pidDir  string
	out     *os.File
	reps    int
	burst   int
	timeout time.Duration
	minSync string
	run     string
	dp      probeReq // the data path's load (without Addr)
	// profiles, when set, is where each proxy's heap profile after its
	// cold start is written (enableProfiling set for every proxy alike).
	profiles string
}

// result is one JSON line of the results.
type result struct {
	Run     string  `json:"run"` // the run's start (report shows the last run)
	Proxy   string  `json:"proxy"`
	N       int     `json:"n"`
	MinSync string  `json:"minSync,omitempty"`
	Metric  string  `json:"metric"`
	Value   float64 `json:"value"`
	Rep     int     `json:"rep,omitempty"`
	Note    string  `json:"note,omitempty"`
}

func (r *runner) record(res result) {
	res.MinSync, res.Run = r.minSync, r.run
	b, _ := json.Marshal(res)
	fmt.Fprintln(r.out, string(b))
}

func logf(format string, args ...any) {
	fmt.Printf("proxybench: "+format+"\n", args...)
}

// unavailableError is a proxy that exited before programming anything:
// the binary refused its mode (or could not run it here).
type unavailableError struct{ msg string }

func (e unavailableError) Error() string { return "not available: " + e.msg }

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var (
		stateDir   = fs.String("state-dir", "", "the lab's --state-dir")
		labName    = fs.String("lab", "", "the lab's --name")
		prefix     = fs.String("prefix", "pb", "prefix of this run's namespace and interface names (unique per run, at most 12 characters)")
		kubeProxy  = fs.String("kube-proxy", "", "the kube-proxy binary")
		flatnet    = fs.String("flatnet", "bin/flatnet", "the flatnet binary")
		modes      = fs.String("modes", strings.Join(allModes, ","), "proxies to measure: any of "+strings.Join(allModes, ","))
		sizes      = fs.String("sizes", "1000,5000,10000", "numbers of Services, ascending")
		endpoints  = fs.Int("endpoints", 3, "endpoints per Service")
		reps       = fs.Int("reps", 50, "single endpoint changes per proxy and size")
		burst      = fs.Int("burst", 1000, "endpoint changes in the burst (issued over one second)")
		minSync    = fs.String("min-sync", "1s", "min sync period (every proxy alike)")
		dpBase     = fs.Int("dp-base", 10, "Services installed for the data path's baseline")
		dpDur      = fs.Duration("dp-duration", 5*time.Second, "data path: longest run")
		dpMax      = fs.Int("dp-max", 150000, "data path: most connections")
		dpConc     = fs.Int("dp-conc", 4, "data path: connections at a time")
		workers    = fs.Int("workers", 16, "concurrent creates and burst updates")
		dir        = fs.String("dir", "", "working directory (configs, logs, pid files)")
		resultPath = fs.String("out", "", "results (JSON lines, appended)")
		timeout    = fs.Duration("timeout", 5*time.Minute, "longest wait for a proxy to program what it is waited for")
		profiles   = fs.String("profiles", "", "write each proxy's heap profile (/debug/pprof/heap, enableProfiling: true for every proxy) after its cold start to this directory")
	)
	_ = fs.Parse(args)
	if *stateDir == "" || *labName == "" || *kubeProxy == "" || *dir == "" || *resultPath == "" {
		return fmt.Errorf("run: -state-dir, -lab, -kube-proxy, -dir and -out are required")
	}
	if len(*prefix) > 12 {
		return fmt.Errorf("-prefix %q: at most 12 characters (interface names)", *prefix)
	}
	ns := []int{*dpBase}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= ns[len(ns)-1] {
			return fmt.Errorf("-sizes %q: ascending, each above -dp-base %d", *sizes, *dpBase)
		}
		ns = append(ns, n)
	}
	if _, err := time.ParseDuration(*minSync); err != nil {
		return fmt.Errorf("-min-sync %q: %w", *minSync, err)
	}
	var chosen []string
	for _, m := range strings.Split(*modes, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(allModes, m) {
			return fmt.Errorf("-modes: %q is not one of %s", m, strings.Join(allModes, ","))
		}
		chosen = append(chosen, m)
	}
	if slices.ContainsFunc(chosen, func(m string) bool { return strings.HasSuffix(m, "-iptables") }) {
		// The monitor sees iptables rules only as nftables rules.
		if v, err := run("iptables", "--version"); err != nil || !strings.Contains(v, "nf_tables") {
			return fmt.Errorf("iptables modes need iptables-nft (the run watches their rules with nft monitor); iptables --version: %q %v", strings.TrimSpace(v), err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	spec, err := lab.LoadSpec(*stateDir, *labName)
	if err != nil {
		return err
	}
	c, err := newClient(spec.Kubeconfig())
	if err != nil {
		return err
	}
	out, err := os.OpenFile(*resultPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	pidDir := filepath.Join(*dir, "pids")
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return err
	}

	// The site's node, on the lab's underlay at .230.
	nodeIP := spec.Underlay.Masked().Addr()
	for range 230 {
		nodeIP = nodeIP.Next()
	}
	for _, n := range spec.Nodes {
		if n.IP == nodeIP {
			return fmt.Errorf("%s is lab node %s's address", nodeIP, n.Name)
		}
	}
	cidr := netip.MustParsePrefix(clusterCIDR)
	for _, p := range []netip.Prefix{spec.ClusterCIDR, netip.MustParsePrefix(endpointsRange), netip.MustParsePrefix(clientIP + "/32")} {
		if !cidr.Contains(p.Addr()) || p.Bits() < cidr.Bits() {
			return fmt.Errorf("cluster CIDR %s does not cover %s", cidr, p)
		}
	}
	if spec.ServiceCIDR.Overlaps(cidr) {
		return fmt.Errorf("the lab's service CIDR %s overlaps the run's cluster CIDR %s", spec.ServiceCIDR, cidr)
	}

	objs := &objects{c: c, ns: benchNamespace, endpoints: *endpoints, workers: *workers, clusterIPs: map[int]string{}, slices: map[int]*discovery.EndpointSlice{}}
	if err := objs.ensureNamespace(ctx); err != nil {
		return err
	}

	// The lab's node agents proxy every Service too: paused while measuring.
	for _, n := range spec.Nodes {
		pid, ok := proc.Running(spec.StateDir, lab.AgentProc(n.Name))
		if !ok {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("pausing lab agent %d: %w", pid, err)
		}
		_ = os.WriteFile(filepath.Join(pidDir, "paused-"+strconv.Itoa(pid)), nil, 0o644)
		logf("lab agent of %s (pid %d) paused (SIGSTOP) for the run", n.Name, pid)
		defer func() {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = os.Remove(filepath.Join(pidDir, "paused-"+strconv.Itoa(pid)))
		}()
	}

	r := &runner{ctx: ctx, lab: spec, objs: objs, configs: map[*proxy]string{}, self: self, prefix: *prefix, nodeIP: nodeIP,
		dir: *dir, pidDir: pidDir, out: out, reps: *reps, burst: *burst, timeout: *timeout, minSync: *minSync, run: time.Now().UTC().Format(time.RFC3339),
		dp: probeReq{Op: "load", Duration: *dpDur, Max: *dpMax, Conc: *dpConc}, profiles: *profiles}
	for i, label := range chosen {
		kind, mode, _ := strings.Cut(strings.TrimPrefix(label, "kube-proxy-"), "-")
		p := &proxy{label: label, kind: "flatnet", mode: mode, table: "flatnet-proxy", metricPrefix: "flatnet_", dir: *dir, pidDir: pidDir,
			nodeName: fmt.Sprintf("%s-%d", *prefix, i),
			argv:     func(cfg string) []string { return []string{*flatnet, "agent", "--proxy-only", "--config", cfg} }}
		if strings.HasPrefix(label, "kube-proxy-") {
			p.kind, p.mode, p.table, p.metricPrefix = "kube-proxy", kind, "kube-proxy", "kubeproxy_"
			p.argv = func(cfg string) []string { return []string{*kubeProxy, "--config", cfg} }
		}
		path := filepath.Join(*dir, label+".yaml")
		cfg := fmt.Appendf(nil, configTemplate, spec.Kubeconfig(), p.nodeName, clusterCIDR, p.mode, *minSync, *minSync, metricsPort, healthzPort)
		if *profiles != "" {
			cfg = append(cfg, "enableProfiling: true\n"...)
		}
		if err := os.WriteFile(path, cfg, 0o644); err != nil {
			return err
		}
		if err := objs.ensureNode(ctx, p.nodeName, nodeIP); err != nil {
			return err
		}
		defer objs.deleteNode(context.Background(), p.nodeName)
		r.proxies = append(r.proxies, p)
		r.configs[p] = path
	}
	defer func() {
		for _, p := range r.proxies {
			p.stop()
		}
	}()

	have := 0
	for _, n := range ns {
		if err := r.size(have, n, n == *dpBase); err != nil {
			return err
		}
		have = n
	}
	return nil
}

// size creates Services have..n-1 and measures each proxy at n.
func (r *runner) size(have, n int, baseline bool) error {
	logf("N=%d: creating Services %d..%d with %d endpoints each", n, have, n-1, r.objs.endpoints)
	t0 := time.Now()
	last, err := r.objs.create(r.ctx, have, n)
	if err != nil {
		return err
	}
	logf("N=%d: created %d Services and slices in %.1fs", n, n-have, last.Sub(t0).Seconds())
	r.record(result{Proxy: "api", N: n, Metric: "create_s", Value: last.Sub(t0).Seconds(), Note: fmt.Sprintf("%d Services + slices", n-have)})
	for _, p := range r.proxies {
		if p.unavailable != "" {
			continue
		}
		err := r.measure(p, n, baseline)
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		var un unavailableError
		switch {
		case errors.As(err, &un):
			p.unavailable = un.msg
			logf("N=%d: %s %v: skipped for the rest of the run", n, p.label, un)
			r.record(result{Proxy: p.label, N: n, Metric: "unavailable", Note: un.msg})
		case err != nil:
			logf("N=%d: %s FAILED: %v", n, p.label, err)
			r.record(result{Proxy: p.label, N: n, Metric: "error", Note: err.Error()})
		}
	}
	return nil
}

// measure runs p alone on a fresh site at n Services: cold start, then
// (baseline: only the data path) memory and full sync, single endpoint
// changes, the burst, the data path.
func (r *runner) measure(p *proxy, n int, baseline bool) (err error) {
	rec := func(metric string, v float64, note string) {
		r.record(result{Proxy: p.label, N: n, Metric: metric, Value: v, Note: note})
	}
	s := newSite(r.prefix, r.nodeIP, r.pidDir)
	defer s.remove()
	if err := s.create(r.lab.Bridge, r.lab.Underlay.Bits(), r.lab.ServiceCIDR, r.self, r.dir); err != nil {
		return err
	}
	p.site, p.n = s, n
	want := r.objs.wantIPs(n)

	// 1. cold start.
	p.mon = nil
	if p.mode != "userspace" {
		set := ""
		if p.mode == "nftables" {
			set = "service-ips"
		}
		if p.mon, err = startMonitor(r.ctx, r.self, s.node, r.lab.ServiceCIDR, want, set); err != nil {
			return err
		}
	}
	defer func() {
		if p.mon != nil {
			p.mon.stop()
			p.mon = nil
		}
	}()
	if err := p.start(r.configs[p]); err != nil {
		return err
	}
	defer p.stop()
	at, seen, err := r.waitPrograms(p, want)
	if err != nil {
		if !p.running() && seen == 0 {
			return unavailableError{p.lastLogLine()}
		}
		return err
	}
	// The rules are in the kernel as soon as the committing process has
	// sent them, but kube-proxy's nft or iptables-restore counts in its
	// CPU only once reaped: wait for that.
	st0, note := settledStats(p.pid())
	cpu := st0.cpu
	// Reachable: the first and the last Service answer from one of their
	// endpoints, through the client namespace.
	if err := r.reach(p, []int{0, n - 1}, nil, 1000); err != nil {
		return fmt.Errorf("all %d programmed, but: %w", n, err)
	}
	reached := time.Now()
	rec("cold_start_s", reached.Sub(p.started).Seconds(), fmt.Sprintf("programmed at %.3fs", at.Sub(p.started).Seconds()))
	rec("cold_start_cpu_s", cpu, note)
	time.Sleep(2 * time.Second) // the first sync's metrics written; the proxy idle
	st, _ := procStats(p.pid())
	rss := st.rssMiB
	rec("rss_mib", rss, "")
	// The peak too: a proxy could return its cold start's transient memory
	// to the kernel before the 2 s are up, and the peak is what a memory
	// limit must allow.
	rec("rss_peak_mib", st.peakMiB, "")
	if r.profiles != "" {
		path := filepath.Join(r.profiles, fmt.Sprintf("%s-%d.heap", p.label, n))
		if _, err := p.in("curl", "-sf", "--max-time", "20", "-o", path, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", metricsPort)); err != nil {
			logf("N=%d: %s: no heap profile: %v", n, p.label, err)
		}
	}
	full := histogram{}
	if m, err := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...); err == nil {
		full = m["sync_full_proxy_rules_duration_seconds"]
		if full.Count > 0 {
			rec("full_sync_s", full.Sum/full.Count, fmt.Sprintf("mean of %.0f full syncs", full.Count))
		}
	}
	logf("N=%d: %s cold start %.2fs to all programmed, %.2fs to reachable (%.2f CPU s), full sync %.3fs, RSS %.0f MiB",
		n, p.label, at.Sub(p.started).Seconds(), reached.Sub(p.started).Seconds(), cpu, full.Sum/max(full.Count, 1), rss)

	if !baseline {
		if k, err := p.rules(); err == nil {
			rec("rules", float64(k), "")
		}
		if err := r.changes(p, n); err != nil {
			return err
		}
		if err := r.burstChanges(p, n); err != nil {
			return err
		}
	}
	return r.dataPath(p, n)
}

// waitPrograms waits until every ClusterIP in want is programmed: seen by
// the monitor (kernel modes) or listened on (userspace, polling ss every
// 200 ms: a socket listing, not a rule listing, cheap at 10,000). It
// returns when the last was, and how many were.
func (r *runner) waitPrograms(p *proxy, want map[string]bool) (time.Time, int, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
	defer cancel()
	if m := p.mon; m != nil {
		exited := make(chan struct{})
		go func() {
			select {
			case <-p.done:
				cancel()
			case <-exited:
			}
		}()
		at, seen, err := m.waitPorts(ctx, len(want))
		close(exited)
		if errors.Is(err, errLost) {
			re := nftSvcRE
			if p.mode == "iptables" {
				re = iptSvcRE
			}
			return r.fallback(ctx, p, "cold start", func(l string) bool {
				got := map[string]bool{}
				for _, e := range re.FindAllStringSubmatch(l, -1) {
					if want[e[1]] {
						got[e[1]] = true
					}
				}
				seen = len(got)
				return seen >= len(want)
			})
		}
		if err != nil {
			return at, seen, fmt.Errorf("%s: %d of %d service ports programmed: %w (running: %v; logs in %s)", p.label, seen, len(want), err, p.running(), r.dir)
		}
		return at, seen, nil
	}
	var at time.Time
	seen := 0
	err := poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("%s exited", p.label)
		}
		out, err := p.in("ss", "-Hltn")
		if err != nil {
			return false, err
		}
		now := time.Now()
		seen = 0
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) < 4 {
				continue
			}
			if ip, port, ok := strings.Cut(f[3], ":"); ok && port == strconv.Itoa(servicePort) && want[ip] {
				seen++
			}
		}
		at = now
		return seen >= len(want), nil
	})
	if err != nil {
		return at, seen, fmt.Errorf("%s: %d of %d service ports listened on: %w (logs in %s)", p.label, seen, len(want), err, r.dir)
	}
	return at, seen, nil
}

// fallback is what a wait does when the kernel dropped notifications:
// `nft list ruleset` in the proxy's namespace every second (seconds of CPU
// at 10,000 Services, so only then) until done holds for it; the monitor
// is replaced for the next wait, and the fallback recorded.
func (r *runner) fallback(ctx context.Context, p *proxy, step string, done func(listing string) bool) (time.Time, int, error) {
	logf("%s: %s: the kernel dropped notifications; polling nft list ruleset instead (coarser)", p.label, step)
	r.record(result{Proxy: p.label, N: p.n, Metric: "monitor_lost", Note: step})
	nm, err := startMonitor(r.ctx, r.self, p.site.node, r.lab.ServiceCIDR, p.mon.want, p.mon.set)
	if err != nil {
		return time.Time{}, 0, err
	}
	p.mon.stop()
	p.mon = nm
	var at time.Time
	err = poll(ctx, time.Second, func() (bool, error) {
		out, err := p.nft("list", "ruleset")
		if err != nil {
			return false, err
		}
		at = time.Now()
		return done(out), nil
	})
	return at, 0, err
}

// reach checks that each Service in idx answers through the client
// namespace: from one of its endpoints, or from want[j] when given.
func (r *runner) reach(p *proxy, idx []int, want []string, tries int) error {
	req := probeReq{Op: "probe", Tries: tries, Par: 8, Timeout: r.timeout}
	for j, i := range idx {
		t := probeTarget{Addr: fmt.Sprintf("%s:%d", r.objs.clusterIP(i), servicePort), Want: r.objs.endpointsOf(i)}
		if want != nil {
			t.Want = []string{want[j]}
		}
		req.Targets = append(req.Targets, t)
	}
	_, err := p.site.prober.do(req)
	if err != nil {
		return fmt.Errorf("%s: connecting: %w", p.label, err)
	}
	return nil
}

// changes replaces one endpoint of one Service REPS times, each timed from
// the API call to the kernel (the monitor: a rule or element naming the
// new address) and to a connection answered by the new endpoint (the
// prober connecting every 2 ms from the API call on). In userspace mode
// there is no kernel change: programmed is answering.
func (r *runner) changes(p *proxy, n int) error {
	minDur, _ := time.ParseDuration(r.minSync)
	var kernel, conns, progs []float64
	for rep := 1; rep <= r.reps; rep++ {
		time.Sleep(max(minDur, 500*time.Millisecond) + 200*time.Millisecond) // idle, past the min sync period (after the 0.5 s below)
		i := 1 + (rep*7919+n/3)%(n-1)                                        // spread over the Services, never the data path's
		newIP, err := r.objs.newEndpoint()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("%s:%d", r.objs.clusterIP(i), servicePort)
		// Metrics are optional: a failed scrape leaves their rows out.
		before, _ := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...)
		var t0, seen, conn time.Time
		var oldIP string
		update := func() (err error) {
			oldIP, t0, err = r.objs.setEndpoint(r.ctx, i, newIP)
			return err
		}
		// The prober connects from the API call on, every 2 ms, until the
		// new endpoint answers (1 in 3 connections once programmed: the
		// proxies pick at random or in turn).
		probe := probeReq{Op: "probe", Targets: []probeTarget{{Addr: addr, Want: []string{newIP}}}, Tries: 1 << 30, Gap: 2 * time.Millisecond, Timeout: r.timeout}
		answered := make(chan error, 1)
		go func() {
			_, err := p.site.prober.do(probe)
			conn = time.Now()
			answered <- err
		}()
		if p.mon != nil {
			ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
			seen, err = r.waitEndpoints(ctx, p, "change", []string{newIP}, update)
			cancel()
			if err != nil {
				return fmt.Errorf("%s: Service %d, %s replacing %s: %w", p.label, i, newIP, oldIP, err)
			}
		} else if err := update(); err != nil {
			return err
		}
		if err := <-answered; err != nil {
			return fmt.Errorf("%s: Service %d, %s replacing %s: not answering: %w", p.label, i, newIP, oldIP, err)
		}
		if p.mon == nil {
			seen = conn // userspace: programmed is answering
		}
		k, c := seen.Sub(t0).Seconds(), conn.Sub(t0).Seconds()
		time.Sleep(500 * time.Millisecond) // the sync that programmed it has returned: its metrics
		after, _ := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...)
		d := func(name string) (float64, float64) {
			if before == nil || after == nil {
				return 0, 0
			}
			return after[name].Sum - before[name].Sum, after[name].Count - before[name].Count
		}
		r.record(result{Proxy: p.label, N: n, Metric: "change_s", Value: k, Rep: rep})
		r.record(result{Proxy: p.label, N: n, Metric: "change_connect_s", Value: c, Rep: rep})
		kernel, conns = append(kernel, k), append(conns, c)
		if ss, sc := d("sync_proxy_rules_duration_seconds"); sc > 0 {
			_, pc := d("sync_partial_proxy_rules_duration_seconds")
			r.record(result{Proxy: p.label, N: n, Metric: "change_sync_s", Value: ss / sc, Rep: rep, Note: fmt.Sprintf("%.0f syncs (%.0f partial)", sc, pc)})
		}
		if ps, pc := d("network_programming_duration_seconds"); pc > 0 {
			r.record(result{Proxy: p.label, N: n, Metric: "change_netprog_s", Value: ps / pc, Rep: rep})
			progs = append(progs, ps/pc)
		}
	}
	sort.Float64s(kernel)
	logf("N=%d: %s one endpoint change: programmed median %.1f ms p99 %.1f ms, answering median %.1f ms, network programming %.1f ms (%d changes)",
		n, p.label, 1000*median(kernel), 1000*percentile(kernel, 99), 1000*median(conns), 1000*median(progs), r.reps)
	return nil
}

// waitEndpoints is the monitor's waitEndpoints, with the fallback.
func (r *runner) waitEndpoints(ctx context.Context, p *proxy, step string, ips []string, during func() error) (time.Time, error) {
	at, err := p.mon.waitEndpoints(ctx, ips, during)
	if !errors.Is(err, errLost) {
		return at, err
	}
	at, _, err = r.fallback(ctx, p, step, func(l string) bool {
		got := map[string]bool{}
		for _, e := range endpointRE.FindAllStringSubmatch(l, -1) {
			got[e[1]] = true
		}
		for _, ip := range ips {
			if !got[ip] {
				return false
			}
		}
		return true
	})
	return at, err
}

// burstChanges replaces one endpoint in each of BURST Services, issued
// evenly over one second (WORKERS at a time), and times from the last
// update's return until all are programmed (monitor; userspace: each
// Service answered by its new endpoint, the prober sweeping them 8 at a
// time), with the proxy's CPU from the burst's start until then.
func (r *runner) burstChanges(p *proxy, n int) error {
	k := min(r.burst, n-1)
	idx := make([]int, k)
	ips := make([]string, k)
	for j := range idx {
		idx[j] = 1 + j*(n-1)/k
		var err error
		if ips[j], err = r.objs.newEndpoint(); err != nil {
			return err
		}
	}
	minDur, _ := time.ParseDuration(r.minSync)
	time.Sleep(max(minDur, 500*time.Millisecond) + time.Second)
	st0, _ := procStats(p.pid())
	cpu0 := st0.cpu
	var start, end time.Time
	issue := func() error {
		var mu sync.Mutex
		var errs []error
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range r.objs.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range jobs {
					if _, _, err := r.objs.setEndpoint(r.ctx, idx[j], ips[j]); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			}()
		}
		start = time.Now()
		for j := range idx {
			time.Sleep(time.Until(start.Add(time.Duration(j) * time.Second / time.Duration(k))))
			jobs <- j
		}
		close(jobs)
		wg.Wait()
		end = time.Now()
		return errors.Join(errs...)
	}
	var at time.Time
	if p.mon != nil {
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		var err error
		at, err = r.waitEndpoints(ctx, p, "burst", ips, issue)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: burst of %d: %w", p.label, k, err)
		}
	} else {
		if err := issue(); err != nil {
			return err
		}
		if err := r.reach(p, idx, ips, 1000); err != nil {
			return fmt.Errorf("burst of %d: %w", k, err)
		}
		at = time.Now()
	}
	st1, _ := settledStats(p.pid())
	cpu1 := st1.cpu
	// Kernel modes: the first and the last changed answer from their new endpoint.
	if err := r.reach(p, []int{idx[0], idx[k-1]}, []string{ips[0], ips[k-1]}, 60); err != nil {
		return fmt.Errorf("after the burst: %w", err)
	}
	r.record(result{Proxy: p.label, N: n, Metric: "burst_s", Value: at.Sub(end).Seconds(), Note: fmt.Sprintf("%d changes issued in %.2fs", k, end.Sub(start).Seconds())})
	r.record(result{Proxy: p.label, N: n, Metric: "burst_issue_s", Value: end.Sub(start).Seconds()})
	r.record(result{Proxy: p.label, N: n, Metric: "burst_cpu_s", Value: cpu1 - cpu0})
	r.record(result{Proxy: p.label, N: n, Metric: "rss_end_mib", Value: st1.rssMiB})
	logf("N=%d: %s burst of %d changes (issued in %.2fs): all programmed %.2fs after the last, %.2f CPU s",
		n, p.label, k, end.Sub(start).Seconds(), at.Sub(end).Seconds(), cpu1-cpu0)
	return nil
}

// dataPath opens new connections to the data path's Service (0) from the
// client namespace: rate and connect latency. Conntrack of the node is
// flushed before and after, so every run starts from an empty table.
func (r *runner) dataPath(p *proxy, n int) error {
	_, _ = p.in("conntrack", "-F")
	defer func() { _, _ = p.in("conntrack", "-F") }()
	if err := r.reach(p, []int{0}, nil, 1000); err != nil {
		return err
	}
	req := r.dp
	req.Addr = fmt.Sprintf("%s:%d", r.objs.clusterIP(0), servicePort)
	resp, err := p.site.prober.do(req)
	if err != nil {
		return fmt.Errorf("%s: data path: %w", p.label, err)
	}
	if resp.N == 0 {
		return fmt.Errorf("%s: data path: no connection made (%d failed)", p.label, resp.Errors)
	}
	note := fmt.Sprintf("%d connections in %.2fs, %d at a time, %d failed", resp.N, resp.Seconds, req.Conc, resp.Errors)
	if p.mode == "iptables" {
		// A new connection walks the nat table's service chain rule by
		// rule to its Service's; kube-proxy writes that chain in Go's map
		// order, so where the target falls varies from run to run.
		if pos, total := servicesChainPosition(p, r.objs.clusterIP(0)); pos > 0 {
			note += fmt.Sprintf("; its rule is %d of %d in the service chain", pos, total)
		}
	}
	rate := float64(resp.N) / resp.Seconds
	r.record(result{Proxy: p.label, N: n, Metric: "dp_cps", Value: rate, Note: note})
	r.record(result{Proxy: p.label, N: n, Metric: "dp_p50_s", Value: resp.P50})
	r.record(result{Proxy: p.label, N: n, Metric: "dp_p99_s", Value: resp.P99})
	logf("N=%d: %s data path: %.0f new connections/s, connect p50 %.0f us p99 %.0f us (%s)", n, p.label, rate, resp.P50*1e6, resp.P99*1e6, note)
	return nil
}

// servicesChainPosition is where ip's rule sits among the rules of the
// nat table's service dispatch chain (KUBE-SERVICES, or flatnet's
// FLATNET-SERVICES), and how many rules that chain has; 0, 0 when unknown.
func servicesChainPosition(p *proxy, ip string) (pos, total int) {
	out, err := p.in("iptables-save", "-t", "nat")
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "-A" || (f[1] != "KUBE-SERVICES" && f[1] != "FLATNET-SERVICES") {
			continue
		}
		total++
		if pos == 0 && strings.Contains(l, " -d "+ip+"/32 ") {
			pos = total
		}
	}
	return pos, total
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
