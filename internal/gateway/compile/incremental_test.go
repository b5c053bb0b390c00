package compile

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// The differential test: random route adds, updates and deletes through
// Incremental.Routes, each step compared with a full Compile of the same
// Input (every status, every host's rules in order, lookups), and the
// previous step's table checked unchanged (copy-on-write).

var (
	diffHosts = []string{"a.example.com", "b.example.com", "x.foo.example.com", "*.example.com", "*.foo.example.com",
		"*.bar.org", "c.bar.org", "A.Example.com", "other.net"}
	diffPaths = []string{"/", "/a", "/a/b", "/b"}
	// What the lookups ask for (besides every hostname above).
	diffReqHosts = []string{"z.example.com", "y.foo.example.com", "deep.x.foo.example.com", "q.bar.org", "nothing.io", "example.com"}
)

// diffWorld: Gateway gw/gw with overlapping listeners on two ports, and a
// second Gateway gw/gw2 (all namespaces, one catch-all listener).
func diffWorld() *Input {
	in := world(
		httpListener("any", 80, "", gwv1.NamespacesFromAll),
		httpListener("wild", 80, "*.example.com", gwv1.NamespacesFromAll),
		httpListener("foo", 80, "*.foo.example.com", gwv1.NamespacesFromSame),
		httpListener("exact", 80, "a.example.com", gwv1.NamespacesFromAll),
		httpListener("alt", 8080, "*.bar.org", gwv1.NamespacesFromAll),
	)
	gw2 := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "gw", Name: "gw2", Generation: 1},
		Spec: gwv1.GatewaySpec{GatewayClassName: "flatnet", Listeners: []gwv1.Listener{httpListener("http", 81, "", gwv1.NamespacesFromAll)}}}
	in.Gateways = append(in.Gateways, gw2)
	in.Binds[BindKey{Gateway: nn("gw", "gw2"), Port: 81}] = 20100
	in.Addresses[nn("gw", "gw2")] = []string{"10.200.0.2"}
	in.ReferenceGrants = append(in.ReferenceGrants, grant("b", "HTTPRoute", "a", "Service", "svc"))
	return in
}

func randRoute(rng *rand.Rand, ns, name string, rv int, grpc bool) any {
	var refs []gwv1.ParentReference
	for range 1 + rng.IntN(2) {
		ref := gwv1.ParentReference{Name: "gw", Namespace: ptrTo(gwv1.Namespace("gw"))}
		switch rng.IntN(8) {
		case 0:
			ref.Name = "gw2"
		case 1:
			ref.Name = "theirs"
		case 2, 3:
			ref.SectionName = ptrTo(gwv1.SectionName([]string{"any", "wild", "foo", "exact", "alt", "nope"}[rng.IntN(6)]))
		case 4:
			ref.Port = ptrTo(gwv1.PortNumber([]int32{80, 8080, 9}[rng.IntN(3)]))
		}
		refs = append(refs, ref)
	}
	var hosts []gwv1.Hostname
	for range rng.IntN(3) {
		hosts = append(hosts, gwv1.Hostname(diffHosts[rng.IntN(len(diffHosts))]))
	}
	backend := func() gwv1.BackendObjectReference {
		ref := gwv1.BackendObjectReference{Name: "svc", Port: ptrTo(gwv1.PortNumber(80))}
		switch rng.IntN(6) {
		case 0:
			ref.Name = "missing"
		case 1:
			ref.Namespace = ptrTo(gwv1.Namespace("b")) // granted for a only
		case 2:
			ref.Port = ptrTo(gwv1.PortNumber(81))
		}
		return ref
	}
	meta := metav1.ObjectMeta{Namespace: ns, Name: name, Generation: int64(rv), ResourceVersion: strconv.Itoa(rv),
		CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(rng.IntN(3)) * time.Second))}
	if grpc {
		gr := &gwv1.GRPCRoute{ObjectMeta: meta}
		gr.Spec.ParentRefs, gr.Spec.Hostnames = refs, hosts
		for range 1 + rng.IntN(2) {
			rule := gwv1.GRPCRouteRule{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: backend()}}}}
			if rng.IntN(2) == 0 {
				rule.Matches = []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{Service: ptrTo("svc.S"), Method: ptrTo([]string{"M", "N"}[rng.IntN(2)])}}}
			}
			gr.Spec.Rules = append(gr.Spec.Rules, rule)
		}
		return gr
	}
	hr := &gwv1.HTTPRoute{ObjectMeta: meta}
	hr.Spec.ParentRefs, hr.Spec.Hostnames = refs, hosts
	for range 1 + rng.IntN(2) {
		rule := gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: backend()}}}}
		for range rng.IntN(3) {
			typ := []gwv1.PathMatchType{gwv1.PathMatchPathPrefix, gwv1.PathMatchExact, gwv1.PathMatchRegularExpression}[rng.IntN(3)]
			v := diffPaths[rng.IntN(len(diffPaths))]
			if typ == gwv1.PathMatchRegularExpression && rng.IntN(3) == 0 {
				v = "/(" // invalid: the rule is dropped
			}
			m := gwv1.HTTPRouteMatch{Path: &gwv1.HTTPPathMatch{Type: &typ, Value: &v}}
			if rng.IntN(4) == 0 {
				m.Headers = []gwv1.HTTPHeaderMatch{{Name: "X-Env", Value: "canary"}}
			}
			rule.Matches = append(rule.Matches, m)
		}
		if rng.IntN(10) == 0 {
			rule.Filters = []gwv1.HTTPRouteFilter{{Type: "Unknown"}} // unsupported: dropped
		}
		hr.Spec.Rules = append(hr.Spec.Rules, rule)
	}
	return hr
}

// describeTable is every port's hosts (empty ones too) with their rules
// in precedence order.
func describeTable(tb *table.Table) string {
	var sb strings.Builder
	for _, bind := range slices.Sorted(mapKeys(tb.Ports)) {
		p := tb.Ports[bind]
		var all []*table.Host
		for _, h := range slices.Sorted(mapKeys(p.Exact)) {
			all = append(all, p.Exact[h])
		}
		all = append(all, p.Wildcards...)
		if p.Any != nil {
			all = append(all, p.Any)
		}
		fmt.Fprintf(&sb, "port %d %s listen %d certs %d\n", bind, p.Protocol, p.Listen, len(p.Certs))
		for _, h := range all {
			fmt.Fprintf(&sb, " host %q\n", h.Name)
			for _, r := range h.Rules {
				sb.WriteString("  " + describeRule(r) + "\n")
			}
		}
	}
	return sb.String()
}

func describeRule(r *table.Rule) string {
	if r == nil {
		return "<nil>"
	}
	s := fmt.Sprintf("%s %d.%d %s %s %s %d hdr=%d", r.Action.Route, r.RuleIndex, r.MatchIndex, r.Match.Path.Type, r.Match.Path.Value,
		r.Match.Method, r.Action.Direct, len(r.Match.Headers))
	for _, b := range r.Action.Backends {
		s += fmt.Sprintf(" %s/%t/%v", b.Name, b.Invalid, b.Endpoints)
	}
	return s
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// lookups answers a fixed set of requests on every port.
func lookups(tb *table.Table) string {
	var sb strings.Builder
	hosts := append(slices.Clone(diffHosts), diffReqHosts...)
	for _, bind := range slices.Sorted(mapKeys(tb.Ports)) {
		p := tb.Ports[bind]
		for _, host := range hosts {
			host = strings.ReplaceAll(host, "*", "w")
			h := p.Lookup(host)
			name := "<nil>"
			if h != nil {
				name = h.Name
			}
			fmt.Fprintf(&sb, "%d %s -> %q:", bind, host, name)
			for _, path := range append(slices.Clone(diffPaths), "/svc.S/M", "/a/b/c") {
				for _, env := range []string{"", "canary"} {
					req := httptest.NewRequest(http.MethodGet, "http://"+host+path, nil)
					if env != "" {
						req.Header.Set("X-Env", env)
					}
					fmt.Fprintf(&sb, " [%s]", describeRule(h.Match(req)))
				}
			}
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}

func compareOutputs(t *testing.T, step string, got, want *Output) {
	t.Helper()
	for _, f := range []struct {
		what string
		get  func(*Output) any
	}{
		{"GatewayClasses", func(o *Output) any { return o.GatewayClasses }},
		{"Gateways", func(o *Output) any { return o.Gateways }},
		{"HTTPRoutes", func(o *Output) any { return o.HTTPRoutes }},
		{"GRPCRoutes", func(o *Output) any { return o.GRPCRoutes }},
		{"Ingresses", func(o *Output) any { return o.Ingresses }},
	} {
		if !equality.Semantic.DeepEqual(f.get(got), f.get(want)) {
			t.Fatalf("%s: %s differ:\nincremental %+v\nfull        %+v", step, f.what, f.get(got), f.get(want))
		}
	}
	if g, w := describeTable(got.Table), describeTable(want.Table); g != w {
		t.Fatalf("%s: tables differ:\nincremental:\n%s\nfull:\n%s", step, g, w)
	}
	if g, w := lookups(got.Table), lookups(want.Table); g != w {
		t.Fatalf("%s: lookups differ:\nincremental:\n%s\nfull:\n%s", step, g, w)
	}
}

func TestIncrementalMatchesCompile(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			in := diffWorld()
			rv := 1
			nsOf := []string{"a", "b", "gw"}
			// A starting set of routes.
			for i := range 12 {
				rv++
				addRoute(in, randRoute(rng, nsOf[i%3], fmt.Sprintf("r%d", i), rv, i%4 == 3))
			}
			var x Incremental
			compareOutputs(t, "start", x.Compile(in), Compile(in))
			prev := x.out
			for step := range 100 {
				before, beforeLookups := describeTable(prev.Table), lookups(prev.Table)
				beforeRoutes := fmt.Sprint(prev.HTTPRoutes)
				next := *in
				next.HTTPRoutes, next.GRPCRoutes = slices.Clone(in.HTTPRoutes), slices.Clone(in.GRPCRoutes)
				var changed []RouteKey
				var what []string
				for range 1 + rng.IntN(3) {
					i := rng.IntN(16)
					grpc := i%4 == 3
					ns, name := nsOf[i%3], fmt.Sprintf("r%d", i)
					kind := gwv1.Kind("HTTPRoute")
					if grpc {
						kind = "GRPCRoute"
					}
					changed = append(changed, RouteKey{kind, ns, name})
					removeRoute(&next, kind, ns, name)
					if rng.IntN(4) == 0 {
						what = append(what, "delete "+ns+"/"+name)
						continue
					}
					rv++
					what = append(what, "put "+ns+"/"+name)
					addRoute(&next, randRoute(rng, ns, name, rv, grpc))
				}
				in = &next
				label := fmt.Sprintf("step %d (%s)", step, strings.Join(what, ", "))
				got := x.Routes(changed, RoutesIn(in))
				compareOutputs(t, label, got, Compile(in))
				if describeTable(prev.Table) != before || lookups(prev.Table) != beforeLookups || fmt.Sprint(prev.HTTPRoutes) != beforeRoutes {
					t.Fatalf("%s: the previous output changed (it must be copy-on-write)", label)
				}
				prev = got
			}
		})
	}
}

func addRoute(in *Input, o any) {
	switch o := o.(type) {
	case *gwv1.HTTPRoute:
		in.HTTPRoutes = append(in.HTTPRoutes, o)
	case *gwv1.GRPCRoute:
		in.GRPCRoutes = append(in.GRPCRoutes, o)
	}
}

func removeRoute(in *Input, kind gwv1.Kind, ns, name string) {
	if kind == "HTTPRoute" {
		in.HTTPRoutes = slices.DeleteFunc(in.HTTPRoutes, func(r *gwv1.HTTPRoute) bool { return r.Namespace == ns && r.Name == name })
	} else {
		in.GRPCRoutes = slices.DeleteFunc(in.GRPCRoutes, func(r *gwv1.GRPCRoute) bool { return r.Namespace == ns && r.Name == name })
	}
}

// TestIncrementalNotReady: Routes needs a Compile first.
func TestIncrementalNotReady(t *testing.T) {
	var x Incremental
	if x.Ready() || x.Routes([]RouteKey{{Kind: "HTTPRoute", Namespace: "a", Name: "r"}}, RoutesIn(diffWorld())) != nil {
		t.Fatal("Routes without a Compile gave an Output")
	}
	x.Compile(diffWorld())
	if !x.Ready() {
		t.Fatal("not Ready after Compile")
	}
}

// TestIncrementalConcurrentReads: the tables Routes returned are read (as
// the proxy does) while the next ones are built; under -race this checks
// nothing shared is written.
func TestIncrementalConcurrentReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	in := diffWorld()
	for i := range 12 {
		addRoute(in, randRoute(rng, "a", fmt.Sprintf("r%d", i), 2+i, i%4 == 3))
	}
	var x Incremental
	tables := make(chan *table.Table, 1)
	tables <- x.Compile(in).Table
	done := make(chan struct{})
	go func() {
		defer close(done)
		for tb := range tables {
			lookups(tb)
		}
	}()
	for step := range 30 {
		i := rng.IntN(12)
		kind := gwv1.Kind("HTTPRoute")
		if i%4 == 3 {
			kind = "GRPCRoute"
		}
		name := fmt.Sprintf("r%d", i)
		next := *in
		next.HTTPRoutes, next.GRPCRoutes = slices.Clone(in.HTTPRoutes), slices.Clone(in.GRPCRoutes)
		removeRoute(&next, kind, "a", name)
		addRoute(&next, randRoute(rng, "a", name, 100+step, i%4 == 3))
		in = &next
		tables <- x.Routes([]RouteKey{{kind, "a", name}}, RoutesIn(in)).Table
	}
	close(tables)
	<-done
}

// TestIncrementalUses: every Service a backend names, resolved or not,
// after Compile and after Routes; everything before the first Compile.
func TestIncrementalUses(t *testing.T) {
	var x Incremental
	if !x.Uses("a", "anything") {
		t.Fatal("before a Compile, Uses must say yes to everything")
	}
	route := func(name string, backends ...string) *gwv1.HTTPRoute {
		hr := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, Generation: 1, ResourceVersion: "1"}}
		hr.Spec.ParentRefs = []gwv1.ParentReference{{Name: "gw", Namespace: ptrTo(gwv1.Namespace("gw"))}}
		for _, b := range backends {
			hr.Spec.Rules = append(hr.Spec.Rules, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{
				{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(b), Port: ptrTo(gwv1.PortNumber(80))}}}}})
		}
		return hr
	}
	in := diffWorld()
	addRoute(in, route("r1", "svc", "missing"))
	x.Compile(in)
	for _, c := range []struct {
		ns, name string
		want     bool
	}{{"a", "svc", true}, {"a", "missing", true}, {"a", "other", false}, {"b", "svc", false}} {
		if got := x.Uses(c.ns, c.name); got != c.want {
			t.Errorf("after Compile: Uses(%s, %s) = %v, want %v", c.ns, c.name, got, c.want)
		}
	}
	addRoute(in, route("r2", "later"))
	x.Routes([]RouteKey{{Kind: "HTTPRoute", Namespace: "a", Name: "r2"}}, RoutesIn(in))
	if !x.Uses("a", "later") || !x.Uses("a", "svc") {
		t.Errorf("after Routes: later %v, svc %v; want both", x.Uses("a", "later"), x.Uses("a", "svc"))
	}
}
