// Package agent is `flatnet agent`, the per-node half of flatnet (a
// DaemonSet with hostNetwork in a real cluster; a process inside each node
// namespace in the lab). It
//
//   - writes the node's CNI conflist (subnet/) once the controller, or
//     kube-controller-manager, has given the Node a spec.podCIDR;
//   - programs the cross-node data plane of its backend (backend/):
//     host-gw routes to every peer's pod subnet (routes/), a VXLAN
//     overlay (vxlan/), or both (vxlan-direct), and publishes on its Node
//     what peers need to reach it (flatnet.io/ annotations);
//   - masquerades pod traffic that leaves the cluster CIDR (masq/) and
//     turns on IP forwarding;
//   - with --proxy, serves Services on nftables (internal/proxy/proxier),
//     one proxier per cluster-CIDR family;
//   - with --network-policy, enforces NetworkPolicy on the node's pods in
//     one nftables table, or iptables chains where nft does not work
//     (policy.go, policy_mode.go, internal/netpol);
//   - in lab mode (--lab-runtime), also runs the lab's process runtime
//     (internal/lab/runtime/process, a kubelet of its own), which
//     registers the Node and runs its pods.
//
// Design. Everything the agent programs is a function of the Node list, so
// there is one full reconcile: read the cached Nodes, compute, apply what
// differs. It runs at start, when this Node changes, periodically to
// repair what someone else changed, and with backoff after a failure. A
// peer Node's change (podCIDR, addresses, flatnet.io/ annotations; not
// heartbeats) changes only that peer's entries (peers.go), and hands over
// to the full reconcile when it cannot. Reconcile twice and the second
// run changes nothing. On exit the agent leaves its conflist, routes and rules
// in place, so pods keep working while it restarts.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab/runtime/process"
	"github.com/flatnet/flatnet/internal/proxy/proxier"
)

// Options are the command's flags.
type Options struct {
	Kubeconfig  string
	NodeName    string
	NodeIP      string
	ClusterCIDR string
	Backend     string
	// VXLAN device and pod MTU (vxlan backends; MTU for all).
	VXLANVNI               uint32
	VXLANPort              uint16
	VXLANTxChecksumOffload bool
	MTU                    int
	CNIConfDir             string
	// CNIConflist is the conflist's style: subnet.StyleFlatnet (one
	// plugin) or subnet.StyleClassic (bridge, bandwidth, portmap).
	CNIConflist string
	CNIBinDir   string
	CNIDataDir  string
	CNICacheDir string
	Masquerade  bool
	Resync      time.Duration

	// Proxy runs the Service proxy (internal/proxy) on nftables.
	Proxy bool
	// ProxyMode: auto, nftables, iptables or userspace (proxymode.go).
	ProxyMode          string
	ProxyMinSyncPeriod time.Duration
	ProxySyncPeriod    time.Duration
	// ProxyProfiling serves /debug/pprof/ on the proxy's metrics server.
	ProxyProfiling bool
	// ProxyFullSyncPeriod: how often the rules are rewritten in full.
	ProxyFullSyncPeriod time.Duration
	// ProxyModulusHold: how long the nftables mode keeps a dispatch
	// rule's endpoint count through an endpoint's replacement (0: never).
	ProxyModulusHold time.Duration
	// ProxyNFTablesExec: the nftables mode runs nft, not netlink (proxynetlink.go).
	ProxyNFTablesExec bool
	// MetricsBindAddress and HealthzBindAddress are the proxy's servers
	// (IP:port; "" or "0": off).
	MetricsBindAddress string
	HealthzBindAddress string

	LabRuntime      bool
	RuntimeStateDir string
	NetnsPrefix     string
	PodPath         string
	// ClusterDNS (comma-separated IPs) and ClusterDomain are the kubelet's
	// --cluster-dns and --cluster-domain, for the lab runtime's pods.
	ClusterDNS    string
	ClusterDomain string

	ProxyOnlyOptions // --proxy-only: the Service proxy alone, replacing kube-proxy (proxyonly.go)
	DNSOptions       // --dns, --dns-only: cluster DNS (dns.go)
	PolicyOptions    // --network-policy: NetworkPolicy in nftables or iptables (policy.go)
}

// NewCommand returns `flatnet agent`.
func NewCommand() *cobra.Command {
	o := Options{}
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run flatnet's node agent: CNI config, cross-node routes or VXLAN overlay, masquerade (and, in the lab, the pod runtime)",
		Long: `flatnet agent runs on every node. Once its Node has a spec.podCIDR it writes
the node's CNI config (<cni-conf-dir>/10-flatnet.conflist: bridge cni0 with
host-local IPAM over the podCIDR and the pod MTU, bandwidth and portmap, as
one plugin of type flatnet or, with --cni-conflist classic, as the chain of
the three; then flatnet-policy with --network-policy), programs how pod
traffic reaches the other nodes (--backend), masquerades pod traffic that
leaves the cluster CIDR, and enables IP forwarding.

Backends (docs/overlay.md):
  host-gw       one route per peer node: peer podCIDR via peer InternalIP. All
                nodes must share one layer-2 network. Pod MTU = underlay MTU.
  vxlan         a VXLAN device (flatnet.1) and per peer one route, one static
                neighbour and one static FDB entry. Works across any IP
                network (UDP --vxlan-port between nodes). Pod MTU = underlay
                MTU - 50.
  vxlan-direct  host-gw to peers on this node's underlay subnet, vxlan to the
                others. Pod MTU as vxlan.
Switching the backend and restarting the agent removes the old backend's
routes and device.

With --lab-runtime it also runs the lab's pod runtime in-process: it
registers the Node and runs the pods bound to it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := kube.SignalContext(cmd.Context(), "agent")
			defer cancel()
			return Run(ctx, o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster service account)")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&o.NodeIP, "node-ip", "", "this node's InternalIP and underlay address (default: the Node's InternalIP; lab runtime: registered on the Node)")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", "10.244.0.0/16", "the cluster's pod CIDR(s), comma-separated for dual-stack: traffic leaving it is masqueraded")
	fs.StringVar(&o.Backend, "backend", backend.HostGW, "how pod traffic crosses nodes: "+strings.Join(backend.Names, ", "))
	fs.Uint32Var(&o.VXLANVNI, "vxlan-vni", vxlan.DefaultVNI, "VXLAN network identifier (vxlan backends; the same on every node)")
	fs.Uint16Var(&o.VXLANPort, "vxlan-port", vxlan.DefaultPort, "VXLAN UDP port (vxlan backends; the same on every node; 4789 is IANA's, 8472 the Linux and flannel default)")
	fs.BoolVar(&o.VXLANTxChecksumOffload, "vxlan-tx-checksum-offload", true, "transmit checksum offload on the VXLAN device; false works around kernels that corrupt NATed VXLAN packets (flannel#1279) at a large throughput cost")
	fs.IntVar(&o.MTU, "mtu", 0, "pod MTU written into the CNI config (0: the underlay interface's MTU, minus 50 for vxlan backends)")
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", "/etc/cni/net.d", "where the CNI conflist is written")
	fs.StringVar(&o.CNIConflist, "cni-conflist", subnet.StyleFlatnet, "the CNI conflist's style: "+subnet.StyleFlatnet+
		" (one plugin of type flatnet doing bridge, host-local, bandwidth and portmap in one process) or "+subnet.StyleClassic+
		" (the chain bridge, bandwidth, portmap); the same network either way, so pods set up under one are torn down under the other")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", "/opt/cni/bin", "where the CNI plugins are")
	fs.StringVar(&o.CNIDataDir, "cni-data-dir", "", "host-local's dataDir (default: the plugin's, /var/lib/cni/networks)")
	fs.StringVar(&o.CNICacheDir, "cni-cache-dir", "", "libcni's cache dir (lab runtime)")
	fs.BoolVar(&o.Masquerade, "masquerade", true, "masquerade pod traffic leaving the cluster CIDR")
	fs.DurationVar(&o.Resync, "resync", time.Minute, "how often to re-check the kernel state even without changes")
	fs.BoolVar(&o.Proxy, "proxy", false, "also serve Services (ClusterIP, NodePort, LoadBalancer, externalIPs) with nftables, replacing kube-proxy")
	addProxyFlags(fs, &o)
	fs.BoolVar(&o.LabRuntime, "lab-runtime", false, "also run the lab's pod runtime (registers the Node and runs its pods)")
	fs.StringVar(&o.RuntimeStateDir, "runtime-state-dir", "", "lab runtime: pod records, pod files and logs")
	fs.StringVar(&o.NetnsPrefix, "netns-prefix", "", "lab runtime: prefix of pod network namespace names")
	fs.StringVar(&o.PodPath, "pod-path", "", "lab runtime: directory put first on containers' PATH")
	fs.StringVar(&o.ClusterDNS, "cluster-dns", "", "lab runtime: the cluster DNS server IPs, comma-separated, as the kubelet's flag (empty: ClusterFirst pods get the node's resolv.conf and a MissingClusterDNS warning)")
	fs.StringVar(&o.ClusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain, as the kubelet's flag: the zone --dns serves, and in the lab runtime pods' search domains and hostnames")
	addProxyOnlyFlags(fs, &o)
	addDNSFlags(fs, &o)
	addPolicyFlags(fs, &o)
	kube.AddLogFlags(fs)
	return cmd
}

// parseCIDRs reads a comma-separated CIDR list.
func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if p.Masked() != p || p.Addr().Is4In6() {
			return nil, fmt.Errorf("%s is not a network address (did you mean %s?)", p, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

// parseIPs reads a comma-separated IP list; empty is none.
func parseIPs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Addr
	for _, f := range strings.Split(s, ",") {
		ip, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, ip.Unmap())
	}
	return out, nil
}

func (o *Options) validate() ([]netip.Prefix, error) {
	var errs []error
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	cidrs, err := parseCIDRs(o.ClusterCIDR)
	if err != nil {
		errs = append(errs, fmt.Errorf("--cluster-cidr %q: %w", o.ClusterCIDR, err))
	}
	if !slices.Contains(backend.Names, o.Backend) {
		errs = append(errs, fmt.Errorf("--backend %q is not supported: want one of %s", o.Backend, strings.Join(backend.Names, ", ")))
	}
	if o.Backend == backend.VXLAN || o.Backend == backend.VXLANDirect {
		for _, c := range cidrs {
			if c.Addr().Is6() {
				errs = append(errs, fmt.Errorf("--backend %s carries IPv4 pod traffic only; --cluster-cidr has %s (use --backend host-gw for IPv6 and dual-stack clusters)", o.Backend, c))
			}
		}
	}
	if o.VXLANVNI == 0 || o.VXLANVNI >= 1<<24 {
		errs = append(errs, fmt.Errorf("--vxlan-vni %d: want 1 to %d", o.VXLANVNI, 1<<24-1))
	}
	if o.VXLANPort == 0 {
		errs = append(errs, errors.New("--vxlan-port must not be 0"))
	}
	minMTU := 68
	if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Addr().Is6() }) {
		minMTU = 1280 // IPv6's minimum link MTU
	}
	if o.MTU != 0 && (o.MTU < minMTU || o.MTU > 65535) {
		errs = append(errs, fmt.Errorf("--mtu %d: want 0 (from the underlay) or %d to 65535", o.MTU, minMTU))
	}
	if o.NodeIP != "" {
		if _, err := netip.ParseAddr(o.NodeIP); err != nil {
			errs = append(errs, fmt.Errorf("--node-ip %q: %w", o.NodeIP, err))
		}
	}
	if o.CNIConfDir == "" {
		errs = append(errs, errors.New("--cni-conf-dir is required"))
	}
	if err := subnet.CheckStyle(o.CNIConflist); err != nil {
		errs = append(errs, err)
	}
	if o.LabRuntime {
		if _, err := netip.ParseAddr(o.NodeIP); err != nil {
			errs = append(errs, fmt.Errorf("--lab-runtime needs --node-ip: %q: %w", o.NodeIP, err))
		}
		if o.RuntimeStateDir == "" {
			errs = append(errs, errors.New("--lab-runtime needs --runtime-state-dir"))
		}
		if _, err := parseIPs(o.ClusterDNS); err != nil {
			errs = append(errs, fmt.Errorf("--cluster-dns %q: %w (want comma-separated IPs)", o.ClusterDNS, err))
		}
		if o.ClusterDomain == "" {
			errs = append(errs, errors.New("--cluster-domain must not be empty (the default is cluster.local)"))
		}
	}
	if o.Proxy && (o.ProxyMinSyncPeriod < 0 || o.ProxySyncPeriod <= 0) {
		errs = append(errs, fmt.Errorf("--proxy-min-sync-period must be >= 0 and --proxy-sync-period > 0 (got %s, %s)", o.ProxyMinSyncPeriod, o.ProxySyncPeriod))
	}
	if (o.Proxy || o.ProxyOnly) && o.ProxyModulusHold < 0 {
		errs = append(errs, fmt.Errorf("--proxy-modulus-hold %s: must not be negative (0: never hold)", o.ProxyModulusHold))
	}
	if (o.Proxy || o.ProxyOnly) && o.ProxyFullSyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("--proxy-full-sync-period %s: must not be negative (0: every --proxy-sync-period)", o.ProxyFullSyncPeriod))
	}
	if o.Resync <= 0 {
		errs = append(errs, fmt.Errorf("--resync must be positive (got %s)", o.Resync))
	}
	if err := o.validatePolicy(); err != nil {
		errs = append(errs, err)
	}
	return cidrs, errors.Join(errs...)
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.DNSOnly {
		return runDNSOnly(ctx, o)
	}
	if o.ProxyOnly || o.usesProxyOnlyFlags() {
		return runProxyOnly(ctx, o)
	}
	cidrs, err := o.validate()
	if err != nil {
		return err
	}
	var dnsCfg dnsSettings
	if o.DNS {
		if dnsCfg, err = resolveDNS(o, os.ReadFile); err != nil {
			return err
		}
	}
	client, err := kube.Client(o.Kubeconfig, "flatnet-agent/"+o.NodeName)
	if err != nil {
		return err
	}
	nodeCtx, stopNodes := context.WithCancel(ctx)
	nodes, err := watchNodes(nodeCtx, client)
	if err != nil {
		stopNodes()
		return err
	}
	defer func() {
		stopNodes()
		nodes.factory.Shutdown()
	}()
	be, err := backend.New(o.Backend, backend.Config{VNI: o.VXLANVNI, Port: o.VXLANPort, MTU: o.MTU, TxChecksumOffload: o.VXLANTxChecksumOffload})
	if err != nil {
		return err
	}
	r := &Reconciler{
		NodeName:     o.NodeName,
		ClusterCIDRs: cidrs,
		CNIConfDir:   o.CNIConfDir,
		CNIConflist:  o.CNIConflist,
		CNIDataDir:   o.CNIDataDir,
		PolicySocket: policySocket(o),
		Backend:      be,
		Kernel:       backend.Kernel{Routes: &routes.Netlink{}, VXLAN: vxlan.Netlink{}},
		Annotate:     annotator(client, o.NodeName),
		Masquerade:   o.Masquerade,
	}
	if o.NodeIP != "" {
		r.NodeIP = netip.MustParseAddr(o.NodeIP).Unmap() // validated
	}
	r.Masq, err = masq.NewDefault()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if missing := missingPlugins(o.CNIBinDir, subnet.Plugins(o.CNIConflist, r.PolicySocket != "")); len(missing) > 0 {
		logger.Info("WARNING: CNI plugins the conflist uses are missing; pods will fail to start until they are installed (make install-cni)",
			"cniBinDir", o.CNIBinDir, "missing", missing)
	}

	// The lab runtime's CNI timings are served with the proxy's metrics
	// (the agent's one metrics endpoint; the lab runs every agent with
	// --proxy).
	var cniMetrics *process.CNIMetrics
	if o.LabRuntime {
		cniMetrics = process.NewCNIMetrics()
	}
	var proxiers []*proxier.Proxier
	if o.Proxy {
		if proxiers, err = newProxiers(ctx, client, o, cidrs, cniMetrics.Collectors()...); err != nil {
			return err
		}
	}

	var policy *policyController
	if o.NetworkPolicy {
		if policy, err = newPolicyController(ctx, client, o, cidrs); err != nil {
			return err
		}
		if o.DNS {
			// One watch of every pod for both (docs/scale.md, "What
			// would break first at 10 ×").
			dnsCfg.pods = policy.podInformer()
		}
	} else {
		removeOtherPolicyRules(ctx, "")
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	if policy != nil {
		wg.Go(func() {
			// The policy's caches start once the Service rules are
			// programmed (policyAfterProxy).
			var synced []<-chan struct{}
			for _, p := range proxiers {
				synced = append(synced, p.FirstSynced())
			}
			policyAfterProxy(ctx, synced, policyWaitsForProxy)
			err := policy.Run(klog.NewContext(ctx, logger.WithName("policy")))
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("stopped")
				}
				cancel(fmt.Errorf("network policy: %w", err))
			}
		})
	}
	if o.LabRuntime {
		clusterDNS, _ := parseIPs(o.ClusterDNS) // validated
		cfg := process.Config{
			NodeName: o.NodeName, NodeIP: o.NodeIP, Client: client,
			StateDir: o.RuntimeStateDir, NetnsPrefix: o.NetnsPrefix, PodPath: o.PodPath,
			CNIConfDir: o.CNIConfDir, CNIBinDir: o.CNIBinDir, CNICacheDir: o.CNICacheDir,
			ClusterDNS: clusterDNS, ClusterDomain: o.ClusterDomain,
			CNIMetrics: cniMetrics,
		}
		wg.Go(func() {
			err := process.Run(klog.NewContext(ctx, logger.WithName("runtime")), cfg)
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("stopped")
				}
				cancel(fmt.Errorf("lab runtime: %w", err))
			}
		})
	}
	if o.DNS {
		wg.Go(func() {
			err := runDNS(klog.NewContext(ctx, logger.WithName("dns")), client, dnsCfg)
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("stopped")
				}
				cancel(fmt.Errorf("dns: %w", err))
			}
		})
	}
	// The pods' links parked by the CNI plugins' DEL.
	wg.Go(func() { collectParked(klog.NewContext(ctx, logger.WithName("parked"))) })
	for _, p := range proxiers {
		wg.Go(func() {
			if err := runProxier(klog.NewContext(ctx, logger.WithName("proxy")), p); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("proxy: %w", err))
			}
		})
	}
	err = runLoop(ctx, nodes, r, o.Resync)
	cancel(err)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// policyWaitsForProxy is the longest the policy's caches wait for the
// proxy's first sync (policyAfterProxy).
const policyWaitsForProxy = 30 * time.Second

// policyAfterProxy waits until every proxier has synced once (each of
// synced is closed), at most limit. The policy caches every pod of the
// cluster (and the DNS reads pod records from that cache): at a restart
// with 100,000 pods their stream kept the API server and this process
// busy for tens of seconds, and the proxy's caches and first sync, and
// the routes' Node list, took several times as long beside it
// (docs/scale.md). A restarted agent
// finds its policy rules in the kernel as it left them, so the policy
// loses nothing by starting seconds later; the Services' rules and the
// routes are what every connection needs first.
func policyAfterProxy(ctx context.Context, synced []<-chan struct{}, limit time.Duration) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for _, c := range synced {
		select {
		case <-c:
		case <-timer.C:
			klog.FromContext(ctx).Info("Proxy not synced yet; starting network policy anyway", "waited", limit)
			return
		case <-ctx.Done():
			return
		}
	}
}

// nodeWatch is the agent's Node cache and the names of the Nodes changed
// since the loop last took them. Run starts it before anything else:
// every peer route waits for its LIST (5,000 Nodes: most of an agent's
// start, docs/scale.md), which then runs while the proxy, policy and DNS
// are set up.
type nodeWatch struct {
	factory informers.SharedInformerFactory
	lister  corelisters.NodeLister
	synced  cache.InformerSynced
	kick    chan struct{} // a Node changed
	mu      sync.Mutex
	changed map[string]bool
}

// watchNodes starts the Node watch; it ends with ctx.
func watchNodes(ctx context.Context, client kubernetes.Interface) (*nodeWatch, error) {
	// A LIST fills the Node cache faster than a WatchList stream, and
	// every peer route waits for it (kube.ListFirst).
	w := &nodeWatch{
		factory: informers.NewSharedInformerFactoryWithOptions(kube.ListFirst(client), 0, informers.WithTransform(trimNode)),
		kick:    make(chan struct{}, 1),
		changed: map[string]bool{},
	}
	nodes := w.factory.Core().V1().Nodes()
	reg, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.mark,
		DeleteFunc: w.mark,
		UpdateFunc: func(old, cur any) {
			if relevantChange(old.(*corev1.Node), cur.(*corev1.Node)) {
				w.mark(cur)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes: %w", err)
	}
	w.lister, w.synced = nodes.Lister(), reg.HasSynced
	w.factory.StartWithContext(ctx)
	return w, nil
}

func (w *nodeWatch) mark(obj any) {
	name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	w.mu.Lock()
	w.changed[name] = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// take returns the Nodes changed since the last take.
func (w *nodeWatch) take() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := w.changed
	w.changed = map[string]bool{}
	return names
}

// runLoop programs each changed peer Node on its own (Reconciler.Peer),
// and reconciles in full at start, every resync, on this Node's changes,
// when Peer cannot, and after failures with backoff, until ctx ends.
func runLoop(ctx context.Context, w *nodeWatch, r *Reconciler, resync time.Duration) error {
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, w.synced) {
		return nil // ctx ended
	}
	logger.Info("Started", "node", r.NodeName, "clusterCIDRs", r.ClusterCIDRs, "backend", r.Backend.Name(), "cniConflist", style(r.CNIConflist), "masquerade", r.Masquerade)

	const minBackoff, maxBackoff = time.Second, 30 * time.Second
	backoff := minBackoff
	timer := time.NewTimer(0) // first reconcile now
	defer timer.Stop()
	for {
		full := false
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		case <-timer.C:
			full = true
		}
		names := w.take()
		for name := range names {
			if full {
				break
			}
			n, err := w.lister.Get(name)
			if apierrors.IsNotFound(err) {
				n, err = nil, nil
			}
			if err == nil {
				err = r.Peer(ctx, name, n)
			}
			if err != nil {
				if !errors.Is(err, errNeedFull) {
					logger.Error(err, "Peer update incomplete; reconciling in full", "node", name)
				}
				full = true
			}
		}
		if !full {
			continue // the timer still runs toward the next resync
		}
		list, err := w.lister.List(labels.Everything())
		if err == nil {
			err = r.Reconcile(ctx, list)
		}
		next := resync
		if err != nil {
			logger.Error(err, "Reconcile incomplete; retrying", "in", backoff)
			next, backoff = backoff, min(2*backoff, maxBackoff)
		} else {
			backoff = minBackoff
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// relevantChange reports whether a Node update matters to the agent (not
// a heartbeat).
func relevantChange(old, cur *corev1.Node) bool {
	return old.Spec.PodCIDR != cur.Spec.PodCIDR || !slices.Equal(old.Spec.PodCIDRs, cur.Spec.PodCIDRs) ||
		!slices.Equal(internalIPs(old), internalIPs(cur)) ||
		!maps.Equal(ourAnnotations(old), ourAnnotations(cur))
}

// trimNode is the Node informer's transform: it keeps only what the agent
// reads (name, podCIDRs, addresses, flatnet.io/ annotations), so the
// cache does not hold managedFields, images, conditions and other
// annotations of every Node (see docs/overlay.md, "Scale").
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
			Annotations: ourAnnotations(n),
		},
		Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

// ourAnnotations are n's flatnet.io/ annotations.
func ourAnnotations(n *corev1.Node) map[string]string {
	var out map[string]string
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, backend.AnnotationPrefix) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// annotator patches node's annotations (a nil value removes one).
func annotator(client kubernetes.Interface, node string) func(context.Context, map[string]*string) error {
	return func(ctx context.Context, set map[string]*string) error {
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": set}})
		if err != nil {
			return err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
}

func internalIPs(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

func podCIDRs(n *corev1.Node) []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

// backendNodes turns Nodes into the backends' plain data.
func backendNodes(nodes []*corev1.Node) []backend.Node {
	out := make([]backend.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, backendNode(n))
	}
	return out
}

func backendNode(n *corev1.Node) backend.Node {
	return backend.Node{Name: n.Name, PodCIDRs: podCIDRs(n), InternalIPs: internalIPs(n), Annotations: ourAnnotations(n)}
}

// missingPlugins are those of plugins in none of binDirs.
func missingPlugins(binDirs string, plugins []string) []string {
	var missing []string
	for _, p := range plugins {
		found := false
		for _, d := range filepath.SplitList(binDirs) {
			if st, err := os.Stat(filepath.Join(d, p)); err == nil && !st.IsDir() {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, p)
		}
	}
	return missing
}
