package compile

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// world is a small Input: Gateway gw/gw (class flatnet) with the given
// listeners, namespaces gw, a (label team=a) and b, Service svc (port 80,
// name http, -> 8080) with one ready endpoint in a and b, every listener
// port bound and the Gateway addressed.
func world(listeners ...gwv1.Listener) *Input {
	gk := nn("gw", "gw")
	in := &Input{
		GatewayClasses: []*gwv1.GatewayClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "flatnet", Generation: 3}, Spec: gwv1.GatewayClassSpec{ControllerName: ControllerName}},
			{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.com/other"}},
		},
		Gateways: []*gwv1.Gateway{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "gw", Name: "gw", Generation: 2},
				Spec: gwv1.GatewaySpec{GatewayClassName: "flatnet", Listeners: listeners}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "gw", Name: "theirs", Generation: 1},
				Spec: gwv1.GatewaySpec{GatewayClassName: "other", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}}},
		},
		Binds:     map[BindKey]int32{},
		Addresses: map[types.NamespacedName][]string{gk: {"10.200.0.1", "lb.example.com"}},
	}
	for i, l := range listeners {
		in.Binds[BindKey{Gateway: gk, Port: int32(l.Port)}] = 20000 + int32(i)
	}
	for _, ns := range []string{"gw", "a", "b"} {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{corev1.LabelMetadataName: ns, "team": ns}}})
	}
	for _, ns := range []string{"a", "b"} {
		in.Services = append(in.Services, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
		in.EndpointSlices = append(in.EndpointSlices, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "svc-1", Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
			Ports:      []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080))}},
			Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"10.9.0.1"}}},
		})
	}
	return in
}

func httpListener(name string, port int32, host string, from gwv1.FromNamespaces) gwv1.Listener {
	l := gwv1.Listener{Name: gwv1.SectionName(name), Port: gwv1.PortNumber(port), Protocol: gwv1.HTTPProtocolType,
		AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &from}}}
	if host != "" {
		l.Hostname = ptrTo(gwv1.Hostname(host))
	}
	return l
}

// httpRoute is a route in ns to gw/gw with one rule to backends.
func httpRoute(ns, name string, backends ...gwv1.HTTPBackendRef) *gwv1.HTTPRoute {
	gwNS := gwv1.Namespace("gw")
	return &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 5},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw", Namespace: &gwNS}}},
			Rules:           []gwv1.HTTPRouteRule{{BackendRefs: backends}},
		}}
}

func svcRef(ns, name string, port int32, weight int32) gwv1.HTTPBackendRef {
	ref := gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
		Name: gwv1.ObjectName(name), Port: ptrTo(gwv1.PortNumber(port))}, Weight: &weight}}
	if ns != "" {
		ref.Namespace = ptrTo(gwv1.Namespace(ns))
	}
	return ref
}

func grant(ns string, fromKind, fromNS, toKind string, name string) *gwv1.ReferenceGrant {
	g := &gwv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"}, Spec: gwv1.ReferenceGrantSpec{
		From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: gwv1.Kind(fromKind), Namespace: gwv1.Namespace(fromNS)}},
		To:   []gwv1.ReferenceGrantTo{{Group: "", Kind: gwv1.Kind(toKind)}}}}
	if name != "" {
		g.Spec.To[0].Name = ptrTo(gwv1.ObjectName(name))
	}
	return g
}

// parentConds returns the conditions of a route's only parents entry.
func parentConds(t *testing.T, out *Output, ns, name string) []metav1.Condition {
	t.Helper()
	st := out.HTTPRoutes[nn(ns, name)]
	if len(st.Parents) != 1 {
		t.Fatalf("HTTPRoute %s/%s parents %+v", ns, name, st.Parents)
	}
	return st.Parents[0].Conditions
}

func TestReferenceGrants(t *testing.T) {
	for _, tc := range []struct {
		name   string
		grants []*gwv1.ReferenceGrant
		want   want
	}{
		{"none", nil, want{"ResolvedRefs", false, "RefNotPermitted"}},
		{"all Services", []*gwv1.ReferenceGrant{grant("b", "HTTPRoute", "a", "Service", "")}, want{"ResolvedRefs", true, "ResolvedRefs"}},
		{"this Service", []*gwv1.ReferenceGrant{grant("b", "HTTPRoute", "a", "Service", "svc")}, want{"ResolvedRefs", true, "ResolvedRefs"}},
		{"another Service", []*gwv1.ReferenceGrant{grant("b", "HTTPRoute", "a", "Service", "other")}, want{"ResolvedRefs", false, "RefNotPermitted"}},
		{"from GRPCRoutes", []*gwv1.ReferenceGrant{grant("b", "GRPCRoute", "a", "Service", "")}, want{"ResolvedRefs", false, "RefNotPermitted"}},
		{"from another namespace", []*gwv1.ReferenceGrant{grant("b", "HTTPRoute", "gw", "Service", "")}, want{"ResolvedRefs", false, "RefNotPermitted"}},
		{"in the wrong namespace", []*gwv1.ReferenceGrant{grant("a", "HTTPRoute", "a", "Service", "")}, want{"ResolvedRefs", false, "RefNotPermitted"}},
		{"to Secrets", []*gwv1.ReferenceGrant{grant("b", "HTTPRoute", "a", "Secret", "")}, want{"ResolvedRefs", false, "RefNotPermitted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
			in.HTTPRoutes = []*gwv1.HTTPRoute{httpRoute("a", "r", svcRef("b", "svc", 80, 1))}
			in.ReferenceGrants = tc.grants
			out := Compile(in)
			checkConds(t, "route", parentConds(t, out, "a", "r"), 5, want{"Accepted", true, "Accepted"}, tc.want)
			r := lookup(t, out, in, nn("gw", "gw"), 80, "x", "/", nil)
			got, wantBackend := backendOf(r), "500"
			if tc.want.status {
				wantBackend = "b/svc"
			}
			if got != wantBackend {
				t.Errorf("request -> %s, want %s", got, wantBackend)
			}
		})
	}
}

func TestWeightedBackends(t *testing.T) {
	in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
	in.HTTPRoutes = []*gwv1.HTTPRoute{
		httpRoute("a", "split", svcRef("", "svc", 80, 3), svcRef("", "missing", 80, 1), svcRef("", "svc", 80, 0)),
		httpRoute("a", "zero", svcRef("", "svc", 80, 0)),
	}
	in.HTTPRoutes[1].Spec.Hostnames = []gwv1.Hostname{"zero.example.com"}
	out := Compile(in)
	checkConds(t, "split", parentConds(t, out, "a", "split"), 5, want{"Accepted", true, ""}, want{"ResolvedRefs", false, "BackendNotFound"})
	r := lookup(t, out, in, nn("gw", "gw"), 80, "x", "/", nil)
	a := r.Action
	if len(a.Backends) != 3 || a.Backends[1].Invalid != true || a.Backends[0].Invalid || a.Direct != 0 {
		t.Fatalf("backends %+v", a.Backends)
	}
	picks := map[int]int{}
	for range 8 {
		picks[a.Balancer.Pick()]++
	}
	if picks[0] != 6 || picks[1] != 2 || picks[2] != 0 {
		t.Errorf("8 picks %v, want 6 valid, 2 invalid (500), 0 for weight 0", picks)
	}
	if got := a.Backends[0].Endpoints; !slices.Equal(got, []string{"10.9.0.1:8080"}) {
		t.Errorf("endpoints %v", got)
	}
	if r := lookup(t, out, in, nn("gw", "gw"), 80, "zero.example.com", "/", nil); r.Action.Direct != 500 {
		t.Errorf("all weights 0: %+v, want a direct 500", r.Action)
	}
}

func TestEndpoints(t *testing.T) {
	yes, no := ptrTo(true), ptrTo(false)
	ep := func(ip string, ready, serving, terminating *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	}
	for _, tc := range []struct {
		name string
		eps  []discoveryv1.Endpoint
		want []string
	}{
		{"ready and unknown count, not ready does not", []discoveryv1.Endpoint{ep("10.0.0.3", yes, nil, nil), ep("10.0.0.1", nil, nil, nil), ep("10.0.0.2", no, no, no)},
			[]string{"10.0.0.1:3000", "10.0.0.3:3000"}},
		{"terminating ones only when none is ready", []discoveryv1.Endpoint{ep("10.0.0.1", no, yes, yes), ep("10.0.0.2", yes, yes, no)},
			[]string{"10.0.0.2:3000"}},
		{"serving terminating as the last resort", []discoveryv1.Endpoint{ep("10.0.0.1", no, yes, yes), ep("10.0.0.2", no, no, yes)},
			[]string{"10.0.0.1:3000"}},
		{"IPv6", []discoveryv1.Endpoint{ep("fd00::1", yes, nil, nil)}, []string{"[fd00::1]:3000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
			in.Services[0].Spec.Ports = []corev1.ServicePort{{Name: "metrics", Port: 9090}, {Name: "web", Port: 80}}
			in.EndpointSlices[0].Ports = []discoveryv1.EndpointPort{{Name: ptrTo("metrics"), Port: ptrTo(int32(9100))}, {Name: ptrTo("web"), Port: ptrTo(int32(3000))}}
			in.EndpointSlices[0].Endpoints = tc.eps
			in.HTTPRoutes = []*gwv1.HTTPRoute{httpRoute("a", "r", svcRef("", "svc", 80, 1))}
			out := Compile(in)
			r := lookup(t, out, in, nn("gw", "gw"), 80, "x", "/", nil)
			if got := r.Action.Backends[0].Endpoints; !slices.Equal(got, tc.want) {
				t.Errorf("endpoints %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAppProtocol(t *testing.T) {
	for _, tc := range []struct {
		proto *string
		want  table.AppProtocol
		ok    bool
	}{
		{nil, table.HTTP1, true},
		{ptrTo("kubernetes.io/h2c"), table.H2C, true},
		{ptrTo("kubernetes.io/ws"), table.WS, true},
		{ptrTo("http"), table.HTTP1, true},
		{ptrTo("https"), "", false},
	} {
		in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
		in.Services[0].Spec.Ports[0].AppProtocol = tc.proto
		in.HTTPRoutes = []*gwv1.HTTPRoute{httpRoute("a", "r", svcRef("", "svc", 80, 1))}
		out := Compile(in)
		b := lookup(t, out, in, nn("gw", "gw"), 80, "x", "/", nil).Action.Backends[0]
		conds := parentConds(t, out, "a", "r")
		if tc.ok {
			checkConds(t, "route", conds, 5, want{"ResolvedRefs", true, ""})
			if b.Protocol != tc.want || b.Invalid {
				t.Errorf("appProtocol %v: backend %+v", tc.proto, b)
			}
		} else {
			checkConds(t, "route", conds, 5, want{"ResolvedRefs", false, "UnsupportedProtocol"})
			if !b.Invalid {
				t.Errorf("appProtocol %v: backend valid", *tc.proto)
			}
		}
	}
}

func TestListeners(t *testing.T) {
	https := gwv1.Listener{Name: "https", Port: 80, Protocol: gwv1.HTTPSProtocolType}
	in := world(
		httpListener("first", 80, "a.example.com", gwv1.NamespacesFromSame),
		httpListener("same-host", 80, "a.example.com", gwv1.NamespacesFromSame),
		https,
		httpListener("selector", 8080, "", gwv1.NamespacesFromSelector),
		gwv1.Listener{Name: "tcp", Port: 9000, Protocol: gwv1.TCPProtocolType},
	)
	in.Gateways[0].Spec.Listeners[3].AllowedRoutes.Namespaces.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	out := Compile(in)
	st := out.Gateways[nn("gw", "gw")]
	checkConds(t, "gateway", st.Conditions, 2, want{"Accepted", true, "ListenersNotValid"}, want{"Programmed", true, "Programmed"})
	wants := map[string][]want{
		"first":     {{"Accepted", true, "Accepted"}, {"Conflicted", false, "NoConflicts"}, {"Programmed", true, "Programmed"}, {"ResolvedRefs", true, "ResolvedRefs"}},
		"same-host": {{"Accepted", false, ""}, {"Conflicted", true, "HostnameConflict"}, {"Programmed", false, "Invalid"}},
		"https":     {{"Accepted", false, ""}, {"Conflicted", true, "ProtocolConflict"}, {"Programmed", false, "Invalid"}},
		"selector":  {{"Accepted", true, "Accepted"}, {"Programmed", true, "Programmed"}},
		"tcp":       {{"Accepted", false, "UnsupportedProtocol"}, {"Programmed", false, "Invalid"}},
	}
	for _, l := range st.Listeners {
		checkConds(t, string(l.Name), l.Conditions, 2, wants[string(l.Name)]...)
		if len(l.Conditions) != 4 {
			t.Errorf("listener %s has %d conditions", l.Name, len(l.Conditions))
		}
	}
	if len(st.Addresses) != 2 || *st.Addresses[0].Type != gwv1.IPAddressType || *st.Addresses[1].Type != gwv1.HostnameAddressType {
		t.Errorf("addresses %+v", st.Addresses)
	}
	checkConds(t, "class", out.GatewayClasses["flatnet"].Conditions, 3, want{"Accepted", true, "Accepted"})
	if _, ok := out.Gateways[nn("gw", "theirs")]; ok {
		t.Error("another class's Gateway got a status")
	}
}

func TestAttachment(t *testing.T) {
	port := func(p int32) *gwv1.PortNumber { v := gwv1.PortNumber(p); return &v }
	section := func(s string) *gwv1.SectionName { v := gwv1.SectionName(s); return &v }
	for _, tc := range []struct {
		name      string
		ns        string
		ref       func(*gwv1.ParentReference)
		hostnames []gwv1.Hostname
		want      want
		attached  map[string]int32
	}{
		{"same namespace listener takes its namespace", "gw", nil, nil, want{"Accepted", true, "Accepted"}, map[string]int32{"same": 1, "selector": 0, "all": 1}},
		{"selector matches team a", "a", nil, nil, want{"Accepted", true, "Accepted"}, map[string]int32{"same": 0, "selector": 1, "all": 1}},
		{"sectionName", "b", func(r *gwv1.ParentReference) { r.SectionName = section("all") }, nil, want{"Accepted", true, "Accepted"}, map[string]int32{"all": 1}},
		{"sectionName not allowed", "b", func(r *gwv1.ParentReference) { r.SectionName = section("same") }, nil, want{"Accepted", false, "NotAllowedByListeners"}, map[string]int32{"same": 0}},
		{"no such sectionName", "b", func(r *gwv1.ParentReference) { r.SectionName = section("nope") }, nil, want{"Accepted", false, "NoMatchingParent"}, nil},
		{"port", "a", func(r *gwv1.ParentReference) { r.Port = port(8080) }, nil, want{"Accepted", true, "Accepted"}, map[string]int32{"selector": 1, "all": 0}},
		{"no such port", "a", func(r *gwv1.ParentReference) { r.Port = port(81) }, nil, want{"Accepted", false, "NoMatchingParent"}, nil},
		{"hostname only the all listener has", "b", nil, []gwv1.Hostname{"x.all.example"}, want{"Accepted", true, "Accepted"}, map[string]int32{"all": 1}},
		{"no hostname in common", "b", nil, []gwv1.Hostname{"x.example.org"}, want{"Accepted", false, "NoMatchingListenerHostname"}, map[string]int32{"all": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := world(
				httpListener("same", 80, "", gwv1.NamespacesFromSame),
				httpListener("selector", 8080, "", gwv1.NamespacesFromSelector),
				httpListener("all", 9090, "*.all.example", gwv1.NamespacesFromAll),
			)
			in.Gateways[0].Spec.Listeners[1].AllowedRoutes.Namespaces.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
			r := httpRoute(tc.ns, "r", svcRef("", "svc", 80, 1))
			r.Spec.Hostnames = tc.hostnames
			if tc.ref != nil {
				tc.ref(&r.Spec.ParentRefs[0])
			}
			in.HTTPRoutes = []*gwv1.HTTPRoute{r}
			out := Compile(in)
			conds := parentConds(t, out, tc.ns, "r")
			checkConds(t, "route", conds, 5, tc.want)
			for _, l := range out.Gateways[nn("gw", "gw")].Listeners {
				if n, ok := tc.attached[string(l.Name)]; ok && l.AttachedRoutes != n {
					t.Errorf("listener %s attachedRoutes %d, want %d", l.Name, l.AttachedRoutes, n)
				}
			}
		})
	}
}

// TestListenerIsolation: a request reaches only the routes of the listener
// with the most specific hostname that matches it, even when a route on a
// wider listener names that host, and even when that listener has no route.
func TestListenerIsolation(t *testing.T) {
	in := world(
		httpListener("any", 80, "", gwv1.NamespacesFromAll),
		httpListener("wild", 80, "*.example.com", gwv1.NamespacesFromAll),
		httpListener("exact", 80, "quiet.example.com", gwv1.NamespacesFromAll),
	)
	section := func(r *gwv1.HTTPRoute, s string, hosts ...gwv1.Hostname) *gwv1.HTTPRoute {
		r.Spec.ParentRefs[0].SectionName = ptrTo(gwv1.SectionName(s))
		r.Spec.Hostnames = hosts
		return r
	}
	in.HTTPRoutes = []*gwv1.HTTPRoute{
		section(httpRoute("a", "on-any", svcRef("", "svc", 80, 1)), "any", "a.example.com", "a.example.org"),
		section(httpRoute("b", "on-wild", svcRef("", "svc", 80, 1)), "wild"),
	}
	out := Compile(in)
	for _, tc := range []struct{ host, want string }{
		{"a.example.org", "a/svc"},     // only the catch-all listener matches
		{"a.example.com", "b/svc"},     // *.example.com is more specific than the catch-all
		{"quiet.example.com", "404"},   // its own listener, no routes
		{"other.example.com", "b/svc"}, // the wildcard listener
		{"example.net", "404"},
	} {
		if got := backendOf(lookup(t, out, in, nn("gw", "gw"), 80, tc.host, "/", nil)); got != tc.want {
			t.Errorf("%s -> %s, want %s", tc.host, got, tc.want)
		}
	}
	// The route is still accepted and attached: some of its hostnames are
	// served through the catch-all listener.
	checkConds(t, "on-any", parentConds(t, out, "a", "on-any"), 5, want{"Accepted", true, "Accepted"})
}

func TestNotOurs(t *testing.T) {
	in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
	r := httpRoute("a", "r", svcRef("", "svc", 80, 1))
	r.Spec.ParentRefs[0].Name = "theirs"
	in.HTTPRoutes = []*gwv1.HTTPRoute{r}
	out := Compile(in)
	st, ok := out.HTTPRoutes[nn("a", "r")]
	if !ok || len(st.Parents) != 0 {
		t.Errorf("route to another controller's Gateway: %+v (present %v), want an entry with no parents", st, ok)
	}
	if l := out.Gateways[nn("gw", "gw")].Listeners[0]; l.AttachedRoutes != 0 {
		t.Errorf("attached %d", l.AttachedRoutes)
	}
}

func TestNotProgrammed(t *testing.T) {
	in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
	in.HTTPRoutes = []*gwv1.HTTPRoute{httpRoute("a", "r", svcRef("", "svc", 80, 1))}
	in.Binds = nil
	out := Compile(in)
	st := out.Gateways[nn("gw", "gw")]
	checkConds(t, "gateway", st.Conditions, 2, want{"Accepted", true, "Accepted"}, want{"Programmed", false, "Pending"})
	checkConds(t, "listener", st.Listeners[0].Conditions, 2, want{"Programmed", false, "Pending"})
	if len(out.Table.Ports) != 0 {
		t.Errorf("ports without binds: %v", out.Table.Ports)
	}
	// Routes still attach: the listener is valid, it only waits for its port.
	checkConds(t, "route", parentConds(t, out, "a", "r"), 5, want{"Accepted", true, "Accepted"})

	in = world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
	in.Addresses = nil
	checkConds(t, "gateway", Compile(in).Gateways[nn("gw", "gw")].Conditions, 2, want{"Programmed", false, "AddressNotAssigned"})
}

func TestGatewaySpec(t *testing.T) {
	ip, host := gwv1.IPAddressType, gwv1.HostnameAddressType
	for _, tc := range []struct {
		name    string
		spec    func(*gwv1.GatewaySpec)
		wants   []want
		serving bool
	}{
		{"parametersRef", func(s *gwv1.GatewaySpec) {
			s.Infrastructure = &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "x"}}
		}, []want{{"Accepted", false, "InvalidParameters"}, {"Programmed", false, "Invalid"}}, false},
		{"hostname address", func(s *gwv1.GatewaySpec) {
			s.Addresses = []gwv1.GatewaySpecAddress{{Type: &host, Value: "gw.example.com"}}
		}, []want{{"Accepted", false, "UnsupportedAddress"}, {"Programmed", false, "Invalid"}}, false},
		{"an IP the load balancer did not give", func(s *gwv1.GatewaySpec) {
			s.Addresses = []gwv1.GatewaySpecAddress{{Type: &ip, Value: "10.200.0.77"}}
		}, []want{{"Accepted", true, "Accepted"}, {"Programmed", false, "AddressNotUsable"}}, true},
		{"the IP the load balancer gave", func(s *gwv1.GatewaySpec) {
			s.Addresses = []gwv1.GatewaySpecAddress{{Value: "10.200.0.1"}}
		}, []want{{"Accepted", true, "Accepted"}, {"Programmed", true, "Programmed"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
			tc.spec(&in.Gateways[0].Spec)
			in.HTTPRoutes = []*gwv1.HTTPRoute{httpRoute("a", "r", svcRef("", "svc", 80, 1))}
			out := Compile(in)
			st := out.Gateways[nn("gw", "gw")]
			checkConds(t, "gateway", st.Conditions, 2, tc.wants...)
			if !tc.serving {
				checkConds(t, "listener", st.Listeners[0].Conditions, 2, want{"Programmed", false, "Invalid"})
			}
			if got := backendOf(lookup(t, out, in, nn("gw", "gw"), 80, "x", "/", nil)); (got == "a/svc") != tc.serving {
				t.Errorf("request -> %s, serving %v", got, tc.serving)
			}
		})
	}
}

func TestRouteValues(t *testing.T) {
	prefix, regex := gwv1.PathMatchPathPrefix, gwv1.PathMatchRegularExpression
	for _, tc := range []struct {
		name  string
		rule  gwv1.HTTPRouteRule
		want  want
		check func(t *testing.T, a *table.Action)
	}{
		{"CORS is not supported", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterCORS, CORS: &gwv1.HTTPCORSFilter{}}}},
			want{"Accepted", false, "UnsupportedValue"}, nil},
		{"bad regular expression", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &regex, Value: ptrTo("/(")}}}},
			want{"Accepted", false, "UnsupportedValue"}, nil},
		{"bad timeout", gwv1.HTTPRouteRule{Timeouts: &gwv1.HTTPRouteTimeouts{Request: ptrTo(gwv1.Duration("soon"))}},
			want{"Accepted", false, "UnsupportedValue"}, nil},
		{"redirect and rewrite", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{
			{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{}},
			{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{}}}},
			want{"Accepted", false, "IncompatibleFilters"}, nil},
		{"timeouts and retry", gwv1.HTTPRouteRule{
			Timeouts: &gwv1.HTTPRouteTimeouts{Request: ptrTo(gwv1.Duration("10s")), BackendRequest: ptrTo(gwv1.Duration("500ms"))},
			Retry:    &gwv1.HTTPRouteRetry{Codes: []gwv1.HTTPRouteRetryStatusCode{502, 503}, Attempts: ptrTo(2), Backoff: ptrTo(gwv1.Duration("100ms"))}},
			want{"Accepted", true, "Accepted"}, func(t *testing.T, a *table.Action) {
				if a.Timeout != 10*time.Second || a.BackendTimeout != 500*time.Millisecond ||
					a.Retry == nil || !slices.Equal(a.Retry.Codes, []int{502, 503}) || a.Retry.Attempts != 2 || a.Retry.Backoff != 100*time.Millisecond {
					t.Errorf("action %+v retry %+v", a, a.Retry)
				}
			}},
		{"redirect replacing the prefix", gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &prefix, Value: ptrTo("/old")}}},
			Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
				Scheme: ptrTo("https"), Port: ptrTo(gwv1.PortNumber(8443)), StatusCode: ptrTo(301),
				Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptrTo("/new")}}}}},
			want{"Accepted", true, "Accepted"}, func(t *testing.T, a *table.Action) {
				rd := a.Redirect
				if rd == nil || rd.Scheme != "https" || rd.Port != 8443 || rd.StatusCode != 301 || rd.Path == nil ||
					rd.Path.FullSet || rd.Path.ReplacePrefix != "/new" || rd.Path.Prefix != "/old" {
					t.Errorf("redirect %+v path %+v", rd, rd.Path)
				}
			}},
		{"rewrite and mirrors", gwv1.HTTPRouteRule{
			Filters: []gwv1.HTTPRouteFilter{
				{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{Hostname: ptrTo(gwv1.PreciseHostname("in.example")),
					Path: &gwv1.HTTPPathModifier{Type: gwv1.FullPathHTTPPathModifier, ReplaceFullPath: ptrTo("/x")}}},
				{Type: gwv1.HTTPRouteFilterRequestMirror, RequestMirror: &gwv1.HTTPRequestMirrorFilter{
					BackendRef: gwv1.BackendObjectReference{Name: "svc", Port: ptrTo(gwv1.PortNumber(80))}, Fraction: &gwv1.Fraction{Numerator: 1, Denominator: ptrTo(int32(4))}}},
				{Type: gwv1.HTTPRouteFilterRequestMirror, RequestMirror: &gwv1.HTTPRequestMirrorFilter{
					BackendRef: gwv1.BackendObjectReference{Name: "svc", Port: ptrTo(gwv1.PortNumber(80))}}},
				{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{
					Add: []gwv1.HTTPHeader{{Name: "x-added", Value: "1"}}, Remove: []string{"x-gone"}}},
			}},
			want{"Accepted", true, "Accepted"}, func(t *testing.T, a *table.Action) {
				rw := a.Rewrite
				if rw == nil || rw.Hostname != "in.example" || rw.Path == nil || !rw.Path.FullSet || rw.Path.Full != "/x" {
					t.Errorf("rewrite %+v", rw)
				}
				if len(a.Mirrors) != 2 || a.Mirrors[0].Percent != 25 || a.Mirrors[1].Percent != 100 || a.Mirrors[0].Backend.Name != "a/svc:80" {
					t.Errorf("mirrors %+v", a.Mirrors)
				}
				if f := a.ResponseHeaders; len(f.Add) != 1 || f.Add[0].Name != "X-Added" || !slices.Equal(f.Remove, []string{"X-Gone"}) {
					t.Errorf("response headers %+v", f)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
			r := httpRoute("a", "r", svcRef("", "svc", 80, 1))
			tc.rule.BackendRefs = r.Spec.Rules[0].BackendRefs
			r.Spec.Rules[0] = tc.rule
			in.HTTPRoutes = []*gwv1.HTTPRoute{r}
			out := Compile(in)
			checkConds(t, "route", parentConds(t, out, "a", "r"), 5, tc.want)
			rule := lookup(t, out, in, nn("gw", "gw"), 80, "x", "/old/y", nil)
			if !tc.want.status {
				if rule != nil {
					t.Errorf("a route not accepted is in the table: %+v", rule)
				}
				return
			}
			tc.check(t, rule.Action)
		})
	}
}

// TestPartiallyInvalid: a rule with an unsupported value is dropped and
// the route says so; the other rules serve.
func TestPartiallyInvalid(t *testing.T) {
	exact := gwv1.PathMatchExact
	in := world(httpListener("http", 80, "", gwv1.NamespacesFromAll))
	r := httpRoute("a", "r", svcRef("", "svc", 80, 1))
	good := r.Spec.Rules[0]
	good.Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &exact, Value: ptrTo("/good")}}}
	bad := good
	bad.Name = ptrTo(gwv1.SectionName("cors"))
	bad.Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &exact, Value: ptrTo("/bad")}}}
	bad.Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterCORS, CORS: &gwv1.HTTPCORSFilter{}}}
	r.Spec.Rules = []gwv1.HTTPRouteRule{good, bad}
	in.HTTPRoutes = []*gwv1.HTTPRoute{r}
	out := Compile(in)
	conds := parentConds(t, out, "a", "r")
	checkConds(t, "route", conds, 5, want{"Accepted", true, "Accepted"}, want{"PartiallyInvalid", true, "UnsupportedValue"})
	if msg := conds[2].Message; !strings.HasPrefix(msg, "Dropped Rule") || !strings.Contains(msg, "cors") {
		t.Errorf("message %q", msg)
	}
	if got := backendOf(lookup(t, out, in, nn("gw", "gw"), 80, "x", "/good", nil)); got != "a/svc" {
		t.Errorf("/good -> %s", got)
	}
	if got := backendOf(lookup(t, out, in, nn("gw", "gw"), 80, "x", "/bad", nil)); got != "404" {
		t.Errorf("/bad -> %s, want the rule dropped", got)
	}
	// Valid again: no PartiallyInvalid at all (it is only ever True).
	r.Spec.Rules = r.Spec.Rules[:1]
	if conds := parentConds(t, Compile(in), "a", "r"); len(conds) != 2 {
		t.Errorf("conditions %v", conds)
	}
}

// TestDeterministic compiles the same objects in two orders, and checks
// that Compile leaves its input alone (it holds the informers' objects).
func TestDeterministic(t *testing.T) {
	files := []string{"httproute-hostname-intersection.yaml", "httproute-matching-across-routes.yaml", "httproute-reference-grant.yaml", "gateway-modify-listeners.yaml"}
	in := loadConformance(t, files...)
	a := Compile(in)
	if !reflect.DeepEqual(in, loadConformance(t, files...)) {
		t.Error("Compile modified its input")
	}
	shuffled := *in
	rng := rand.New(rand.NewPCG(1, 2))
	shuffled.HTTPRoutes = slices.Clone(in.HTTPRoutes)
	shuffled.Gateways = slices.Clone(in.Gateways)
	shuffled.EndpointSlices = slices.Clone(in.EndpointSlices)
	rng.Shuffle(len(shuffled.HTTPRoutes), reflect.Swapper(shuffled.HTTPRoutes))
	rng.Shuffle(len(shuffled.Gateways), reflect.Swapper(shuffled.Gateways))
	rng.Shuffle(len(shuffled.EndpointSlices), reflect.Swapper(shuffled.EndpointSlices))
	b := Compile(&shuffled)
	for _, f := range []func(*Output) any{
		func(o *Output) any { return o.GatewayClasses }, func(o *Output) any { return o.Gateways },
		func(o *Output) any { return o.HTTPRoutes }, func(o *Output) any { return dumpTable(o.Table) },
	} {
		if !reflect.DeepEqual(f(a), f(b)) {
			t.Errorf("outputs differ:\n%v\n%v", f(a), f(b))
		}
	}
}

// dumpTable writes each port's hosts and rules in lookup order.
func dumpTable(tb *table.Table) string {
	var sb strings.Builder
	binds := slices.Sorted(func(yield func(int32) bool) {
		for b := range tb.Ports {
			if !yield(b) {
				return
			}
		}
	})
	for _, bind := range binds {
		p := tb.Ports[bind]
		hosts := slices.Sorted(func(yield func(string) bool) {
			for h := range p.Exact {
				if !yield(h) {
					return
				}
			}
		})
		var all []*table.Host
		for _, h := range hosts {
			all = append(all, p.Exact[h])
		}
		all = append(all, p.Wildcards...)
		if p.Any != nil {
			all = append(all, p.Any)
		}
		for _, h := range all {
			for _, r := range h.Rules {
				sb.WriteString(strings.Join([]string{strconv.Itoa(int(bind)), h.Name, r.RouteKey, string(r.Match.Path.Type), r.Match.Path.Value, backendOf(r)}, " "))
				sb.WriteByte('\n')
			}
		}
	}
	return sb.String()
}
