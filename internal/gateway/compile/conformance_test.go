package compile

import (
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

const (
	infra = "gateway-conformance-infra"
	web   = "gateway-conformance-web-backend"
	app   = "gateway-conformance-app-backend"
)

// want is one expected condition; Reason "" takes any reason.
type want struct {
	typ    string
	status bool
	reason string
}

func checkConds(t *testing.T, what string, got []metav1.Condition, gen int64, wants ...want) {
	t.Helper()
	for _, c := range got {
		if c.ObservedGeneration != gen {
			t.Errorf("%s: condition %s has observedGeneration %d, want %d", what, c.Type, c.ObservedGeneration, gen)
		}
		if !c.LastTransitionTime.IsZero() {
			t.Errorf("%s: condition %s has a transition time", what, c.Type)
		}
	}
	for _, w := range wants {
		found := false
		for _, c := range got {
			if c.Type != w.typ {
				continue
			}
			found = true
			st := metav1.ConditionFalse
			if w.status {
				st = metav1.ConditionTrue
			}
			if c.Status != st || (w.reason != "" && c.Reason != w.reason) {
				t.Errorf("%s: %s is %s/%s (%s), want %s/%s", what, w.typ, c.Status, c.Reason, c.Message, st, w.reason)
			}
		}
		if !found {
			t.Errorf("%s: no %s condition in %v", what, w.typ, got)
		}
	}
}

func gwKey(name string) types.NamespacedName { return nn(infra, name) }

// gatewayReady checks what NamespacesMustBeReady wants of a Gateway.
func gatewayReady(t *testing.T, out *Output, name string) {
	t.Helper()
	st, ok := out.Gateways[gwKey(name)]
	if !ok {
		t.Fatalf("no status for Gateway %s", name)
	}
	checkConds(t, "Gateway "+name, st.Conditions, 1, want{"Accepted", true, ""}, want{"Programmed", true, ""})
	if len(st.Addresses) != 1 || st.Addresses[0].Value != testAddress || *st.Addresses[0].Type != gwv1.IPAddressType {
		t.Errorf("Gateway %s addresses %v", name, st.Addresses)
	}
}

func listenerOf(t *testing.T, out *Output, gw, name string) gwv1.ListenerStatus {
	t.Helper()
	for _, l := range out.Gateways[gwKey(gw)].Listeners {
		if string(l.Name) == name {
			return l
		}
	}
	t.Fatalf("Gateway %s has no listener %s in status", gw, name)
	return gwv1.ListenerStatus{}
}

func checkListener(t *testing.T, out *Output, gw, name string, kinds []string, attached int32, wants ...want) {
	t.Helper()
	l := listenerOf(t, out, gw, name)
	var got []string
	for _, k := range l.SupportedKinds {
		got = append(got, string(k.Kind))
	}
	if len(kinds) == 0 && len(got) != 0 || len(kinds) > 0 && !containsAll(got, kinds) {
		t.Errorf("Gateway %s listener %s supportedKinds %v, want %v", gw, name, got, kinds)
	}
	if l.AttachedRoutes != attached {
		t.Errorf("Gateway %s listener %s attachedRoutes %d, want %d", gw, name, l.AttachedRoutes, attached)
	}
	checkConds(t, "Gateway "+gw+" listener "+name, l.Conditions, 1, wants...)
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		ok := false
		for _, h := range have {
			ok = ok || h == w
		}
		if !ok {
			return false
		}
	}
	return true
}

// checkRoute checks the parents entry of an HTTPRoute for a Gateway.
func checkRoute(t *testing.T, out *Output, route types.NamespacedName, gw string, wants ...want) {
	t.Helper()
	st, ok := out.HTTPRoutes[route]
	if !ok {
		t.Fatalf("no status for HTTPRoute %s", route)
	}
	for _, p := range st.Parents {
		ns := route.Namespace
		if p.ParentRef.Namespace != nil {
			ns = string(*p.ParentRef.Namespace)
		}
		if string(p.ParentRef.Name) == gw && ns == infra {
			if p.ControllerName != ControllerName || *p.ParentRef.Group != gwv1.GroupName || *p.ParentRef.Kind != "Gateway" {
				t.Errorf("HTTPRoute %s parent %+v", route, p)
			}
			checkConds(t, "HTTPRoute "+route.String(), p.Conditions, 1, wants...)
			return
		}
	}
	t.Errorf("HTTPRoute %s has no parent %s: %+v", route, gw, st.Parents)
}

var accepted = want{"Accepted", true, "Accepted"}
var resolved = want{"ResolvedRefs", true, ""}

// request is one request and the backend the suite expects ("404", "500"
// or "namespace/service").
type request struct {
	gw     string
	port   int32
	host   string
	path   string
	header http.Header
	want   string
}

func checkRequests(t *testing.T, in *Input, out *Output, reqs ...request) {
	t.Helper()
	for _, r := range reqs {
		port := r.port
		if port == 0 {
			port = 80
		}
		got := backendOf(lookup(t, out, in, gwKey(r.gw), port, r.host, r.path, r.header))
		if got != r.want {
			t.Errorf("%s:%d %s%s %v -> %s, want %s", r.gw, port, r.host, r.path, r.header, got, r.want)
		}
	}
}

var httpKinds = []string{"HTTPRoute"}

// TestConformanceCore runs the statuses and routing of the suite's
// GATEWAY-HTTP core tests on their own manifests.
func TestConformanceCore(t *testing.T) {
	tests := []struct {
		name  string
		files []string
		check func(t *testing.T, in *Input, out *Output)
	}{
		{"GatewayClassObservedGenerationBump", []string{"gatewayclass-observed-generation-bump.yaml"}, func(t *testing.T, in *Input, out *Output) {
			st := out.GatewayClasses["flatnet"]
			checkConds(t, "GatewayClass", st.Conditions, 1, want{"Accepted", true, "Accepted"})
			if len(st.SupportedFeatures) == 0 {
				t.Error("no supportedFeatures")
			}
			if _, ok := out.GatewayClasses["gatewayclass-observed-generation-bump"]; ok {
				t.Error("a class of another controller got a status")
			}
		}},
		{"GatewayInvalidRouteKind", []string{"gateway-invalid-route-kind.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-only-invalid-route-kind", "http", nil, 0, want{"ResolvedRefs", false, "InvalidRouteKinds"})
			checkListener(t, out, "gateway-supported-and-invalid-route-kind", "http", httpKinds, 0, want{"ResolvedRefs", false, "InvalidRouteKinds"})
		}},
		{"GatewayInvalidTLSConfiguration", []string{"gateway-invalid-tls-configuration.yaml"}, func(t *testing.T, in *Input, out *Output) {
			for _, gw := range []string{"gateway-certificate-nonexistent-secret", "gateway-certificate-unsupported-group",
				"gateway-certificate-unsupported-kind", "gateway-certificate-malformed-secret"} {
				checkListener(t, out, gw, "https", httpKinds, 0, want{"ResolvedRefs", false, "InvalidCertificateRef"})
			}
		}},
		{"GatewayListenerUnsupportedProtocol", []string{"gateway-invalid-listeners-unsupported-protocol.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkConds(t, "Gateway", out.Gateways[gwKey("gateway-only-unsupported-protocols")].Conditions, 1, want{"Accepted", false, "ListenersNotValid"})
			checkListener(t, out, "gateway-only-unsupported-protocols", "invalid", nil, 0, want{"Accepted", false, "UnsupportedProtocol"})
			checkConds(t, "Gateway", out.Gateways[gwKey("gateway-supported-and-unsupported-protocols")].Conditions, 1, want{"Accepted", true, "ListenersNotValid"})
			gatewayReady(t, out, "gateway-supported-and-unsupported-protocols")
			checkListener(t, out, "gateway-supported-and-unsupported-protocols", "http", httpKinds, 0, want{"Accepted", true, "Accepted"})
			checkListener(t, out, "gateway-supported-and-unsupported-protocols", "invalid", nil, 0, want{"Accepted", false, "UnsupportedProtocol"})
		}},
		{"GatewayModifyListeners", []string{"gateway-modify-listeners.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gatewayReady(t, out, "gateway-add-listener")
			checkListener(t, out, "gateway-add-listener", "https", httpKinds, 1, want{"Accepted", true, ""}, want{"ResolvedRefs", true, ""})
			gatewayReady(t, out, "gateway-remove-listener")
			checkListener(t, out, "gateway-remove-listener", "https", httpKinds, 1, want{"Accepted", true, ""}, want{"ResolvedRefs", true, ""})
			checkListener(t, out, "gateway-remove-listener", "http", httpKinds, 1, want{"Accepted", true, ""}, want{"ResolvedRefs", true, ""})
		}},
		{"GatewayObservedGenerationBump", []string{"gateway-observed-generation-bump.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gatewayReady(t, out, "gateway-observed-generation-bump")
		}},
		{"GatewaySecretInvalidReferenceGrant", []string{"gateway-secret-invalid-reference-grant.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-secret-invalid-reference-grant", "https", httpKinds, 0, want{"ResolvedRefs", false, "RefNotPermitted"})
		}},
		{"GatewaySecretMissingReferenceGrant", []string{"gateway-secret-missing-reference-grant.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-secret-missing-reference-grant", "https", httpKinds, 0, want{"ResolvedRefs", false, "RefNotPermitted"})
		}},
		{"GatewaySecretReferenceGrantAllInNamespace", []string{"gateway-secret-reference-grant-all-in-namespace.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-secret-reference-grant-all-in-namespace", "https", httpKinds, 0,
				want{"Programmed", true, "Programmed"}, want{"ResolvedRefs", true, ""})
		}},
		{"GatewaySecretReferenceGrantSpecific", []string{"gateway-secret-reference-grant-specific.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-secret-reference-grant-specific", "https", httpKinds, 0,
				want{"Programmed", true, "Programmed"}, want{"ResolvedRefs", true, ""})
		}},
		{"GatewayWithAttachedRoutes", []string{"gateway-with-attached-routes.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkListener(t, out, "gateway-with-one-attached-route", "http", httpKinds, 1, want{"Accepted", true, ""}, want{"ResolvedRefs", true, ""})
			checkListener(t, out, "gateway-with-two-attached-routes", "http", httpKinds, 2, want{"Accepted", true, ""}, want{"ResolvedRefs", true, ""})
			checkRoute(t, out, nn(infra, "http-route-not-accepted"), "gateway-with-two-attached-routes", want{"Accepted", false, "NoMatchingListenerHostname"})
			checkListener(t, out, "unresolved-gateway-with-one-attached-unresolved-route", "tls", httpKinds, 1,
				want{"Programmed", false, ""}, want{"ResolvedRefs", false, ""})
			checkRoute(t, out, nn(infra, "http-route-4"), "unresolved-gateway-with-one-attached-unresolved-route", want{"ResolvedRefs", false, ""})
		}},
		{"GatewayHTTPListenerIsolation (extended)", []string{"gateway-http-listener-isolation.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gw, v1 := "http-listener-isolation", infra+"/infra-backend-v1"
			paths := []string{"/empty-hostname", "/wildcard-example-com", "/wildcard-foo-example-com", "/abc-foo-example-com"}
			for i, host := range []string{"bar.com", "bar.example.com", "bar.foo.example.com", "abc.foo.example.com"} {
				for j, path := range paths {
					want := "404"
					if i == j {
						want = v1
					}
					checkRequests(t, in, out, request{gw: gw, host: host, path: path, want: want})
				}
			}
		}},
		{"HTTPRouteCrossNamespace", []string{"httproute-cross-namespace.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gatewayReady(t, out, "backend-namespaces")
			checkRoute(t, out, nn(web, "cross-namespace"), "backend-namespaces", accepted, resolved)
			checkRequests(t, in, out, request{gw: "backend-namespaces", path: "/", want: web + "/web-backend"})
		}},
		{"HTTPRouteExactPathMatching", []string{"httproute-exact-path-matching.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "exact-matching"), "same-namespace", accepted, resolved)
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/one", want: infra + "/infra-backend-v1"},
				request{gw: "same-namespace", path: "/two", want: infra + "/infra-backend-v2"},
				request{gw: "same-namespace", path: "/", want: "404"},
				request{gw: "same-namespace", path: "/one/example", want: "404"},
				request{gw: "same-namespace", path: "/two/", want: "404"},
			)
		}},
		{"HTTPRouteHTTPSListener", []string{"httproute-https-listener.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gatewayReady(t, out, "same-namespace-with-https-listener")
			for _, l := range out.Gateways[gwKey("same-namespace-with-https-listener")].Listeners {
				checkConds(t, "listener "+string(l.Name), l.Conditions, 1, want{"Accepted", true, ""}, want{"Programmed", true, ""}, want{"ResolvedRefs", true, ""})
			}
			p := out.Table.Ports[in.Binds[BindKey{Gateway: gwKey("same-namespace-with-https-listener"), Port: 443}]]
			if p == nil || p.Protocol != "HTTPS" || len(p.Certs) != 4 {
				t.Fatalf("HTTPS port %+v", p)
			}
			gw := "same-namespace-with-https-listener"
			checkRoute(t, out, nn(infra, "httproute-https-test"), gw, accepted, resolved)
			checkRoute(t, out, nn(infra, "httproute-https-test-no-hostname"), gw, accepted, resolved)
			checkRequests(t, in, out,
				request{gw: gw, port: 443, host: "example.org", path: "/", want: infra + "/infra-backend-v1"},
				request{gw: gw, port: 443, host: "second-example.org", path: "/", want: infra + "/infra-backend-v2"},
				request{gw: gw, port: 443, host: "unknown-example.org", path: "/", want: "404"},
			)
		}},
		{"HTTPRouteHeaderMatching", []string{"httproute-header-matching.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "header-matching"), "same-namespace", accepted, resolved)
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"one"}}, want: infra + "/infra-backend-v1"},
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"two"}}, want: infra + "/infra-backend-v2"},
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"two"}, "Color": {"orange"}}, want: infra + "/infra-backend-v1"},
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"three"}}, want: "404"},
			)
		}},
		{"HTTPRouteHostnameIntersection", []string{"httproute-hostname-intersection.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gw := "httproute-hostname-intersection"
			gatewayReady(t, out, gw)
			for _, r := range []string{"specific-host-matches-listener-specific-host", "specific-host-matches-listener-wildcard-host",
				"wildcard-host-matches-listener-specific-host", "wildcard-host-matches-listener-wildcard-host"} {
				checkRoute(t, out, nn(infra, r), gw, accepted, resolved)
			}
			checkRoute(t, out, nn(infra, "no-intersecting-hosts"), gw, want{"Accepted", false, "NoMatchingListenerHostname"})
			checkListener(t, out, gw, "listener-1", httpKinds, 2)
			checkListener(t, out, gw, "listener-2", httpKinds, 1)
			checkListener(t, out, gw, "listener-3", httpKinds, 1)
			v1, v2, v3 := infra+"/infra-backend-v1", infra+"/infra-backend-v2", infra+"/infra-backend-v3"
			checkRequests(t, in, out,
				request{gw: gw, host: "very.specific.com", path: "/s1", want: v1},
				request{gw: gw, host: "very.specific.com:1234", path: "/s1", want: v1},
				request{gw: gw, host: "non.matching.com", path: "/s1", want: "404"},
				request{gw: gw, host: "foo.nonmatchingwildcard.io", path: "/s1", want: "404"},
				request{gw: gw, host: "foo.wildcard.io", path: "/s1", want: "404"},
				request{gw: gw, host: "very.specific.com", path: "/non-matching-prefix", want: "404"},
				request{gw: gw, host: "foo.wildcard.io", path: "/s2", want: v2},
				request{gw: gw, host: "bar.wildcard.io", path: "/s2", want: v2},
				request{gw: gw, host: "foo.bar.wildcard.io", path: "/s2", want: v2},
				request{gw: gw, host: "wildcard.io", path: "/s2", want: "404"},
				request{gw: gw, host: "very.specific.com", path: "/s2", want: "404"},
				request{gw: gw, host: "very.specific.com", path: "/s3", want: v3},
				request{gw: gw, host: "foo.specific.com", path: "/s3", want: "404"},
				request{gw: gw, host: "foo.anotherwildcard.io", path: "/s4", want: v1},
				request{gw: gw, host: "foo.bar.anotherwildcard.io", path: "/s4", want: v1},
				request{gw: gw, host: "anotherwildcard.io", path: "/s4", want: "404"},
				request{gw: gw, host: "foo.wildcard.io", path: "/s4", want: "404"},
				request{gw: gw, host: "specific.but.wrong.com", path: "/s5", want: "404"},
				request{gw: gw, host: "wildcard.io", path: "/s5", want: "404"},
			)
			all := "httproute-hostname-intersection-all"
			gatewayReady(t, out, all)
			checkRoute(t, out, nn(infra, all), all, accepted, resolved)
			checkRequests(t, in, out,
				request{gw: all, host: "first.com", path: "/", want: v2},
				request{gw: all, host: "sub.first.com", path: "/", want: v2},
				request{gw: all, host: "second.com", path: "/", want: v2},
				request{gw: all, host: "sub.second.com", path: "/", want: v2},
				request{gw: all, host: "third.com", path: "/", want: "404"},
				request{gw: all, host: "sub.third.com", path: "/", want: "404"},
			)
		}},
		{"HTTPRouteInvalidBackendRefUnknownKind", []string{"httproute-invalid-backendref-unknown-kind.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "invalid-backend-ref-unknown-kind"), "same-namespace", accepted, want{"ResolvedRefs", false, "InvalidKind"})
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/v2", want: "500"})
		}},
		{"HTTPRouteInvalidCrossNamespaceBackendRef", []string{"httproute-invalid-cross-namespace-backend-ref.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "invalid-cross-namespace-backend-ref"), "same-namespace", accepted, want{"ResolvedRefs", false, "RefNotPermitted"})
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/", want: "500"})
		}},
		{"HTTPRouteInvalidCrossNamespaceParentRef", []string{"httproute-invalid-cross-namespace-parent-ref.yaml"}, func(t *testing.T, in *Input, out *Output) {
			r := nn(web, "invalid-cross-namespace-parent-ref")
			checkRoute(t, out, r, "same-namespace", want{"Accepted", false, "NotAllowedByListeners"}, resolved)
			if n := len(out.HTTPRoutes[r].Parents); n != 1 {
				t.Errorf("%d parents", n)
			}
			checkListener(t, out, "same-namespace", "http", httpKinds, 0)
		}},
		{"HTTPRouteInvalidNonExistentBackendRef", []string{"httproute-invalid-nonexistent-backendref.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "invalid-nonexistent-backend-ref"), "same-namespace", accepted, want{"ResolvedRefs", false, "BackendNotFound"})
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/", want: "500"})
		}},
		{"HTTPRouteInvalidParentRefNotMatchingSectionName", []string{"httproute-invalid-parentref-not-matching-section-name.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "httproute-listener-not-matching-section-name"), "same-namespace", want{"Accepted", false, "NoMatchingParent"})
			checkListener(t, out, "same-namespace", "http", httpKinds, 0)
		}},
		{"HTTPRouteInvalidReferenceGrant", []string{"httproute-invalid-reference-grant.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "reference-grant"), "same-namespace", accepted, want{"ResolvedRefs", false, "RefNotPermitted"})
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/", want: "500"})
		}},
		{"HTTPRouteListenerHostnameMatching", []string{"httproute-listener-hostname-matching.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gw := "httproute-listener-hostname-matching"
			gatewayReady(t, out, gw)
			v1, v2, v3 := infra+"/infra-backend-v1", infra+"/infra-backend-v2", infra+"/infra-backend-v3"
			checkRequests(t, in, out,
				request{gw: gw, host: "bar.com", path: "/", want: v1},
				request{gw: gw, host: "foo.bar.com", path: "/", want: v2},
				request{gw: gw, host: "baz.bar.com", path: "/", want: v3},
				request{gw: gw, host: "boo.bar.com", path: "/", want: v3},
				request{gw: gw, host: "multiple.prefixes.bar.com", path: "/", want: v3},
				request{gw: gw, host: "multiple.prefixes.foo.com", path: "/", want: v3},
				request{gw: gw, host: "foo.com", path: "/", want: "404"},
				request{gw: gw, host: "no.matching.host", path: "/", want: "404"},
			)
		}},
		{"HTTPRouteMatching", []string{"httproute-matching.yaml"}, func(t *testing.T, in *Input, out *Output) {
			v1, v2 := infra+"/infra-backend-v1", infra+"/infra-backend-v2"
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/", want: v1},
				request{gw: "same-namespace", path: "/example", want: v1},
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"one"}}, want: v1},
				request{gw: "same-namespace", path: "/v2", want: v2},
				request{gw: "same-namespace", path: "/v2/example", want: v2},
				request{gw: "same-namespace", path: "/", header: http.Header{"Version": {"two"}}, want: v2},
			)
		}},
		{"HTTPRouteMatchingAcrossRoutes", []string{"httproute-matching-across-routes.yaml"}, func(t *testing.T, in *Input, out *Output) {
			v1, v2 := infra+"/infra-backend-v1", infra+"/infra-backend-v2"
			checkRequests(t, in, out,
				request{gw: "same-namespace", host: "example.com", path: "/", want: v1},
				request{gw: "same-namespace", host: "example.com", path: "/example", want: v1},
				request{gw: "same-namespace", host: "example.net", path: "/", want: v1},
				request{gw: "same-namespace", host: "example.com", path: "/", header: http.Header{"Version": {"one"}}, want: v1},
				request{gw: "same-namespace", host: "example.com", path: "/v2", header: http.Header{"Version": {"two"}}, want: v2},
				request{gw: "same-namespace", host: "example.com", path: "/v2", want: v2},
				request{gw: "same-namespace", host: "example.com", path: "/v2/example", want: v2},
				request{gw: "same-namespace", host: "example.com", path: "/", header: http.Header{"Version": {"two"}}, want: v2},
				request{gw: "same-namespace", host: "example.net", path: "/v2", want: v1},
				request{gw: "same-namespace", host: "example.net", path: "/", header: http.Header{"Version": {"two"}}, want: v1},
			)
		}},
		{"HTTPRouteMultipleGateways", []string{"httproute-multiple-gateways.yaml"}, func(t *testing.T, in *Input, out *Output) {
			v1, v2, v3 := infra+"/infra-backend-v1", infra+"/infra-backend-v2", infra+"/infra-backend-v3"
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/shared", want: v1},
				request{gw: "same-namespace", path: "/", want: v2},
				request{gw: "all-namespaces", path: "/shared", want: v1},
				request{gw: "all-namespaces", path: "/", want: v3},
			)
		}},
		{"HTTPRouteNoBackendRefs", []string{"httproute-omitted-backendrefs.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "omitted-backendrefs"), "same-namespace", accepted, resolved)
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/forward", want: infra + "/infra-backend-v1"},
				request{gw: "same-namespace", path: "/omitted-no-forward", want: "500"},
				request{gw: "same-namespace", path: "/empty-no-forward", want: "500"},
			)
		}},
		{"HTTPRouteObservedGenerationBump", []string{"httproute-observed-generation-bump.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "observed-generation-bump"), "same-namespace", accepted, resolved)
		}},
		{"HTTPRoutePartiallyInvalidViaInvalidReferenceGrant", []string{"httproute-partially-invalid-via-invalid-reference-grant.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "invalid-reference-grant"), "same-namespace", accepted, want{"ResolvedRefs", false, "RefNotPermitted"})
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/v2", want: "500"},
				request{gw: "same-namespace", path: "/", want: app + "/app-backend-v1"},
			)
		}},
		{"HTTPRoutePathMatchOrder", []string{"httproute-path-match-order.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "path-matching-order"), "same-namespace", accepted, resolved)
			v1, v2, v3 := infra+"/infra-backend-v1", infra+"/infra-backend-v2", infra+"/infra-backend-v3"
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/match/exact/one", want: v3},
				request{gw: "same-namespace", path: "/match/exact", want: v2},
				request{gw: "same-namespace", path: "/match", want: v1},
				request{gw: "same-namespace", path: "/match/prefix/one/any", want: v2},
				request{gw: "same-namespace", path: "/match/prefix/any", want: v1},
				request{gw: "same-namespace", path: "/match/any", want: v3},
			)
		}},
		{"HTTPRouteRedirectHostAndStatus", []string{"httproute-redirect-host-and-status.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "redirect-host-and-status"), "same-namespace", accepted, resolved)
			r := lookup(t, out, in, gwKey("same-namespace"), 80, "", "/hostname-redirect", nil)
			if r == nil || r.Action.Redirect == nil || r.Action.Redirect.Hostname != "example.org" || r.Action.Redirect.StatusCode != 302 {
				t.Errorf("hostname-redirect rule %+v", r)
			}
			r = lookup(t, out, in, gwKey("same-namespace"), 80, "", "/host-and-status", nil)
			if r == nil || r.Action.Redirect == nil || r.Action.Redirect.StatusCode != 301 {
				t.Errorf("host-and-status rule %+v", r)
			}
		}},
		{"HTTPRouteReferenceGrant", []string{"httproute-reference-grant.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "reference-grant"), "same-namespace", accepted, resolved)
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/", want: web + "/web-backend"})
		}},
		{"HTTPRouteRequestHeaderModifier", []string{"httproute-request-header-modifier.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "request-header-modifier"), "same-namespace", accepted, resolved)
			r := lookup(t, out, in, gwKey("same-namespace"), 80, "", "/set", nil)
			if r == nil || len(r.Action.RequestHeaders.Set) != 1 || r.Action.RequestHeaders.Set[0].Name != "X-Header-Set" {
				t.Errorf("set rule %+v", r)
			}
		}},
		{"HTTPRouteServiceTypes", []string{"httproute-service-types.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "service-types"), "same-namespace", accepted, resolved)
			checkRequests(t, in, out,
				request{gw: "same-namespace", path: "/manual-endpointslices", want: infra + "/manual-endpointslices"},
				request{gw: "same-namespace", path: "/headless", want: infra + "/headless"},
			)
		}},
		{"HTTPRouteSimpleSameNamespace", []string{"httproute-simple-same-namespace.yaml"}, func(t *testing.T, in *Input, out *Output) {
			gatewayReady(t, out, "same-namespace")
			checkRoute(t, out, nn(infra, "gateway-conformance-infra-test"), "same-namespace", accepted, resolved)
			checkListener(t, out, "same-namespace", "http", httpKinds, 1, want{"Accepted", true, ""}, want{"Programmed", true, ""}, want{"ResolvedRefs", true, ""})
			checkRequests(t, in, out, request{gw: "same-namespace", path: "/", want: infra + "/infra-backend-v1"})
		}},
		{"HTTPRouteWeight", []string{"httproute-weight.yaml"}, func(t *testing.T, in *Input, out *Output) {
			checkRoute(t, out, nn(infra, "weighted-backends"), "same-namespace", accepted, resolved)
			checkSplit(t, lookup(t, out, in, gwKey("same-namespace"), 80, "", "/", nil), "infra-backend")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := loadConformance(t, tc.files...)
			out := Compile(in)
			// Every base Gateway the suite waits for must be ready.
			for _, gw := range []string{"same-namespace", "all-namespaces", "backend-namespaces", "same-namespace-with-https-listener"} {
				gatewayReady(t, out, gw)
			}
			tc.check(t, in, out)
		})
	}
}

// checkSplit checks the suite's 70/30/0 weights over prefix-v1..v3: the
// smooth weighted round robin gives exactly that over 100 picks.
func checkSplit(t *testing.T, r *table.Rule, prefix string) {
	t.Helper()
	if r == nil || len(r.Action.Backends) != 3 || r.Action.Balancer == nil {
		t.Fatalf("rule %+v", r)
	}
	n := map[string]int{}
	for range 100 {
		n[r.Action.Backends[r.Action.Balancer.Pick()].Name]++
	}
	if n[infra+"/"+prefix+"-v1:8080"] != 70 || n[infra+"/"+prefix+"-v2:8080"] != 30 {
		t.Errorf("100 picks: %v, want 70/30/0", n)
	}
}
