package endpointslice

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// describe is a one-line text form of a slice: family, ports, then each
// endpoint as pod=addresses[flags] (r ready, s serving, t terminating,
// @node, %zone, ^hostname).
func describe(s *discovery.EndpointSlice) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s ports[", s.AddressType)
	for i, p := range s.Ports {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s/%s/%d", *p.Name, *p.Protocol, *p.Port)
	}
	b.WriteString("]")
	for _, e := range s.Endpoints {
		fmt.Fprintf(&b, " %s=%s[", e.TargetRef.Name, strings.Join(e.Addresses, ","))
		if *e.Conditions.Ready {
			b.WriteString("r")
		}
		if *e.Conditions.Serving {
			b.WriteString("s")
		}
		if *e.Conditions.Terminating {
			b.WriteString("t")
		}
		if e.NodeName != nil {
			b.WriteString("@" + *e.NodeName)
		}
		if e.Zone != nil {
			b.WriteString("%" + *e.Zone)
		}
		if e.Hostname != nil {
			b.WriteString("^" + *e.Hostname)
		}
		b.WriteString("]")
	}
	return b.String()
}

func describeAll(ss []*discovery.EndpointSlice) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, describe(s))
	}
	return out
}

func TestReconcileFromNothing(t *testing.T) {
	nodes := []*corev1.Node{node("node-a", "zone-a"), node("node-b", "")}
	named := withPorts(corev1.ServicePort{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")})
	tests := []struct {
		name    string
		svc     *corev1.Service
		pods    []*corev1.Pod
		max     int
		want    []string
		wantErr bool
	}{{
		name: "ready pods, zone from the node label",
		svc:  service("s"),
		pods: []*corev1.Pod{pod("p2", "s", "node-b", "10.1.0.2"), pod("p1", "s", "node-a", "10.1.0.1")},
		want: []string{"IPv4 ports[http/TCP/8080] p1=10.1.0.1[rs@node-a%zone-a] p2=10.1.0.2[rs@node-b]"},
	}, {
		name: "conditions: not ready, terminating ready, terminating not ready",
		svc:  service("s"),
		pods: []*corev1.Pod{
			with(pod("p1", "s", "node-a", "10.1.0.1"), notReady),
			with(pod("p2", "s", "node-a", "10.1.0.2"), terminating),
			with(pod("p3", "s", "node-a", "10.1.0.3"), terminating, notReady),
		},
		want: []string{"IPv4 ports[http/TCP/8080] p1=10.1.0.1[@node-a%zone-a] p2=10.1.0.2[st@node-a%zone-a] p3=10.1.0.3[t@node-a%zone-a]"},
	}, {
		name: "publishNotReadyAddresses: ready is always true",
		svc:  service("s", publishNotReady),
		pods: []*corev1.Pod{with(pod("p1", "s", "node-b", "10.1.0.1"), notReady), with(pod("p2", "s", "node-b", "10.1.0.2"), terminating)},
		want: []string{"IPv4 ports[http/TCP/8080] p1=10.1.0.1[r@node-b] p2=10.1.0.2[rst@node-b]"},
	}, {
		name: "finished pods and pods without IP are left out",
		svc:  service("s"),
		pods: []*corev1.Pod{with(pod("p1", "s", "node-b", "10.1.0.1"), succeeded), pod("p2", "s", "node-b"), pod("p3", "s", "node-b", "10.1.0.3")},
		want: []string{"IPv4 ports[http/TCP/8080] p3=10.1.0.3[rs@node-b]"},
	}, {
		name: "named targetPort resolved per pod: different numbers, different slices; missing name, no port",
		svc:  service("s", named),
		pods: []*corev1.Pod{
			with(pod("p1", "s", "node-b", "10.1.0.1"), containerPort("web", 8080)),
			with(pod("p2", "s", "node-b", "10.1.0.2"), containerPort("web", 9090)),
			with(pod("p3", "s", "node-b", "10.1.0.3"), containerPort("web", 8080)),
			with(pod("p4", "s", "node-b", "10.1.0.4"), sidecarPort("web", 9090)),
			pod("p5", "s", "node-b", "10.1.0.5"),
		},
		want: []string{
			"IPv4 ports[web/TCP/8080] p1=10.1.0.1[rs@node-b] p3=10.1.0.3[rs@node-b]",
			"IPv4 ports[web/TCP/9090] p2=10.1.0.2[rs@node-b] p4=10.1.0.4[rs@node-b]",
			"IPv4 ports[] p5=10.1.0.5[rs@node-b]",
		},
	}, {
		name: "dual stack: one slice per family",
		svc:  service("s", dualStack),
		pods: []*corev1.Pod{pod("p1", "s", "node-b", "10.1.0.1", "fd00::1"), pod("p2", "s", "node-b", "10.1.0.2")},
		want: []string{
			"IPv4 ports[http/TCP/8080] p1=10.1.0.1[rs@node-b] p2=10.1.0.2[rs@node-b]",
			"IPv6 ports[http/TCP/8080] p1=fd00::1[rs@node-b]",
		},
	}, {
		name: "headless without ports, hostname set for the subdomain",
		svc:  service("s", headless),
		pods: []*corev1.Pod{with(pod("p1", "s", "node-b", "10.1.0.1"), hostname("h1", "s")), with(pod("p2", "s", "node-b", "10.1.0.2"), hostname("h2", "other"))},
		want: []string{
			"IPv4 ports[] p1=10.1.0.1[rs@node-b^h1] p2=10.1.0.2[rs@node-b]",
		},
	}, {
		name: "headless without families (old API server): both families, IPv6 as placeholder",
		svc:  service("s", headless, func(s *corev1.Service) { s.Spec.IPFamilies = nil }),
		pods: []*corev1.Pod{pod("p1", "s", "node-b", "10.1.0.1")},
		want: []string{
			"IPv4 ports[] p1=10.1.0.1[rs@node-b]",
			"IPv6 ports[]",
		},
	}, {
		name: "no pods: one placeholder",
		svc:  service("s"),
		want: []string{"IPv4 ports[]"},
	}, {
		name:    "unknown node: pod left out, error says so",
		svc:     service("s"),
		pods:    []*corev1.Pod{pod("p1", "s", "node-x", "10.1.0.1"), pod("p2", "s", "node-b", "10.1.0.2")},
		want:    []string{"IPv4 ports[http/TCP/8080] p2=10.1.0.2[rs@node-b]"},
		wantErr: true,
	}, {
		name: "unknown node with publishNotReadyAddresses: kept",
		svc:  service("s", publishNotReady),
		pods: []*corev1.Pod{pod("p1", "s", "node-x", "10.1.0.1")},
		want: []string{"IPv4 ports[http/TCP/8080] p1=10.1.0.1[rs@node-x]"},
	}, {
		name: "max per slice",
		svc:  service("s"),
		pods: manyPods("s", 5),
		max:  2,
		want: []string{
			"IPv4 ports[http/TCP/8080] s-000=10.1.0.1[rs@node-a%zone-a] s-001=10.1.0.2[rs@node-b]",
			"IPv4 ports[http/TCP/8080] s-002=10.1.0.3[rs@node-a%zone-a] s-003=10.1.0.4[rs@node-b]",
			"IPv4 ports[http/TCP/8080] s-004=10.1.0.5[rs@node-a%zone-a]",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pods := podsOf(tc.pods...)
			before := make([]*Pod, len(pods))
			for i, p := range pods {
				before[i] = p.DeepCopy()
			}
			plan, err := Reconcile(tc.svc, pods, nodeGetter(nodes), nil, tc.max, time.Time{})
			var me *MissingNodeError
			if tc.wantErr != errors.As(err, &me) {
				t.Fatalf("error %v, want error: %v", err, tc.wantErr)
			}
			if len(plan.Update)+len(plan.Delete) != 0 {
				t.Errorf("updates/deletes from nothing: %v", plan)
			}
			got := describeAll(plan.Create)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("slices (-want +got):\n%s", d)
			}
			for _, s := range plan.Create {
				if s.Labels[discovery.LabelServiceName] != tc.svc.Name || s.Labels[discovery.LabelManagedBy] != ManagedBy {
					t.Errorf("labels %v", s.Labels)
				}
				if !OwnedBy(s, tc.svc) || !*s.OwnerReferences[0].Controller {
					t.Errorf("owner %v", s.OwnerReferences)
				}
				if s.GenerateName != "s-" || s.Namespace != ns {
					t.Errorf("generateName %q namespace %q", s.GenerateName, s.Namespace)
				}
			}
			if !equality.Semantic.DeepEqual(before, pods) {
				t.Error("Reconcile modified its pods")
			}
		})
	}
}

// named gives plan's creates names as the API server would, returning the
// resulting state.
func named(plan Plan, existing []*discovery.EndpointSlice) []*discovery.EndpointSlice {
	out := map[string]*discovery.EndpointSlice{}
	for _, s := range existing {
		out[s.Name] = s
	}
	for _, s := range plan.Delete {
		delete(out, s.Name)
	}
	for _, s := range plan.Update {
		out[s.Name] = s
	}
	for i, s := range plan.Create {
		s = s.DeepCopy()
		s.Name = fmt.Sprintf("%sn%d-%d", s.GenerateName, len(out), i)
		out[s.Name] = s
	}
	var list []*discovery.EndpointSlice
	for _, k := range slices.Sorted(maps.Keys(out)) {
		list = append(list, out[k])
	}
	return list
}

func TestReconcileUpdatesRatherThanChurns(t *testing.T) {
	nodes := nodeGetter([]*corev1.Node{node("node-a", "zone-a"), node("node-b", "")})
	svc := service("s")
	pods := manyPods("s", 250)
	plan, err := Reconcile(svc, podsOf(pods...), nodes, nil, 100, time.Time{})
	if err != nil || len(plan.Create) != 3 {
		t.Fatalf("first: %d creates, err %v", len(plan.Create), err)
	}
	state := named(plan, nil)
	snapshot := func() []*discovery.EndpointSlice {
		var out []*discovery.EndpointSlice
		for _, s := range state {
			out = append(out, s.DeepCopy())
		}
		return out
	}

	type counts struct{ create, update, delete int }
	steps := []struct {
		name   string
		change func()
		want   counts
	}{
		{"nothing changed: nothing written", func() {}, counts{}},
		{"one pod not ready: one update", func() { notReady(pods[7]) }, counts{0, 1, 0}},
		{"one pod gone: one update", func() { pods = slices.Delete(pods, 3, 4) }, counts{0, 1, 0}},
		{"a new pod fills the slice with room", func() { pods = append(pods, pod("s-new", "s", "node-a", "10.2.0.1")) }, counts{0, 1, 0}},
		{"service label mirrored on every slice", func() { svc = service("s", svcLabels(map[string]string{"team": "x"})) }, counts{0, 3, 0}},
		{"all pods gone: the last slice becomes the placeholder", func() { pods = nil }, counts{0, 1, 2}},
		{"placeholder kept", func() {}, counts{}},
	}
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, st := range steps {
		st.change()
		before := snapshot()
		at := base.Add(time.Duration(i) * time.Second)
		plan, err := Reconcile(svc, podsOf(pods...), nodes, state, 100, at)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got := counts{len(plan.Create), len(plan.Update), len(plan.Delete)}
		if got != st.want {
			t.Errorf("%s: creates/updates/deletes %v, want %v", st.name, got, st.want)
		}
		if !equality.Semantic.DeepEqual(before, state) {
			t.Fatalf("%s: Reconcile modified the existing slices", st.name)
		}
		for _, s := range slices.Concat(plan.Create, plan.Update) {
			if got, want := s.Annotations[corev1.EndpointsLastChangeTriggerTime], at.Format(time.RFC3339Nano); got != want {
				t.Errorf("%s: written slice has trigger time %q, want %q", st.name, got, want)
			}
		}
		state = named(plan, state)
		// The state now holds exactly the wanted endpoints, each once.
		var have []string
		for _, s := range state {
			if len(s.Endpoints) > 100 {
				t.Errorf("%s: slice %s has %d endpoints", st.name, s.Name, len(s.Endpoints))
			}
			for _, e := range s.Endpoints {
				have = append(have, e.TargetRef.Name)
			}
		}
		var want []string
		for _, p := range pods {
			want = append(want, p.Name)
		}
		slices.Sort(have)
		slices.Sort(want)
		if d := cmp.Diff(want, have); d != "" {
			t.Errorf("%s: endpoints (-want +got):\n%s", st.name, d)
		}
		// Idempotent: planning again on the result writes nothing, even
		// with another trigger time (the annotation alone is no reason
		// to write).
		if again, _ := Reconcile(svc, podsOf(pods...), nodes, state, 100, at.Add(time.Hour)); !again.Empty() {
			t.Errorf("%s: second run not empty: %d/%d/%d", st.name, len(again.Create), len(again.Update), len(again.Delete))
		}
	}
}

func TestReconcileForeignAndStaleSlices(t *testing.T) {
	nodes := nodeGetter([]*corev1.Node{node("node-b", "")})
	svc := service("s")
	pods := []*corev1.Pod{pod("p1", "s", "node-b", "10.1.0.1")}
	first, _ := Reconcile(svc, podsOf(pods...), nodes, nil, 0, time.Time{})
	state := named(first, nil)

	// A slice of an earlier Service of the same name (other UID) is
	// deleted; since a slice is to be created at the same time, it is
	// rewritten instead (same name, new owner).
	old := service("s")
	old.UID = "uid-old"
	oldPlan, _ := Reconcile(old, podsOf(pods...), nodes, nil, 0, time.Time{})
	stale := named(oldPlan, nil)[0]
	stale.Name = "s-stale"
	plan, _ := Reconcile(svc, podsOf(pods...), nodes, []*discovery.EndpointSlice{stale}, 0, time.Time{})
	if len(plan.Create) != 1 || len(plan.Delete) != 1 || len(plan.Update) != 0 {
		t.Errorf("old owner: %d/%d/%d, want a create and a delete (never adopt another owner's slice)", len(plan.Create), len(plan.Update), len(plan.Delete))
	}

	// A slice of a family the Service no longer has is deleted.
	v6 := state[0].DeepCopy()
	v6.Name, v6.AddressType = "s-v6", discovery.AddressTypeIPv6
	plan, _ = Reconcile(svc, podsOf(pods...), nodes, append(slices.Clone(state), v6), 0, time.Time{})
	if len(plan.Delete) != 1 || plan.Delete[0].Name != "s-v6" || len(plan.Create)+len(plan.Update) != 0 {
		t.Errorf("other family: %v", plan)
	}

	// Ports changed: the slice is rewritten, not deleted and created.
	svc2 := service("s", withPorts(corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9000)}))
	plan, _ = Reconcile(svc2, podsOf(pods...), nodes, state, 0, time.Time{})
	if len(plan.Create)+len(plan.Delete) != 0 || len(plan.Update) != 1 || plan.Update[0].Name != state[0].Name {
		t.Fatalf("ports changed: %d/%d/%d", len(plan.Create), len(plan.Update), len(plan.Delete))
	}
	if got := describe(plan.Update[0]); got != "IPv4 ports[http/TCP/9000] p1=10.1.0.1[rs@node-b]" {
		t.Errorf("ports changed: %s", got)
	}

	// A Service being deleted gets no new slices.
	gone := service("s")
	gone.DeletionTimestamp = pods[0].CreationTimestamp.DeepCopy()
	if plan, _ := Reconcile(gone, podsOf(pods...), nodes, nil, 0, time.Time{}); len(plan.Create) != 0 {
		t.Errorf("deleting service: %d creates", len(plan.Create))
	}
}

func TestReconcileStampsTriggerTime(t *testing.T) {
	nodes := nodeGetter([]*corev1.Node{node("node-a", "zone-a"), node("node-b", "")})
	svc := service("s")
	pods := manyPods("s", 150)
	annotation := func(s *discovery.EndpointSlice) string { return s.Annotations[corev1.EndpointsLastChangeTriggerTime] }

	// Created slices carry the time in UTC, nanoseconds kept.
	t0 := time.Date(2026, 1, 2, 4, 4, 5, 123456789, time.FixedZone("CET", 3600))
	plan, _ := Reconcile(svc, podsOf(pods...), nodes, nil, 100, t0)
	if len(plan.Create) != 2 {
		t.Fatalf("first: %d creates, want 2", len(plan.Create))
	}
	for _, s := range plan.Create {
		if got := annotation(s); got != "2026-01-02T03:04:05.123456789Z" {
			t.Errorf("created slice: trigger time %q", got)
		}
	}
	state := named(plan, nil)
	for _, s := range state {
		s.Annotations["other"] = "kept" // someone else's annotation
	}
	before := make([]*discovery.EndpointSlice, len(state))
	for i, s := range state {
		before[i] = s.DeepCopy()
	}

	// One pod changes: only its slice is written, with the new time; the
	// other keeps its old one (it is not in the plan at all).
	notReady(pods[120])
	t1 := t0.Add(time.Minute)
	plan, _ = Reconcile(svc, podsOf(pods...), nodes, state, 100, t1)
	if len(plan.Create)+len(plan.Delete) != 0 || len(plan.Update) != 1 {
		t.Fatalf("one pod changed: %d/%d/%d, want one update", len(plan.Create), len(plan.Update), len(plan.Delete))
	}
	u := plan.Update[0]
	if got := annotation(u); got != "2026-01-02T03:05:05.123456789Z" || u.Annotations["other"] != "kept" {
		t.Errorf("updated slice: annotations %v", u.Annotations)
	}
	if !equality.Semantic.DeepEqual(before, state) {
		t.Fatal("Reconcile modified the existing slices")
	}
	state = named(plan, state)

	// A write with no known trigger removes the annotation instead of
	// leaving a stale time; other annotations stay.
	pods = pods[:110]
	plan, _ = Reconcile(svc, podsOf(pods...), nodes, state, 100, time.Time{})
	if len(plan.Update) != 1 || len(plan.Create) != 0 {
		t.Fatalf("pods gone: %d/%d/%d, want one update", len(plan.Create), len(plan.Update), len(plan.Delete))
	}
	if _, ok := plan.Update[0].Annotations[corev1.EndpointsLastChangeTriggerTime]; ok || plan.Update[0].Annotations["other"] != "kept" {
		t.Errorf("zero trigger time: annotations %v", plan.Update[0].Annotations)
	}

	// Deleted slices are left as they are.
	plan, _ = Reconcile(svc, nil, nodes, state, 100, t1.Add(time.Minute))
	if len(plan.Delete) == 0 {
		t.Fatal("no pods: nothing deleted")
	}
	for _, s := range plan.Delete {
		if got := annotation(s); got != annotation(findByName(state, s.Name)) {
			t.Errorf("deleted slice %s: trigger time %q changed", s.Name, got)
		}
	}
	for _, s := range slices.Concat(plan.Create, plan.Update) {
		if got := annotation(s); got != "2026-01-02T03:06:05.123456789Z" {
			t.Errorf("placeholder %s: trigger time %q", s.Name, got)
		}
	}
}

func findByName(ss []*discovery.EndpointSlice, name string) *discovery.EndpointSlice {
	for _, s := range ss {
		if s.Name == name {
			return s
		}
	}
	return nil
}
