package compile

import (
	"reflect"
	"slices"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// withRVs gives every object a resourceVersion, as the API server does,
// which is what lets Compile reuse the previous Compile's work.
func withRVs(in *Input) *Input {
	for _, o := range in.HTTPRoutes {
		o.ResourceVersion = "1"
	}
	for _, o := range in.GRPCRoutes {
		o.ResourceVersion = "1"
	}
	for _, o := range in.Services {
		o.ResourceVersion = "1"
	}
	for _, o := range in.EndpointSlices {
		o.ResourceVersion = "1"
	}
	for _, o := range in.ReferenceGrants {
		o.ResourceVersion = "1"
	}
	return in
}

// rulesOf returns the rules a lookup reaches, by path, for identity checks.
func rulesOf(t *testing.T, out *Output, in *Input, paths ...string) []*table.Rule {
	t.Helper()
	var rs []*table.Rule
	for _, p := range paths {
		rs = append(rs, lookup(t, out, in, nn("gw", "gw"), 80, "x", p, nil))
	}
	return rs
}

func TestMemo(t *testing.T) {
	exact := gwv1.PathMatchExact
	route := func(ns, name, path string, ref gwv1.HTTPBackendRef) *gwv1.HTTPRoute {
		r := httpRoute(ns, name, ref)
		r.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &exact, Value: ptrTo(path)}}}
		r.ResourceVersion = "1"
		return r
	}
	in := withRVs(world(httpListener("http", 80, "", gwv1.NamespacesFromAll)))
	in.HTTPRoutes = []*gwv1.HTTPRoute{
		route("a", "ra", "/a", svcRef("", "svc", 80, 1)),
		route("b", "rb", "/b", svcRef("", "svc", 80, 1)),
		route("a", "cross", "/cross", svcRef("b", "svc", 80, 1)),
	}
	first := Compile(in)
	before := rulesOf(t, first, in, "/a", "/b", "/cross")

	// Nothing changed: every rule comes back, the same objects.
	second := Compile(in)
	if after := rulesOf(t, second, in, "/a", "/b", "/cross"); !slices.Equal(after, before) {
		t.Errorf("unchanged input: rules recompiled")
	}
	if !reflect.DeepEqual(first.HTTPRoutes, second.HTTPRoutes) || dumpTable(first.Table) != dumpTable(second.Table) {
		t.Error("a memoized Compile differs")
	}

	// b's EndpointSlice changes: the routes to b/svc are compiled again
	// with the new endpoint, a's route is not.
	es := in.EndpointSlices[1].DeepCopy()
	es.ResourceVersion = "2"
	es.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.9.9.9"}}}
	in.EndpointSlices[1] = es
	third := Compile(in)
	after := rulesOf(t, third, in, "/a", "/b", "/cross")
	if after[0] != before[0] || after[1] == before[1] || after[2] == before[2] {
		t.Errorf("after b's endpoints changed: reused %v %v %v, want true false false", after[0] == before[0], after[1] == before[1], after[2] == before[2])
	}
	if got := after[1].Action.Backends[0].Endpoints; !slices.Equal(got, []string{"10.9.9.9:8080"}) {
		t.Errorf("b's endpoints %v", got)
	}
	checkConds(t, "cross", parentConds(t, third, "a", "cross"), 5, want{"ResolvedRefs", false, "RefNotPermitted"})

	// A ReferenceGrant appears: the cross-namespace route resolves.
	g := grant("b", "HTTPRoute", "a", "Service", "")
	g.ResourceVersion = "1"
	in.ReferenceGrants = append(in.ReferenceGrants, g)
	fourth := Compile(in)
	checkConds(t, "cross", parentConds(t, fourth, "a", "cross"), 5, want{"ResolvedRefs", true, ""})
	if got := backendOf(lookup(t, fourth, in, nn("gw", "gw"), 80, "x", "/cross", nil)); got != "b/svc" {
		t.Errorf("/cross -> %s", got)
	}

	// A route changes (a new object, as informers give): it is compiled again.
	r := in.HTTPRoutes[0].DeepCopy()
	r.ResourceVersion = "2"
	r.Spec.Rules[0].Matches[0].Path.Value = ptrTo("/a2")
	in.HTTPRoutes[0] = r
	fifth := Compile(in)
	if got := backendOf(lookup(t, fifth, in, nn("gw", "gw"), 80, "x", "/a2", nil)); got != "a/svc" {
		t.Errorf("/a2 -> %s", got)
	}
	if got := backendOf(lookup(t, fifth, in, nn("gw", "gw"), 80, "x", "/a", nil)); got != "404" {
		t.Errorf("/a -> %s after the route moved to /a2", got)
	}

	// a's Service goes away: its route answers 500 and says why.
	in.Services = in.Services[1:]
	sixth := Compile(in)
	checkConds(t, "ra", parentConds(t, sixth, "a", "ra"), 5, want{"ResolvedRefs", false, "BackendNotFound"})
	if got := backendOf(lookup(t, sixth, in, nn("gw", "gw"), 80, "x", "/a2", nil)); got != "500" {
		t.Errorf("/a2 -> %s with its Service gone", got)
	}
}

// TestMemoSameOutput compiles the suite's manifests with and without
// resourceVersions, twice each: the memo must not change any output.
func TestMemoSameOutput(t *testing.T) {
	files := []string{"httproute-hostname-intersection.yaml", "httproute-reference-grant.yaml", "httproute-weight.yaml",
		"httproute-partially-invalid-via-invalid-reference-grant.yaml", "httproute-service-types.yaml"}
	plain := Compile(loadConformance(t, files...))
	in := withRVs(loadConformance(t, files...))
	Compile(in)
	memoized := Compile(in)
	if !reflect.DeepEqual(plain.HTTPRoutes, memoized.HTTPRoutes) || !reflect.DeepEqual(plain.Gateways, memoized.Gateways) {
		t.Error("statuses differ")
	}
	if a, b := dumpTable(plain.Table), dumpTable(memoized.Table); a != b {
		t.Errorf("tables differ:\n%s\n%s", a, b)
	}
}

// TestMemoConcurrent runs Compiles at once over the same objects (the
// memo is shared); run with -race.
func TestMemoConcurrent(t *testing.T) {
	in := withRVs(loadConformance(t, "httproute-matching.yaml", "httproute-weight.yaml"))
	want := dumpTable(Compile(in).Table)
	done := make(chan string)
	for range 4 {
		go func() {
			var got string
			for range 5 {
				got = dumpTable(Compile(in).Table)
			}
			done <- got
		}()
	}
	for range 4 {
		if got := <-done; got != want {
			t.Errorf("concurrent Compile gave\n%s\nwant\n%s", got, want)
		}
	}
}
