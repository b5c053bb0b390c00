package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
	"github.com/flatnet/flatnet/internal/proc"
)

// Client returns a clientset for the lab's admin kubeconfig.
func Client(kubeconfig string) (kubernetes.Interface, string, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	rc.Timeout = 10 * time.Second
	rc.QPS, rc.Burst = 50, 100
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", err
	}
	return c, rc.Host, nil
}

// conflistWhat says what the agents' conflist of style chains (the lab's
// agents run the policy gate).
func conflistWhat(style string) string {
	if style == subnet.StyleClassic {
		return "conflist classic: bridge (host-local), bandwidth, portmap, flatnet-policy"
	}
	return "conflist " + style + ": flatnet (bridge, host-local, bandwidth, portmap in one process), flatnet-policy"
}

func hasCNIConfig(dir string) bool {
	for _, pat := range []string{"*.conflist", "*.conf", "*.json"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

// waitReady waits until every node of s is Ready, has a pod CIDR and its
// agent has written the node's CNI config. A daemon that dies meanwhile
// ends the wait with the end of its log.
func waitReady(ctx context.Context, s *Spec, kubeconfig string, timeout time.Duration) (podCIDRs map[string]netip.Prefix, err error) {
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, _, err := Client(kubeconfig)
	if err != nil {
		return nil, err
	}
	var missing []string
	for {
		var procs []string
		if !s.Manifest() {
			procs = append([]string{ProcController}, agentProcs(s)...)
		}
		for _, name := range procs {
			if _, ok := proc.Running(s.StateDir, name); !ok {
				log := proc.LogFile(s.StateDir, name)
				return nil, fmt.Errorf("%s exited; end of %s:\n%s", name, log, proc.Tail(log, 15))
			}
		}
		missing = missing[:0]
		podCIDRs = map[string]netip.Prefix{}
		// The real nodes only: a list of thousands of simulated ones five
		// times a second would load the apiserver this wait is for.
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "!" + simnodes.LabelSimulated})
		if err != nil {
			missing = append(missing, "node list: "+err.Error())
		} else {
			byName := map[string]*corev1.Node{}
			for i := range nodes.Items {
				byName[nodes.Items[i].Name] = &nodes.Items[i]
			}
			for _, n := range s.Nodes {
				kn := byName[n.Name]
				switch {
				case kn == nil:
					missing = append(missing, n.Name+" not registered")
				case kn.Spec.PodCIDR == "":
					missing = append(missing, n.Name+" has no pod CIDR")
				case !kube.NodeReady(kn):
					missing = append(missing, n.Name+" not Ready")
				case !hasCNIConfig(s.CNIConfDir(n)):
					missing = append(missing, n.Name+" has no CNI config in "+s.CNIConfDir(n))
				}
				if kn != nil {
					if p, err := netip.ParsePrefix(kn.Spec.PodCIDR); err == nil {
						podCIDRs[n.Name] = p
					}
				}
			}
		}
		if len(missing) == 0 {
			// Pods need their namespace's service account (ServiceAccount
			// admission): the controller manager makes default's.
			if _, err := c.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
				missing = append(missing, "no default service account yet: "+err.Error())
			} else {
				return podCIDRs, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("not ready after %s: %s (logs in %s)", timeout, strings.Join(missing, "; "), s.LogDir())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func agentProcs(s *Spec) []string {
	var out []string
	for _, n := range s.Nodes {
		out = append(out, AgentProc(n.Name), GatewayProc(n.Name))
	}
	return out
}

// Status is a lab as seen from the kernel, the state dir and the API.
type Status struct {
	Spec         *Spec
	K8sBinDir    string
	Underlay     bool
	Router       bool // wired (two-subnet labs)
	External     bool // wired (labs with an external host)
	ExternalPID  int  // its netexec; 0 when not running
	Server       string
	APIServerPID int
	EtcdPID      int
	ControlPlane bool
	Controller   int // pid; 0 when not running
	// Drift lists what the kernel lacks (one line per fix `up` would
	// apply); empty when every part is wired.
	Drift    []string
	Nodes    []NodeStatus
	Pods     []PodStatus
	APIError error // the API could not be read
	// Simulated counts the simulated nodes and their pods (which Pods
	// leaves out); nil in a lab without any.
	Simulated *SimulatedStatus
}

// SimulatedStatus is the simulated nodes of a lab, counted.
type SimulatedStatus struct {
	Want int // Spec.SimulatedNodes
	Kwok int // kwok's pid; 0 when not running
	// Nodes exist, of which Ready are Ready and PodCIDRs have a podCIDR;
	// Pods are bound to them, of which Running are Running.
	Nodes, Ready, PodCIDRs, Pods, Running int
}

// NodeStatus is one node.
type NodeStatus struct {
	Node
	Wired bool
	Agent int // pid; 0 when not running
	// Kubelet is the kubelet's pid (--runtime containerd); 0 when not
	// running.
	Kubelet int
	PodCIDR string
	Ready   string // "True", "False", "Unknown", or "-" when not registered
}

// PodStatus is one pod.
type PodStatus struct {
	Namespace, Name, Node, IP, Phase string
	Ready                            string // "1/2"
}

// GetStatus reads lab name's status.
func GetStatus(ctx context.Context, root, name string) (*Status, error) {
	rec, err := loadRecord(root, name)
	if err != nil {
		return nil, err
	}
	s := &rec.Spec
	st := &Status{Spec: s, K8sBinDir: rec.K8sBinDir}
	fixes, err := newKernel("").plan(s)
	if err != nil {
		return nil, err
	}
	for _, f := range fixes {
		st.Drift = append(st.Drift, f.String())
	}
	st.Underlay = ready(fixes, partUnderlay)
	st.Router = s.Router != nil && ready(fixes, partRouter)
	st.External = s.External != nil && ready(fixes, partExternal)
	if s.External != nil {
		if pid, ok := proc.Running(s.StateDir, ProcExternal); ok {
			st.ExternalPID = pid
		}
	}
	st.APIServerPID, st.EtcdPID, st.ControlPlane = controlplane.Running(s.StateDir)
	if pid, ok := proc.Running(s.StateDir, ProcController); ok {
		st.Controller = pid
	}
	for _, n := range s.Nodes {
		ns := NodeStatus{Node: n, Ready: "-", Wired: ready(fixes, nodePart(n.Name))}
		if pid, ok := proc.Running(s.StateDir, AgentProc(n.Name)); ok {
			ns.Agent = pid
		}
		if s.Containerd() {
			_, ns.Kubelet = nodeDaemons(s, n)
		}
		st.Nodes = append(st.Nodes, ns)
	}
	if !st.ControlPlane {
		st.APIError = errors.New("the control plane is not running")
		return st, nil
	}
	c, host, err := Client(s.Kubeconfig())
	if err != nil {
		st.APIError = err
		return st, nil
	}
	st.Server = host
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		st.APIError = err
		return st, nil
	}
	simulated := map[string]bool{}
	if pid, kwok := proc.Running(s.StateDir, ProcKwok); kwok || s.SimulatedNodes > 0 {
		st.Simulated = &SimulatedStatus{Want: s.SimulatedNodes, Kwok: pid}
	}
	for i := range nodes.Items {
		kn := &nodes.Items[i]
		if _, ok := kn.Labels[simnodes.LabelSimulated]; !ok {
			continue
		}
		simulated[kn.Name] = true
		if st.Simulated == nil {
			st.Simulated = &SimulatedStatus{}
		}
		st.Simulated.Nodes++
		if kube.NodeReady(kn) {
			st.Simulated.Ready++
		}
		if kn.Spec.PodCIDR != "" {
			st.Simulated.PodCIDRs++
		}
	}
	for i := range st.Nodes {
		for _, kn := range nodes.Items {
			if kn.Name != st.Nodes[i].Name {
				continue
			}
			st.Nodes[i].PodCIDR = kn.Spec.PodCIDR
			st.Nodes[i].Ready = "Unknown"
			for _, c := range kn.Status.Conditions {
				if c.Type == corev1.NodeReady {
					st.Nodes[i].Ready = string(c.Status)
				}
			}
		}
	}
	if err := readPods(ctx, c, st, simulated); err != nil {
		st.APIError = err
		return st, nil
	}
	sort.Slice(st.Pods, func(i, j int) bool {
		if st.Pods[i].Namespace != st.Pods[j].Namespace {
			return st.Pods[i].Namespace < st.Pods[j].Namespace
		}
		return st.Pods[i].Name < st.Pods[j].Name
	})
	return st, nil
}

// readPods fills st.Pods with the pods of the lab's own nodes (and those
// not bound yet) and counts those of its simulated nodes. A lab without
// simulated nodes lists every pod. With them it never does: at 100,000
// simulated pods that one LIST kept the API server busy for over 10
// seconds (and `lab up`, which prints this status, restarts agents that
// list the API themselves). It lists the pods of each real node and the
// unbound ones (field selectors on spec.nodeName, which the API server's
// cache indexes), counts every pod from a one-item page's
// remainingItemCount and lists only the pods not Running.
func readPods(ctx context.Context, c kubernetes.Interface, st *Status, simulated map[string]bool) error {
	if st.Simulated == nil {
		pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			st.Pods = append(st.Pods, podStatus(&pods.Items[i]))
		}
		return nil
	}
	total, err := countPods(ctx, c)
	if err != nil {
		return err
	}
	own := []string{""} // "": not bound to a node yet
	for _, n := range st.Nodes {
		own = append(own, n.Name)
	}
	for _, node := range own {
		pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
		if err != nil {
			return fmt.Errorf("listing the pods of node %q: %w", node, err)
		}
		for i := range pods.Items {
			st.Pods = append(st.Pods, podStatus(&pods.Items[i]))
		}
	}
	// Every other pod is on a simulated node (or on a Node since
	// deleted, which kwok no longer serves either).
	st.Simulated.Pods = max(0, total-len(st.Pods))
	notRunning, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermNotEqualSelector("status.phase", string(corev1.PodRunning)).String()})
	if err != nil {
		return fmt.Errorf("listing the pods not Running: %w", err)
	}
	st.Simulated.Running = st.Simulated.Pods
	for _, p := range notRunning.Items {
		if simulated[p.Spec.NodeName] {
			st.Simulated.Running--
		}
	}
	return nil
}

// countPods counts every pod without listing them: the count of a
// one-item page and the items remaining after it.
func countPods(ctx context.Context, c kubernetes.Interface) (int, error) {
	page, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, fmt.Errorf("counting pods: %w", err)
	}
	n := len(page.Items)
	switch {
	case page.RemainingItemCount != nil:
		n += int(*page.RemainingItemCount)
	case page.Continue != "":
		return 0, errors.New("counting pods: the API server gave a page of pods without remainingItemCount")
	}
	return n, nil
}

func podStatus(p *corev1.Pod) PodStatus {
	ready := 0
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Ready {
			ready++
		}
	}
	return PodStatus{
		Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, IP: p.Status.PodIP,
		Phase: string(p.Status.Phase), Ready: fmt.Sprintf("%d/%d", ready, len(p.Spec.Containers)),
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func pidOrDown(pid int) string {
	if pid == 0 {
		return "not running"
	}
	return fmt.Sprintf("pid %d", pid)
}

// Print writes st as tables.
func (st *Status) Print(w io.Writer) {
	s := st.Spec
	fmt.Fprintf(w, "lab %s (state %s)\n", s.Name, s.StateDir)
	under := "up"
	if !st.Underlay {
		under = "MISSING"
	}
	fmt.Fprintf(w, "underlay:      %s on bridge %s, host %s (%s)\n", s.Underlay, s.Bridge, s.HostAddr, under)
	upOrMissing := func(ok bool) string {
		if ok {
			return "up"
		}
		return "MISSING"
	}
	if r := s.Router; r != nil {
		fmt.Fprintf(w, "underlay 2:    %s on bridge %s in netns %s, router %s <-> %s (%s)\n",
			s.Underlay2, r.Bridge, r.Netns, r.IP, r.IP2, upOrMissing(st.Router))
	}
	if x := s.External; x != nil {
		fmt.Fprintf(w, "external host: %s in netns %s (%s), netexec HTTP :%d, UDP :%d, %s\n",
			x.IP, x.Netns, upOrMissing(st.External), ExternalHTTPPort, ExternalUDPPort, pidOrDown(st.ExternalPID))
	}
	cp := fmt.Sprintf("kube-apiserver %s, etcd %s", pidOrDown(st.APIServerPID), pidOrDown(st.EtcdPID))
	if !st.ControlPlane {
		cp = "not running (" + cp + ")"
	}
	if st.Server != "" {
		cp = st.Server + ", " + cp
	}
	fmt.Fprintf(w, "control plane: %s\n", cp)
	controller, agent := pidOrDown(st.Controller), func(n NodeStatus) string { return pidOrDown(n.Agent) }
	if s.Manifest() {
		controller = "Deployment kube-system/flatnet-controller (deploy/flatnet.yaml)"
		agent = func(NodeStatus) string { return "DaemonSet" }
	}
	fmt.Fprintf(w, "controller:    %s\n", controller)
	runtime := "process (flatnet's lab runtime in each agent: pods are processes of this machine)"
	if s.Containerd() {
		runtime = "containerd (containerd, runc and the kubelet on every node)"
	}
	fmt.Fprintf(w, "runtime:       %s\n", runtime)
	fmt.Fprintf(w, "networks:      cluster %s (/%d per node), services %s, backend %s\n", s.ClusterCIDR, s.NodeCIDRMaskSize, s.ServiceCIDR, s.Backend)
	plugins := s.CNIBinDir()
	if s.CNIPluginDir != "" {
		plugins = s.CNIPluginDir + ", then " + plugins + " (--cni-bin-dir)"
	}
	fmt.Fprintf(w, "cni:           %s; plugins in %s\n", conflistWhat(s.AgentCNIConflist()), plugins)
	if s.LBPool.IsValid() {
		reach := "routed to the nodes from the external host"
		if s.External == nil {
			reach = "no external host routes it (add one with up --external)"
		}
		fmt.Fprintf(w, "load balancer: %s: LoadBalancer IPs %s, externalIPs %s; %s\n", s.LBPool, s.LoadBalancerPool(), s.ExternalIPRange(), reach)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "NODE\tINTERNAL-IP\tPOD-CIDR\tREADY\tNETNS\tAGENT"
	if s.Containerd() {
		header += "\tKUBELET"
	}
	fmt.Fprintln(tw, header)
	for _, n := range st.Nodes {
		netns := n.Netns
		if !n.Wired {
			netns += " (MISSING)"
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", n.Name, n.IP, orDash(n.PodCIDR), n.Ready, netns, agent(n))
		if s.Containerd() {
			row += "\t" + pidOrDown(n.Kubelet)
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	if sim := st.Simulated; sim != nil {
		kwok := pidOrDown(sim.Kwok)
		if sim.Want == 0 && sim.Kwok == 0 {
			kwok = "not running (none wanted)"
		}
		fmt.Fprintf(w, "simulated:     %d of %d nodes (%s-sim-NNNNN, InternalIPs in %s): %d Ready, %d with a pod CIDR; %d pods on them, %d Running; kwok %s\n",
			sim.Nodes, sim.Want, s.Name, orDash(prefixOption(s.SimulatedNodeRange)), sim.Ready, sim.PodCIDRs, sim.Pods, sim.Running, kwok)
	}
	fmt.Fprintln(w)
	if len(st.Drift) > 0 {
		fmt.Fprintf(w, "missing in the kernel (`flatnet lab up%s` repairs it):\n", nameFlag(s.Name))
		for _, d := range st.Drift {
			fmt.Fprintf(w, "  %s\n", d)
		}
		fmt.Fprintln(w)
	}
	if st.APIError != nil {
		fmt.Fprintf(w, "pods: cannot read the API: %v\n", st.APIError)
		return
	}
	if len(st.Pods) == 0 {
		fmt.Fprintln(w, "pods: none")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tPOD\tNODE\tIP\tPHASE\tREADY")
	for _, p := range st.Pods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, orDash(p.Node), orDash(p.IP), orDash(p.Phase), p.Ready)
	}
	tw.Flush()
}

// PrintUsage tells how to use a running lab.
func PrintUsage(w io.Writer, st *Status) {
	n := nameFlag(st.Spec.Name)
	if root := filepath.Dir(st.Spec.StateDir); root != DefaultStateRoot {
		n += " --state-dir " + root
	}
	fmt.Fprintf(w, "\nUse it:\n")
	fmt.Fprintf(w, "  flatnet lab kubectl%s -- get nodes -o wide\n", n)
	if st.K8sBinDir != "" {
		fmt.Fprintf(w, "  export KUBECONFIG=%s; %s get pods -A -o wide\n", st.Spec.Kubeconfig(), filepath.Join(st.K8sBinDir, "kubectl"))
	}
	fmt.Fprintf(w, "  flatnet lab exec%s POD -- CMD       run CMD inside a pod\n", n)
	fmt.Fprintf(w, "  ip netns exec %s ip route    a node's routes\n", st.Spec.Nodes[0].Netns)
	fmt.Fprintf(w, "  flatnet lab status%s\n", n)
	fmt.Fprintf(w, "  flatnet lab down%s                removes everything\n", n)
	fmt.Fprintf(w, "  logs: %s\n", st.Spec.LogDir())
}

// fileExists is a small helper for the CLI.
func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
