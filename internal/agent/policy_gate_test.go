package agent

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/fake"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/knftables"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/conntrack"
	"github.com/flatnet/flatnet/internal/netpol/gate"
	policymetrics "github.com/flatnet/flatnet/internal/netpol/metrics"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy/runner"
)

// gateTest runs a policy controller for node n1 over client with a fake
// table and a fake conntrack table; it returns the controller and a
// reader of a set's keys (first field).
func gateTest(t *testing.T, client *fake.Clientset, ct *conntrack.Fake) (*policyController, func(set string) []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := nft.NewFake(knftables.InetFamily, nftables.DefaultTable)
	c := &policyController{node: "n1", client: client, renderer: nftables.NewRenderer(), syncer: nftables.NewSyncer(f),
		socket: filepath.Join(t.TempDir(), "policy.sock")}
	if ct != nil {
		c.conntrack = ct
	}
	c.metrics = policymetrics.New(f)
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: 0, MaxInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	keys := func(set string) []string {
		f.RLock()
		defer f.RUnlock()
		if f.Table == nil || f.Table.Sets[set] == nil {
			return nil
		}
		var out []string
		for _, e := range f.Table.Sets[set].Elements {
			out = append(out, e.Key[0])
		}
		slices.Sort(out)
		return out
	}
	return c, keys
}

func denyAllIngress(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deny"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
}

// TestGateAdmitsBeforeTheStatus: the CNI plugin's request carries a new
// pod's address before the API has it; the gate answers only once the
// pod is isolated at that address, through the real socket, and the
// override ends when the status catches up.
func TestGateAdmitsBeforeTheStatus(t *testing.T) {
	pod := policyPod("a", "n1", "", map[string]string{"app": "a"})
	pod.Status.PodIPs, pod.UID = nil, "uid-a"
	client := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
		denyAllIngress("x"), pod)
	c, keys := gateTest(t, client, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := gate.Request{Namespace: "x", Name: "a", UID: "uid-a", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9")}}
	var err error
	for {
		if err = gate.Ask(ctx, c.socket, req); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // the socket is not there yet
	}
	if err != nil {
		t.Fatalf("gate: %v", err)
	}
	if got := keys("ingress-isolated-v4"); !slices.Equal(got, []string{"10.244.1.9"}) {
		t.Fatalf("when the gate answered, isolated = %v, want the new pod's address", got)
	}
	// A request for an earlier pod of the same name is refused in time.
	short, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	if err := c.admit(short, gate.Request{Namespace: "x", Name: "a", UID: "uid-old", IPs: req.IPs}); err == nil || !strings.Contains(err.Error(), "uid-old") {
		t.Errorf("admit for another uid: %v, want an error naming it", err)
	}
	// The kubelet writes the address: the override has served.
	pod.Status.PodIP, pod.Status.PodIPs = "10.244.1.9", []corev1.PodIP{{IP: "10.244.1.9"}}
	if _, err := client.CoreV1().Pods("x").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c.gate.mu.Lock()
		n := len(c.gate.overrides)
		c.gate.mu.Unlock()
		if n == 0 && slices.Equal(keys("ingress-isolated-v4"), []string{"10.244.1.9"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("override still there (%d) or isolated = %v", n, keys("ingress-isolated-v4"))
		}
	}
}

// TestApplyOverridesReusedAddress: a deleted pod still listing an address
// the gate gave to a new pod is left out, so the new pod's rules hold.
func TestApplyOverridesReusedAddress(t *testing.T) {
	c := &policyController{gate: newGateState()}
	old := policyPod("old", "n1", "10.244.1.9", nil)
	cur := policyPod("new", "n1", "", nil)
	cur.Status.PodIPs = nil
	key := types.NamespacedName{Namespace: "x", Name: "new"}
	ovs := map[types.NamespacedName]override{key: {ips: []netip.Addr{netip.MustParseAddr("10.244.1.9")}}}
	c.gate.overrides[key] = ovs[key]
	got := c.applyOverrides([]*corev1.Pod{old, cur}, ovs)
	if len(got) != 1 || got[0].Name != "new" || got[0].Status.PodIP != "10.244.1.9" || cur.Status.PodIP != "" {
		t.Errorf("applyOverrides = %v (the cached pod must not change)", got)
	}
}

// TestCutOnDeny: a policy that now denies an established flow to a pod
// deletes its conntrack entry; the node's other flows stay, and with
// --policy-keep-established nothing is cut.
func TestCutOnDeny(t *testing.T) {
	for _, keep := range []bool{false, true} {
		ct := conntrack.NewFake(
			conntrack.Flow{Src: netip.MustParseAddr("10.244.2.5"), Dst: netip.MustParseAddr("10.244.1.5"), Proto: netpol.ProtoTCP, Port: 80},
			conntrack.Flow{Src: netip.MustParseAddr("10.244.2.5"), Dst: netip.MustParseAddr("10.244.1.6"), Proto: netpol.ProtoTCP, Port: 80},
		)
		client := fake.NewClientset(
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "y", Labels: map[string]string{"kubernetes.io/metadata.name": "y"}}},
			policyPod("a", "n1", "10.244.1.5", nil),
		)
		other := policyPod("b", "n1", "10.244.1.6", nil)
		other.Namespace = "y"
		if _, err := client.CoreV1().Pods("y").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c, keys := gateTest(t, client, ct)
		c.keepEstablished = keep
		if _, err := client.NetworkingV1().NetworkPolicies("x").Create(context.Background(), denyAllIngress("x"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); len(keys("ingress-isolated-v4")) == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the policy never reached the table")
			}
		}
		want := 1
		if keep {
			want = 2
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			n := ct.Len(false)
			if n == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("keep=%v: %d flows left, want %d", keep, n, want)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); promtest.ToFloat64(c.metrics.CutFlows) != float64(2-want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("keep=%v: cut_flows_total %v, want %d", keep, promtest.ToFloat64(c.metrics.CutFlows), 2-want)
			}
		}
		if got := promtest.ToFloat64(c.metrics.Pods); got != 1 {
			t.Errorf("pods gauge %v, want 1", got)
		}
	}
}

func TestNarrowed(t *testing.T) {
	e := func(peer string, port uint16) netpol.Allow {
		return netpol.Allow{Entry: netpol.Entry{Peer: netip.MustParsePrefix(peer), Proto: netpol.ProtoTCP, From: port, To: port}}
	}
	open := netpol.Rules{}
	deny := netpol.Rules{Isolated: true}
	one := netpol.Rules{Isolated: true, Allowed: []netpol.Allow{e("10.0.0.1/32", 80)}}
	two := netpol.Rules{Isolated: true, Allowed: []netpol.Allow{e("10.0.0.1/32", 80), e("10.0.0.2/32", 80)}}
	admin := netpol.Rules{Admin: []netpol.TierRule{{Action: netpol.Deny}}}
	for _, tc := range []struct {
		name      string
		prev, cur netpol.Rules
		want      bool
	}{
		{"same", one, one, false},
		{"a peer more", one, two, false},
		{"isolation lifted", one, open, false},
		{"a peer less", two, one, true},
		{"newly isolated", open, one, true},
		{"default deny", one, deny, true},
		{"admin rule added", open, admin, true},
	} {
		if got := narrowed(&tc.prev, &tc.cur); got != tc.want {
			t.Errorf("%s: narrowed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestOtherNamespacesPolicyCostsNothing: a NetworkPolicy in a namespace
// with no pod on this node changes nothing here, so no transaction runs;
// one in the pod's namespace does.
func TestOtherNamespacesPolicyCostsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
		policyPod("a", "n1", "10.244.1.5", map[string]string{"app": "a"}),
	)
	f := nft.NewFake(knftables.InetFamily, nftables.DefaultTable)
	c := &policyController{node: "n1", client: client, renderer: nftables.NewRenderer(), syncer: nftables.NewSyncer(f),
		metrics: policymetrics.New(f)}
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: 0, MaxInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	recompiled := func() float64 { return promtest.ToFloat64(c.metrics.Recompiled) }
	waitRuns := func(what string, ok func(int) bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(f.Runs()); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d transactions", what, f.Runs())
			}
		}
	}
	waitRuns("first sync", func(n int) bool { return n > 0 })
	before, compiled := f.Runs(), recompiled()
	other := denyAllIngress("y")
	if _, err := client.NetworkingV1().NetworkPolicies("y").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mine := denyAllIngress("x")
	// The policy in y is seen before the one in x (one informer, in order).
	time.Sleep(200 * time.Millisecond)
	if f.Runs() != before || recompiled() != compiled {
		t.Errorf("a policy of another namespace ran %d transactions and recompiled %v pods", f.Runs()-before, recompiled()-compiled)
	}
	if _, err := client.NetworkingV1().NetworkPolicies("x").Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRuns("policy in x", func(n int) bool { return n == before+1 })
	if got := recompiled() - compiled; got != 1 {
		t.Errorf("a policy of the pod's namespace recompiled %v pods, want 1", got)
	}
}

// TestClusterPoliciesOnceServed: the ClusterNetworkPolicy CRD installed
// after the agent started is picked up without a restart.
func TestClusterPoliciesOnceServed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}},
		policyPod("a", "n1", "10.244.1.5", map[string]string{"app": "a"}),
	)
	deny := &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: cnpv1.AdminTier, Priority: 1,
			Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}}},
		},
	}
	f := nft.NewFake(knftables.InetFamily, nftables.DefaultTable)
	c := &policyController{node: "n1", client: client, renderer: nftables.NewRenderer(), syncer: nftables.NewSyncer(f),
		cnpClient: cnpfake.NewSimpleClientset(deny), cnpPoll: 20 * time.Millisecond}
	disco := &lateDiscovery{DiscoveryInterface: client.Discovery()}
	c.discovery = disco
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: 0, MaxInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	admin := func() int {
		f.RLock()
		defer f.RUnlock()
		n := 0
		if f.Table != nil {
			for name := range f.Table.Sets {
				if strings.HasPrefix(name, "ingress-admin-") {
					n++
				}
			}
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); f.Runs() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no first sync")
		}
	}
	time.Sleep(100 * time.Millisecond)
	if admin() != 0 {
		t.Fatal("a ClusterNetworkPolicy was enforced before the API served the kind")
	}
	disco.served.Store(true) // the CRD is installed
	for deadline := time.Now().Add(10 * time.Second); admin() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ClusterNetworkPolicy was not enforced once the API served it")
		}
	}
}

// lateDiscovery serves ClusterNetworkPolicy once served is set.
type lateDiscovery struct {
	discovery.DiscoveryInterface
	served atomic.Bool
}

func (d *lateDiscovery) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	if gv == cnpGroupVersion && d.served.Load() {
		return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}}}, nil
	}
	return d.DiscoveryInterface.ServerResourcesForGroupVersion(gv)
}

// TestGateWaitsForPoliciesBeforeThePod: a policy the API has but the
// agent's watch has not delivered yet holds the gate.
func TestGateWaitsForPoliciesBeforeThePod(t *testing.T) {
	np := denyAllIngress("x")
	np.UID = "np-uid"
	client := fake.NewClientset(np)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	c := &policyController{client: client, policies: networkinglisters.NewNetworkPolicyLister(idx)}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.awaitPolicies(ctx, "x"); err == nil || !strings.Contains(err.Error(), "NetworkPolicy x/deny") {
		t.Fatalf("awaitPolicies with the policy not watched yet: %v, want an error naming it", err)
	}
	if err := idx.Add(np); err != nil {
		t.Fatal(err)
	}
	if err := c.awaitPolicies(context.Background(), "x"); err != nil {
		t.Fatalf("awaitPolicies with the policy watched: %v", err)
	}
	if err := c.awaitPolicies(context.Background(), "y"); err != nil {
		t.Fatalf("awaitPolicies for a namespace without policies: %v", err)
	}
}
