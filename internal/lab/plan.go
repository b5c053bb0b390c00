package lab

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
)

// StepKind names one kind of step of `up`, in the order they run.
type StepKind string

// The steps of `up`.
const (
	StepStateDir     StepKind = "state dir"
	StepBin          StepKind = "binaries"
	StepUnderlay     StepKind = "underlay"
	StepRouter       StepKind = "router"
	StepNode         StepKind = "node"
	StepExternal     StepKind = "external"
	StepControlPlane StepKind = "control plane"
	StepController   StepKind = "controller"
	StepAgent        StepKind = "agent"
	StepGateway      StepKind = "gateway"
	StepImages       StepKind = "images"
	StepKubelet      StepKind = "kubelet"
	StepManifest     StepKind = "manifest"
	StepReady        StepKind = "ready"
	StepKwok         StepKind = "kwok"
	StepSimulated    StepKind = "simulated"
)

// Step is one piece of the lab: Present when the running lab already has
// it, so `up` skips it.
type Step struct {
	Kind    StepKind
	Node    string // for StepNode and StepAgent
	What    string // for people: what this step makes
	Present bool
	// Restart: a process runs but must be restarted (its namespace was
	// rebuilt under it, or an agent runs another backend).
	Restart bool
}

func (s Step) String() string {
	mark := "create"
	switch {
	case s.Present:
		mark = "present"
	case s.Restart:
		mark = "restart"
	}
	return fmt.Sprintf("%-13s %-7s %s", s.Kind, mark, s.What)
}

// Observed is the running lab as read from the kernel and the state dir.
type Observed struct {
	StateDir bool
	Bin      bool
	// BinOutdated: the lab's copies of flatnet or flatnet-cni are not
	// the build this up installs: up replaces them and restarts every
	// flatnet daemon (an old program would not know new flags).
	BinOutdated  bool
	Underlay     bool
	Nodes        map[string]bool // node name -> namespace fully wired
	ControlPlane bool
	Controller   bool
	Agents       map[string]bool // node name -> agent process running
	// Gateways: node name -> its `flatnet gateway` runs (process install);
	// GatewaysOutdated: with other flags than up would give it.
	Gateways         map[string]bool
	GatewaysOutdated map[string]bool
	// Kubelets: node name -> its containerd and kubelet run
	// (--runtime containerd).
	Kubelets map[string]bool
	// AgentProxyModes: node name -> the --proxy-mode a running agent
	// was started with ("" when none: auto).
	AgentProxyModes map[string]string
	// AgentBackends: node name -> the --backend a running agent was
	// started with.
	AgentBackends map[string]string
	// AgentCNIConflists: node name -> the --cni-conflist a running agent
	// was started with ("" when none: an agent from before the flag,
	// which wrote the classic chain).
	AgentCNIConflists map[string]string
	// AgentCNIBinDirs: node name -> the --cni-bin-dir a running agent
	// was started with.
	AgentCNIBinDirs map[string]string
	// AgentsWithoutProxy: node name -> a running agent was started
	// without --proxy (a lab from before Services): up restarts it.
	AgentsWithoutProxy map[string]bool
	// AgentsDNSOutdated: node name -> a running agent was started without
	// --dns (a lab from before cluster DNS) or with other upstreams (the
	// external host came or went): up restarts it.
	AgentsDNSOutdated map[string]bool
	// ControllerOutdated: the running controller was started with other
	// flags than up would give it (without --endpointslices, or with the
	// --bind-pods of labs from before the scheduler): up restarts it.
	ControllerOutdated bool
	// ControllerLBPool is the running controller's --load-balancer-ip-pool;
	// up restarts it when the Spec wants another.
	ControllerLBPool string
	Router           bool // the router is wired (two-subnet labs)
	External         bool // the external host's namespace is wired
	ExternalServer   bool // its netexec runs
	// ExternalWithoutDNS: its netexec runs without the DNS server (a lab
	// from before cluster DNS): up restarts it.
	ExternalWithoutDNS bool
	// Rewired: node name -> up re-makes its namespace or its veth pair,
	// so a running agent there restarts; ExternalRewired is the same for
	// the external host's server. Other repairs (a route, a sysctl, a
	// link down) leave the processes alone.
	Rewired         map[string]bool
	ExternalRewired bool
	// Kwok: kwok runs; KwokOutdated: with another command line or
	// config file than up would give it.
	Kwok         bool
	KwokOutdated bool
	// SimulatedNodes is how many simulated nodes the lab had when last
	// recorded (up deletes them when asked for fewer).
	SimulatedNodes int
}

// newBuild is what the binaries step adds when it replaces the copies.
func newBuild(o Observed) string {
	if o.Bin && o.BinOutdated {
		return "; a new build: the copies replaced, the flatnet daemons restarted"
	}
	return ""
}

// Plan lists the steps that make spec from what is observed. It is pure.
// The final StepReady is never Present: `up` always waits for the nodes
// (a no-op wait on a ready lab).
func Plan(s *Spec, o Observed) []Step {
	underlay := fmt.Sprintf("bridge %s, host address %s/%d", s.Bridge, s.HostAddr, s.Underlay.Bits())
	if r := s.Router; r != nil {
		underlay += fmt.Sprintf(", route %s via %s", s.Underlay2, r.IP)
	}
	steps := []Step{
		{Kind: StepStateDir, What: s.StateDir, Present: o.StateDir},
		{Kind: StepBin, What: s.BinDir() + " (flatnet), " + s.CNIBinDir() + " (flatnet-cni as " + strings.Join(cniPluginNames, ", ") + ")" + newBuild(o), Present: o.Bin && !o.BinOutdated},
		{Kind: StepUnderlay, What: underlay, Present: o.Underlay},
	}
	if r := s.Router; r != nil {
		steps = append(steps, Step{Kind: StepRouter,
			What: fmt.Sprintf("netns %s: eth0 %s/%d <-> %s, bridge %s %s/%d, forwarding", r.Netns, r.IP, s.Underlay.Bits(), r.HostVeth,
				r.Bridge, r.IP2, s.Underlay2.Bits()),
			Present: o.Underlay && o.Router})
	}
	// wired: node n's namespace and its segment are in place.
	wired := func(n Node) bool {
		if n.Subnet == 1 {
			return o.Nodes[n.Name]
		}
		return o.Underlay && o.Nodes[n.Name]
	}
	for _, n := range s.Nodes {
		where := n.HostVeth
		if n.Subnet == 1 {
			where = fmt.Sprintf("%s on %s in %s", n.HostVeth, s.Router.Bridge, s.Router.Netns)
		}
		steps = append(steps, Step{Kind: StepNode, Node: n.Name,
			What:    fmt.Sprintf("%s: netns %s, eth0 %s/%d <-> %s", n.Name, n.Netns, n.IP, s.UnderlayOf(n.Subnet).Bits(), where),
			Present: wired(n)})
	}
	if x := s.External; x != nil {
		ready := o.Underlay && o.External
		lbRoute := ""
		if gws := s.lbGateways(); len(gws) > 0 {
			lbRoute = fmt.Sprintf(", route %s via %s", s.LBPool, joinAddrs(gws))
		}
		steps = append(steps, Step{Kind: StepExternal,
			What: fmt.Sprintf("netns %s: eth0 %s/%d <-> %s%s, netexec HTTP :%d, UDP :%d, DNS :53 (%s)", x.Netns, x.IP, s.Underlay.Bits(), x.HostVeth,
				lbRoute, ExternalHTTPPort, ExternalUDPPort, ExternalDNSZone),
			Present: ready && o.ExternalServer && !o.ExternalWithoutDNS && !o.BinOutdated,
			Restart: o.ExternalServer && (o.ExternalRewired || o.ExternalWithoutDNS || o.BinOutdated)})
	}
	// (The pool shows in up's header line and in status; this text is
	// matched by tooling as it is.)
	controllerWhat := "flatnet controller (node IPAM, EndpointSlices)"
	controllerOutdated := o.ControllerOutdated || o.ControllerLBPool != s.LoadBalancerPool() || o.BinOutdated
	if o.Controller && o.ControllerLBPool != s.LoadBalancerPool() {
		controllerWhat += fmt.Sprintf("; LoadBalancer IPs %s, was %s", orNone(s.LoadBalancerPool()), orNone(o.ControllerLBPool))
	}
	steps = append(steps,
		Step{Kind: StepControlPlane, What: fmt.Sprintf("etcd, kube-apiserver on %s, kube-controller-manager, kube-scheduler; CRDs ClusterNetworkPolicy (network-policy-api v0.3.0) and Gateway API v1.6.3, GatewayClass and IngressClass flatnet", s.HostAddr), Present: o.ControlPlane})
	if !s.Manifest() {
		steps = append(steps, Step{Kind: StepController, What: controllerWhat,
			Present: o.Controller && !controllerOutdated,
			Restart: o.Controller && controllerOutdated})
	}
	role := "lab runtime"
	if s.Containerd() {
		role = "CNI config"
	}
	for _, n := range s.Nodes {
		if s.Manifest() {
			break
		}
		what := fmt.Sprintf("flatnet agent on %s (%s, %s)", n.Name, role, s.Backend)
		other := o.Agents[n.Name] && o.AgentBackends[n.Name] != "" && o.AgentBackends[n.Name] != s.Backend
		if other {
			what = fmt.Sprintf("flatnet agent on %s (%s, %s; was %s)", n.Name, role, s.Backend, o.AgentBackends[n.Name])
		}
		if was := o.AgentProxyModes[n.Name]; o.Agents[n.Name] && o.AgentProxyModes != nil && orAuto(was) != s.AgentProxyMode() {
			other = true
			what += fmt.Sprintf("; proxy mode %s, was %s", s.AgentProxyMode(), orAuto(was))
		}
		if was := o.AgentCNIConflists[n.Name]; o.Agents[n.Name] && o.AgentCNIConflists != nil && orClassic(was) != s.AgentCNIConflist() {
			other = true
			what += fmt.Sprintf("; CNI conflist %s, was %s", s.AgentCNIConflist(), orClassic(was))
		}
		if was := o.AgentCNIBinDirs[n.Name]; o.Agents[n.Name] && o.AgentCNIBinDirs != nil && was != s.AgentCNIBinDir() {
			other = true
			what += fmt.Sprintf("; CNI plugins from %s, was %s", s.AgentCNIBinDir(), was)
		}
		if o.Agents[n.Name] && o.AgentsWithoutProxy[n.Name] {
			other = true
			what += "; was without the Service proxy"
		}
		if o.Agents[n.Name] && o.AgentsDNSOutdated[n.Name] {
			other = true
			what += "; cluster DNS was off or had other upstreams"
		}
		other = other || o.BinOutdated
		steps = append(steps, Step{Kind: StepAgent, Node: n.Name,
			What:    what,
			Present: o.Agents[n.Name] && !o.Rewired[n.Name] && !other,
			Restart: o.Agents[n.Name] && (o.Rewired[n.Name] || other)})
	}
	for _, n := range s.Nodes {
		if s.Manifest() {
			break
		}
		steps = append(steps, Step{Kind: StepGateway, Node: n.Name,
			What:    fmt.Sprintf("flatnet gateway on %s (Gateway API, Ingress)", n.Name),
			Present: o.Gateways[n.Name] && !o.Rewired[n.Name] && !o.GatewaysOutdated[n.Name] && !o.BinOutdated,
			Restart: o.Gateways[n.Name] && (o.Rewired[n.Name] || o.GatewaysOutdated[n.Name] || o.BinOutdated)})
	}
	if s.Containerd() {
		// The images are needed only by a node whose kubelet starts.
		all := true
		for _, n := range s.Nodes {
			all = all && o.Kubelets[n.Name] && !o.Rewired[n.Name]
		}
		steps = append(steps, Step{Kind: StepImages, What: "pause, agnhost, glibc-dns-testing, busybox, nginx, coredns, echo-basic, flatnet:dev (built once, cached)", Present: all})
		for _, n := range s.Nodes {
			steps = append(steps, Step{Kind: StepKubelet, Node: n.Name,
				What:    fmt.Sprintf("containerd, runc and kubelet on %s", n.Name),
				Present: o.Kubelets[n.Name] && !o.Rewired[n.Name],
				Restart: o.Kubelets[n.Name] && o.Rewired[n.Name]})
		}
		if s.Manifest() {
			// Applied on every up: server-side apply of the same objects
			// changes nothing.
			steps = append(steps, Step{Kind: StepManifest, What: fmt.Sprintf("deploy/flatnet.yaml: DaemonSet flatnet-agent (%s, Services, DNS), Deployment flatnet-controller", s.Backend)})
		}
	}
	steps = append(steps, Step{Kind: StepReady, What: fmt.Sprintf("%d nodes Ready with a pod CIDR and a CNI config; Service kube-system/kube-dns at %s; CRDs (ClusterNetworkPolicy, Gateway API) Established, GatewayClass and IngressClass flatnet", len(s.Nodes), s.KubeDNSIP())})
	return append(steps, simulatedSteps(s, o)...)
}

// simulatedSteps are kwok and the simulated nodes: kwok starts before
// the nodes are made, and stops after the last is deleted. The nodes'
// step is never Present while any are wanted or were recorded: it
// compares them with the API and waits until all are Ready.
func simulatedSteps(s *Spec, o Observed) []Step {
	n := s.SimulatedNodes
	if n == 0 && o.SimulatedNodes == 0 && !o.Kwok {
		return nil
	}
	nodes := Step{Kind: StepSimulated, What: fmt.Sprintf("%d simulated nodes (%s-sim-NNNNN, InternalIPs in %s) Ready with a pod CIDR", n, s.Name, s.SimulatedNodeRange)}
	if n == 0 {
		nodes.What = "no simulated nodes: delete any, with their pods"
		stop := Step{Kind: StepKwok, What: "stop kwok (no simulated nodes)", Present: !o.Kwok}
		return []Step{nodes, stop}
	}
	kwok := Step{Kind: StepKwok, What: fmt.Sprintf("kwok %s (the simulated nodes' kubelet; nodes annotated %s=%s, no leases)", simnodes.KwokVersion, simnodes.AnnotationKwok, simnodes.KwokValue),
		Present: o.Kwok && !o.KwokOutdated, Restart: o.Kwok && o.KwokOutdated}
	return []Step{kwok, nodes}
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, " ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// cniPluginNames are the names flatnet-cni answers to.
var cniPluginNames = []string{"bridge", "host-local", "loopback", "ptp", "macvlan", "bandwidth", "portmap", "flatnet", "flatnet-policy"}

// orClassic is the conflist style an agent started with --cni-conflist
// style writes ("": an agent from before the flag, the classic chain).
func orClassic(style string) string {
	if style == "" {
		return subnet.StyleClassic
	}
	return style
}

// orAuto is a --proxy-mode as the agent reads it ("" is auto).
func orAuto(mode string) string {
	if mode == "" {
		return "auto"
	}
	return mode
}
