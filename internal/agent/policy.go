package agent

// Network policy (--network-policy): informers on NetworkPolicies, Pods and
// Namespaces ask a bounded-frequency runner (proxy/runner) for a sync; a
// sync compiles the node's own pods (netpol/compile), renders them
// (netpol/nftables) and commits the difference in one transaction. Bursts
// of events are coalesced, but only for a short MinInterval (50 ms): the
// target is a change enforced within 250 ms. A full rebuild runs at start,
// after a failure and every --policy-sync-period.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnplisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"

	"github.com/flatnet/flatnet/internal/cni/policygate"
	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/compile"
	"github.com/flatnet/flatnet/internal/netpol/conntrack"
	"github.com/flatnet/flatnet/internal/netpol/gate"
	"github.com/flatnet/flatnet/internal/netpol/iptables"
	policymetrics "github.com/flatnet/flatnet/internal/netpol/metrics"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/proxy/runner"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// PolicyOptions are the network policy flags.
type PolicyOptions struct {
	// NetworkPolicy enforces NetworkPolicy on this node's pods.
	NetworkPolicy       bool
	PolicyMinSyncPeriod time.Duration
	PolicySyncPeriod    time.Duration
	// PolicySocket is where the gate listens for the flatnet-policy CNI
	// plugin ("": no gate, and the conflist does not chain the plugin).
	PolicySocket string
	// PolicyKeepEstablished leaves established flows alone when a policy
	// change denies them.
	PolicyKeepEstablished bool
	// PolicyMetricsBindAddress serves the policy's /metrics ("" or "0": not).
	PolicyMetricsBindAddress string
	// PolicyMode is the renderer: auto, nftables or iptables (policy_mode.go).
	PolicyMode string
}

func addPolicyFlags(fs *pflag.FlagSet, o *Options) {
	fs.BoolVar(&o.NetworkPolicy, "network-policy", false, "enforce NetworkPolicy on this node's pods with nftables (table inet "+nftables.DefaultTable+"), or iptables where nft does not work (--policy-mode); needs br_netfilter for traffic between pods of one node")
	fs.DurationVar(&o.PolicyMinSyncPeriod, "policy-min-sync-period", 50*time.Millisecond, "--network-policy: the least time between two rule syncs (bursts of changes are coalesced)")
	fs.DurationVar(&o.PolicySyncPeriod, "policy-sync-period", 5*time.Minute, "--network-policy: how often the policy table is rebuilt in full")
	fs.StringVar(&o.PolicySocket, "policy-socket", policygate.DefaultSocket, "--network-policy: unix socket where the flatnet-policy CNI plugin asks for a new pod's policy before the pod starts "+
		"(the agent chains the plugin in its conflist); \"\" turns the gate off, and a pod may then send and receive before its policy is in place")
	fs.StringVar(&o.PolicyMetricsBindAddress, "policy-metrics-bind-address", "127.0.0.1:9080", "--network-policy: IP:port of the policy's Prometheus /metrics "+
		"(flatnet_networkpolicy_*: dropped packets per policy in nftables mode, sync and gate latency); \"\" or \"0\" disables")
	fs.StringVar(&o.PolicyMode, "policy-mode", policyModeAuto, policyModeHelp)
	fs.BoolVar(&o.PolicyKeepEstablished, "policy-keep-established", false, "--network-policy: keep established connections that a policy change now denies "+
		"(default: their conntrack entries are deleted, so their next packet meets the new rules and is dropped)")
}

func (o *PolicyOptions) validatePolicy() error {
	if o.NetworkPolicy {
		if err := validPolicyMode(o.PolicyMode); err != nil {
			return err
		}
	}
	if o.NetworkPolicy && (o.PolicyMinSyncPeriod < 0 || o.PolicySyncPeriod <= 0) {
		return fmt.Errorf("--policy-min-sync-period must be >= 0 and --policy-sync-period > 0 (got %s, %s)", o.PolicyMinSyncPeriod, o.PolicySyncPeriod)
	}
	return nil
}

// bridgeSysctls make bridged frames (pod to pod on one node's bridge) pass
// the IP hooks, the policy's forward chain among them.
var bridgeSysctls = map[bool]string{false: "net.bridge.bridge-nf-call-iptables", true: "net.bridge.bridge-nf-call-ip6tables"}

// ensureBridgeNetfilter turns bridge-nf-call-ip(6)tables on in the
// agent's network namespace for each family of cidrs, or says what to do.
func ensureBridgeNetfilter(cidrs []netip.Prefix) error {
	if _, err := os.Stat("/proc/sys/net/bridge"); errors.Is(err, os.ErrNotExist) {
		return errors.New("--network-policy: traffic between pods of this node would bypass the policy: " +
			"/proc/sys/net/bridge is missing (the br_netfilter module is not loaded); run `modprobe br_netfilter` " +
			"(and add it to /etc/modules-load.d/ so it loads at boot), then restart the agent")
	}
	for _, v6 := range []bool{false, true} {
		if !slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Addr().Is6() == v6 }) {
			continue
		}
		if err := sysctl.Set(bridgeSysctls[v6], "1"); err != nil {
			return fmt.Errorf("--network-policy: traffic between pods of this node would bypass the policy unless %s=1: %w (run `sysctl -w %s=1`, or run the agent privileged)",
				bridgeSysctls[v6], err, bridgeSysctls[v6])
		}
	}
	return nil
}

// policyController keeps the node's policy table in step with the API.
type policyController struct {
	node     string
	client   kubernetes.Interface
	renderer *nftables.Renderer
	syncer   *nftables.Syncer
	// ipt, when set, renders with iptables instead (--policy-mode).
	ipt    *iptables.Syncer
	mode   string
	runner *runner.Runner
	pods   corelisters.PodLister
	// podsByNode is the pods' indexer with byNode (nil in tests that set
	// pods alone).
	podsByNode cache.Indexer
	nss        corelisters.NamespaceLister
	policies   networkinglisters.NetworkPolicyLister
	// cnps is nil while the API does not serve ClusterNetworkPolicy (or
	// before Run); read it through clusterPolicies.
	cnpMu sync.Mutex
	cnps  cnplisters.ClusterNetworkPolicyLister
	// cnpClient, when set, is asked for ClusterNetworkPolicies: at Run when
	// the API serves them, else once it starts to (checked every cnpPoll).
	cnpClient cnpclient.Interface
	cnpPoll   time.Duration
	// discovery answers whether the API serves them (nil: the client's).
	discovery discovery.DiscoveryInterface
	// lastErrs is the compiler's and renderer's complaints last logged (only
	// the runner's goroutine touches it), so each is logged once.
	lastErrs string
	// socket: the gate's unix socket ("": no gate). ready is set once the
	// caches are full and the first sync has committed.
	socket string
	gate   *gateState
	ready  atomic.Bool
	// conntrack (nil: never cut) and the rules last committed per pod,
	// for cutting established flows that a change denies.
	conntrack       conntrack.Interface
	keepEstablished bool
	// dirty is what changed since the last sync.
	dirty dirtySet
	// metrics (nil in tests) and where to serve them ("": not served).
	metrics     *policymetrics.Metrics
	metricsAddr string
	lastRules   map[types.NamespacedName]*netpol.Pod
	// factory holds the informers Run starts (informers, made once).
	factoryOnce sync.Once
	factory     informers.SharedInformerFactory
}

// informers is the factory of the policy's informers, made on first use:
// by podInformer before Run when the agent's DNS shares the pod cache.
func (c *policyController) informers() informers.SharedInformerFactory {
	c.factoryOnce.Do(func() {
		c.factory = informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTransform(policyTransform))
	})
	return c.factory
}

// podInformer is the informer of every pod of the cluster, trimmed
// (trimPod), that Run starts. The agent's DNS reads its pods from it
// rather than watching them all a second time.
func (c *policyController) podInformer() cache.SharedIndexInformer {
	return c.informers().Core().V1().Pods().Informer()
}

// newPolicyController checks that the node can enforce policy (nft or
// iptables present and working, bridged traffic on the IP hooks), removes
// the other mode's rules and returns the controller; Run starts it.
func newPolicyController(ctx context.Context, client kubernetes.Interface, o Options, cidrs []netip.Prefix) (*policyController, error) {
	mode, r, err := choosePolicyMode(ctx, o.PolicyMode, iptFamilies(cidrs))
	if err != nil {
		return nil, err
	}
	if err := ensureBridgeNetfilter(cidrs); err != nil {
		return nil, err
	}
	c := &policyController{node: o.NodeName, client: client, mode: mode,
		socket: o.PolicySocket, conntrack: conntrack.Netlink{}, keepEstablished: o.PolicyKeepEstablished}
	if mode == policyModeIPTables {
		c.ipt, c.metrics = iptables.NewSyncer(ipt.New(), iptFamilies(cidrs)...), policymetrics.New(noCounters{})
	} else {
		c.renderer, c.syncer, c.metrics = nftables.NewRenderer(), nftables.NewSyncer(r), policymetrics.New(r)
	}
	removeOtherPolicyRules(ctx, mode)
	if a := o.PolicyMetricsBindAddress; a != "" && a != "0" {
		c.metricsAddr = a
	}
	if c.cnpClient, err = newCNPClient(o.Kubeconfig, "flatnet-agent/"+o.NodeName); err != nil {
		return nil, fmt.Errorf("--network-policy: %w", err)
	}
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: o.PolicyMinSyncPeriod, MaxInterval: o.PolicySyncPeriod})
	return c, nil
}

// policyTransform is the informers' transform: managedFields go (the
// policy needs none of them), and Pods keep only what it reads (trimPod).
func policyTransform(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return trimPod(p), nil
	}
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// trimPod keeps of a Pod what the policy reads (its identity and labels,
// node, host network, addresses, phase, and the named ports of its
// containers and sidecars) and drops the rest: every pod of the cluster
// is cached here, and a pod's specs and statuses are most of it (at
// 100,000 pods the untrimmed cache was most of the agent's memory).
func trimPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	for _, c := range p.Spec.InitContainers {
		if len(c.Ports) > 0 && c.RestartPolicy != nil {
			out.Spec.InitContainers = append(out.Spec.InitContainers, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
		}
	}
	return out
}

// Run watches the API and syncs until ctx ends.
func (c *policyController) Run(ctx context.Context) error {
	factory := c.informers()
	pods := factory.Core().V1().Pods()
	nss := factory.Core().V1().Namespaces()
	nps := factory.Networking().V1().NetworkPolicies()
	c.pods, c.nss, c.policies = pods.Lister(), nss.Lister(), nps.Lister()
	if err := pods.Informer().AddIndexers(cache.Indexers{byNode: podNode}); err != nil {
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	c.podsByNode = pods.Informer().GetIndexer()
	// A NetworkPolicy selects pods of its own namespace only, so its
	// change needs that namespace's pods recompiled; any other change
	// (a pod's labels or address, a namespace's labels) may touch the
	// peers of every pod.
	handler := func(relevant func(old, cur any) bool, mark func(obj any)) cache.ResourceEventHandler {
		run := func(obj any) { mark(obj); c.runner.Run() }
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    run,
			DeleteFunc: run,
			UpdateFunc: func(old, cur any) {
				if relevant(old, cur) {
					run(cur)
				}
			},
		}
	}
	markAll := func(any) { c.dirty.markAll() }
	markNS := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			ns, _, _ := cache.SplitMetaNamespaceKey(key)
			c.dirty.markNS(ns)
			return
		}
		c.dirty.markAll()
	}
	var synced []cache.InformerSynced
	for _, w := range []struct {
		what     string
		informer cache.SharedIndexInformer
		relevant func(old, cur any) bool
		mark     func(obj any)
	}{
		{"pods", pods.Informer(), func(old, cur any) bool { return podChanged(old.(*corev1.Pod), cur.(*corev1.Pod)) }, markAll},
		{"namespaces", nss.Informer(), func(old, cur any) bool {
			return !maps.Equal(old.(*corev1.Namespace).Labels, cur.(*corev1.Namespace).Labels)
		}, markAll},
		{"networkpolicies", nps.Informer(), func(old, cur any) bool {
			return !equality.Semantic.DeepEqual(old.(*networkingv1.NetworkPolicy).Spec, cur.(*networkingv1.NetworkPolicy).Spec)
		}, markNS},
	} {
		reg, err := w.informer.AddEventHandler(handler(w.relevant, w.mark))
		if err != nil {
			return fmt.Errorf("watching %s: %w", w.what, err)
		}
		synced = append(synced, reg.HasSynced)
	}
	if c.cnpClient != nil {
		switch served, err := servesCNP(c.discoveryClient()); {
		case err != nil:
			return fmt.Errorf("--network-policy: %w", err)
		case served:
			lister, hasSynced, err := c.watchCNPs(ctx, c.cnpClient)
			if err != nil {
				return err
			}
			c.setClusterPolicies(lister)
			synced = append(synced, hasSynced)
		default:
			klog.FromContext(ctx).Info("The API does not serve ClusterNetworkPolicy (" + cnpGroupVersion + ") yet; enforcing NetworkPolicy, " +
				"and ClusterNetworkPolicy as soon as its CRD (sigs.k8s.io/network-policy-api v0.3.0) is installed")
			go c.awaitCNPs(ctx)
		}
	}
	if c.gate == nil {
		c.gate = newGateState()
	}
	if c.metricsAddr != "" {
		go func() {
			if err := c.metrics.Serve(ctx, c.metricsAddr); err != nil && ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Serving the network policy's metrics", "address", c.metricsAddr)
			}
		}()
	}
	gateErr := make(chan error, 1)
	if c.socket != "" {
		srv := &gate.Server{Path: c.socket, Handler: c.admit}
		go func() { gateErr <- srv.Serve(ctx) }()
	}
	factory.StartWithContext(ctx)
	defer factory.Shutdown()
	// Syncing before the caches are full would drop the rules of every
	// policy and pod not yet seen.
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil
	}
	rules := "table inet " + nftables.DefaultTable
	if c.ipt != nil {
		rules = "iptables chains " + iptables.ChainTop + "*"
	}
	klog.FromContext(ctx).Info("Enforcing NetworkPolicy", "rules", rules,
		"clusterNetworkPolicy", c.clusterPolicies() != nil, "gate", c.socket, "keepEstablished", c.keepEstablished)
	loopDone := make(chan struct{})
	go func() { c.runner.Loop(ctx); close(loopDone) }()
	select {
	case err := <-gateErr:
		if ctx.Err() == nil {
			return fmt.Errorf("policy gate: %w", err)
		}
	case <-loopDone:
	}
	<-loopDone
	return nil
}

// podChanged reports whether a Pod update can change any pod's policy
// (as a subject or as a peer): not a condition or a container status.
func podChanged(old, cur *corev1.Pod) bool {
	return !maps.Equal(old.Labels, cur.Labels) || !slices.Equal(old.Status.PodIPs, cur.Status.PodIPs) ||
		old.Status.PodIP != cur.Status.PodIP || old.Spec.NodeName != cur.Spec.NodeName ||
		old.Status.Phase != cur.Status.Phase || old.Spec.HostNetwork != cur.Spec.HostNetwork
}

// localPod reports whether p is a pod of node whose traffic the node's
// table checks: on the pod network, with addresses, not finished (its
// addresses may already be another pod's).
func localPod(p *corev1.Pod, node string) bool {
	return p.Spec.NodeName == node && !p.Spec.HostNetwork && (p.Status.PodIP != "" || len(p.Status.PodIPs) > 0) &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func (c *policyController) syncAndLog(ctx context.Context, full bool) error {
	err := c.sync(ctx, full)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Network policy rules not synced; retrying with a full sync")
		if c.metrics != nil {
			c.metrics.SyncFailures.Inc()
		}
	}
	return err
}

// byNode indexes pods by spec.nodeName.
const byNode = "spec.nodeName"

func podNode(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

// podsToCompile lists the pods a sync compiles with: every pod of the
// cluster (a policy's peers may be any of them), or, when no policy of
// either kind exists, this node's own only (nobody is anyone's peer):
// with no policy a sync then costs this node's pods, not the cluster's.
func (c *policyController) podsToCompile(noPolicy bool) ([]*corev1.Pod, error) {
	if !noPolicy || c.podsByNode == nil {
		return c.pods.List(labels.Everything())
	}
	objs, err := c.podsByNode.ByIndex(byNode, c.node)
	if err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

func (c *policyController) sync(ctx context.Context, full bool) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	nss, err := c.nss.List(labels.Everything())
	if err != nil {
		return err
	}
	nps, err := c.policies.List(labels.Everything())
	if err != nil {
		return err
	}
	var cnps []*cnpv1.ClusterNetworkPolicy
	if l := c.clusterPolicies(); l != nil {
		if cnps, err = l.List(labels.Everything()); err != nil {
			return err
		}
	}
	pods, err := c.podsToCompile(len(nps) == 0 && len(cnps) == 0)
	if err != nil {
		return err
	}
	if c.gate == nil {
		c.gate = newGateState()
	}
	n, ovs := c.gate.begin()
	pods = c.applyOverrides(pods, ovs)
	all, dirtyNS := c.dirty.take()
	all = all || full || c.lastRules == nil
	var comp *compile.Compiler
	var local []netpol.Pod
	recompiled := 0
	for _, p := range pods {
		if !localPod(p, c.node) {
			continue
		}
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		if prev := c.lastRules[key]; !all && !dirtyNS[p.Namespace] && prev != nil {
			local = append(local, *prev) // only other namespaces' policies changed
			continue
		}
		if comp == nil {
			comp = compile.New(compile.Input{NetworkPolicies: nps, ClusterNetworkPolicies: cnps, Pods: pods, Namespaces: nss})
		}
		local = append(local, comp.Pod(p))
		recompiled++
	}
	if c.metrics != nil {
		c.metrics.Recompiled.Add(float64(recompiled))
	}
	if comp == nil && !all {
		// No pod of this node is in a namespace whose policies changed:
		// the table already holds these rules.
		c.gate.commit(n)
		return nil
	}
	var compileErrs []error
	if comp != nil {
		compileErrs = comp.Errors()
	}
	res, left, err := c.commit(ctx, local, full)
	c.logErrors(logger, append(compileErrs, left...))
	if err != nil {
		c.dirty.markAll()
		return err
	}
	c.gate.commit(n)
	c.ready.Store(true)
	if c.metrics != nil {
		c.metrics.SetCounters(res.counters)
		c.metrics.SyncDuration.WithLabelValues(strconv.FormatBool(res.full)).Observe(time.Since(start).Seconds())
		c.metrics.Pods.Set(float64(res.pods))
		c.metrics.Elements.Set(float64(res.elements))
	}
	c.cutChanged(ctx, local)
	logger.V(2).Info("Synced network policy rules", "full", res.full, "pods", len(local), "recompiled", recompiled, "selected", res.pods,
		"policies", len(nps), "elements", res.elements, "rules", res.rules, "operations", res.operations, "took", time.Since(start))
	return nil
}

// logErrors logs what the compiler and renderer left out, once per change.
func (c *policyController) logErrors(logger klog.Logger, errs []error) {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	joined := strings.Join(msgs, "\n")
	if joined == c.lastErrs {
		return
	}
	c.lastErrs = joined
	for _, e := range errs {
		logger.Error(e, "Network policy: part left out")
	}
}
