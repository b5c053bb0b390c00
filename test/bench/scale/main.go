// Command scalebench is the Go half of hack/bench-scale.sh (make
// bench-scale): flatnet's control plane and node agent at cluster scale,
// with simulated nodes (kwok, through `flatnet lab up --simulated-nodes`)
// against the real kube-apiserver and etcd, and real agents on the lab's
// real nodes seeing every simulated peer (issue 16; method and figures in
// docs/scale.md).
//
// Design. One run, phases in order, each measured from outside the
// processes it measures: the API (informers: when nodes got podCIDRs and
// became Ready, how many pod events the controllers received, how many
// ready endpoints the EndpointSlices hold), /proc (CPU seconds and
// resident memory of every lab process, by its pid file), the agent's own
// Prometheus histograms (network programming latency and proxy sync
// durations, read before and after a phase: the difference is the phase),
// and the routes in the real node's namespace (ip -n). The harness runs
// `flatnet lab up` itself (the same flags each time, so that nothing but
// the simulated node count changes), and writes one JSON result and a
// Markdown table with every target of the issue checked.
//
// Phases: nodes (N simulated nodes, podCIDRs, Ready), agent-start (each
// real agent restarted: time to all peer routes), peer-churn (10 % of the
// simulated nodes deleted and made again: agent CPU per node event),
// objects (namespaces, Services, pods: controller CPU per pod event, all
// endpoints ready), proxy-restart (full sync at full size), burst (500
// pods at once), churn (steady pods/s, created and deleted), rolling (10 %
// of the pods replaced), services (1 % more Services made and deleted).
//
// Nothing here sends traffic: simulated nodes' addresses answer nowhere.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/proc"
)

type config struct {
	Flatnet, Lab, Root string
	RealNodes          int
	Backend            string
	ClusterCIDR        string
	Nodes, Pods        int
	Services           int
	Burst              int
	ChurnRate          int
	ChurnFor           time.Duration
	Workers            int
	Out                string
	Timeout            time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.Flatnet, "flatnet", "bin/flatnet", "the flatnet binary (runs the lab)")
	flag.StringVar(&c.Lab, "lab", "scale", "lab name")
	flag.StringVar(&c.Root, "state-dir", "/var/lib/flatnet/lab", "labs' state root")
	flag.IntVar(&c.RealNodes, "real-nodes", 1, "real lab nodes (each runs an agent)")
	flag.StringVar(&c.Backend, "backend", "host-gw", "cross-node backend: host-gw or vxlan")
	flag.StringVar(&c.ClusterCIDR, "cluster-cidr", "10.128.0.0/11", "pod network (a /11 holds 8,192 /24 node subnets)")
	flag.IntVar(&c.Nodes, "nodes", 500, "simulated nodes")
	flag.IntVar(&c.Pods, "pods", 5000, "pods (on simulated nodes)")
	flag.IntVar(&c.Services, "services", 500, "Services, each selecting pods/services pods")
	flag.IntVar(&c.Burst, "burst", 500, "pods created at once in the burst phase")
	flag.IntVar(&c.ChurnRate, "churn-rate", 20, "pods created (and as many deleted) per second in the churn phase")
	flag.DurationVar(&c.ChurnFor, "churn-for", 60*time.Second, "how long the churn phase lasts")
	flag.IntVar(&c.Workers, "workers", 32, "parallel API clients creating objects")
	flag.StringVar(&c.Out, "out", "", "write the JSON result here (also printed)")
	flag.DurationVar(&c.Timeout, "timeout", 60*time.Minute, "the whole run")
	anchors := map[string]*string{
		anchorFlag:           flag.String(anchorFlag, "", "run as the peer-churn phase's anchor, a bare Node watch, against this kubeconfig (the harness starts it)"),
		controllerAnchorFlag: flag.String(controllerAnchorFlag, "", "run as the controller's anchor, bare Pod, Service, Node and EndpointSlice watches, against this kubeconfig (the harness starts it)"),
	}
	flag.Parse()
	for name, kubeconfig := range anchors {
		if *kubeconfig == "" {
			continue
		}
		if err := runAnchor(name, *kubeconfig); err != nil {
			fmt.Fprintln(os.Stderr, "scalebench anchor:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	res, err := run(ctx, c)
	if res != nil {
		b, _ := json.MarshalIndent(res, "", "  ")
		if c.Out != "" {
			if werr := os.WriteFile(c.Out, append(b, '\n'), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "scalebench:", werr)
			}
		}
		res.table(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

// result is one run.
type result struct {
	Started  time.Time        `json:"started"`
	Size     map[string]int   `json:"size"`
	Backend  string           `json:"backend"`
	Load     string           `json:"loadAtStart"`
	Phases   []*phase         `json:"phases"`
	Procs    map[string]usage `json:"processesAtEnd"`
	Checks   []check          `json:"checks"`
	Complete bool             `json:"complete"`
}

type phase struct {
	Name    string             `json:"name"`
	Seconds float64            `json:"seconds"`
	Values  map[string]float64 `json:"values"`
	CPU     map[string]float64 `json:"cpuSeconds"` // per lab process, during the phase
}

type check struct {
	What     string  `json:"what"`
	Target   string  `json:"target"`
	Measured float64 `json:"measured"`
	Unit     string  `json:"unit"`
	Pass     bool    `json:"pass"`
}

// bench is the state of a run.
type bench struct {
	c       config
	spec    *lab.Spec
	client  kubernetes.Interface
	w       *watcher
	lay     layout
	cluster netip.Prefix
	res     *result
	seq     int      // pods made so far (spreads them over nodes)
	live    []podRef // pods that exist, oldest first
	ctlAnc  *anchor  // the controller's anchor, from the objects phase on
}

func run(ctx context.Context, c config) (*result, error) {
	load, _ := os.ReadFile("/proc/loadavg")
	b := &bench{c: c, res: &result{Started: time.Now().UTC(), Backend: c.Backend, Load: strings.TrimSpace(string(load)),
		Size: map[string]int{"nodes": c.Nodes, "pods": c.Pods, "services": c.Services, "realNodes": c.RealNodes}}}
	var err error
	if b.cluster, err = netip.ParsePrefix(c.ClusterCIDR); err != nil {
		return nil, fmt.Errorf("-cluster-cidr: %w", err)
	}
	if c.Pods/max(1, c.Nodes) > 250 {
		return nil, fmt.Errorf("%d pods on %d nodes is more than 250 per node (a /24's pool): add nodes", c.Pods, c.Nodes)
	}
	if err := b.labUp(ctx, 1); err != nil {
		return nil, err
	}
	if b.spec, err = lab.LoadSpec(c.Root, c.Lab); err != nil {
		return nil, err
	}
	kc, err := clientcmd.BuildConfigFromFlags("", b.spec.Kubeconfig())
	if err != nil {
		return nil, err
	}
	kc.QPS, kc.Burst = 5000, 5000
	kc.ContentType = "application/vnd.kubernetes.protobuf"
	kc.UserAgent = "flatnet-scalebench"
	if b.client, err = kubernetes.NewForConfig(kc); err != nil {
		return nil, err
	}
	var real []string
	for _, n := range b.spec.Nodes {
		real = append(real, n.Name)
	}
	defer func() {
		if b.ctlAnc != nil {
			b.ctlAnc.stop()
		}
	}()
	b.w = newWatcher(real)
	if err := b.w.start(ctx, b.client); err != nil {
		return b.res, fmt.Errorf("watching the API: %w", err)
	}
	steps := []struct {
		name string
		fn   func(context.Context, *phase) error
	}{
		{"nodes", b.nodes},
		{"agent-start", b.agentStart},
		{"peer-churn", b.peerChurn},
		{"objects", b.objects},
		{"proxy-restart", b.proxyRestart},
		{"burst", b.burst},
		{"churn", b.churn},
		{"rolling", b.rolling},
		{"services", b.servicesChurn},
	}
	for _, s := range steps {
		p := &phase{Name: s.name, Values: map[string]float64{}, CPU: map[string]float64{}}
		before := labProcs(b.spec.StateDir)
		t0 := time.Now()
		fmt.Fprintf(os.Stderr, "scalebench: %s phase %s\n", time.Now().Format("15:04:05"), s.name)
		err := s.fn(ctx, p)
		p.Seconds = time.Since(t0).Seconds()
		for name, u := range labProcs(b.spec.StateDir) {
			if u0, ok := before[name]; ok && u0.PID == u.PID {
				p.CPU[name] = round(u.CPU-u0.CPU, 2)
			} else {
				p.CPU[name] = round(u.CPU, 2) // started during the phase
			}
		}
		b.res.Phases = append(b.res.Phases, p)
		if err != nil {
			b.res.Procs = labProcs(b.spec.StateDir)
			b.checks()
			return b.res, fmt.Errorf("phase %s: %w", s.name, err)
		}
	}
	b.res.Procs = labProcs(b.spec.StateDir)
	b.res.Complete = true
	b.checks()
	return b.res, nil
}

// labUp runs flatnet lab up with the run's flags and sim simulated nodes.
func (b *bench) labUp(ctx context.Context, sim int) error {
	argv := []string{"lab", "--name", b.c.Lab, "--state-dir", b.c.Root, "up",
		"--nodes", strconv.Itoa(b.c.RealNodes), "--backend", b.c.Backend, "--proxy-mode", "nftables",
		"--cluster-cidr", b.c.ClusterCIDR, "--simulated-nodes", strconv.Itoa(sim), "--timeout", "30m"}
	cmd := exec.CommandContext(ctx, b.c.Flatnet, argv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", b.c.Flatnet, strings.Join(argv, " "), err, tail(string(out), 30))
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every interval until it holds or ctx ends.
func waitFor(ctx context.Context, what string, interval time.Duration, cond func() (bool, string)) error {
	last := ""
	said := time.Now()
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		last = state
		if time.Since(said) > 30*time.Second {
			fmt.Fprintf(os.Stderr, "scalebench: %s still waiting for %s: %s\n", time.Now().Format("15:04:05"), what, state)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

func round(v float64, digits int) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return -1
	}
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// agentOf is the real node's agent: its process name and namespace.
func (b *bench) agent(i int) (name, netnsName string, own netip.Prefix) {
	n := b.spec.Nodes[i]
	own = b.ownCIDR(n.Name)
	return lab.AgentProc(n.Name), n.Netns, own
}

func (b *bench) ownCIDR(node string) netip.Prefix {
	n, err := b.client.CoreV1().Nodes().Get(context.Background(), node, metaGet)
	if err != nil {
		return netip.Prefix{}
	}
	p, _ := netip.ParsePrefix(n.Spec.PodCIDR)
	return p
}

func (b *bench) agentUsage(name string) (usage, bool) {
	pid, ok := proc.Running(b.spec.StateDir, name)
	if !ok {
		return usage{}, false
	}
	u, err := readUsage(pid)
	return u, err == nil
}
