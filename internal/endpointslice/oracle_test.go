package endpointslice

// The comparison with kube-controller-manager: upstream's reconciler
// (k8s.io/endpointslice, test-only) and ours run on the same Service,
// pods, nodes and existing slices, each against its own fake clientset,
// and the slices each leaves behind are compared field by field.
// Upstream is told to use flatnet's managed-by value, so labels compare
// exactly. Both are given the same trigger time, so the slices' annotations
// (the last-change-trigger-time) compare too: every case runs once with
// a trigger time and once without one, the existing slices carrying an
// older one (from upstream's first run), so that both stamping a new time
// and clearing an old one are covered. Ignored, because they
// legitimately differ: object names (generated), the order of a slice's
// ports (see portsText), and, when a port group needs several slices,
// which endpoint lands in
// which slice (upstream pops from a map in random order): there the
// group's endpoints are compared as one sorted list plus the sorted list
// of slice sizes. The numbers of creates, updates and deletes must match.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	upstream "k8s.io/endpointslice"
	upstreamutil "k8s.io/endpointslice/util"
	"k8s.io/klog/v2"
)

type oracleCase struct {
	name   string
	svc    *corev1.Service
	before []*corev1.Pod // reconciled first (by upstream) to make the existing slices
	after  []*corev1.Pod
	max    int
}

func oracleCases() []oracleCase {
	named := withPorts(
		corev1.ServicePort{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)},
	)
	mixed := []*corev1.Pod{
		with(pod("p1", "s", "node-a", "10.1.0.1", "fd00::1"), containerPort("web", 8080)),
		with(pod("p2", "s", "node-b", "10.1.0.2", "fd00::2"), containerPort("web", 9090), notReady),
		with(pod("p3", "s", "node-a", "10.1.0.3"), containerPort("web", 8080), terminating),
		with(pod("p4", "s", "node-b", "10.1.0.4"), sidecarPort("web", 9090), terminating, notReady),
		with(pod("p5", "s", "node-a", "10.1.0.5"), succeeded),
		pod("p6", "s", "node-a"),
		with(pod("p7", "s", "node-x", "10.1.0.7"), containerPort("web", 8080)),
		with(pod("p8", "s", "node-b", "10.1.0.8"), hostname("h8", "s")),
	}
	many := manyPods("s", 230)
	fewer := slices.Clone(many[:150])
	fewer[10] = with(fewer[10].DeepCopy(), notReady)
	return []oracleCase{
		{name: "ready pods", svc: service("s"), after: manyPods("s", 3)},
		{name: "mixed conditions and named ports", svc: service("s", named), after: mixed},
		{name: "mixed, dual stack", svc: service("s", named, dualStack), after: mixed},
		{name: "mixed, publishNotReadyAddresses", svc: service("s", named, publishNotReady), after: mixed},
		{name: "headless", svc: service("s", headless), after: mixed},
		{name: "headless without families", svc: service("s", headless, func(s *corev1.Service) { s.Spec.IPFamilies = nil }), after: mixed},
		{name: "no pods: placeholder", svc: service("s")},
		{name: "230 pods", svc: service("s"), after: many},
		{name: "230 pods, 50 per slice", svc: service("s"), after: many, max: 50},
		{name: "230 then 150 pods, one not ready", svc: service("s"), before: many, after: fewer},
		{name: "150 then 230 pods", svc: service("s"), before: fewer, after: many},
		{name: "pods then none", svc: service("s"), before: many[:5]},
		{name: "placeholder then pods", svc: service("s"), before: []*corev1.Pod{}, after: many[:5]},
		{name: "one pod changes", svc: service("s"), before: many[:120], after: append(slices.Clone(many[:119]), with(many[119].DeepCopy(), terminating))},
		{name: "ports change", svc: service("s", named), before: many[:20], after: many[:20]},
		{name: "service labels", svc: service("s", svcLabels(map[string]string{"team": "x", discovery.LabelServiceName: "evil"})), before: many[:3], after: many[:3]},
	}
}

// state is what one reconciler left: the slices and its write counts.
type state struct {
	slices                 []*discovery.EndpointSlice
	creates, updates, dels int
}

func list(t *testing.T, c *fake.Clientset) []*discovery.EndpointSlice {
	t.Helper()
	l, err := c.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*discovery.EndpointSlice
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

func writes(c *fake.Clientset) (cr, up, del int) {
	for _, a := range c.Actions() {
		if a.GetResource().Resource != "endpointslices" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			cr++
		case "update":
			up++
		case "delete":
			del++
		}
	}
	return
}

func runUpstream(t *testing.T, svc *corev1.Service, pods []*corev1.Pod, nodes []*corev1.Node, existing []*discovery.EndpointSlice, max int, trigger time.Time) state {
	t.Helper()
	var objs []runtime.Object
	for _, s := range existing {
		objs = append(objs, s.DeepCopy())
	}
	c := fake.NewClientset(objs...)
	nameOnCreate(c)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	r := upstream.NewReconciler(c, corelisters.NewNodeLister(idx), int32(max), upstreamutil.NewEndpointSliceTracker(), nil, record.NewFakeRecorder(100), ManagedBy)
	_ = r.Reconcile(klog.Background(), svc, pods, existing, trigger) // errors: missing nodes, as ours
	st := state{slices: list(t, c)}
	st.creates, st.updates, st.dels = writes(c)
	return st
}

func runOurs(t *testing.T, svc *corev1.Service, pods []*corev1.Pod, nodes []*corev1.Node, existing []*discovery.EndpointSlice, max int, trigger time.Time) state {
	t.Helper()
	var objs []runtime.Object
	for _, s := range existing {
		objs = append(objs, s.DeepCopy())
	}
	c := fake.NewClientset(objs...)
	// Ours sees what its informers keep: the transformed objects.
	nodes = transformed(t, nodes)
	plan, _ := Reconcile(svc, transformedPods(t, pods), nodeGetter(nodes), existing, max, trigger)
	ctrl := &Controller{client: c, pending: map[string]map[string]expectation{}}
	if err := ctrl.apply(context.Background(), ns+"/"+svc.Name, plan); err != nil {
		t.Fatal(err)
	}
	st := state{slices: list(t, c)}
	st.creates, st.updates, st.dels = writes(c)
	return st
}

// transformed are deep copies of objs through Transform.
func transformed[T interface{ DeepCopyObject() runtime.Object }](t *testing.T, objs []T) []T {
	t.Helper()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		got, err := Transform(o.DeepCopyObject())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got.(T))
	}
	return out
}

// transformedPods are deep copies of pods through Transform.
func transformedPods(t *testing.T, pods []*corev1.Pod) []*Pod {
	t.Helper()
	out := make([]*Pod, 0, len(pods))
	for _, p := range pods {
		got, err := Transform(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got.(*Pod))
	}
	return out
}

// groups is a state in comparable form: per (family, ports) group, the
// slices' shared metadata, their sizes, and all their endpoints.
type group4cmp struct {
	Meta      []string // one line per slice: labels, annotations, owners, ports; sorted
	Sizes     []int
	Endpoints []discovery.Endpoint
}

func comparableSlices(ss []*discovery.EndpointSlice) map[string]*group4cmp {
	out := map[string]*group4cmp{}
	for _, s := range ss {
		k := string(s.AddressType) + " " + portsKey(s.Ports)
		g := out[k]
		if g == nil {
			g = &group4cmp{}
			out[k] = g
		}
		g.Meta = append(g.Meta, fmt.Sprintf("ns=%s gen=%s labels=%v annotations=%v owners=%s ports=%s", s.Namespace, s.GenerateName, s.Labels, s.Annotations, owners(s.OwnerReferences), portsText(s.Ports)))
		g.Sizes = append(g.Sizes, len(s.Endpoints))
		g.Endpoints = append(g.Endpoints, s.Endpoints...)
	}
	for _, g := range out {
		slices.Sort(g.Meta)
		slices.Sort(g.Sizes)
		slices.SortFunc(g.Endpoints, func(a, b discovery.Endpoint) int {
			return strings.Compare(endpointKey(&a), endpointKey(&b))
		})
	}
	return out
}

func owners(os []metav1.OwnerReference) string {
	var b strings.Builder
	for _, o := range os {
		fmt.Fprintf(&b, "%s/%s/%s/%s/c=%v/b=%v;", o.APIVersion, o.Kind, o.Name, o.UID, *o.Controller, *o.BlockOwnerDeletion)
	}
	return b.String()
}

// portsText is the ports in a canonical order: upstream orders a slice's
// ports by a hash of each port (a side effect of computing its port-map
// key), which carries no meaning; flatnet keeps the Service's order.
func portsText(ps []discovery.EndpointPort) string {
	var parts []string
	for _, p := range ps {
		app := "-"
		if p.AppProtocol != nil {
			app = *p.AppProtocol
		}
		parts = append(parts, fmt.Sprintf("%s/%s/%d/%s", *p.Name, *p.Protocol, *p.Port, app))
	}
	slices.Sort(parts)
	return "[" + strings.Join(parts, " ") + "]"
}

func TestMatchesUpstreamReconciler(t *testing.T) {
	nodes := []*corev1.Node{node("node-a", "zone-a"), node("node-b", "zone-b")}
	// The existing slices' trigger time, and this sync's (not in UTC, with
	// nanoseconds: both must format it the same way).
	older := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	triggers := []struct {
		name string
		at   time.Time
	}{
		{"trigger time", time.Date(2026, 1, 2, 4, 4, 6, 789000001, time.FixedZone("CET", 3600))},
		{"no trigger time", time.Time{}},
	}
	for _, tc := range oracleCases() {
		for _, tr := range triggers {
			t.Run(tc.name+"/"+tr.name, func(t *testing.T) {
				max := tc.max
				if max == 0 {
					max = DefaultMaxEndpointsPerSlice
				}
				// The existing slices: upstream's own result for before (with
				// the ports-change case, of the Service before its change).
				var existing []*discovery.EndpointSlice
				if tc.before != nil {
					prev := tc.svc
					if tc.name == "ports change" {
						prev = service("s")
					}
					existing = runUpstream(t, prev, tc.before, nodes, nil, max, older).slices
				}
				cached := make([]*discovery.EndpointSlice, len(existing))
				for i, s := range existing {
					cached[i] = s.DeepCopy()
				}
				want := runUpstream(t, tc.svc, tc.after, nodes, existing, max, tr.at)
				got := runOurs(t, tc.svc, tc.after, nodes, existing, max, tr.at)
				if d := cmp.Diff(comparableSlices(want.slices), comparableSlices(got.slices), cmpopts.EquateEmpty()); d != "" {
					t.Errorf("slices differ from upstream's (-upstream +flatnet):\n%s", d)
				}
				if w, g := [3]int{want.creates, want.updates, want.dels}, [3]int{got.creates, got.updates, got.dels}; w != g {
					t.Errorf("creates/updates/deletes: upstream %v, flatnet %v", w, g)
				}
				if d := cmp.Diff(cached, existing, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("existing slices were modified:\n%s", d)
				}
				if len(got.slices) == 0 {
					t.Error("no slices at all (there is always at least the placeholder)")
				}
				// The comparison covers the annotation only if someone
				// writes it: with a trigger time and any write, some
				// slice carries it.
				if !tr.at.IsZero() && got.creates+got.updates > 0 && !slices.ContainsFunc(got.slices, func(s *discovery.EndpointSlice) bool {
					return s.Annotations[corev1.EndpointsLastChangeTriggerTime] == "2026-01-02T03:04:06.789000001Z"
				}) {
					t.Error("slices written, none with the trigger time")
				}
			})
		}
	}
}
