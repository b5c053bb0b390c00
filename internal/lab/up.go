package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/controller"
	"github.com/flatnet/flatnet/internal/hostroutes"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
	"github.com/flatnet/flatnet/internal/proc"
)

// UpConfig is how `lab up` runs beyond the requested lab.
type UpConfig struct {
	// FlatnetBinary and CNIBinary are copied into the lab's bin dir;
	// empty means this executable and flatnet-cni next to it.
	FlatnetBinary, CNIBinary string
	// K8sBinDir holds kube-apiserver, etcd and kubectl; empty means
	// controlplane.BinDir().
	K8sBinDir string
	// ReadyTimeout bounds the wait for all nodes Ready (0: 2 minutes).
	ReadyTimeout time.Duration
	// Out receives progress lines.
	Out io.Writer
}

// Up brings lab req up, creating only what is missing, and returns its
// Spec once every node is Ready.
func Up(ctx context.Context, req Request, cfg UpConfig) (*Spec, error) {
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("flatnet lab needs root (network namespaces, interfaces, netlink): run it with sudo")
	}
	if err := ValidateName(req.Name); err != nil {
		return nil, err
	}
	root := req.StateRoot
	if root == "" {
		root = DefaultStateRoot
		req.StateRoot = root
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("--state-dir %q must be an absolute path", root)
	}

	unlock, err := lockRoot(root, out)
	if err != nil {
		return nil, err
	}
	defer unlock()

	k := newKernel("")
	recorded, recordedBin, err := loadOrRecover(req, func() (runningLab, error) { return readRunningLab(k, root, req.Name) }, out)
	if err != nil {
		return nil, err
	}
	host, err := hostroutes.HostPrefixesExcept(BridgeName(req.Name))
	if err != nil {
		return nil, fmt.Errorf("reading this machine's routes: %w", err)
	}
	s, err := resolve(req, recorded, host, otherRanges(root, req.Name))
	if err != nil {
		return nil, err
	}
	if err := checkCNIPluginDir(s); err != nil {
		return nil, err
	}

	k8sBin := cfg.K8sBinDir
	if k8sBin == "" {
		k8sBin = recordedBin
	}
	if k8sBin == "" {
		if k8sBin, err = controlplane.BinDir(); err != nil {
			return nil, err
		}
	}
	flatnetBin, cniBin, err := sourceBinaries(cfg)
	if err != nil {
		return nil, err
	}
	var kwokBin string
	if s.SimulatedNodes > 0 {
		if kwokBin, err = simnodes.KwokBinary(); err != nil {
			return nil, fmt.Errorf("--simulated-nodes %d needs kwok: %w", s.SimulatedNodes, err)
		}
	}

	reportBadPIDFiles(s.StateDir, out)
	obs, fixes, err := observe(k, s)
	if err != nil {
		return nil, err
	}
	obs.Kwok, obs.KwokOutdated = observeKwok(s, kwokBin)
	if obs.BinOutdated, err = binariesOutdated(s, flatnetBin, cniBin); err != nil {
		return nil, err
	}
	if recorded != nil {
		obs.SimulatedNodes = recorded.SimulatedNodes
	}
	// The record goes first, so that `down` finds everything up creates
	// even if up stops half way.
	if err := saveRecord(&record{Spec: *s, K8sBinDir: k8sBin}); err != nil {
		return nil, err
	}
	// Keys, the admin kubeconfig and etcd's data: root only (labs made
	// before had it 0755).
	if err := controlplane.PrivateDir(s.StateDir); err != nil {
		return nil, err
	}

	warnBridgeFirewall(out, s.Bridge)
	if why := controlplane.Outdated(controlPlaneConfig(s, k8sBin)); why != "" {
		fmt.Fprintf(out, "control plane outdated, restarting it: %s\n", why)
	}
	steps := Plan(s, obs)
	layout := fmt.Sprintf("underlay %s", s.Underlay)
	if s.Router != nil {
		layout = fmt.Sprintf("underlays %s and %s (router %s)", s.Underlay, s.Underlay2, s.Router.IP)
	}
	if s.External != nil {
		layout += fmt.Sprintf(", external host %s", s.External.IP)
	}
	if s.LBPool.IsValid() {
		layout += fmt.Sprintf(", load-balancer range %s", s.LBPool)
	}
	if s.SimulatedNodes > 0 {
		layout += fmt.Sprintf(", %d simulated nodes (InternalIPs in %s)", s.SimulatedNodes, s.SimulatedNodeRange)
	}
	fmt.Fprintf(out, "lab %s: %d nodes, backend %s, %s, cluster CIDR %s (/%d per node), service CIDR %s\n",
		s.Name, len(s.Nodes), s.Backend, layout, s.ClusterCIDR, s.NodeCIDRMaskSize, s.ServiceCIDR)
	start := time.Now()
	var kubeconfig string
	var tarballs []string
	for i, st := range steps {
		prefix := fmt.Sprintf("[%2d/%d] %-13s", i+1, len(steps), st.Kind)
		if st.Present {
			fmt.Fprintf(out, "%s %s: present\n", prefix, st.What)
			continue
		}
		t0 := time.Now()
		fmt.Fprintf(out, "%s %s ...", prefix, st.What)
		var err error
		detail := "" // what the step did, when it says more than done
		switch st.Kind {
		case StepStateDir:
			err = makeStateDirs(s)
		case StepBin:
			err = installBinaries(s, flatnetBin, cniBin)
		case StepUnderlay:
			err = k.apply(fixesOf(fixes, partUnderlay))
		case StepRouter:
			err = k.apply(fixesOf(fixes, partRouter))
		case StepNode:
			err = k.apply(fixesOf(fixes, nodePart(st.Node)))
		case StepExternal:
			if st.Restart {
				if err = proc.Stop(s.StateDir, ProcExternal, 5*time.Second); err != nil {
					break
				}
			}
			if err = k.apply(fixesOf(fixes, partExternal)); err != nil {
				break
			}
			if st.Restart {
				if err = proc.Stop(s.StateDir, ProcExternal, 10*time.Second); err != nil {
					break
				}
			}
			if _, running := proc.Running(s.StateDir, ProcExternal); !running {
				_, err = proc.Start(ProcExternal, externalArgv(s), nil, s.StateDir, NetnsPath(s.External.Netns))
			}
		case StepControlPlane:
			var info *controlplane.Info
			info, err = controlplane.Up(ctx, controlPlaneConfig(s, k8sBin), io.Discard)
			if info != nil {
				kubeconfig = info.Kubeconfig
			}
			if err == nil {
				// Before any agent starts: an agent looks for the
				// ClusterNetworkPolicy API once, at its start.
				err = ensureCRDs(ctx, kubeconfig)
			}
		case StepController:
			if st.Restart {
				if err = proc.Stop(s.StateDir, ProcController, 10*time.Second); err != nil {
					break
				}
			}
			_, err = proc.Start(ProcController, controllerArgv(s), nil, s.StateDir, "")
		case StepAgent:
			n, _ := s.Node(st.Node)
			if st.Restart {
				if err = proc.Stop(s.StateDir, AgentProc(n.Name), 10*time.Second); err != nil {
					break
				}
			}
			if err = os.MkdirAll(s.NodeDir(n), 0o755); err == nil {
				_, err = proc.Start(AgentProc(n.Name), agentArgv(s, n), nil, s.StateDir, NetnsPath(n.Netns))
			}
		case StepGateway:
			n, _ := s.Node(st.Node)
			if st.Restart {
				if err = proc.Stop(s.StateDir, GatewayProc(n.Name), 10*time.Second); err != nil {
					break
				}
			}
			_, err = proc.Start(GatewayProc(n.Name), gatewayArgv(s, n), nil, s.StateDir, NetnsPath(n.Netns))
		case StepImages:
			tarballs, err = buildImages(ctx, s, k8sBin, flatnetBin)
		case StepKubelet:
			n, _ := s.Node(st.Node)
			if tarballs == nil {
				// The images step was present: find the cached tarballs.
				if tarballs, err = buildImages(ctx, s, k8sBin, flatnetBin); err != nil {
					break
				}
			}
			err = upKubelet(ctx, s, n, k8sBin, tarballs, st.Restart)
		case StepManifest:
			if kubeconfig == "" {
				kubeconfig = s.Kubeconfig()
			}
			err = applyManifest(ctx, s, kubeconfig, k8sBin)
		case StepReady:
			if kubeconfig == "" {
				kubeconfig = s.Kubeconfig()
			}
			var cidrs map[string]netip.Prefix
			if cidrs, err = waitReady(ctx, s, kubeconfig, cfg.ReadyTimeout); err != nil {
				break
			}
			if err = routePodCIDRs(k, s, k8sBin, cidrs); err != nil {
				break
			}
			if err = ensureKubeDNS(ctx, s, kubeconfig); err != nil {
				break
			}
			err = ensureCRDs(ctx, kubeconfig)
		case StepKwok:
			if s.SimulatedNodes == 0 {
				err = proc.Stop(s.StateDir, ProcKwok, 10*time.Second)
				break
			}
			err = upKwok(s, kwokBin, st.Restart)
		case StepSimulated:
			if kubeconfig == "" {
				kubeconfig = s.Kubeconfig()
			}
			detail, err = scaleSimulated(ctx, s, kubeconfig, cfg.ReadyTimeout)
		}
		if err != nil {
			fmt.Fprintf(out, " failed\n")
			what := string(st.Kind)
			if st.Node != "" {
				what += " " + st.Node
			}
			return s, fmt.Errorf("lab %s: %s: %w\n(the lab is partly up: fix the cause and run `flatnet lab up%s` again, or remove it with `flatnet lab down%s`)",
				s.Name, what, err, nameFlag(s.Name), nameFlag(s.Name))
		}
		if detail != "" {
			detail = ": " + detail
		}
		fmt.Fprintf(out, " done%s (%s)\n", detail, roundDur(time.Since(t0)))
	}
	fmt.Fprintf(out, "lab %s is up (%s)\n", s.Name, roundDur(time.Since(start)))
	fmt.Fprintf(out, "security: etcd and kube-apiserver accept only the lab's certificates (%s, %s: root only)\n"+
		"security: pods run as root on this machine: whoever can create a Pod in this lab is root here; do not share the kubeconfig\n",
		controlplane.PKIDir(s.StateDir), s.Kubeconfig())
	return s, nil
}

func roundDur(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

func nameFlag(name string) string {
	if name == DefaultName {
		return ""
	}
	return " --name " + name
}

// observe reads what of s already runs, and the kernel fixes s needs.
func observe(k kernel, s *Spec) (Observed, []fix, error) {
	o := Observed{Nodes: map[string]bool{}, Agents: map[string]bool{}, Kubelets: map[string]bool{}, AgentBackends: map[string]string{}, AgentCNIConflists: map[string]string{}, AgentCNIBinDirs: map[string]string{}, AgentProxyModes: map[string]string{}, AgentsWithoutProxy: map[string]bool{}, AgentsDNSOutdated: map[string]bool{}, Gateways: map[string]bool{}, GatewaysOutdated: map[string]bool{}}
	if st, err := os.Stat(s.StateDir); err == nil && st.IsDir() {
		o.StateDir = true
	}
	o.Bin = binariesPresent(s)
	fixes, err := k.plan(s)
	if err != nil {
		return o, nil, err
	}
	o.Underlay = ready(fixes, partUnderlay)
	o.Router = s.Router != nil && ready(fixes, partRouter)
	o.External = s.External != nil && ready(fixes, partExternal)
	o.ExternalRewired = rewired(fixes, partExternal)
	o.Rewired = map[string]bool{}
	for _, n := range s.Nodes {
		o.Nodes[n.Name] = ready(fixes, nodePart(n.Name))
		o.Rewired[n.Name] = rewired(fixes, nodePart(n.Name))
		if s.Containerd() {
			o.Kubelets[n.Name] = containerdRunning(s, n)
		}
		if gpid, ok := proc.Running(s.StateDir, GatewayProc(n.Name)); ok {
			o.Gateways[n.Name] = true
			o.GatewaysOutdated[n.Name] = !sameArgs(gpid, gatewayArgv(s, n))
		}
		var pid int
		pid, o.Agents[n.Name] = proc.Running(s.StateDir, AgentProc(n.Name))
		if o.Agents[n.Name] {
			o.AgentBackends[n.Name] = flagOf(pid, "--backend")
			o.AgentProxyModes[n.Name] = flagOf(pid, "--proxy-mode")
			o.AgentCNIConflists[n.Name] = flagOf(pid, "--cni-conflist")
			o.AgentCNIBinDirs[n.Name] = flagOf(pid, "--cni-bin-dir")
			o.AgentsWithoutProxy[n.Name] = !hasFlag(pid, "--proxy")
			o.AgentsDNSOutdated[n.Name] = !hasFlag(pid, "--dns") || flagOf(pid, "--dns-upstreams") != s.dnsUpstreams()
		}
	}
	if s.External != nil {
		var pid int
		if pid, o.ExternalServer = proc.Running(s.StateDir, ProcExternal); o.ExternalServer {
			o.ExternalWithoutDNS = flagOf(pid, "--dns-answer") == ""
		}
	}
	// A control plane running with old flags (etcd on plain HTTP) is
	// not present: its step restarts it.
	o.ControlPlane = controlplane.Current(controlPlaneConfig(s, ""))
	var cpid int
	if cpid, o.Controller = proc.Running(s.StateDir, ProcController); o.Controller {
		o.ControllerOutdated = !sameArgs(cpid, controllerArgv(s))
		o.ControllerLBPool = flagOf(cpid, "--load-balancer-ip-pool")
	}
	return o, fixes, nil
}

func makeStateDirs(s *Spec) error {
	for _, d := range []string{s.StateDir, s.LogDir(), filepath.Join(s.StateDir, "pids")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// routePodCIDRs records the nodes' pod CIDRs and routes them from the
// root namespace over the lab's bridge (Spec.hostRoutes).
func routePodCIDRs(k kernel, s *Spec, k8sBin string, cidrs map[string]netip.Prefix) error {
	if !maps.Equal(s.PodCIDRs, cidrs) {
		s.PodCIDRs = cidrs
		if err := saveRecord(&record{Spec: *s, K8sBinDir: k8sBin}); err != nil {
			return err
		}
	}
	fixes, err := k.plan(s)
	if err != nil {
		return err
	}
	return k.apply(fixesOf(fixes, partUnderlay))
}

// controlPlaneConfig is the lab's control plane: the apiserver on the
// underlay's host address, the controller manager and the scheduler, with
// one EndpointSlice controller (flatnet's: the lab's controller runs it).
func controlPlaneConfig(s *Spec, k8sBin string) controlplane.Config {
	disabled := []string{"endpointslice-controller"}
	if s.Manifest() {
		// deploy/'s controller leaves EndpointSlices to the cluster's.
		disabled = nil
	}
	cfg := controlplane.Config{
		StateDir:            s.StateDir,
		BinDir:              k8sBin,
		Addr:                s.HostAddr,
		ServiceCIDR:         s.ServiceCIDR.String(),
		Name:                s.Name,
		Controllers:         true,
		DisabledControllers: disabled,
	}
	// Only with simulated nodes, although harmless without: changing
	// these flags restarts the control plane, which a lab without
	// simulated nodes has no reason to go through. Simulated nodes renew
	// no lease, so kube-controller-manager must wait long for their
	// heartbeats (simnodes.NodeMonitorGracePeriod); thousands of them
	// need the larger limits.
	//
	// And no TTL controller: its node.alpha.kubernetes.io/ttl annotation
	// is read only by kubelets (how long they cache Secrets and
	// ConfigMaps), which simulated nodes have none of, and when thousands
	// of Nodes appear within a minute it rewrites every Node at each size
	// step it crosses (100, 500, 1,000, 2,000), a GET and a PATCH per Node
	// at the controller manager's 20 QPS: ten minutes of Node updates
	// that every Node watcher receives, in the middle of what the lab's
	// users measure (make bench-scale).
	//
	// Nor the legacy Endpoints controller: nothing in the lab reads
	// Endpoints (flatnet's proxy, DNS and gateway read EndpointSlices), and
	// it writes one per Service at every pod readiness change, beside the
	// EndpointSlice write of flatnet's controller: in a 5,000-pod run of
	// make bench-scale it cost kube-controller-manager 9 CPU-s, the
	// apiserver 10 and etcd 4 (docs/scale.md), on the two CPUs the
	// simulation and the measured processes share.
	if s.SimulatedNodes > 0 {
		cfg.NodeMonitorGracePeriod = simnodes.NodeMonitorGracePeriod
		cfg.ManyNodes = true
		cfg.DisabledControllers = append(cfg.DisabledControllers, "ttl-controller", "endpoints-controller")
	}
	return cfg
}

// controllerMetricsAddr is where the lab's controller serves its metrics:
// the port of controller.DefaultMetricsBindAddress on the lab's own host
// address.
func controllerMetricsAddr(s *Spec) string {
	_, port, _ := net.SplitHostPort(controller.DefaultMetricsBindAddress)
	return net.JoinHostPort(s.HostAddr.String(), port)
}

// controllerArgv is the command line of the lab's flatnet controller.
func controllerArgv(s *Spec) []string {
	argv := []string{
		filepath.Join(s.BinDir(), "flatnet"), "controller",
		"--kubeconfig", s.Kubeconfig(),
		"--cluster-cidr", s.ClusterCIDR.String(),
		"--node-cidr-mask-size", strconv.Itoa(s.NodeCIDRMaskSize),
		"--allocate-node-cidrs=true",
		// The metrics server (with pprof: a lab is for looking inside)
		// on the lab's own host address: unlike the agents, each in its
		// node's namespace, the controller runs in the machine's, where
		// every lab's controller would take the same default address and
		// the second would fail to start.
		"--metrics-bind-address=" + controllerMetricsAddr(s),
		"--profiling",
		// flatnet writes the EndpointSlices the agents' Service proxies
		// read (kube-controller-manager's controller is off).
		"--endpointslices",
	}
	if pool := s.LoadBalancerPool(); pool != "" {
		// No cloud: flatnet gives LoadBalancer Services their addresses.
		argv = append(argv, "--load-balancer-ip-pool", pool)
	}
	return argv
}

// checkCNIPluginDir refuses a --cni-bin-dir that is not a directory, or
// lacks a plugin of the agents' conflist: the plugins come from it rather
// than from the lab (flatnet-policy, the lab's own, is not asked for).
func checkCNIPluginDir(s *Spec) error {
	dir := s.CNIPluginDir
	if dir == "" {
		return nil
	}
	if st, err := os.Stat(dir); err != nil {
		return fmt.Errorf("--cni-bin-dir: %w (want a directory of CNI plugins; --cni-bin-dir \"\" for the lab's own)", err)
	} else if !st.IsDir() {
		return fmt.Errorf("--cni-bin-dir %s is not a directory (want one of CNI plugins; --cni-bin-dir \"\" for the lab's own)", dir)
	}
	var missing []string
	for _, p := range subnet.Plugins(s.AgentCNIConflist(), false) {
		if st, err := os.Stat(filepath.Join(dir, p)); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("--cni-bin-dir %s has no executable %s, which the %s conflist runs (%s); install them there, or pass --cni-bin-dir \"\" for the lab's own",
			dir, strings.Join(missing, ", "), s.AgentCNIConflist(), strings.Join(subnet.Plugins(s.AgentCNIConflist(), false), ", "))
	}
	return nil
}

// sameArgs reports whether process pid runs with want's arguments (the
// program's path is not compared; false when unreadable).
func sameArgs(pid int, want []string) bool {
	argv, err := readArgv(pid)
	return err == nil && len(argv) > 0 && slices.Equal(argv[1:], want[1:])
}

// hasFlag reports whether process pid was started with the boolean flag
// (flag, flag=true or flag=1; false when unreadable).
func hasFlag(pid int, flag string) bool {
	argv, err := readArgv(pid)
	if err != nil {
		return false
	}
	on := false
	for _, a := range argv {
		if a == flag {
			on = true
		} else if v, ok := strings.CutPrefix(a, flag+"="); ok {
			on = v == "true" || v == "1"
		}
	}
	return on
}

// flagOf returns the value of flag in process pid's command line ("" when
// absent or unreadable).
func flagOf(pid int, flag string) string {
	argv, err := readArgv(pid)
	if err != nil {
		return ""
	}
	return flagIn(argv, flag)
}

// flagIn returns the value of flag in argv ("" when absent).
func flagIn(argv []string, flag string) string {
	for i, a := range argv {
		if a == flag && i+1 < len(argv) {
			return argv[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

func readArgv(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// externalArgv is the command line of the external host's server: the
// "internet" of the lab, with a DNS server for ExternalDNSZone that the
// nodes' cluster DNS forwards to.
func externalArgv(s *Spec) []string {
	return []string{
		filepath.Join(s.BinDir(), "flatnet"), "netexec",
		"--http-port", strconv.Itoa(ExternalHTTPPort),
		"--udp-port", strconv.Itoa(ExternalUDPPort),
		"--dns-port", "53", "--dns-zone", ExternalDNSZone, "--dns-answer", s.External.IP.String(),
	}
}

// agentArgv is the command line of node n's agent (lab mode).
func agentArgv(s *Spec, n Node) []string {
	argv := []string{
		filepath.Join(s.BinDir(), "flatnet"), "agent",
		"--kubeconfig", s.Kubeconfig(),
		"--node-name", n.Name,
		"--node-ip", n.IP.String(),
		"--cluster-cidr", s.ClusterCIDR.String(),
		"--backend", s.Backend,
		"--cni-conf-dir", s.CNIConfDir(n),
		"--cni-conflist", s.AgentCNIConflist(),
		"--cni-bin-dir", s.AgentCNIBinDir(),
		"--cni-data-dir", s.CNIDataDir(n),
		"--cni-cache-dir", s.CNICacheDir(n),
		"--masquerade=true",
	}
	if !s.Containerd() {
		// The agent is the node's kubelet too.
		argv = append(argv,
			"--lab-runtime",
			"--runtime-state-dir", s.RuntimeDir(n),
			"--netns-prefix", s.PodNetnsPrefix,
			"--pod-path", s.BinDir())
	}
	return append(argv,
		// Services: the lab has no kube-proxy. Go's /debug/pprof/ on the
		// proxy's metrics server, in the node's namespace, as the
		// controller's: a lab is for looking inside.
		"--proxy", "--proxy-mode", s.AgentProxyMode(), "--profiling",
		// NetworkPolicy, by the agent as in deploy/flatnet.yaml, with the
		// gate's socket in the node's own directory (nodes share the
		// machine's file system; a containerd node's mount namespace
		// shows the state dir as it is).
		"--network-policy",
		"--policy-socket", s.PolicySocket(n),
		// Cluster DNS: no CoreDNS either. Each agent takes the kube-dns
		// ClusterIP and the node-local address on its node.
		"--dns",
		"--cluster-dns", s.KubeDNSIP().String(),
		"--dns-addresses", NodeLocalDNS+","+s.KubeDNSIP().String(),
		"--dns-upstreams", s.dnsUpstreams(),
		"--dns-reverse-cidrs", s.ServiceCIDR.String()+","+s.ClusterCIDR.String(),
	)
}

// gatewayArgv runs `flatnet gateway` in node n's namespace, like the
// DaemonSet in deploy/flatnet.yaml does on a real node.
func gatewayArgv(s *Spec, n Node) []string {
	return []string{
		filepath.Join(s.BinDir(), "flatnet"), "gateway",
		"--kubeconfig", s.Kubeconfig(),
		"--node-name", n.Name,
		"--namespace", "kube-system",
	}
}

// dnsUpstreams is where the lab's cluster DNS forwards other names: the
// external host's DNS server, or nowhere (the nodes have no route to the
// machine's own resolvers, and must not).
func (s *Spec) dnsUpstreams() string {
	if s.External != nil {
		return s.External.IP.String()
	}
	return "none"
}
