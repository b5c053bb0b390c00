package simnodes

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/flatnet/flatnet/internal/agent/backend"
)

func TestNames(t *testing.T) {
	for _, c := range []struct {
		i    int
		name string
	}{{1, "kwk-sim-00001"}, {42, "kwk-sim-00042"}, {99999, "kwk-sim-99999"}, {123456, "kwk-sim-123456"}} {
		if got := Name("kwk", c.i); got != c.name {
			t.Errorf("Name(kwk, %d) = %s, want %s", c.i, got, c.name)
		}
		if i, ok := Index("kwk", c.name); !ok || i != c.i {
			t.Errorf("Index(kwk, %s) = %d, %v; want %d", c.name, i, ok, c.i)
		}
	}
	for _, bad := range []string{"kwk-node1", "kwk-sim-1", "kwk-sim-00000", "kwk-sim-0001x", "other-sim-00001", "kwk-sim-000001", "kwk-x-sim-00001"} {
		if i, ok := Index("kwk", bad); ok {
			t.Errorf("Index(kwk, %s) = %d, true; want not a simulated node of kwk", bad, i)
		}
	}
}

func TestInternalIPAndMAC(t *testing.T) {
	r := netip.MustParsePrefix("10.252.0.0/16")
	if got := MaxNodes(r); got != 65534 {
		t.Errorf("MaxNodes(%s) = %d, want 65534", r, got)
	}
	for i, want := range map[int]string{1: "10.252.0.1", 255: "10.252.0.255", 256: "10.252.1.0", 65534: "10.252.255.254"} {
		got, err := InternalIP(r, i)
		if err != nil || got.String() != want {
			t.Errorf("InternalIP(%s, %d) = %s, %v; want %s", r, i, got, err, want)
		}
	}
	for _, i := range []int{0, -1, 65535} {
		if a, err := InternalIP(r, i); err == nil {
			t.Errorf("InternalIP(%s, %d) = %s, want an error", r, i, a)
		}
	}
	seen := map[string]int{}
	for i := 1; i <= 70000; i++ {
		m := VTEPMAC(i)
		if j, dup := seen[m]; dup {
			t.Fatalf("VTEPMAC(%d) = VTEPMAC(%d) = %s", i, j, m)
		}
		seen[m] = i
	}
	// Locally administered (0x02 set), unicast (0x01 clear).
	if m := VTEPMAC(258); m != "06:6b:00:00:01:02" {
		t.Errorf("VTEPMAC(258) = %s", m)
	}
}

func TestNode(t *testing.T) {
	hostgw, err := Config{Lab: "kwk", Backend: backend.HostGW}.Node(3)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{AnnotationKwok: KwokValue}
	if diff := cmp.Diff(want, hostgw.Annotations); diff != "" {
		t.Errorf("host-gw node annotations (-want +got):\n%s", diff)
	}
	if hostgw.Labels[LabelSimulated] != "kwk" || hostgw.Name != "kwk-sim-00003" {
		t.Errorf("node %s labels %v", hostgw.Name, hostgw.Labels)
	}
	wantAddrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.252.0.3"}, {Type: corev1.NodeHostName, Address: "kwk-sim-00003"}}
	if diff := cmp.Diff(wantAddrs, hostgw.Status.Addresses); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
	if len(hostgw.Spec.Taints) != 1 || hostgw.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taints %v, want kwok's NoSchedule", hostgw.Spec.Taints)
	}
	vx, err := Config{Lab: "kwk", Backend: backend.VXLAN, IPRange: netip.MustParsePrefix("10.253.0.0/24")}.Node(7)
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]string{AnnotationKwok: KwokValue, backend.AnnotationBackend: "vxlan",
		backend.AnnotationVTEPMAC: "06:6b:00:00:00:07", backend.AnnotationPublicIP: "10.253.0.7"}
	if diff := cmp.Diff(want, vx.Annotations); diff != "" {
		t.Errorf("vxlan node annotations (-want +got):\n%s", diff)
	}
	if _, err := (Config{Lab: "kwk", IPRange: netip.MustParsePrefix("10.253.0.0/30")}).Node(3); err == nil {
		t.Error("node 3 of a /30 (2 addresses): want an error")
	}
}

func TestPlan(t *testing.T) {
	cfg := Config{Lab: "kwk", Backend: backend.VXLAN}
	var existing []corev1.Node
	for _, i := range []int{1, 2, 4, 9} {
		n, _ := cfg.Node(i)
		existing = append(existing, *n)
	}
	// Node 2 was made for host-gw: no flatnet.io/ annotations.
	old, _ := Config{Lab: "kwk", Backend: backend.HostGW}.Node(2)
	existing[1] = *old
	// Not named like one of kwk's: deleted.
	stray := existing[0]
	stray.Name = "kwk-sim-x"
	existing = append(existing, stray)

	p, err := cfg.Plan(existing, 5)
	if err != nil {
		t.Fatal(err)
	}
	names := func(ns []*corev1.Node) (out []string) {
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out
	}
	got := map[string][]string{"create": names(p.Create), "update": names(p.Update), "delete": p.Delete}
	want := map[string][]string{"create": {"kwk-sim-00003", "kwk-sim-00005"}, "update": {"kwk-sim-00002"}, "delete": {"kwk-sim-00009", "kwk-sim-x"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
	if p.Update[0].Annotations[backend.AnnotationVTEPMAC] != VTEPMAC(2) {
		t.Errorf("update of node 2 has annotations %v", p.Update[0].Annotations)
	}
	if existing[1].Annotations[backend.AnnotationVTEPMAC] != "" {
		t.Error("Plan modified the listed node")
	}
	if p.Describe() != "create 2, update 1, delete 2" {
		t.Errorf("Describe = %q", p.Describe())
	}
	// The other way: host-gw drops the vxlan annotations.
	p, err = Config{Lab: "kwk", Backend: backend.HostGW}.Plan(existing[:1], 1)
	if err != nil || len(p.Update) != 1 || len(p.Update[0].Annotations) != 1 {
		t.Errorf("vxlan node under host-gw: plan %+v, %v; want one update keeping only kwok's annotation", p, err)
	}
	// Planned twice against what it made: nothing to do.
	var made []corev1.Node
	for i := 1; i <= 3; i++ {
		n, _ := cfg.Node(i)
		made = append(made, *n)
	}
	if p, err := cfg.Plan(made, 3); err != nil || !p.Empty() {
		t.Errorf("plan against its own nodes: %+v, %v; want empty", p, err)
	}
	if _, err := cfg.Plan(nil, 70000); err == nil {
		t.Error("70,000 nodes in a /16: want an error")
	}
}

// Scale creates the nodes, then shrinking deletes the extra nodes and
// their pods (at once: grace 0), and no other pod.
func TestScale(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	cfg := Config{Lab: "kwk", Backend: backend.HostGW}
	if _, _, err := Scale(ctx, c, cfg, 20, 4); err != nil {
		t.Fatal(err)
	}
	nodes, err := List(ctx, c, "kwk")
	if err != nil || len(nodes.Items) != 20 {
		t.Fatalf("%v after Scale(20), %v", nodes, err)
	}
	// A real node (no label) and pods on a kept node, a dropped node and
	// the real node.
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kwk-node1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"a", Name("kwk", 1)}, {"b", Name("kwk", 7)}, {"c", Name("kwk", 20)}, {"d", "kwk-node1"}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p[0], Namespace: "default"}, Spec: corev1.PodSpec{NodeName: p[1]}}
		if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The fake clientset ignores field selectors: answer the pod list by
	// spec.nodeName as the apiserver does.
	c.PrependReactor("list", "pods", func(a ktesting.Action) (bool, kruntime.Object, error) {
		sel := a.(ktesting.ListAction).GetListRestrictions().Fields
		all, err := c.Tracker().List(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "")
		if err != nil {
			return true, nil, err
		}
		out := &corev1.PodList{}
		for _, p := range all.(*corev1.PodList).Items {
			if sel.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) {
				out.Items = append(out.Items, p)
			}
		}
		return true, out, nil
	})
	p, listed, err := Scale(ctx, c, cfg, 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.Items) != 20 {
		t.Errorf("Scale planned from %d nodes, want the 20 there were", len(listed.Items))
	}
	if len(p.Delete) != 15 || len(p.Create) != 0 {
		t.Errorf("shrink plan: %s, want delete 15", p.Describe())
	}
	nodes, _ = List(ctx, c, "kwk")
	if len(nodes.Items) != 5 {
		t.Errorf("%d simulated nodes after Scale(5), want 5", len(nodes.Items))
	}
	if _, err := c.CoreV1().Nodes().Get(ctx, "kwk-node1", metav1.GetOptions{}); err != nil {
		t.Errorf("the real node: %v", err)
	}
	pods, _ := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	var left []string
	for _, p := range pods.Items {
		left = append(left, p.Name)
	}
	if diff := cmp.Diff([]string{"a", "d"}, left); diff != "" {
		t.Errorf("pods after shrinking (-want +got):\n%s", diff)
	}
	for _, a := range c.Actions() {
		if d, ok := a.(ktesting.DeleteAction); ok && d.GetResource().Resource == "pods" {
			if g := d.GetDeleteOptions().GracePeriodSeconds; g == nil || *g != 0 {
				t.Errorf("pod %s deleted with grace %v, want 0 (no kubelet is left to confirm)", d.GetName(), g)
			}
		}
	}
}

// KwokConfig is kwok's configuration document and four Stages, each
// valid YAML, with the annotation selector and flatnet's stage names.
func TestKwokConfig(t *testing.T) {
	docs := strings.Split(string(KwokConfig(253)), "\n---\n")
	var kinds, names []string
	for _, d := range docs {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Options map[string]any `json:"options"`
			Spec    struct {
				Next struct {
					StatusTemplate string `json:"statusTemplate"`
				} `json:"next"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatalf("document %q: %v", d, err)
		}
		kinds = append(kinds, obj.Kind)
		names = append(names, obj.Metadata.Name)
		if obj.Kind == "KwokConfiguration" && obj.Options["manageNodesWithAnnotationSelector"] != AnnotationKwok+"="+KwokValue {
			t.Errorf("kwok manages nodes by %v, want %s=%s", obj.Options["manageNodesWithAnnotationSelector"], AnnotationKwok, KwokValue)
		}
		if strings.Contains(d, "@") {
			t.Errorf("document %s has an unreplaced placeholder:\n%s", obj.Metadata.Name, d)
		}
	}
	if diff := cmp.Diff([]string{"KwokConfiguration", "Stage", "Stage", "Stage", "Stage"}, kinds); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "flatnet-node-ready", "flatnet-node-heartbeat", "flatnet-pod-ready", "flatnet-pod-delete"}, names); diff != "" {
		t.Errorf("stages (-want +got):\n%s", diff)
	}
	if !strings.Contains(docs[1], `pods: "253"`) {
		t.Error("node ready stage does not give 253 pods capacity")
	}
	if got := MaxPodsPerNode(24); got != 253 {
		t.Errorf("MaxPodsPerNode(24) = %d, want 253", got)
	}
	argv := strings.Join(KwokArgv("/k", "/kc", "/c.yaml"), " ")
	for _, want := range []string{"--node-lease-duration-seconds=0", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--config=/c.yaml"} {
		if !strings.Contains(argv, want) {
			t.Errorf("kwok's argv %q lacks %s", argv, want)
		}
	}
}

// KwokVersion is the version hack/kwok/go.mod pins (where
// hack/build-kwok.sh puts the binary).
func TestKwokVersionPinned(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "kwok", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^require sigs\.k8s\.io/kwok (\S+)$`).FindSubmatch(b)
	if m == nil || string(m[1]) != KwokVersion {
		t.Errorf("hack/kwok/go.mod requires kwok %q, KwokVersion is %s", m, KwokVersion)
	}
}

// WaitReady returns once every wanted node has a podCIDR and is Ready,
// following updates; with one node never Ready it ends with the context,
// counting it.
func TestWaitReady(t *testing.T) {
	c := fake.NewClientset()
	cfg := Config{Lab: "kwk"}
	ctx := context.Background()
	if err := Create(ctx, c, cfg, 1, 3, 2); err != nil {
		t.Fatal(err)
	}
	// A node beyond the 3 wanted, never ready: not waited for.
	if err := Create(ctx, c, cfg, 4, 4, 1); err != nil {
		t.Fatal(err)
	}
	set := func(i int, ready bool) {
		n, err := c.CoreV1().Nodes().Get(ctx, Name("kwk", i), metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		n.Spec.PodCIDR = "10.244." + string(rune('0'+i)) + ".0/24"
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
		if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	}
	// Node 3 never becomes Ready.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	go func() {
		for tctx.Err() == nil {
			set(1, true)
			set(2, true)
			set(3, false)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	_, err := WaitReady(tctx, c, "kwk", 3, time.Now(), nil)
	if err == nil || !strings.Contains(err.Error(), "0 missing, 0 without a podCIDR, 1 not Ready") {
		t.Errorf("node 3 not Ready: %v", err)
	}
	// Now it is (set again and again: the fake watch starts after its list).
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				set(3, true)
			}
		}
	}()
	tm, err := WaitReady(rctx, c, "kwk", 3, time.Now(), nil)
	if err != nil || tm.PodCIDRs <= 0 || tm.Ready <= 0 {
		t.Errorf("all Ready: %+v, %v", tm, err)
	}

	// Handed a list that shows them all done (Scale's), it lists nothing.
	listed, err := List(ctx, c, "kwk")
	if err != nil {
		t.Fatal(err)
	}
	c.ClearActions()
	if _, err := WaitReady(rctx, c, "kwk", 3, time.Now(), listed); err != nil {
		t.Errorf("from a list of ready nodes: %v", err)
	}
	for _, a := range c.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			t.Errorf("WaitReady from a list of ready nodes asked the API: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	// Handed a list from before node 3 was Ready, it follows from there.
	stale := listed.DeepCopy()
	for i := range stale.Items {
		if stale.Items[i].Name == Name("kwk", 3) {
			stale.Items[i].Status.Conditions = nil
		}
	}
	if _, err := WaitReady(rctx, c, "kwk", 3, time.Now(), stale); err != nil {
		t.Errorf("from a list with node 3 not Ready yet: %v", err)
	}
}
