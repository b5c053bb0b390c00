// Package lab runs a real multi-node Kubernetes network on one machine:
// upstream etcd and kube-apiserver in the root namespace, N nodes as
// network namespaces on an underlay bridge, each running a flatnet agent
// whose lab runtime starts pods as processes in their own namespaces.
//
// Layouts. One subnet (default): every node and the host on one underlay
// bridge. Two subnets (--subnets 2): odd nodes on that first underlay,
// even nodes on a second one, joined by a router namespace, so peers on
// the other subnet are not on-link and only an overlay reaches their pods.
// An optional external host (--external) sits on the first underlay with
// an address outside every cluster range and answers with the client's
// address, so egress masquerade can be seen. It routes the load-balancer
// range (--lb-pool) to the nodes, ECMP over every node of the first
// underlay, as a BGP router would, so it reaches LoadBalancer IPs and
// externalIPs.
//
// Design: the requested lab is plain data (Spec: every name, address and
// path, computed from a few options), the running lab is read from the
// kernel and the state dir (Observed), and Plan compares the two into a
// list of steps, each present or missing. `up` applies only the missing
// steps, so running it on a running lab changes nothing; `down` removes
// what the Spec names plus anything the runtime state dirs still record.
package lab

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
)

// Defaults for a new lab.
const (
	DefaultName        = "flatnet"
	DefaultStateRoot   = "/var/lib/flatnet/lab"
	DefaultNodes       = 3
	DefaultBackend     = "host-gw"
	DefaultClusterCIDR = "10.244.0.0/16"
	DefaultServiceCIDR = "10.96.0.0/16"
	DefaultNodeMask    = 24
	// DefaultLBPool is routed to the nodes from the external host: its
	// lower half is the controller's LoadBalancer pool, its upper half is
	// left for spec.externalIPs. Outside the underlays (10.250.0.0/16),
	// since an address inside an underlay would need someone to answer
	// ARP for it.
	DefaultLBPool = "10.251.0.0/24"
	// maxLBPoolBits leaves the controller at least three addresses (a /29:
	// .1-.3 of its lower half).
	maxLBPoolBits = 29
	// MaxNodes keeps node addresses (.11 upward) inside the underlay /24.
	MaxNodes = 200
)

// underlayBase is the /16 that lab underlays are carved from: the default
// lab takes 10.250.0.0/24, other labs 10.250.N.0/24.
var underlayBase = netip.MustParsePrefix("10.250.0.0/16")

// ProxyModes are the agent's --proxy-mode values.
var ProxyModes = []string{"auto", "nftables", "iptables", "userspace"}

// AgentProxyMode is the --proxy-mode the agents run with.
func (s *Spec) AgentProxyMode() string {
	if s.ProxyMode == "" {
		return "auto"
	}
	return s.ProxyMode
}

// AgentCNIConflist is the --cni-conflist the agents run with: the
// recorded style, or classic for a lab recorded before the flag (its
// agents wrote the chain).
func (s *Spec) AgentCNIConflist() string {
	if s.CNIConflist == "" {
		return subnet.StyleClassic
	}
	return s.CNIConflist
}

// AgentCNIBinDir is the --cni-bin-dir the agents run with: the lab's
// cni-bin dir, after CNIPluginDir when there is one (a PATH-style list:
// plugins found there win, and flatnet's own, flatnet-policy, still
// resolve).
func (s *Spec) AgentCNIBinDir() string {
	if s.CNIPluginDir == "" {
		return s.CNIBinDir()
	}
	return s.CNIPluginDir + string(filepath.ListSeparator) + s.CNIBinDir()
}

// Backends are the cross-node backends the agent implements.
var Backends = []string{"host-gw", "vxlan", "vxlan-direct"}

// Pod runtimes of lab nodes: the agent's own process runtime (the
// default), or upstream containerd + kubelet per node.
const (
	RuntimeProcess    = "process"
	RuntimeContainerd = "containerd"
)

// Runtimes are the values of --runtime.
var Runtimes = []string{RuntimeProcess, RuntimeContainerd}

// How flatnet gets onto the nodes: the lab starts its processes, or
// applies deploy/flatnet.yaml as a user would (--runtime containerd).
const (
	InstallProcess  = "process"
	InstallManifest = "manifest"
)

// Host numbers on the first underlay: the host is .1, node i is .10+i
// (up to .210), the external host .250 and the router .254. On the second
// underlay the router is .1 and node i is .10+i.
const (
	externalHost = 250
	routerHost   = 254
	router2Host  = 1
)

// External host ports: netexec's HTTP and UDP servers.
const (
	ExternalHTTPPort = 8080
	ExternalUDPPort  = 8081
	// ExternalDNSZone is the zone the external host's DNS server answers
	// (every name in it is the external host).
	ExternalDNSZone = "external.test"
)

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// Options are what a user asks for; NewSpec turns them into a Spec.
type Options struct {
	Name      string
	StateRoot string // labs live in StateRoot/<name>
	Nodes     int
	Backend   string
	// ProxyMode is the agents' --proxy-mode ("" is auto).
	ProxyMode string
	// CNIConflist is the agents' --cni-conflist ("" is flatnet).
	CNIConflist string
	// CNIPluginDir (lab up --cni-bin-dir) is searched for CNI plugins
	// before the lab's own cni-bin dir ("": that one alone).
	CNIPluginDir     string
	ClusterCIDR      string
	ServiceCIDR      string
	NodeCIDRMaskSize int
	// Underlay is "A" or "A,B" (one /24 or larger per subnet); "" or a
	// missing B chooses free ones.
	Underlay string
	Subnets  int  // 1 (default) or 2: nodes on two underlay subnets joined by a router
	External bool // an external host on the first underlay
	// Runtime is RuntimeProcess ("" too) or RuntimeContainerd.
	Runtime string
	// Install is InstallProcess ("" too) or InstallManifest (containerd
	// only).
	Install string
	// LBPool is the load-balancer range (see Spec.LBPool); "" for none.
	LBPool string
	// SimulatedNodes is how many simulated nodes kwok plays besides the
	// real ones (Spec.SimulatedNodes).
	SimulatedNodes int
	// SimulatedNodeRange holds their InternalIPs; "" is
	// simnodes.DefaultIPRange.
	SimulatedNodeRange string
}

// Spec is a lab as data: every name, address and path it uses.
type Spec struct {
	Name      string `json:"name"`
	StateDir  string `json:"stateDir"`
	Backend   string `json:"backend"`
	ProxyMode string `json:"proxyMode,omitempty"` // "" or auto: the agent picks
	// CNIConflist is the agents' conflist style (subnet.Styles); ""
	// in a lab recorded before it: classic (AgentCNIConflist).
	CNIConflist string `json:"cniConflist,omitempty"`
	// CNIPluginDir is searched for the agents' CNI plugins before
	// CNIBinDir ("": CNIBinDir alone; AgentCNIBinDir).
	CNIPluginDir     string       `json:"cniPluginDir,omitempty"`
	ClusterCIDR      netip.Prefix `json:"clusterCIDR"`
	ServiceCIDR      netip.Prefix `json:"serviceCIDR"`
	NodeCIDRMaskSize int          `json:"nodeCIDRMaskSize"`
	Underlay         netip.Prefix `json:"underlay"`
	HostAddr         netip.Addr   `json:"hostAddr"` // the root namespace's address on the underlay
	Bridge           string       `json:"bridge"`   // underlay bridge in the root namespace
	PodNetnsPrefix   string       `json:"podNetnsPrefix"`
	Nodes            []Node       `json:"nodes"`
	// Runtime runs the nodes' pods: "" (the agent's process runtime) or
	// RuntimeContainerd (containerd, runc and the kubelet per node).
	Runtime string `json:"runtime,omitempty"`
	// Install: "" (the lab runs flatnet's controller and agents as
	// processes) or InstallManifest (deploy/flatnet.yaml applied to the
	// cluster: the agents run as a DaemonSet, the controller as a
	// Deployment, on the real nodes).
	Install string `json:"install,omitempty"`
	// Underlay2 is the second subnet (--subnets 2), behind Router.
	Underlay2 netip.Prefix `json:"underlay2,omitzero"`
	Router    *Router      `json:"router,omitempty"`
	External  *External    `json:"external,omitempty"`
	// LBPool is the load-balancer range: the external host routes it to
	// the nodes; its lower half (without the network address) is the
	// controller's --load-balancer-ip-pool (LoadBalancerPool), its upper
	// half is left for spec.externalIPs (ExternalIPRange). Zero in a lab
	// recorded before it existed.
	LBPool netip.Prefix `json:"lbPool,omitzero"`
	// PodCIDRs are the nodes' pod CIDRs (node name -> CIDR) as the
	// controller gave them, learned by `up` once the nodes are Ready: the
	// root namespace routes them over the lab's bridge (hostRoutes), so
	// that the apiserver reaches pods (pods/proxy, services/proxy).
	PodCIDRs map[string]netip.Prefix `json:"podCIDRs,omitempty"`
	// SimulatedNodes is how many simulated nodes (internal/lab/simnodes)
	// the lab keeps: Node objects kwok plays the kubelet for, with pods
	// that kwok marks Running and that answer nothing. 0: none, and no
	// kwok.
	SimulatedNodes int `json:"simulatedNodes,omitempty"`
	// SimulatedNodeRange holds the simulated nodes' InternalIPs (set when
	// SimulatedNodes > 0). No interface holds them; each real node has
	// the range on-link on its eth0, inside its namespace only, so that
	// host-gw routes via them are accepted (nodeEndpoint).
	SimulatedNodeRange netip.Prefix `json:"simulatedNodeRange,omitzero"`
}

// Router joins the two underlays of a two-subnet lab: a namespace with
// eth0 on the first underlay's bridge and, inside, the second underlay's
// bridge, forwarding between them. No route in it leads anywhere else.
type Router struct {
	Netns    string     `json:"netns"`
	HostVeth string     `json:"hostVeth"` // root-namespace end, on Spec.Bridge
	IP       netip.Addr `json:"ip"`       // eth0, on Underlay
	Bridge   string     `json:"bridge"`   // the second underlay, inside Netns
	IP2      netip.Addr `json:"ip2"`      // on Bridge, on Underlay2
}

// External is a host outside the cluster on the first underlay, running
// netexec (HTTP /clientip tells who connected).
type External struct {
	Netns    string     `json:"netns"`
	HostVeth string     `json:"hostVeth"` // root-namespace end, on Spec.Bridge
	IP       netip.Addr `json:"ip"`
}

// Node is one lab node.
type Node struct {
	Index    int        `json:"index"`
	Name     string     `json:"name"`     // the Kubernetes Node name
	Netns    string     `json:"netns"`    // under /run/netns
	HostVeth string     `json:"hostVeth"` // root-namespace end, on the bridge
	IP       netip.Addr `json:"ip"`       // InternalIP, eth0 in the node namespace
	// Subnet is 0 for the first underlay (HostVeth on Spec.Bridge in the
	// root namespace), 1 for the second (HostVeth on Router.Bridge in the
	// router's namespace).
	Subnet int `json:"subnet,omitempty"`
}

// Process names (pid and log files in the state dir).
const (
	ProcController = "controller"
	ProcExternal   = "external"
	ProcKwok       = "kwok"
)

// AgentProc is the process name of a node's agent.
func AgentProc(node string) string { return "agent-" + node }

// GatewayProc is the process name of a node's `flatnet gateway`.
func GatewayProc(node string) string { return "gateway-" + node }

// ValidateName checks a lab name: it becomes part of Kubernetes node names
// and of namespace and interface names.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid lab name %q: use 1-32 lowercase letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// ifName is prefix+name+suffix when that fits an interface name (15
// bytes), else prefix+hash(name)+suffix, so names stay unique per lab.
func ifName(prefix, name, suffix string) string {
	if n := prefix + name + suffix; len(n) <= 15 {
		return n
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:])
	return prefix + h[:15-len(prefix)-len(suffix)] + suffix
}

// BridgeName is the underlay bridge of lab name.
func BridgeName(name string) string { return ifName("fl-", name, "") }

// NodeNetns is the network namespace of node i (1-based).
func NodeNetns(name string, i int) string { return "fl-" + name + "-n" + strconv.Itoa(i) }

// RouterNetns and ExternalNetns are the router's and the external host's
// namespaces. Neither matches a node ("-n<digits>") or pod ("-<8 hex>")
// namespace name of this or another lab.
func RouterNetns(name string) string   { return "fl-" + name + "-rt" }
func ExternalNetns(name string) string { return "fl-" + name + "-ext" }

// RouterVeth and ExternalVeth are their veths' root-namespace ends. The
// prefixes fr- and fx- keep them apart from every lab's fl- names.
func RouterVeth(name string) string   { return ifName("fr-", name, "") }
func ExternalVeth(name string) string { return ifName("fx-", name, "") }

// router2Bridge is the second underlay's bridge inside the router.
const router2Bridge = "underlay2"

// NodeName is the Kubernetes name of node i.
func NodeName(name string, i int) string { return name + "-node" + strconv.Itoa(i) }

// PodNetnsPrefix is the prefix of the lab's pod namespaces; the runtime
// appends the first 8 hex digits of the pod UID.
func PodNetnsPrefix(name string) string { return "fl-" + name + "-" }

// podNetnsPattern matches the lab's pod namespaces and no other lab's
// (a lab named "a-b" has pod namespaces "fl-a-b-<8 hex>", which do not
// match lab "a"'s "fl-a-<8 hex>").
func podNetnsPattern(name string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(PodNetnsPrefix(name)) + `[0-9a-f]{8}$`)
}

// nodeNetnsPattern matches the lab's node namespaces.
func nodeNetnsPattern(name string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta("fl-"+name+"-n") + `([0-9]+)$`)
}

// DefaultUnderlay is the first underlay tried for lab name: 10.250.0.0/24
// for the default lab, 10.250.N.0/24 (N from a hash of the name) for others.
func DefaultUnderlay(name string) netip.Prefix {
	return underlayN(underlayStart(name))
}

func underlayStart(name string) int {
	if name == DefaultName {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return 1 + int(h.Sum32()%254)
}

func underlayN(n int) netip.Prefix {
	b := underlayBase.Addr().As4()
	b[2] = byte(n)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// ChooseUnderlay picks the underlay for lab name: the first /24 from
// DefaultUnderlay on (wrapping within 10.250.1-254.0/24; the default lab
// has 10.250.0.0/24 only) that overlaps none of taken (the host's routes
// and addresses and other labs' underlays).
func ChooseUnderlay(name string, taken []netip.Prefix) (netip.Prefix, error) {
	free := func(p netip.Prefix) bool {
		for _, t := range taken {
			if p.Overlaps(t) {
				return false
			}
		}
		return true
	}
	start := underlayStart(name)
	if start == 0 {
		p := underlayN(0)
		if !free(p) {
			return netip.Prefix{}, fmt.Errorf("the default underlay %s overlaps a network this machine or another lab uses; pick one with --underlay-cidr", p)
		}
		return p, nil
	}
	for k := range 254 {
		p := underlayN(1 + (start-1+k)%254)
		if free(p) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("every underlay in %s is taken by this machine or other labs; pick one with --underlay-cidr", underlayBase)
}

// ChooseSecondUnderlay picks the second underlay of a two-subnet lab: the first
// /24 after first (within 10.250.1-254.0/24, wrapping) that overlaps
// neither first nor taken.
func ChooseSecondUnderlay(first netip.Prefix, taken []netip.Prefix) (netip.Prefix, error) {
	start := 0
	if underlayBase.Contains(first.Addr()) {
		start = int(first.Addr().As4()[2])
	}
	for k := range 254 {
		p := underlayN(1 + (start+k)%254)
		if p.Overlaps(first) {
			continue
		}
		free := true
		for _, t := range taken {
			if p.Overlaps(t) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free second underlay in %s; pick both with --underlay-cidr A,B", underlayBase)
}

// hostAddr is host number h of the underlay p (a /24 or larger: h < 256).
func hostAddr(p netip.Prefix, h int) netip.Addr {
	b := p.Addr().As4()
	b[3] += byte(h)
	return netip.AddrFrom4(b)
}

// NewSpec builds the Spec for opts. The underlays must be chosen already
// (from opts.Underlay, ChooseUnderlay and ChooseSecondUnderlay): one per subnet.
func NewSpec(opts Options, underlays ...netip.Prefix) (*Spec, error) {
	if err := ValidateName(opts.Name); err != nil {
		return nil, err
	}
	if opts.Nodes < 1 || opts.Nodes > MaxNodes {
		return nil, fmt.Errorf("--nodes %d: want 1 to %d", opts.Nodes, MaxNodes)
	}
	if !validBackend(opts.Backend) {
		return nil, fmt.Errorf("--backend %q: this flatnet supports %v", opts.Backend, Backends)
	}
	if opts.ProxyMode != "" && !slices.Contains(ProxyModes, opts.ProxyMode) {
		return nil, fmt.Errorf("--proxy-mode %q: want one of %v", opts.ProxyMode, ProxyModes)
	}
	conflist := cmp.Or(opts.CNIConflist, subnet.StyleFlatnet)
	if !slices.Contains(subnet.Styles, conflist) {
		return nil, fmt.Errorf("--cni-conflist %q: want %s (one plugin of type flatnet) or %s (the chain bridge, bandwidth, portmap)",
			opts.CNIConflist, subnet.StyleFlatnet, subnet.StyleClassic)
	}
	runtime, err := specRuntime(opts.Runtime)
	if err != nil {
		return nil, err
	}
	pluginDir, err := specPluginDir(opts.CNIPluginDir, runtime)
	if err != nil {
		return nil, err
	}
	install, err := specInstall(opts.Install, runtime)
	if err != nil {
		return nil, err
	}
	subnets := opts.Subnets
	if subnets == 0 {
		subnets = 1
	}
	if subnets != 1 && subnets != 2 {
		return nil, fmt.Errorf("--subnets %d: want 1 (every node on one underlay) or 2 (two underlays joined by a router)", opts.Subnets)
	}
	if subnets == 2 && opts.Backend == "host-gw" {
		return nil, fmt.Errorf("--backend host-gw needs every node on one layer-2 segment (a route to a peer's pods goes via the peer's InternalIP, which must be on-link); " +
			"with --subnets 2 half the peers are behind a router: use --backend vxlan or vxlan-direct")
	}
	if len(underlays) != subnets {
		return nil, fmt.Errorf("%d underlays for %d subnets", len(underlays), subnets)
	}
	underlay := underlays[0]
	var underlay2 netip.Prefix
	if subnets == 2 {
		underlay2 = underlays[1]
	}
	cluster, err := parseV4Prefix("--cluster-cidr", opts.ClusterCIDR)
	if err != nil {
		return nil, err
	}
	service, err := parseV4Prefix("--service-cidr", opts.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	for _, u := range underlays {
		if !u.IsValid() || !u.Addr().Is4() || u.Bits() > 24 || u.Masked() != u {
			return nil, fmt.Errorf("underlay %s: want an IPv4 network of /24 or larger, such as 10.250.7.0/24", u)
		}
	}
	mask := opts.NodeCIDRMaskSize
	if mask < cluster.Bits() || mask > 30 {
		return nil, fmt.Errorf("--node-cidr-mask-size %d: want %d (the cluster CIDR's size) to 30", mask, cluster.Bits())
	}
	if err := checkNodeSubnets(cluster, mask, opts.Nodes, opts.SimulatedNodes); err != nil {
		return nil, err
	}
	simRange, err := simulatedNodeRange(opts)
	if err != nil {
		return nil, err
	}
	named := map[string]netip.Prefix{"underlay": underlay, "cluster CIDR": cluster, "service CIDR": service}
	nets := []string{"underlay", "cluster CIDR", "service CIDR"}
	if subnets == 2 {
		named["second underlay"] = underlay2
		nets = append(nets, "second underlay")
	}
	var lbPool netip.Prefix
	if opts.LBPool != "" {
		if lbPool, err = parseV4Prefix("--lb-pool", opts.LBPool); err != nil {
			return nil, err
		}
		if lbPool.Bits() > maxLBPoolBits {
			return nil, fmt.Errorf("--lb-pool %s: want a /%d or larger (its lower half goes to LoadBalancer Services, its upper half to externalIPs)", lbPool, maxLBPoolBits)
		}
		named["load-balancer pool"] = lbPool
		nets = append(nets, "load-balancer pool")
	}
	if simRange.IsValid() {
		named["simulated node range"] = simRange
		nets = append(nets, "simulated node range")
	}
	for _, a := range nets {
		for _, b := range nets {
			if a < b && named[a].Overlaps(named[b]) {
				return nil, fmt.Errorf("the %s %s overlaps the %s %s; they must be disjoint", a, named[a], b, named[b])
			}
		}
	}
	root := opts.StateRoot
	if root == "" {
		root = DefaultStateRoot
	}
	s := &Spec{
		Name:             opts.Name,
		StateDir:         filepath.Join(root, opts.Name),
		Backend:          opts.Backend,
		ProxyMode:        opts.ProxyMode,
		CNIConflist:      conflist,
		CNIPluginDir:     pluginDir,
		ClusterCIDR:      cluster,
		ServiceCIDR:      service,
		NodeCIDRMaskSize: mask,
		Underlay:         underlay,
		HostAddr:         underlay.Addr().Next(),
		Bridge:           BridgeName(opts.Name),
		PodNetnsPrefix:   PodNetnsPrefix(opts.Name),
		LBPool:           lbPool,
		Runtime:          runtime,
		Install:          install,

		SimulatedNodes:     opts.SimulatedNodes,
		SimulatedNodeRange: simRange,
	}
	if subnets == 2 {
		s.Underlay2 = underlay2
		s.Router = &Router{
			Netns:    RouterNetns(opts.Name),
			HostVeth: RouterVeth(opts.Name),
			IP:       hostAddr(underlay, routerHost),
			Bridge:   router2Bridge,
			IP2:      hostAddr(underlay2, router2Host),
		}
	}
	if opts.External {
		s.External = &External{
			Netns:    ExternalNetns(opts.Name),
			HostVeth: ExternalVeth(opts.Name),
			IP:       hostAddr(underlay, externalHost),
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		// Two subnets: odd nodes on the first, even ones on the second,
		// so any three nodes include same-subnet and cross-subnet peers
		// and a grown lab keeps every node where it was.
		sub := 0
		if subnets == 2 && i%2 == 0 {
			sub = 1
		}
		s.Nodes = append(s.Nodes, Node{
			Index:    i,
			Name:     NodeName(opts.Name, i),
			Netns:    NodeNetns(opts.Name, i),
			HostVeth: ifName("fl-", opts.Name, "-n"+strconv.Itoa(i)),
			IP:       hostAddr(s.UnderlayOf(sub), 10+i),
			Subnet:   sub,
		})
	}
	return s, nil
}

// checkNodeSubnets checks that the cluster CIDR holds a node subnet of
// /mask for every real and simulated node.
func checkNodeSubnets(cluster netip.Prefix, mask, nodes, simulated int) error {
	if simulated < 0 {
		return fmt.Errorf("--simulated-nodes %d: want 0 or more", simulated)
	}
	if mask-cluster.Bits() >= 31 {
		return nil
	}
	holds := 1 << (mask - cluster.Bits())
	switch {
	case simulated == 0 && nodes > holds:
		return fmt.Errorf("--cluster-cidr %s holds %s node subnets of /%d, fewer than --nodes %d", cluster, thousands(holds), mask, nodes)
	case nodes+simulated > holds:
		return fmt.Errorf("--cluster-cidr %s holds %s node subnets of /%d, fewer than --nodes %d plus --simulated-nodes %d: "+
			"pick a larger --cluster-cidr (10.128.0.0/11 holds 8,192 /24 node subnets) or a longer --node-cidr-mask-size",
			cluster, thousands(holds), mask, nodes, simulated)
	}
	return nil
}

// simulatedNodeRange is the Spec's SimulatedNodeRange for opts: none
// without simulated nodes.
func simulatedNodeRange(opts Options) (netip.Prefix, error) {
	if opts.SimulatedNodes == 0 {
		return netip.Prefix{}, nil
	}
	r := simnodes.DefaultIPRange
	if opts.SimulatedNodeRange != "" {
		var err error
		if r, err = parseV4Prefix("--simulated-node-range", opts.SimulatedNodeRange); err != nil {
			return netip.Prefix{}, err
		}
	}
	if max := simnodes.MaxNodes(r); opts.SimulatedNodes > max {
		return netip.Prefix{}, fmt.Errorf("--simulated-node-range %s holds %s node addresses, fewer than --simulated-nodes %d: pick a larger range",
			r, thousands(max), opts.SimulatedNodes)
	}
	return r, nil
}

// thousands writes n with commas: 8,192.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func validBackend(b string) bool {
	for _, x := range Backends {
		if b == x {
			return true
		}
	}
	return false
}

func parseV4Prefix(flag, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: %w", flag, s, err)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%s %s: the lab is IPv4 only for now", flag, s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%s %s: host bits set; did you mean %s?", flag, s, p.Masked())
	}
	return p, nil
}

// UnderlayOf is the underlay of subnet 0 or 1.
func (s *Spec) UnderlayOf(subnet int) netip.Prefix {
	if subnet == 1 {
		return s.Underlay2
	}
	return s.Underlay
}

// Subnets is 1 or 2.
func (s *Spec) Subnets() int {
	if s.Router != nil {
		return 2
	}
	return 1
}

// Underlays lists the lab's underlay subnets.
func (s *Spec) Underlays() []netip.Prefix {
	if s.Router != nil {
		return []netip.Prefix{s.Underlay, s.Underlay2}
	}
	return []netip.Prefix{s.Underlay}
}

// Options returns the options s was made from (StateRoot, Name, Nodes,
// Backend, ranges, layout); NewSpec(s.Options(), s.Underlays()...)
// rebuilds s.
func (s *Spec) Options() Options {
	us := make([]string, 0, 2)
	for _, u := range s.Underlays() {
		us = append(us, u.String())
	}
	return Options{
		Name: s.Name, StateRoot: filepath.Dir(s.StateDir), Nodes: len(s.Nodes), Backend: s.Backend, ProxyMode: s.ProxyMode,
		CNIConflist: s.AgentCNIConflist(), CNIPluginDir: s.CNIPluginDir,
		ClusterCIDR: s.ClusterCIDR.String(), ServiceCIDR: s.ServiceCIDR.String(), NodeCIDRMaskSize: s.NodeCIDRMaskSize,
		Underlay: strings.Join(us, ","), Subnets: s.Subnets(), External: s.External != nil,
		LBPool: prefixOption(s.LBPool), Runtime: s.RuntimeName(), Install: s.InstallName(),
		SimulatedNodes: s.SimulatedNodes, SimulatedNodeRange: prefixOption(s.SimulatedNodeRange),
	}
}

// specPluginDir checks --cni-bin-dir's form (its content is checked by
// checkCNIPluginDir, when up runs): an absolute path the agents can put
// before the lab's cni-bin dir, on the process runtime (a containerd node's
// plugins are containerd's bin_dir, the lab's cni-bin dir).
func specPluginDir(dir, runtime string) (string, error) {
	if dir == "" {
		return "", nil
	}
	if runtime == RuntimeContainerd {
		return "", fmt.Errorf("--cni-bin-dir %s: only for --runtime %s (containerd runs the plugins of its own bin_dir, the lab's cni-bin dir)", dir, RuntimeProcess)
	}
	if !filepath.IsAbs(dir) || strings.ContainsRune(dir, filepath.ListSeparator) {
		return "", fmt.Errorf("--cni-bin-dir %q: want an absolute path without %q", dir, filepath.ListSeparator)
	}
	return filepath.Clean(dir), nil
}

// prefixOption is p as a flag's value ("" when invalid).
func prefixOption(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// SimConfig is how the lab's simulated nodes are made.
func (s *Spec) SimConfig() simnodes.Config {
	return simnodes.Config{Lab: s.Name, IPRange: s.SimulatedNodeRange, Backend: s.Backend}
}

// specRuntime is Spec.Runtime for --runtime v.
func specRuntime(v string) (string, error) {
	switch v {
	case "", RuntimeProcess:
		return "", nil
	case RuntimeContainerd:
		return v, nil
	}
	return "", fmt.Errorf("--runtime %q: want %s", v, strings.Join(Runtimes, " or "))
}

// specInstall is Spec.Install for --install v on runtime.
func specInstall(v, runtime string) (string, error) {
	switch v {
	case "", InstallProcess:
		return "", nil
	case InstallManifest:
		if runtime != RuntimeContainerd {
			return "", fmt.Errorf("--install manifest needs --runtime containerd (the manifest's DaemonSet and Deployment need real kubelets)")
		}
		return v, nil
	}
	return "", fmt.Errorf("--install %q: want %s or %s", v, InstallProcess, InstallManifest)
}

// InstallName is the lab's --install.
func (s *Spec) InstallName() string {
	if s.Install == "" {
		return InstallProcess
	}
	return s.Install
}

// Manifest reports whether flatnet runs from deploy/flatnet.yaml.
func (s *Spec) Manifest() bool { return s.Install == InstallManifest }

// RuntimeName is the lab's --runtime: RuntimeProcess or RuntimeContainerd.
func (s *Spec) RuntimeName() string {
	if s.Runtime == "" {
		return RuntimeProcess
	}
	return s.Runtime
}

// Containerd reports whether the nodes run containerd and the kubelet.
func (s *Spec) Containerd() bool { return s.Runtime == RuntimeContainerd }

// halves splits LBPool into its lower and upper half.
func (s *Spec) halves() (lo, hi netip.Prefix) {
	lo = netip.PrefixFrom(s.LBPool.Addr(), s.LBPool.Bits()+1)
	b := s.LBPool.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += 1 << (31 - s.LBPool.Bits())
	hi = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), s.LBPool.Bits()+1)
	return lo, hi
}

// LoadBalancerPool is the controller's --load-balancer-ip-pool: the lower
// half of LBPool without its network address ("10.251.0.1-10.251.0.127"
// for 10.251.0.0/24), or "" without an LBPool.
func (s *Spec) LoadBalancerPool() string {
	if !s.LBPool.IsValid() {
		return ""
	}
	lo, hi := s.halves()
	return lo.Addr().Next().String() + "-" + hi.Addr().Prev().String()
}

// ExternalIPRange is the upper half of LBPool, routed like the
// LoadBalancer pool but never handed out by the controller: for
// spec.externalIPs. Invalid without an LBPool.
func (s *Spec) ExternalIPRange() netip.Prefix {
	if !s.LBPool.IsValid() {
		return netip.Prefix{}
	}
	_, hi := s.halves()
	return hi
}

// Paths in the state dir.

// SpecFile records the Spec of a lab that up has started.
func (s *Spec) SpecFile() string { return filepath.Join(s.StateDir, "lab.json") }

// BinDir holds flatnet (the daemons' program, and on pods' PATH).
func (s *Spec) BinDir() string { return filepath.Join(s.StateDir, "bin") }

// CNIBinDir holds flatnet-cni under every plugin name: the nodes' CNI
// plugin dir. Apart from BinDir, since the plugin type flatnet and the
// flatnet command share a name.
func (s *Spec) CNIBinDir() string { return filepath.Join(s.StateDir, "cni-bin") }

// Kubeconfig is the admin kubeconfig the control plane writes.
func (s *Spec) Kubeconfig() string { return filepath.Join(s.StateDir, "admin.kubeconfig") }

// LogDir holds one log per process.
func (s *Spec) LogDir() string { return filepath.Join(s.StateDir, "logs") }

// PolicySocket is where node n's agent listens for its CNI plugin's
// policy gate requests.
func (s *Spec) PolicySocket(n Node) string { return filepath.Join(s.NodeDir(n), "policy.sock") }

// NodeDir holds a node's CNI and runtime state.
func (s *Spec) NodeDir(n Node) string { return filepath.Join(s.StateDir, "nodes", n.Name) }

// CNIConfDir is where the node's agent writes its conflist.
func (s *Spec) CNIConfDir(n Node) string { return filepath.Join(s.NodeDir(n), "cni", "net.d") }

// CNIDataDir is host-local's dataDir on the node.
func (s *Spec) CNIDataDir(n Node) string { return filepath.Join(s.NodeDir(n), "cni", "networks") }

// CNICacheDir is libcni's cache on the node.
func (s *Spec) CNICacheDir(n Node) string { return filepath.Join(s.NodeDir(n), "cni", "cache") }

// ContainerdDir is the containerd runtime's directory for node n.
func (s *Spec) ContainerdDir(n Node) string { return filepath.Join(s.NodeDir(n), "containerd") }

// KubeletKubeconfig is node n's kubelet kubeconfig (containerd runtime).
func (s *Spec) KubeletKubeconfig(n Node) string {
	return filepath.Join(s.NodeDir(n), "kubelet.kubeconfig")
}

// RuntimeDir is the node runtime's state dir (pods/<ns>_<name>/...).
func (s *Spec) RuntimeDir(n Node) string { return filepath.Join(s.NodeDir(n), "runtime") }

// NetnsPath is the path of a named namespace.
func NetnsPath(name string) string { return filepath.Join("/run/netns", name) }

// Node returns the node named name.
func (s *Spec) Node(name string) (Node, bool) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}
