package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flatnet/flatnet/internal/lab"
)

// Enforcer names, as rows of the result.
const (
	none    = "none"
	knp     = "kube-network-policies"
	flatnet = "flatnet"
)

// flatnetTable is the agent's NetworkPolicy table (family inet).
const flatnetTable = "flatnet-policy"

// Probing: a new connection every probeEvery, each waiting probeTimeout;
// a state counts once stableProbes in a row show it.
const (
	probeEvery   = 10 * time.Millisecond
	probeTimeout = 200 * time.Millisecond
	stableProbes = 5
)

type result struct {
	Date  string `json:"date"`
	Setup setup  `json:"setup"`
	Rows  []row  `json:"rows"`
}

type setup struct {
	Machine            string  `json:"machine"`
	Lab                string  `json:"lab"`
	Namespaces         int     `json:"namespaces"`
	Pods               int     `json:"pods"`
	Policies           int     `json:"policies"`
	PodsOnEnforcerNode int     `json:"podsOnEnforcerNode"`
	EnforcerNode       string  `json:"enforcerNode"`
	ClientNode         string  `json:"clientNode"`
	Samples            int     `json:"samples"`
	RateWorkers        int     `json:"rateWorkers"`
	RateSeconds        float64 `json:"rateSeconds"`
	RateRuns           int     `json:"rateRuns"`
	KNP                string  `json:"kubeNetworkPolicies"`
	Flatnet            string  `json:"flatnet"`
	SetupSeconds       float64 `json:"setupSeconds"`
	// The machine's load average (1, 5, 15 min) before and after: other
	// work on a shared machine shows in the tails.
	LoadStart string `json:"loadStart"`
	LoadEnd   string `json:"loadEnd"`
}

type row struct {
	Enforcer          string    `json:"enforcer"`
	Note              string    `json:"note,omitempty"`
	StartToEnforcingS float64   `json:"startToEnforcingSeconds,omitempty"`
	RulesetLines      int       `json:"rulesetLines"`
	DenyMs            []float64 `json:"denyMs,omitempty"`
	AllowMs           []float64 `json:"allowMs,omitempty"`
	P50Ms             float64   `json:"p50Ms,omitempty"`
	P99Ms             float64   `json:"p99Ms,omitempty"`
	DenyP50Ms         float64   `json:"denyP50Ms,omitempty"`
	DenyP99Ms         float64   `json:"denyP99Ms,omitempty"`
	AllowP50Ms        float64   `json:"allowP50Ms,omitempty"`
	AllowP99Ms        float64   `json:"allowP99Ms,omitempty"`
	Failures          int       `json:"failures,omitempty"`
	ConnPerSec        float64   `json:"connPerSec"`
	ConnRuns          []float64 `json:"connRuns"`
	ConnFailed        int64     `json:"connFailed"`
	ConnRatio         float64   `json:"connRatio,omitempty"`
	Process           string    `json:"process"`
	RSSMiB            float64   `json:"rssMiB"`
	PeakRSSMiB        float64   `json:"peakRssMiB"`
	CPUSeconds        float64   `json:"cpuSeconds"`
	ConnCPUSeconds    float64   `json:"connCpuSeconds"`
	// The enforcer's own metrics at the end of its turn: flatnet's policy
	// syncs, kube-network-policies' per-packet verdict time and queue.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

func logf(format string, args ...any) {
	fmt.Printf("policybench: "+format+"\n", args...)
}

type runner struct {
	ctx          context.Context
	c            kubernetes.Interface
	spec         *lab.Spec
	enforcer     node
	dir          string
	knpBin       string
	flatnetFlags []string
	d            *dialer
	targets      []netip.AddrPort
	rateAddr     netip.AddrPort
	canary       netip.AddrPort
	samples      int
	rateWorkers  int
	rateDur      time.Duration
	rateRuns     int
	seq          int
}

func runCmd(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var (
		stateDir    = fs.String("state-dir", "", "the lab's --state-dir")
		labName     = fs.String("lab", "", "the lab's --name")
		knpBin      = fs.String("knp", "", "the kube-network-policies binary (hack/build-knp.sh)")
		flatnetBin  = fs.String("flatnet", "bin/flatnet", "the flatnet binary the lab runs (to ask whether its agent has --network-policy)")
		flags       = fs.String("flatnet-flags", "--network-policy", "flags that turn flatnet's enforcement on in the agent (space separated)")
		enforcers   = fs.String("enforcers", none+","+knp+","+flatnet+","+none, "turns, in order")
		namespaces  = fs.Int("namespaces", 100, "workload namespaces")
		pods        = fs.Int("pods", 500, "workload pods")
		policies    = fs.Int("policies", 1000, "NetworkPolicies in all")
		targets     = fs.Int("targets", 8, "probe targets on the enforcer node")
		samples     = fs.Int("samples", 50, "deny+allow cycles per enforcer")
		rateWorkers = fs.Int("rate-workers", 4, "parallel connection loops")
		rateDur     = fs.Duration("rate-duration", 5*time.Second, "length of one connection-rate run")
		rateRuns    = fs.Int("rate-runs", 3, "connection-rate runs per enforcer (median)")
		dir         = fs.String("dir", "", "working directory")
		out         = fs.String("out", "", "result (JSON)")
	)
	_ = fs.Parse(args)
	if *stateDir == "" || *labName == "" || *dir == "" || *out == "" {
		return fmt.Errorf("run: -state-dir, -lab, -dir and -out are required")
	}
	if *pods < *namespaces || *namespaces < 1 || *policies < 16 {
		return fmt.Errorf("run: want -pods >= -namespaces >= 1 and -policies >= 16")
	}
	turns := strings.Split(*enforcers, ",")
	for _, t := range turns {
		if t != none && t != knp && t != flatnet {
			return fmt.Errorf("-enforcers: unknown %q (want %s, %s, %s)", t, none, knp, flatnet)
		}
		if t == knp && *knpBin == "" {
			return fmt.Errorf("-enforcers has %s: -knp is required", knp)
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	spec, err := lab.LoadSpec(*stateDir, *labName)
	if err != nil {
		return err
	}
	if spec.Containerd() || len(spec.Nodes) < 2 {
		return fmt.Errorf("lab %s: want the process runtime and at least 2 nodes", *labName)
	}
	c, err := newClient(spec.Kubeconfig())
	if err != nil {
		return err
	}
	var nodeNames []string
	for _, n := range spec.Nodes {
		nodeNames = append(nodeNames, n.Name)
	}
	l := layout{namespaces: *namespaces, pods: *pods, policies: *policies, targets: *targets,
		nodes: nodeNames, clientNode: spec.Nodes[0].Name, enforcerNode: spec.Nodes[1].Name}
	w := build(l)
	res := result{
		Date: time.Now().UTC().Format(time.RFC3339),
		Setup: setup{
			Machine:    machine(),
			LoadStart:  loadavg(),
			Lab:        fmt.Sprintf("%d nodes, process runtime, backend %s", len(spec.Nodes), spec.Backend),
			Namespaces: *namespaces, Pods: *pods, Policies: len(w.Policies),
			EnforcerNode: l.enforcerNode, ClientNode: l.clientNode,
			Samples: *samples, RateWorkers: *rateWorkers, RateSeconds: rateDur.Seconds(), RateRuns: *rateRuns,
			KNP:     "sigs.k8s.io/kube-network-policies v0.8.0",
			Flatnet: strings.TrimSpace(firstLine(*flatnetBin, "version")),
		},
	}
	for _, p := range w.Pods {
		if p.Spec.NodeName == l.enforcerNode {
			res.Setup.PodsOnEnforcerNode++
		}
	}

	t0 := time.Now()
	logf("creating %d namespaces, %d pods, %d policies", len(w.Namespaces), len(w.Pods), len(w.Policies))
	if err := create(ctx, c, w, 32); err != nil {
		return err
	}
	ips, err := waitPods(ctx, c, w, 10*time.Minute)
	if err != nil {
		return err
	}
	res.Setup.SetupSeconds = time.Since(t0).Seconds()
	logf("workload up in %.0fs (%d pods on the enforcer node %s)", res.Setup.SetupSeconds, res.Setup.PodsOnEnforcerNode, l.enforcerNode)

	r := &runner{ctx: ctx, c: c, spec: spec, enforcer: node{spec.Nodes[1]}, dir: *dir, knpBin: *knpBin,
		flatnetFlags: strings.Fields(*flags), samples: *samples,
		rateWorkers: *rateWorkers, rateDur: *rateDur, rateRuns: *rateRuns}
	addr := func(ns, name string) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(ips[ns+"/"+name]), port)
	}
	for t := range *targets {
		r.targets = append(r.targets, addr(probeNS, target(t)))
	}
	r.rateAddr, r.canary = addr(probeNS, "rate"), addr(canaryNS, "canary")
	clientNetns, err := podNetns(spec, spec.Nodes[0], clientNS, "client")
	if err != nil {
		return err
	}
	if r.d, err = newDialer(clientNetns); err != nil {
		return err
	}
	defer r.d.close()

	for _, t := range turns {
		if t == flatnet && !hasFlag(*flatnetBin, r.flatnetFlags[0]) {
			res.Rows = append(res.Rows, row{Enforcer: flatnet, Note: "not measured: this flatnet's agent has no " + r.flatnetFlags[0]})
			logf("flatnet: not measured: `%s agent --help` lists no %s", *flatnetBin, r.flatnetFlags[0])
			continue
		}
		rw, err := r.turn(t)
		if err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
		res.Rows = append(res.Rows, rw)
	}
	res.Setup.LoadEnd = loadavg()
	// The baseline: the mean of the none turns (the default runs one
	// first and one last, so a machine whose load drifts shows in both).
	var base float64
	var nbase int
	for i := range res.Rows {
		if res.Rows[i].Enforcer == none {
			if nbase > 0 {
				res.Rows[i].Note = "again, after the enforcers (the baseline is the mean of the none rows)"
			}
			base += res.Rows[i].ConnPerSec
			nbase++
		}
	}
	if nbase > 0 {
		base /= float64(nbase)
	}
	for i := range res.Rows {
		if base > 0 && res.Rows[i].ConnPerSec > 0 {
			res.Rows[i].ConnRatio = res.Rows[i].ConnPerSec / base
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Println()
	report(os.Stdout, res)
	return nil
}

// turn measures one enforcer on the enforcer node, alone.
func (r *runner) turn(name string) (row, error) {
	rw := row{Enforcer: name}
	logf("%s: starting", name)
	// flatnet's enforcement only on the enforcer node and only in its
	// turn, as kube-network-policies runs only there in its turn: each
	// enforcer alone on one node of a machine whose cores all nodes share
	// (the client is selected by no policy, so its node has nothing to
	// enforce). The enforcer node's agent is restarted every turn.
	var agentPID int
	for _, n := range r.spec.Nodes {
		on := name == flatnet && n.Name == r.enforcer.Name
		pid, err := restartAgent(r.spec, n, r.flatnetFlags, on, n.Name == r.enforcer.Name)
		if err != nil {
			return rw, fmt.Errorf("restarting the agent of %s: %w", n.Name, err)
		}
		if n.Name == r.enforcer.Name {
			agentPID = pid
		}
		// An agent stopped with policy on may leave its table behind.
		if !on {
			nn := node{n}
			if _, err := nn.nft("list", "table", "inet", flatnetTable); err == nil {
				// The new agent may be removing it too: gone is gone.
				if _, err := nn.nft("delete", "table", "inet", flatnetTable); err != nil {
					if _, lerr := nn.nft("list", "table", "inet", flatnetTable); lerr == nil {
						return rw, err
					}
				}
				logf("%s: table inet %s left in %s removed", name, flatnetTable, n.Netns)
			}
		}
	}
	start, pid := time.Now(), agentPID
	var err error
	rw.Process = "flatnet agent (pid of the node's agent: proxy, DNS, pod runtime and, with --network-policy, policy)"
	if name == knp {
		// The agent first: the anchor starts on a node whose pods answer.
		if _, err := r.d.waitFor(r.ctx, r.rateAddr, true, probeEvery, probeTimeout, stableProbes, 2*time.Minute); err != nil {
			return rw, fmt.Errorf("agent restarted, rate target: %w", err)
		}
		start = time.Now()
		if pid, rw.Note, err = startKNP(r.ctx, r.c, r.spec, r.enforcer, r.knpBin, r.dir); err != nil {
			return rw, err
		}
		defer func() {
			if err := stopKNP(r.spec, r.enforcer); err != nil {
				logf("stopping kube-network-policies: %v", err)
			}
		}()
		rw.Process = "kube-network-policies"
	}
	if name == none {
		if _, err := r.d.waitFor(r.ctx, r.canary, true, probeEvery, probeTimeout, stableProbes, 2*time.Minute); err != nil {
			return rw, fmt.Errorf("no enforcer, canary: %w", err)
		}
	} else {
		at, err := r.d.waitFor(r.ctx, r.canary, false, probeEvery, probeTimeout, stableProbes, 3*time.Minute)
		if err != nil {
			return rw, fmt.Errorf("canary (default-deny namespace) never denied: %w", err)
		}
		rw.StartToEnforcingS = at.Sub(start).Seconds()
		logf("%s: enforcing %.2fs after start", name, rw.StartToEnforcingS)
	}
	if _, err := r.d.waitFor(r.ctx, r.rateAddr, true, probeEvery, probeTimeout, stableProbes, 2*time.Minute); err != nil {
		return rw, fmt.Errorf("rate target: %w", err)
	}
	time.Sleep(2 * time.Second) // let the start settle
	if rw.RulesetLines, err = r.enforcer.rulesetLines(); err != nil {
		return rw, err
	}
	if name != none {
		if err := r.latency(&rw); err != nil {
			return rw, err
		}
	}
	u0, err := readUsage(pid)
	if err != nil {
		return rw, err
	}
	for i := range r.rateRuns {
		cps, failed := r.d.rate(r.rateAddr, r.rateWorkers, r.rateDur)
		rw.ConnRuns = append(rw.ConnRuns, cps)
		rw.ConnFailed += failed
		logf("%s: %.0f connections/s (run %d, %d failed)", name, cps, i+1, failed)
	}
	rw.ConnPerSec = median(rw.ConnRuns)
	u1, err := readUsage(pid)
	if err != nil {
		return rw, err
	}
	switch name {
	case flatnet:
		rw.Metrics, err = r.enforcer.metrics("flatnet_networkpolicy_sync", "flatnet_networkpolicy_set_elements", "flatnet_networkpolicy_pods")
	case knp:
		rw.Metrics, err = r.enforcer.metrics("kube_network_policies_packet_process_duration", "kube_network_policies_nfqueue", "kube_network_policies_packet_count")
	}
	if err != nil {
		logf("%s: metrics: %v", name, err)
	}
	rw.ConnCPUSeconds = (u1.CPU - u0.CPU).Seconds()
	rw.CPUSeconds = u1.CPU.Seconds()
	rw.RSSMiB, rw.PeakRSSMiB = mib(u1.RSS), mib(u1.HWM)
	logf("%s: ruleset %d lines, RSS %.0f MiB (peak %.0f), CPU %.1fs (%.1fs in the rate runs)", name, rw.RulesetLines, rw.RSSMiB, rw.PeakRSSMiB, rw.CPUSeconds, rw.ConnCPUSeconds)
	return rw, nil
}

// latency runs the deny/allow cycles on the probe targets in turn.
func (r *runner) latency(rw *row) error {
	pols := r.c.NetworkingV1().NetworkPolicies(probeNS)
	for k := range r.samples {
		t := k % len(r.targets)
		a := r.targets[t]
		if _, err := r.d.waitFor(r.ctx, a, true, probeEvery, probeTimeout, stableProbes, time.Minute); err != nil {
			return fmt.Errorf("target %s before cycle %d: %w", target(t), k, err)
		}
		r.seq++
		deny, allow := denyPolicy(fmt.Sprintf("deny-%d", r.seq), t), allowPolicy(fmt.Sprintf("allow-%d", r.seq), t)
		for _, step := range []struct {
			p    *netv1.NetworkPolicy
			want bool
			into *[]float64
		}{{deny, false, &rw.DenyMs}, {allow, true, &rw.AllowMs}} {
			t0 := time.Now()
			if _, err := pols.Create(r.ctx, step.p, metav1.CreateOptions{}); err != nil {
				return err
			}
			at, err := r.d.waitFor(r.ctx, a, step.want, probeEvery, probeTimeout, stableProbes, 30*time.Second)
			if err != nil {
				rw.Failures++
				logf("%s: %s: %v", rw.Enforcer, step.p.Name, err)
				continue
			}
			*step.into = append(*step.into, float64(at.Sub(t0).Microseconds())/1000)
		}
		for _, p := range []string{deny.Name, allow.Name} {
			if err := pols.Delete(r.ctx, p, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
	}
	all := append(append([]float64(nil), rw.DenyMs...), rw.AllowMs...)
	rw.P50Ms, rw.P99Ms = percentile(all, 50), percentile(all, 99)
	rw.DenyP50Ms, rw.DenyP99Ms = percentile(rw.DenyMs, 50), percentile(rw.DenyMs, 99)
	rw.AllowP50Ms, rw.AllowP99Ms = percentile(rw.AllowMs, 50), percentile(rw.AllowMs, 99)
	logf("%s: create -> enforced p50 %.0f ms, p99 %.0f ms (deny %.0f/%.0f, allow %.0f/%.0f; %d failures)", rw.Enforcer,
		rw.P50Ms, rw.P99Ms, rw.DenyP50Ms, rw.DenyP99Ms, rw.AllowP50Ms, rw.AllowP99Ms, rw.Failures)
	return nil
}

// podNetns is the network namespace of a process-runtime pod, from the
// runtime's state.
func podNetns(s *lab.Spec, n lab.Node, ns, pod string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.RuntimeDir(n), "pods", ns+"_"+pod, "state.json"))
	if err != nil {
		return "", fmt.Errorf("runtime state of %s/%s: %w", ns, pod, err)
	}
	var st struct {
		Netns string `json:"netns"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Netns == "" {
		return "", fmt.Errorf("runtime state of %s/%s: no netns (%v)", ns, pod, err)
	}
	return lab.NetnsPath(st.Netns), nil
}

func median(xs []float64) float64 { return percentile(xs, 50) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func firstLine(argv ...string) string {
	out, _ := exec.Command(argv[0], argv[1:]...).Output()
	l, _, _ := strings.Cut(string(out), "\n")
	return l
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func machine() string {
	var u syscall.Utsname
	_ = syscall.Uname(&u)
	rel := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), Linux %s", runtime.NumCPU(), model, rel)
}
