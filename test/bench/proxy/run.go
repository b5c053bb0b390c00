package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/proc"
)

// The KubeProxyConfiguration both proxies read; only hostnameOverride
// differs. conntrack's zeros leave the namespace's sysctls as they are
// (kube-proxy would set them inside its namespace otherwise; flatnet
// ignores the section). nodePortAddresses 0.0.0.0/0: every address for
// both (flatnet's default; kube-proxy's nftables default, the node's
// primary IPs, is one flatnet refuses); no NodePorts are measured.
const configTemplate = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
hostnameOverride: %s
clusterCIDR: %s
mode: nftables
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
)

var histograms = []string{
	"sync_proxy_rules_duration_seconds",
	"sync_full_proxy_rules_duration_seconds",
	"sync_partial_proxy_rules_duration_seconds",
	"network_programming_duration_seconds",
}

type runner struct {
	ctx      context.Context
	lab      *lab.Spec
	objs     *objects
	proxies  []*proxy
	dir      string
	out      *os.File
	reps     int
	timeout  time.Duration
	minSyncs []string
}

// result is one JSON line of the results.
type result struct {
	Proxy   string  `json:"proxy"`
	N       int     `json:"n"`
	MinSync string  `json:"minSync,omitempty"`
	Metric  string  `json:"metric"`
	Value   float64 `json:"value"`
	Rep     int     `json:"rep,omitempty"`
	Note    string  `json:"note,omitempty"`
}

func (r *runner) record(res result) {
	b, _ := json.Marshal(res)
	fmt.Fprintln(r.out, string(b))
}

func logf(format string, args ...any) {
	fmt.Printf("proxybench: "+format+"\n", args...)
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var (
		stateDir   = fs.String("state-dir", "", "the lab's --state-dir")
		labName    = fs.String("lab", "", "the lab's --name")
		prefix     = fs.String("prefix", "pb", "prefix of this run's namespace and interface names (unique per run)")
		kubeProxy  = fs.String("kube-proxy", "", "the kube-proxy binary")
		flatnet    = fs.String("flatnet", "bin/flatnet", "the flatnet binary")
		sizes      = fs.String("sizes", "1000,5000", "numbers of Services, ascending")
		endpoints  = fs.Int("endpoints", 3, "endpoints per Service")
		reps       = fs.Int("reps", 10, "partial updates per proxy, size and min sync period")
		minSyncs   = fs.String("min-sync", "1s,0s", "min sync periods (both proxies alike); churn uses the first")
		workers    = fs.Int("workers", 16, "concurrent creates")
		dir        = fs.String("dir", "", "working directory (configs, logs, pid files)")
		resultPath = fs.String("out", "", "results (JSON lines)")
		timeout    = fs.Duration("timeout", 5*time.Minute, "longest wait for a proxy to program what it is waited for")
	)
	_ = fs.Parse(args)
	if *stateDir == "" || *labName == "" || *kubeProxy == "" || *dir == "" || *resultPath == "" {
		return fmt.Errorf("run: -state-dir, -lab, -kube-proxy, -dir and -out are required")
	}
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || (len(ns) > 0 && n <= ns[len(ns)-1]) {
			return fmt.Errorf("-sizes %q: positive and ascending", *sizes)
		}
		ns = append(ns, n)
	}
	for _, m := range strings.Split(*minSyncs, ",") {
		if _, err := time.ParseDuration(m); err != nil {
			return fmt.Errorf("-min-sync %q: %w", m, err)
		}
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
	out, err := os.Create(*resultPath)
	if err != nil {
		return err
	}
	defer out.Close()
	pidDir := filepath.Join(*dir, "pids")
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return err
	}

	// Two namespaces on the lab's underlay, at .230 and .231.
	mkNode := func(suffix string, host int) (*node, error) {
		ip := spec.Underlay.Masked().Addr()
		for range host {
			ip = ip.Next()
		}
		for _, n := range spec.Nodes {
			if n.IP == ip {
				return nil, fmt.Errorf("%s is lab node %s's address", ip, n.Name)
			}
		}
		n := &node{netns: *prefix + "-" + suffix, hostVeth: *prefix + suffix, ip: ip, name: *prefix + "-" + suffix}
		if len(n.hostVeth) > 15 {
			return nil, fmt.Errorf("-prefix %q too long for interface %s", *prefix, n.hostVeth)
		}
		return n, nil
	}
	kpNode, err := mkNode("kp", 230)
	if err != nil {
		return err
	}
	flNode, err := mkNode("fl", 231)
	if err != nil {
		return err
	}
	for _, n := range []*node{kpNode, flNode} {
		defer n.remove()
		if err := createNode(n, spec.Bridge, spec.Underlay.Bits(), spec.ServiceCIDR); err != nil {
			return err
		}
	}

	objs := &objects{c: c, ns: benchNamespace, endpoints: *endpoints, workers: *workers, clusterIPs: map[int]string{}}
	if err := objs.ensureNamespace(ctx); err != nil {
		return err
	}
	for _, n := range []*node{kpNode, flNode} {
		if err := objs.ensureNode(ctx, n.name, n.ip); err != nil {
			return err
		}
		defer objs.deleteNode(context.Background(), n.name)
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

	clusterCIDR := netip.MustParsePrefix("10.244.0.0/15") // the lab's pods and the benchmark's endpoints
	if !clusterCIDR.Contains(netip.MustParseAddr(endpointsBase)) || !clusterCIDR.Contains(spec.ClusterCIDR.Addr()) {
		return fmt.Errorf("cluster CIDR %s does not cover the lab's %s and the endpoints' %s", clusterCIDR, spec.ClusterCIDR, endpointsBase)
	}
	writeConfig := func(n *node, minSync string) (string, error) {
		path := filepath.Join(*dir, fmt.Sprintf("%s-%s.yaml", n.name, minSync))
		return path, os.WriteFile(path, fmt.Appendf(nil, configTemplate, spec.Kubeconfig(), n.name, clusterCIDR, minSync, metricsPort, healthzPort), 0o644)
	}
	kp := &proxy{label: "kube-proxy", node: kpNode, table: "kube-proxy", metricPrefix: "kubeproxy_", dir: *dir, pidDir: pidDir,
		argv: func(cfg string) []string { return []string{*kubeProxy, "--config", cfg} }}
	fl := &proxy{label: "flatnet", node: flNode, table: "flatnet-proxy", metricPrefix: "flatnet_", dir: *dir, pidDir: pidDir,
		argv: func(cfg string) []string { return []string{*flatnet, "agent", "--proxy-only", "--config", cfg} }}
	r := &runner{ctx: ctx, lab: spec, objs: objs, proxies: []*proxy{kp, fl}, dir: *dir, out: out, reps: *reps, timeout: *timeout,
		minSyncs: strings.Split(*minSyncs, ",")}
	defer func() {
		for _, p := range r.proxies {
			p.stop()
		}
	}()
	configs := map[*proxy]map[string]string{}
	for _, p := range r.proxies {
		configs[p] = map[string]string{}
		for _, m := range r.minSyncs {
			if configs[p][m], err = writeConfig(p.node, m); err != nil {
				return err
			}
		}
	}

	have := 0
	for _, n := range ns {
		if err := r.size(have, n, configs); err != nil {
			return err
		}
		have = n
	}
	return nil
}

// size runs every measurement at n Services, creating those from have on.
func (r *runner) size(have, n int, configs map[*proxy]map[string]string) error {
	first := r.minSyncs[0]
	// 1. churn: both running and caught up at have, then create up to n.
	mons := map[*proxy]*monitor{}
	defer func() {
		for _, m := range mons {
			m.stop()
		}
	}()
	for _, p := range r.proxies {
		p.deleteTables()
		m, err := startMonitor(r.ctx, p, "elements")
		if err != nil {
			return err
		}
		mons[p] = m
		if err := p.start(configs[p][first]); err != nil {
			return err
		}
	}
	for _, p := range r.proxies {
		if err := r.waitTable(p); err != nil {
			return err
		}
		if _, err := r.waitPorts(p, mons[p], have); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second) // past the min sync period: both idle
	logf("N=%d: creating Services %d..%d with %d endpoints each (both proxies running)", n, have, n-1, r.objs.endpoints)
	t0 := time.Now()
	last, err := r.objs.create(r.ctx, have, n)
	if err != nil {
		return err
	}
	logf("N=%d: created %d Services and slices in %.1fs", n, n-have, last.Sub(t0).Seconds())
	r.record(result{Proxy: "api", N: n, MinSync: first, Metric: "create_s", Value: last.Sub(t0).Seconds(), Note: fmt.Sprintf("%d Services + slices", n-have)})
	type caught struct {
		p   *proxy
		at  time.Time
		err error
	}
	ch := make(chan caught, len(r.proxies))
	for _, p := range r.proxies {
		go func() {
			at, err := r.waitPorts(p, mons[p], n)
			ch <- caught{p, at, err}
		}()
	}
	for range r.proxies {
		c := <-ch
		if c.err != nil {
			return c.err
		}
		d := c.at.Sub(last).Seconds()
		logf("N=%d: %s had all %d service ports %.2fs after the last create", n, c.p.label, n, d)
		r.record(result{Proxy: c.p.label, N: n, MinSync: first, Metric: "churn_catchup_s", Value: d})
	}
	for _, p := range r.proxies {
		mons[p].stop()
		delete(mons, p)
		p.stop()
	}

	// 2. each proxy alone.
	for mi, m := range r.minSyncs {
		for _, p := range r.proxies {
			if err := r.alone(p, n, m, configs[p][m], mi == 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitTable waits for p's service-ips map to exist (its first sync).
func (r *runner) waitTable(p *proxy) error {
	ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
	defer cancel()
	var lastErr error
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("%s exited; log in %s", p.label, r.dir)
		}
		var out string
		if out, lastErr = p.nft("list", "tables"); lastErr != nil {
			return false, nil
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.TrimSpace(l) == "table ip "+p.table {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%s: no table ip %s: %w (%v)", p.label, p.table, err, lastErr)
	}
	return nil
}

// waitPorts waits until m has seen n of the benchmark's service ports
// added to p's service-ips map, returns when the n-th was, and checks
// (untimed) that the map holds them.
func (r *runner) waitPorts(p *proxy, m *monitor, n int) (time.Time, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
	defer cancel()
	exited := make(chan struct{})
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-exited:
		}
	}()
	at, seen, err := m.waitPorts(ctx, n)
	close(exited)
	if err != nil {
		return at, fmt.Errorf("%s: %d of %d service ports added to service-ips: %w (running: %v; logs in %s)", p.label, seen, n, err, p.running(), r.dir)
	}
	if n > 0 {
		if c, err := p.servicePorts(r.objs.ns); err != nil || c != n {
			return at, fmt.Errorf("%s: the monitor saw %d service ports added, the map holds %d (%v)", p.label, n, c, err)
		}
	}
	return at, nil
}

// alone measures p with the other proxies stopped: cold start, table size,
// partial updates.
func (r *runner) alone(p *proxy, n int, minSync, config string, size bool) error {
	rec := func(metric string, v float64, note string) {
		r.record(result{Proxy: p.label, N: n, MinSync: minSync, Metric: metric, Value: v, Note: note})
	}
	time.Sleep(time.Second)
	p.deleteTables()
	em, err := startMonitor(r.ctx, p, "elements")
	if err != nil {
		return err
	}
	if err := p.start(config); err != nil {
		em.stop()
		return err
	}
	defer p.stop()
	at, err := r.waitPorts(p, em, n)
	em.stop()
	if err != nil {
		return err
	}
	cold := at.Sub(p.started).Seconds()
	cpu, _, _ := procStats(p.pid())
	rec("cold_start_s", cold, "")
	rec("cold_start_cpu_s", cpu, "")
	time.Sleep(2 * time.Second) // the first sync's metrics written; the proxy idle
	m, err := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...)
	if err != nil {
		return err
	}
	full := m["sync_full_proxy_rules_duration_seconds"]
	if full.Count > 0 {
		rec("full_sync_s", full.Sum/full.Count, fmt.Sprintf("mean of %.0f full syncs", full.Count))
	}
	_, rss, _ := procStats(p.pid())
	rec("rss_mib", rss, "")
	logf("N=%d min-sync %s: %s cold start %.2fs (%.2f CPU s), full sync %.3fs (%v syncs), RSS %.0f MiB",
		n, minSync, p.label, cold, cpu, full.Sum/max(full.Count, 1), full.Count, rss)
	if size {
		s, err := p.tableSize()
		if err != nil {
			return err
		}
		rec("nft_rules", float64(s.Rules), "")
		rec("nft_chains", float64(s.Chains), "")
		rec("nft_elements", float64(s.Elements), "")
		rec("nft_lines", float64(s.Lines), "")
		rec("nft_bytes", float64(s.Bytes), "")
		logf("N=%d: %s table ip %s: %d chains, %d rules, %d map/set elements, %d lines", n, p.label, p.table, s.Chains, s.Rules, s.Elements, s.Lines)
	}

	rm, err := startMonitor(r.ctx, p, "rules")
	if err != nil {
		return err
	}
	defer rm.stop()
	minDur, _ := time.ParseDuration(minSync)
	var kernel, syncs, progs []float64
	for rep := 1; rep <= r.reps; rep++ {
		time.Sleep(max(minDur, 500*time.Millisecond) + 500*time.Millisecond) // idle, past the min sync period
		i := (rep*7919 + n/3) % n                                            // spread over the Services
		ip := r.objs.clusterIPs[i]
		chain, err := p.serviceChain(ip, servicePort)
		if err != nil {
			return err
		}
		before, err := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...)
		if err != nil {
			return err
		}
		var oldIP, newIP string
		var t0 time.Time
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		// The service chain's new rule names the new endpoint: the
		// transaction that rewrote the chain is committed.
		seen, err := rm.waitLine(ctx, func(l string) bool {
			return strings.Contains(l, " "+chain+" ") && hasEndpoint(l, newIP, endpointPort)
		}, func() error {
			var err error
			rm.mu.Lock() // newIP is read by the matcher
			defer rm.mu.Unlock()
			oldIP, newIP, t0, err = r.objs.replaceEndpoint(r.ctx, i)
			return err
		})
		cancel()
		if err != nil {
			listing, _ := p.nft("list", "chain", "ip", p.table, chain)
			return fmt.Errorf("%s: waiting for %s (replacing %s) in %s: %w; the chain now:\n%s", p.label, newIP, oldIP, chain, err, listing)
		}
		k := seen.Sub(t0).Seconds()
		// The sync that programmed it has returned: wait for its metrics.
		time.Sleep(500 * time.Millisecond)
		after, err := p.metrics(fmt.Sprintf("127.0.0.1:%d", metricsPort), histograms...)
		if err != nil {
			return err
		}
		if rep == 1 { // untimed: the kernel has the new endpoint and not the old
			listing, err := p.nft("list", "chain", "ip", p.table, chain)
			if err != nil || !hasEndpoint(listing, newIP, endpointPort) || hasEndpoint(listing, oldIP, endpointPort) {
				return fmt.Errorf("%s: %s after the update (%v): want %s and not %s:\n%s", p.label, chain, err, newIP, oldIP, listing)
			}
		}
		d := func(name string) (float64, float64) {
			return after[name].Sum - before[name].Sum, after[name].Count - before[name].Count
		}
		ss, sc := d("sync_proxy_rules_duration_seconds")
		_, pc := d("sync_partial_proxy_rules_duration_seconds")
		ps, pcount := d("network_programming_duration_seconds")
		r.record(result{Proxy: p.label, N: n, MinSync: minSync, Metric: "partial_kernel_s", Value: k, Rep: rep})
		kernel = append(kernel, k)
		if sc > 0 {
			r.record(result{Proxy: p.label, N: n, MinSync: minSync, Metric: "partial_sync_s", Value: ss / sc, Rep: rep,
				Note: fmt.Sprintf("%.0f syncs (%.0f partial)", sc, pc)})
			syncs = append(syncs, ss/sc)
		}
		if pcount > 0 {
			r.record(result{Proxy: p.label, N: n, MinSync: minSync, Metric: "partial_netprog_s", Value: ps / pcount, Rep: rep})
			progs = append(progs, ps/pcount)
		}
	}
	logf("N=%d min-sync %s: %s partial update: kernel %.3fs, sync %.4fs, network programming %.3fs (medians of %d)",
		n, minSync, p.label, median(kernel), median(syncs), median(progs), r.reps)
	return nil
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
