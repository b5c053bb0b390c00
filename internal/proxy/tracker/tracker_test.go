package tracker

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/proxy"
)

func ptr[T any](v T) *T { return &v }

func service(name string, mod ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080}},
		},
	}
	for _, f := range mod {
		f(s)
	}
	return s
}

func slice(svc, name string, port int32, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(port)}},
		Endpoints:   eps,
	}
}

func ep(ip string, mod ...func(*discovery.Endpoint)) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{ip}, NodeName: ptr("node-a")}
	for _, f := range mod {
		f(&e)
	}
	return e
}

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

func TestConvert(t *testing.T) {
	tests := []struct {
		name   string
		svc    *v1.Service
		slices []*discovery.EndpointSlice
		ipv6   bool
		want   *proxy.Service
	}{{
		name: "cluster IP with conditions",
		svc:  service("web"),
		slices: []*discovery.EndpointSlice{slice("web", "web-1", 8080, ep("10.1.0.2"), ep("10.1.0.3", func(e *discovery.Endpoint) {
			e.Conditions = discovery.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
			e.NodeName = ptr("node-b")
		}))},
		want: &proxy.Service{Namespace: "ns", Name: "web", Type: proxy.ClusterIP, ClusterIP: a("10.96.0.10"), Ports: []proxy.ServicePort{{
			Name: "http", Protocol: proxy.TCP, Port: 80, Endpoints: []proxy.Endpoint{
				{IP: a("10.1.0.2"), Port: 8080, Ready: true, Serving: true, NodeName: "node-a"},
				{IP: a("10.1.0.3"), Port: 8080, Serving: true, Terminating: true, NodeName: "node-b"},
			}}}},
	}, {
		name: "named target port resolved per slice, duplicates once, other port names ignored",
		svc:  service("web"),
		slices: []*discovery.EndpointSlice{
			slice("web", "web-1", 8080, ep("10.1.0.2")),
			slice("web", "web-2", 9090, ep("10.1.0.4"), ep("10.1.0.2")),
			func() *discovery.EndpointSlice {
				s := slice("web", "web-3", 7070, ep("10.1.0.9"))
				s.Ports[0].Name = ptr("metrics")
				return s
			}(),
		},
		want: &proxy.Service{Namespace: "ns", Name: "web", Type: proxy.ClusterIP, ClusterIP: a("10.96.0.10"), Ports: []proxy.ServicePort{{
			Name: "http", Protocol: proxy.TCP, Port: 80, Endpoints: []proxy.Endpoint{
				{IP: a("10.1.0.2"), Port: 8080, Ready: true, Serving: true, NodeName: "node-a"},
				{IP: a("10.1.0.2"), Port: 9090, Ready: true, Serving: true, NodeName: "node-a"},
				{IP: a("10.1.0.4"), Port: 9090, Ready: true, Serving: true, NodeName: "node-a"},
			}}}},
	}, {
		name: "load balancer with policies, affinity and external IPs, one family",
		svc: service("lb", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ClusterIPs = []string{"fd00::10", "10.96.0.10"}
			s.Spec.ExternalIPs = []string{"10.200.0.1", "fd00::1"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.201.0.1"}, {Hostname: "lb.example"}}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.LoadBalancerSourceRanges = []string{" 192.168.7.1/24", "fd00::/8", "bogus"}
		}),
		want: &proxy.Service{Namespace: "ns", Name: "lb", Type: proxy.LoadBalancer, ClusterIP: a("10.96.0.10"),
			ExternalIPs: []netip.Addr{a("10.200.0.1")}, LoadBalancerIPs: []netip.Addr{a("10.201.0.1")},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}, Firewall: true,
			AffinityTimeout: time.Minute, ExternalLocal: true, InternalLocal: true, HealthCheckNodePort: 32000,
			Ports: []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, NodePort: 30080}}},
	}, {
		name: "a health check node port only counts for a LoadBalancer with policy Local",
		svc: service("np", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
		}),
		want: &proxy.Service{Namespace: "ns", Name: "np", Type: proxy.NodePort, ClusterIP: a("10.96.0.10"), ExternalLocal: true,
			Ports: []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, NodePort: 30080}}},
	}, {
		name: "IPv6 side of a dual-stack service, default affinity timeout, UDP default",
		svc: service("dns", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"}
			s.Spec.Ports = []v1.ServicePort{{Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053}}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		slices: []*discovery.EndpointSlice{func() *discovery.EndpointSlice {
			s := slice("dns", "dns-6", 5353, ep("fd00::1:2"))
			s.AddressType = discovery.AddressTypeIPv6
			s.Ports[0].Name, s.Ports[0].Protocol = ptr(""), ptr(v1.ProtocolUDP)
			return s
		}(), slice("dns", "dns-4", 5353, ep("10.1.0.2"))},
		ipv6: true,
		want: &proxy.Service{Namespace: "ns", Name: "dns", Type: proxy.NodePort, ClusterIP: a("fd00::10"), AffinityTimeout: 3 * time.Hour,
			Ports: []proxy.ServicePort{{Protocol: proxy.UDP, Port: 53, NodePort: 30053, Endpoints: []proxy.Endpoint{
				{IP: a("fd00::1:2"), Port: 5353, Ready: true, Serving: true, NodeName: "node-a"}}}}},
	}, {
		name: "headless keeps a zero cluster IP",
		svc:  service("hl", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
		want: &proxy.Service{Namespace: "ns", Name: "hl", Type: proxy.ClusterIP, Ports: []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80}}},
	}, {
		name: "external name is not proxied",
		svc:  service("ext", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Convert(tt.svc, tt.slices, tt.ipv6)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y }),
				cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })); diff != "" {
				t.Errorf("Convert (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTrackerChanges(t *testing.T) {
	tr := New(false)
	svc := service("web")
	sl := slice("web", "web-1", 8080, ep("10.1.0.2"))
	tr.OnService(svc)
	tr.OnEndpointSlice(sl)
	tr.OnService(service("other"))
	r := tr.Take()
	got, changed := r.Services, r.Changed
	if len(got) != 2 || len(changed) != 2 || changed["ns/web"] != got[1] || changed["ns/other"] != got[0] {
		t.Fatalf("changed after adds: %v, want ns/web and ns/other with their models in Services (%v)", changed, got)
	}
	if p, ok := r.Previous["ns/web"]; !ok || p != nil {
		t.Fatalf("previous of a new service: %+v, %v; want nil, true", p, ok)
	}
	if len(got) != 2 || got[0].Key() != "ns/other" || got[1].Key() != "ns/web" || len(got[1].Ports[0].Endpoints) != 1 {
		t.Fatalf("services after adds: %+v", got)
	}
	if tr.Pending() {
		t.Fatal("Pending after Take")
	}

	// An update that changes nothing the proxy uses is no change.
	relabeled := svc.DeepCopy()
	relabeled.Labels = map[string]string{"x": "y"}
	tr.OnService(relabeled)
	if tr.Pending() {
		t.Fatal("a label-only update counted as a change")
	}

	// A change undone before the sync is dropped.
	tr.OnEndpointSlice(slice("web", "web-1", 8080, ep("10.1.0.2"), ep("10.1.0.3")))
	if !tr.Pending() {
		t.Fatal("a new endpoint is not pending")
	}
	tr.OnEndpointSlice(sl)
	if changed := tr.Take().Changed; len(changed) != 0 {
		t.Fatalf("changed after a reverted update: %v", changed)
	}

	// A slice change touches only its service.
	tr.OnEndpointSlice(slice("web", "web-1", 8080, ep("10.1.0.3")))
	r = tr.Take()
	got, changed = r.Services, r.Changed
	if diff := cmp.Diff(map[string]bool{"ns/web": true}, keysOf(t, changed, r.Services)); diff != "" {
		t.Fatalf("changed after slice update (-want +got):\n%s", diff)
	}
	if e := got[1].Ports[0].Endpoints; len(e) != 1 || e[0].IP != a("10.1.0.3") {
		t.Fatalf("endpoints after slice update: %+v", e)
	}
	if p := r.Previous["ns/web"]; p == nil || len(p.Ports[0].Endpoints) != 1 || p.Ports[0].Endpoints[0].IP != a("10.1.0.2") {
		t.Fatalf("previous after slice update: %+v; want the model with 10.1.0.2", p)
	}

	// Slices without a service label are ignored; a slice for a service
	// that does not exist yet is kept for when it comes.
	tr.OnEndpointSlice(&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orphan"}})
	tr.OnEndpointSlice(slice("late", "late-1", 80, ep("10.1.0.7")))
	if tr.Pending() {
		t.Fatal("slices without a service made a change")
	}
	tr.OnService(service("late"))
	r = tr.Take()
	got, changed = r.Services, r.Changed
	if changed["ns/late"] == nil || len(changed) != 1 || len(got) != 3 || len(got[0].Ports[0].Endpoints) != 1 {
		t.Fatalf("late service: changed %v, services %+v", changed, got)
	}

	// Deletes.
	tr.OnServiceDelete(svc)
	tr.OnEndpointSliceDelete(sl)
	r = tr.Take()
	got, changed = r.Services, r.Changed
	if diff := cmp.Diff(map[string]bool{"ns/web": true}, keysOf(t, changed, r.Services)); diff != "" {
		t.Fatalf("changed after delete (-want +got):\n%s", diff)
	}
	if p := r.Previous["ns/web"]; p == nil || p.Ports[0].Endpoints[0].IP != a("10.1.0.3") {
		t.Fatalf("previous of a deleted service: %+v", p)
	}
	for _, s := range got {
		if s.Key() == "ns/web" {
			t.Fatal("deleted service still listed")
		}
	}
	// Added and deleted between two syncs: nothing to do.
	tr.OnService(service("blip"))
	tr.OnServiceDelete(service("blip"))
	if tr.Pending() {
		t.Fatal("add+delete between syncs left a change")
	}
}

// The metrics' inputs: pending counts and the slices' trigger times.
func TestTrackerMetricsInputs(t *testing.T) {
	tr := New(false)
	triggered := func(s *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
		s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		return s
	}
	t1 := time.Now().Add(time.Second).Truncate(time.Millisecond)
	t2 := t1.Add(time.Second)
	tr.OnService(service("web"))
	tr.OnEndpointSlice(triggered(slice("web", "web-1", 8080, ep("10.1.0.2")), t1))
	tr.OnEndpointSlice(triggered(slice("web", "web-1", 8080, ep("10.1.0.3")), t2))
	// Changes nothing: not counted, its time not kept.
	tr.OnEndpointSlice(triggered(slice("web", "web-1", 8080, ep("10.1.0.3")), t2.Add(time.Second)))
	// Another family's slice: not this tracker's change.
	v6 := triggered(slice("web", "web-v6", 8080, ep("fd00::2")), t2)
	v6.AddressType = discovery.AddressTypeIPv6
	tr.OnEndpointSlice(v6)
	// From before the tracker started: no latency of ours.
	tr.OnService(service("old"))
	tr.OnEndpointSlice(triggered(slice("old", "old-1", 8080, ep("10.1.0.9")), time.Now().Add(-time.Hour)))
	if s, e := tr.PendingChanges(); s != 2 || e != 3 {
		t.Errorf("PendingChanges = %d services, %d endpoint changes; want 2, 3", s, e)
	}
	r := tr.Take()
	want := map[string][]time.Time{"ns/web": {t1, t2}}
	if diff := cmp.Diff(want, r.TriggerTimes); diff != "" {
		t.Errorf("trigger times (-want +got):\n%s", diff)
	}
	if s, e := tr.PendingChanges(); s != 0 || e != 0 {
		t.Errorf("PendingChanges after Take = %d, %d", s, e)
	}

	// A slice deletion drops the key's trigger times (kube-proxy's rule).
	tr.OnEndpointSlice(triggered(slice("web", "web-1", 8080, ep("10.1.0.4")), t2.Add(time.Second)))
	tr.OnEndpointSliceDelete(slice("web", "web-1", 8080))
	if r := tr.Take(); len(r.TriggerTimes) != 0 || r.Changed["ns/web"] == nil {
		t.Errorf("after a slice deletion: changed %v, trigger times %v", r.Changed, r.TriggerTimes)
	}
}

// TestPendingServicesCounted: the incremental count of PendingChanges'
// services matches a count from scratch through changes, reverts,
// deletions and Takes.
func TestPendingServicesCounted(t *testing.T) {
	tr := New(false)
	count := func() int {
		n := 0
		for k := range tr.serviceEvents {
			if _, ok := tr.previous[k]; ok {
				n++
			}
		}
		return n
	}
	port := func(p int32) func(*v1.Service) { return func(s *v1.Service) { s.Spec.Ports[0].Port = p } }
	steps := []func(){
		func() { tr.OnService(service("a")) },
		func() { tr.OnService(service("b")) },
		func() { tr.OnEndpointSlice(slice("a", "a-1", 8080, ep("10.1.0.2"))) },
		func() { tr.Take() },
		func() { tr.OnService(service("a", port(81))) },
		func() { tr.OnEndpointSlice(slice("b", "b-1", 8080, ep("10.1.0.3"))) },
		func() { tr.OnService(service("a")) }, // back to the synced form
		func() { tr.OnServiceDelete(service("b")) },
		func() { tr.OnService(service("b")) },
		func() { tr.OnService(service("c", port(82))) },
		func() { tr.OnServiceDelete(service("c")) },
		func() { tr.Take() },
		func() { tr.OnService(service("b", port(90))) },
	}
	for i, step := range steps {
		step()
		if s, _ := tr.PendingChanges(); s != count() {
			t.Errorf("step %d: PendingChanges services = %d, counted %d", i, s, count())
		}
	}
}

// TestTakeKeepsKeyOrder: Take sorts its keys only when one came or went,
// and the services it hands over follow every add, delete and update.
func TestTakeKeepsKeyOrder(t *testing.T) {
	tr := New(false)
	for _, n := range []string{"c", "a"} {
		tr.OnService(service(n))
	}
	keys := func() []string {
		var out []string
		for _, s := range tr.Take().Services {
			out = append(out, s.Name+"/"+strconv.Itoa(len(s.Ports[0].Endpoints)))
		}
		return out
	}
	if diff := cmp.Diff([]string{"a/0", "c/0"}, keys()); diff != "" {
		t.Fatalf("first Take (-want +got):\n%s", diff)
	}
	tr.OnService(service("b"))
	tr.OnServiceDelete(service("a"))
	if diff := cmp.Diff([]string{"b/0", "c/0"}, keys()); diff != "" {
		t.Fatalf("after an add and a delete (-want +got):\n%s", diff)
	}
	tr.OnEndpointSlice(slice("c", "c-1", 8080, ep("10.1.0.2")))
	if diff := cmp.Diff([]string{"b/0", "c/1"}, keys()); diff != "" {
		t.Fatalf("after an endpoint change (-want +got):\n%s", diff)
	}
}

// A service's slices are kept by name: added in any order, replaced,
// deleted (also one never seen), the model is Convert's of what is left.
func TestSlicesOfAService(t *testing.T) {
	tr := New(false)
	svc := service("web")
	tr.OnService(svc)
	now := map[string]*discovery.EndpointSlice{}
	apply := func(s *discovery.EndpointSlice, del bool) {
		if del {
			tr.OnEndpointSliceDelete(s)
			delete(now, s.Name)
		} else {
			tr.OnEndpointSlice(s)
			now[s.Name] = s
		}
		var want []*discovery.EndpointSlice
		for _, name := range slices.Sorted(maps.Keys(now)) {
			want = append(want, now[name])
		}
		got := tr.Take().Services
		if diff := cmp.Diff([]*proxy.Service{Convert(svc, want, false)}, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
			t.Fatalf("after %s %s (-want +got):\n%s", map[bool]string{true: "deleting", false: "adding"}[del], s.Name, diff)
		}
	}
	apply(slice("web", "web-b", 8080, ep("10.1.0.2")), false)
	apply(slice("web", "web-a", 8080, ep("10.1.0.1")), false)
	apply(slice("web", "web-c", 8080, ep("10.1.0.3")), false)
	apply(slice("web", "web-b", 8080, ep("10.1.0.4"), ep("10.1.0.5")), false)
	apply(slice("web", "web-x", 8080), true)
	apply(slice("web", "web-a", 8080), true)
	apply(slice("web", "web-c", 8080), true)
	apply(slice("web", "web-b", 8080), true)
	if len(tr.slices) != 0 {
		t.Errorf("slices left for gone slices: %v", tr.slices)
	}
}

// keysOf is changed's keys, after checking that each one's model is the
// one in services (nil for a key services lacks: a deletion).
func keysOf(t *testing.T, changed proxy.Changes, services []*proxy.Service) map[string]bool {
	t.Helper()
	byKey := map[string]*proxy.Service{}
	for _, svc := range services {
		byKey[svc.Key()] = svc
	}
	out := map[string]bool{}
	for k, svc := range changed {
		if svc != byKey[k] {
			t.Errorf("changed %s: model %p, Services has %p", k, svc, byKey[k])
		}
		out[k] = true
	}
	return out
}
