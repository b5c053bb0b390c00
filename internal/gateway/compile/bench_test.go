package compile

import (
	"fmt"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// scaleInput is one Gateway (an HTTP listener taking routes from all
// namespaces) and nNS namespaces each with perNS HTTPRoutes, one Service
// and its EndpointSlice of two endpoints; every route has its own
// hostname, an Exact and a PathPrefix match with a header match, a
// request header filter and two weighted backends.
func scaleInput(nNS, perNS int) *Input {
	gk := types.NamespacedName{Namespace: "gw", Name: "gw"}
	all := gwv1.NamespacesFromAll
	in := &Input{
		GatewayClasses: []*gwv1.GatewayClass{{ObjectMeta: metav1.ObjectMeta{Name: "flatnet", Generation: 1},
			Spec: gwv1.GatewayClassSpec{ControllerName: ControllerName}}},
		Gateways: []*gwv1.Gateway{{ObjectMeta: metav1.ObjectMeta{Namespace: gk.Namespace, Name: gk.Name, Generation: 1},
			Spec: gwv1.GatewaySpec{GatewayClassName: "flatnet", Listeners: []gwv1.Listener{{
				Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType,
				AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}}}}}}},
		Binds:     map[BindKey]int32{{Gateway: gk, Port: 80}: 20000},
		Addresses: map[types.NamespacedName][]string{gk: {"10.200.0.1"}},
	}
	exact, prefix := gwv1.PathMatchExact, gwv1.PathMatchPathPrefix
	for i := range nNS {
		ns := fmt.Sprintf("ns-%d", i)
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{corev1.LabelMetadataName: ns}}})
		in.Services = append(in.Services, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}}})
		in.EndpointSlices = append(in.EndpointSlices, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc-1", Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
			Ports:      []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(3000))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.%d.%d.1", i/250, i%250)}},
				{Addresses: []string{fmt.Sprintf("10.%d.%d.2", i/250, i%250)}}},
		})
		for j := range perNS {
			name := fmt.Sprintf("r-%d", j)
			gwNS := gwv1.Namespace(gk.Namespace)
			in.HTTPRoutes = append(in.HTTPRoutes, &gwv1.HTTPRoute{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1,
					CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(i*perNS+j) * time.Second))},
				Spec: gwv1.HTTPRouteSpec{
					CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw", Namespace: &gwNS}}},
					Hostnames:       []gwv1.Hostname{gwv1.Hostname(fmt.Sprintf("%s.%s.example.com", name, ns))},
					Rules: []gwv1.HTTPRouteRule{{
						Matches: []gwv1.HTTPRouteMatch{
							{Path: &gwv1.HTTPPathMatch{Type: &exact, Value: ptrTo("/exact")}},
							{Path: &gwv1.HTTPPathMatch{Type: &prefix, Value: ptrTo("/api")},
								Headers: []gwv1.HTTPHeaderMatch{{Name: "x-version", Value: "v1"}}},
						},
						Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier,
							RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "x-route", Value: name}}}}},
						BackendRefs: []gwv1.HTTPBackendRef{
							{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "svc", Port: ptrTo(gwv1.PortNumber(8080))}, Weight: ptrTo(int32(90))}},
							{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "svc", Port: ptrTo(gwv1.PortNumber(8080))}, Weight: ptrTo(int32(10))}},
						},
					}},
				},
			})
		}
	}
	return in
}

// BenchmarkCompile10kRoutes: 10,000 HTTPRoutes over 1,000 namespaces.
// go test -run '^$' -bench Compile10k -benchmem ./internal/gateway/compile/
func BenchmarkCompile10kRoutes(b *testing.B) {
	in := scaleInput(1000, 10)
	out := Compile(in)
	if st := out.Gateways[types.NamespacedName{Namespace: "gw", Name: "gw"}]; st.Listeners[0].AttachedRoutes != 10000 {
		b.Fatalf("attached %d routes", st.Listeners[0].AttachedRoutes)
	}
	b.ResetTimer()
	for b.Loop() {
		Compile(in)
	}
}

// TestCompileScale compiles 10,000 routes, from scratch and after a
// one-route change, and logs the times; the bound is generous (a shared
// 2-core machine), the figures are what matter.
func TestCompileScale(t *testing.T) {
	if testing.Short() {
		testutil.Skip(t, "-short: compiling 10,000 routes takes seconds")
	}
	in := scaleInput(1000, 10)
	Compile(in) // warm the caches the runtime keeps
	start := time.Now()
	out := Compile(in)
	cold := time.Since(start)
	if n := len(out.Table.Ports[20000].Exact); n != 10000 {
		t.Errorf("%d hostnames in the table, want 10000", n)
	}
	withRVs(in)
	Compile(in)
	r := in.HTTPRoutes[5000].DeepCopy()
	r.ResourceVersion = "2"
	in.HTTPRoutes[5000] = r
	start = time.Now()
	Compile(in)
	warm := time.Since(start)
	t.Logf("Compile of 10,000 HTTPRoutes over 1,000 namespaces: %v from scratch, %v after one route changed", cold, warm)
	if cold > 2*time.Second || warm > 2*time.Second {
		t.Errorf("Compile took %v / %v", cold, warm)
	}
}

// BenchmarkCompile10kSimpleRoutes: the route change benchmarks' shape, one
// hostname, one PathPrefix rule, one backend per route.
func BenchmarkCompile10kSimpleRoutes(b *testing.B) {
	in := scaleInput(1000, 10)
	for _, r := range in.HTTPRoutes {
		rule := &r.Spec.Rules[0]
		rule.Matches = rule.Matches[1:]
		rule.Matches[0].Headers = nil
		rule.Filters = nil
		rule.BackendRefs = rule.BackendRefs[:1]
	}
	b.ResetTimer()
	for b.Loop() {
		Compile(in)
	}
}

// BenchmarkCompile10kRoutesOneChange: the steady state, where each Compile
// follows a change to one route (a new object with a new resourceVersion,
// as informers give) and the other 9,999 routes come from the memo.
func BenchmarkCompile10kRoutesOneChange(b *testing.B) {
	in := withRVs(scaleInput(1000, 10))
	Compile(in)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		r := in.HTTPRoutes[i%len(in.HTTPRoutes)].DeepCopy()
		r.ResourceVersion = fmt.Sprint(i + 2)
		in.HTTPRoutes[i%len(in.HTTPRoutes)] = r
		i++
		Compile(in)
	}
}

// BenchmarkIncremental10kRoutesOneChange is the same change through
// Incremental.Routes, which the controller uses when only routes changed.
func BenchmarkIncremental10kRoutesOneChange(b *testing.B) {
	in := withRVs(scaleInput(1000, 10))
	var x Incremental
	x.Compile(in)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		r := in.HTTPRoutes[i%len(in.HTTPRoutes)].DeepCopy()
		r.ResourceVersion = fmt.Sprint(i + 2)
		in.HTTPRoutes[i%len(in.HTTPRoutes)] = r
		i++
		x.Routes([]RouteKey{{Kind: "HTTPRoute", Namespace: r.Namespace, Name: r.Name}}, func(RouteKey) any { return r })
	}
}
