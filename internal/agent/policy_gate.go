package agent

// What the policy controller adds around a sync (policy.go):
//
//   - ClusterNetworkPolicy: watched when the API serves
//     policy.networking.k8s.io/v1beta1 (the lab installs the CRD); without
//     it, NetworkPolicy alone is enforced and the agent says so.
//   - The gate (netpol/gate): the flatnet-policy CNI plugin hands over a
//     new pod's addresses before the kubelet has written them to the API.
//     They are kept as overrides, used by the next sync as if they were in
//     the pod's status (so the pod is checked as a subject and known as a
//     peer), and the plugin is answered once a sync that started after
//     they arrived has committed. An override ends when the status shows
//     the same addresses or the pod goes away.
//   - Established flows (netpol/conntrack): after a commit, the conntrack
//     entries that pods whose rules changed now deny are deleted, so a
//     denied flow stops within one sync, unless --policy-keep-established.

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
	cnplisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/conntrack"
	"github.com/flatnet/flatnet/internal/netpol/gate"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
)

// policySocket is the gate's socket the conflist names: none without
// --network-policy.
func policySocket(o Options) string {
	if !o.NetworkPolicy {
		return ""
	}
	return o.PolicySocket
}

// removeStalePolicyTable deletes the policy table an earlier agent with
// --network-policy left: its rules would go on enforcing a stale view of
// the policies (and the gate would be gone, so no new pod could start).
// why says what follows (for the log).
func removeStalePolicyTable(ctx context.Context, why string) {
	r, err := nft.New(knftables.InetFamily, nftables.DefaultTable, nft.StandardPaths...)
	if err != nil {
		return // no nft: no table either
	}
	t, err := r.ListTable(ctx)
	if err != nil || t == nil {
		return
	}
	tx := r.NewTransaction()
	tx.Delete(&knftables.Table{})
	logger := klog.FromContext(ctx)
	if err := r.Run(ctx, tx); err != nil {
		logger.Error(err, "Removing the network policy table left by an agent with --network-policy", "table", "inet "+nftables.DefaultTable)
		return
	}
	logger.Info("Removed the network policy table left by an agent with --network-policy: "+why, "table", "inet "+nftables.DefaultTable)
}

// cnpGroupVersion is the ClusterNetworkPolicy API flatnet reads.
var cnpGroupVersion = cnpv1.SchemeGroupVersion.String()

// servesCNP reports whether the API serves ClusterNetworkPolicies.
func servesCNP(d discovery.DiscoveryInterface) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(cnpGroupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("asking the API for %s: %w", cnpGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "clusternetworkpolicies" {
			return true, nil
		}
	}
	return false, nil
}

// newCNPClient builds a ClusterNetworkPolicy client from the agent's
// kubeconfig (JSON: CRDs have no protobuf).
func newCNPClient(kubeconfig, userAgent string) (cnpclient.Interface, error) {
	cfg, err := kube.Config(kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	return cnpclient.NewForConfig(cfg)
}

func (c *policyController) discoveryClient() discovery.DiscoveryInterface {
	if c.discovery != nil {
		return c.discovery
	}
	return c.client.Discovery()
}

func (c *policyController) clusterPolicies() cnplisters.ClusterNetworkPolicyLister {
	c.cnpMu.Lock()
	defer c.cnpMu.Unlock()
	return c.cnps
}

func (c *policyController) setClusterPolicies(l cnplisters.ClusterNetworkPolicyLister) {
	c.cnpMu.Lock()
	defer c.cnpMu.Unlock()
	c.cnps = l
}

// awaitCNPs asks the API every cnpPoll (30 s) whether it serves
// ClusterNetworkPolicy yet (its CRD installed after the agent started) and
// then watches and enforces them, without a restart.
func (c *policyController) awaitCNPs(ctx context.Context) {
	logger := klog.FromContext(ctx)
	poll := c.cnpPoll
	if poll <= 0 {
		poll = 30 * time.Second
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		served, err := servesCNP(c.discoveryClient())
		if err != nil {
			logger.V(2).Info("Asking the API for ClusterNetworkPolicy", "err", err)
			continue
		}
		if !served {
			continue
		}
		lister, hasSynced, err := c.watchCNPs(ctx, c.cnpClient)
		if err != nil {
			logger.Error(err, "Watching ClusterNetworkPolicies")
			return
		}
		if !cache.WaitForNamedCacheSyncWithContext(ctx, hasSynced) {
			return
		}
		c.setClusterPolicies(lister)
		logger.Info("The API serves ClusterNetworkPolicy now: enforcing it")
		c.dirty.markAll()
		c.runner.Run()
		return
	}
}

// watchCNPs starts an informer on ClusterNetworkPolicies that asks for a
// sync on every change; it returns the lister and the informer's synced
// func.
func (c *policyController) watchCNPs(ctx context.Context, client cnpclient.Interface) (cnplisters.ClusterNetworkPolicyLister, cache.InformerSynced, error) {
	factory := cnpinformers.NewSharedInformerFactoryWithOptions(client, 0, cnpinformers.WithTransform(policyTransform))
	inf := factory.Policy().V1beta1().ClusterNetworkPolicies()
	reg, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.dirty.markAll(); c.runner.Run() },
		DeleteFunc: func(any) { c.dirty.markAll(); c.runner.Run() },
		UpdateFunc: func(old, cur any) {
			if !reflect.DeepEqual(old.(*cnpv1.ClusterNetworkPolicy).Spec, cur.(*cnpv1.ClusterNetworkPolicy).Spec) {
				c.dirty.markAll()
				c.runner.Run()
			}
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watching ClusterNetworkPolicies: %w", err)
	}
	factory.Start(ctx.Done())
	context.AfterFunc(ctx, factory.Shutdown)
	return inf.Lister(), reg.HasSynced, nil
}

// dirtySet is what changed since the last sync: everything, or only the
// NetworkPolicies of some namespaces.
type dirtySet struct {
	mu  sync.Mutex
	all bool
	ns  map[string]bool
}

func (d *dirtySet) markAll() {
	d.mu.Lock()
	d.all = true
	d.mu.Unlock()
}

func (d *dirtySet) markNS(ns string) {
	d.mu.Lock()
	if d.ns == nil {
		d.ns = map[string]bool{}
	}
	d.ns[ns] = true
	d.mu.Unlock()
}

// take returns what changed and starts afresh.
func (d *dirtySet) take() (all bool, ns map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	all, ns = d.all, d.ns
	d.all, d.ns = false, nil
	return all, ns
}

// override is a pod's addresses as the CNI plugin reported them.
type override struct {
	uid types.UID
	ips []netip.Addr
}

// gateState is what the gate and the syncs share.
type gateState struct {
	mu        sync.Mutex
	overrides map[types.NamespacedName]override
	started   uint64        // syncs started
	committed uint64        // the latest sync that committed (its start number)
	changed   chan struct{} // closed and replaced when committed moves
}

func newGateState() *gateState {
	return &gateState{overrides: map[types.NamespacedName]override{}, changed: make(chan struct{})}
}

// begin is called as a sync starts: it returns the sync's number and the
// overrides it must apply.
func (g *gateState) begin() (uint64, map[types.NamespacedName]override) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started++
	out := make(map[types.NamespacedName]override, len(g.overrides))
	for k, v := range g.overrides {
		out[k] = v
	}
	return g.started, out
}

// commit records that sync n has committed.
func (g *gateState) commit(n uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n > g.committed {
		g.committed = n
		close(g.changed)
		g.changed = make(chan struct{})
	}
}

// drop ends key's override if it is still the one given (a newer request
// may have replaced it).
func (g *gateState) drop(key types.NamespacedName, o override) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cur, ok := g.overrides[key]; ok && cur.uid == o.uid && slices.Equal(cur.ips, o.ips) {
		delete(g.overrides, key)
	}
}

// admit is the gate's handler: it returns once a sync that knows req's
// addresses has committed.
func (c *policyController) admit(ctx context.Context, req gate.Request) error {
	if c.metrics != nil {
		start := time.Now()
		defer func() { c.metrics.GateDuration.Observe(time.Since(start).Seconds()) }()
	}
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Name}
	// The runtime read the pod from the API, so the watch has it or
	// soon will; the first sync after the caches filled must also be done.
	for {
		if c.ready.Load() {
			p, err := c.pods.Pods(req.Namespace).Get(req.Name)
			if err == nil && (req.UID == "" || string(p.UID) == req.UID) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s (uid %q) is not in the agent's view of the API: %w", key, req.UID, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := c.awaitPolicies(ctx, req.Namespace); err != nil {
		return fmt.Errorf("pod %s: %w", key, err)
	}
	g := c.gate
	g.mu.Lock()
	g.overrides[key] = override{uid: types.UID(req.UID), ips: req.IPs}
	need := g.started + 1
	g.mu.Unlock()
	c.dirty.markAll() // new addresses: peers of other pods' rules too
	c.runner.Run()
	for {
		g.mu.Lock()
		done, wait := g.committed >= need, g.changed
		g.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s: its policy was not committed: %w", key, ctx.Err())
		case <-wait:
		}
	}
}

// awaitPolicies waits until the watches hold every NetworkPolicy of ns
// and every ClusterNetworkPolicy the API has now. Pods and policies come
// through separate watches, so a policy created just before a pod may
// reach the agent after the pod; without this, the pod could start
// before that policy is in force. One list of each kind per new pod.
func (c *policyController) awaitPolicies(ctx context.Context, ns string) error {
	type want struct {
		name string
		uid  types.UID
	}
	var nps, cnps []want
	list, err := c.client.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the NetworkPolicies of %s: %w", ns, err)
	}
	for _, p := range list.Items {
		nps = append(nps, want{p.Name, p.UID})
	}
	if c.clusterPolicies() != nil {
		list, err := c.cnpClient.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing ClusterNetworkPolicies: %w", err)
		}
		for _, p := range list.Items {
			cnps = append(cnps, want{p.Name, p.UID})
		}
	}
	for {
		missing := ""
		for _, w := range nps {
			if p, err := c.policies.NetworkPolicies(ns).Get(w.name); err != nil || p.UID != w.uid {
				missing = "NetworkPolicy " + ns + "/" + w.name
				break
			}
		}
		if l := c.clusterPolicies(); missing == "" && l != nil {
			for _, w := range cnps {
				if p, err := l.Get(w.name); err != nil || p.UID != w.uid {
					missing = "ClusterNetworkPolicy " + w.name
					break
				}
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s, in the API before the pod, is not in the agent's view yet: %w", missing, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// applyOverrides returns pods with the gate's addresses filled in (a
// copy of each pod changed) and drops the overrides that have served:
// the status has the addresses, or the pod is gone. A pod whose
// addresses an override gives to another pod is left out: its sandbox is
// gone and its address reused.
func (c *policyController) applyOverrides(pods []*corev1.Pod, ovs map[types.NamespacedName]override) []*corev1.Pod {
	if len(ovs) == 0 {
		return pods
	}
	taken := map[netip.Addr]types.NamespacedName{}
	for k, o := range ovs {
		for _, ip := range o.ips {
			taken[ip] = k
		}
	}
	seen := map[types.NamespacedName]bool{}
	out := make([]*corev1.Pod, 0, len(pods))
	for _, p := range pods {
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		o, ok := ovs[key]
		if ok && (o.uid == "" || o.uid == p.UID) {
			seen[key] = true
			if slices.Equal(statusIPs(p), o.ips) {
				c.gate.drop(key, o)
			} else {
				cp := *p
				cp.Status.PodIPs = nil
				for _, ip := range o.ips {
					cp.Status.PodIPs = append(cp.Status.PodIPs, corev1.PodIP{IP: ip.String()})
				}
				cp.Status.PodIP = o.ips[0].String()
				p = &cp
			}
			out = append(out, p)
			continue
		}
		if slices.ContainsFunc(statusIPs(p), func(ip netip.Addr) bool { k, ok := taken[ip]; return ok && k != key }) {
			continue
		}
		out = append(out, p)
	}
	for k, o := range ovs {
		if !seen[k] {
			c.gate.drop(k, o)
		}
	}
	return out
}

func statusIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, s := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(s.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// narrowed reports whether cur may deny a flow that prev allowed; false
// only when that is sure: the same tier rules, and the NetworkPolicy
// tier's isolation gone or its allowed boxes a superset. (The usual
// changes, an allow policy or a new peer pod, then cost no conntrack
// dump.)
func narrowed(prev, cur *netpol.Rules) bool {
	if !reflect.DeepEqual(prev.Admin, cur.Admin) || !reflect.DeepEqual(prev.Baseline, cur.Baseline) {
		return true
	}
	switch {
	case !cur.Isolated:
		return false
	case !prev.Isolated:
		return true
	}
	have := make(map[netpol.Entry]bool, len(cur.Allowed))
	for _, a := range cur.Allowed {
		have[a.Entry] = true
	}
	for _, a := range prev.Allowed {
		if !have[a.Entry] {
			return true
		}
	}
	return false
}

// cutChanged deletes the established flows that the pods whose rules
// changed since the last sync now deny, and remembers the rules.
func (c *policyController) cutChanged(ctx context.Context, local []netpol.Pod) {
	changed := conntrack.Pods{}
	next := make(map[types.NamespacedName]*netpol.Pod, len(local))
	for i := range local {
		p := &local[i]
		next[p.Pod] = p
		prev := c.lastRules[p.Pod]
		if prev != nil && slices.Equal(prev.IPs, p.IPs) && !narrowed(&prev.Ingress, &p.Ingress) && !narrowed(&prev.Egress, &p.Egress) {
			continue // allows at least what it did: nothing to cut
		}
		if prev == nil && p.Ingress.Empty() && p.Egress.Empty() {
			continue // nothing to cut for a pod no policy selects
		}
		for _, ip := range p.IPs {
			changed[ip] = p
		}
	}
	c.lastRules = next
	if c.keepEstablished || len(changed) == 0 || c.conntrack == nil {
		return
	}
	start := time.Now()
	n, err := conntrack.Cut(c.conntrack, changed)
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Network policy: cutting established flows the new rules deny", "pods", len(changed))
		return
	}
	if c.metrics != nil {
		c.metrics.CutFlows.Add(float64(n))
	}
	logger.V(2).Info("Cut established flows the new rules deny", "flows", n, "pods", len(changed), "took", time.Since(start))
}
