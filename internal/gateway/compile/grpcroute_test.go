package compile

import (
	"net/http"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

const grpcEcho = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/"

// grpcLookup sends a gRPC call (POST, application/grpc) through the table.
func grpcLookup(t *testing.T, out *Output, in *Input, gw, host, method string, md map[string]string) *table.Rule {
	t.Helper()
	p := out.Table.Ports[in.Binds[BindKey{Gateway: gwKey(gw), Port: 80}]]
	if p == nil {
		t.Fatalf("no port for %s", gw)
	}
	h := p.Lookup(host)
	if h == nil {
		return nil
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+host+grpcEcho+method, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	for k, v := range md {
		req.Header.Set(k, v)
	}
	return h.Match(req)
}

func checkGRPCRoute(t *testing.T, out *Output, route types.NamespacedName, gw string, wants ...want) {
	t.Helper()
	st, ok := out.GRPCRoutes[route]
	if !ok || len(st.Parents) == 0 {
		t.Fatalf("GRPCRoute %s status %+v", route, st)
	}
	for _, p := range st.Parents {
		if string(p.ParentRef.Name) == gw {
			checkConds(t, "GRPCRoute "+route.String(), p.Conditions, 1, wants...)
			return
		}
	}
	t.Errorf("GRPCRoute %s has no parent %s", route, gw)
}

// TestConformanceGRPC runs the suite's GATEWAY-GRPC core GRPCRoute tests
// on their manifests: a method or header match picks the backend; no match
// is a 404 (the proxy answers it as gRPC Unimplemented).
func TestConformanceGRPC(t *testing.T) {
	v1, v2, v3 := infra+"/grpc-infra-backend-v1", infra+"/grpc-infra-backend-v2", infra+"/grpc-infra-backend-v3"
	type call struct {
		gw, host, method string
		md               map[string]string
		want             string
	}
	tests := []struct {
		name  string
		file  string
		route string
		calls []call
	}{
		{"GRPCExactMethodMatching", "grpcroute-exact-method-matching.yaml", "exact-matching", []call{
			{method: "Echo", want: v1},
			{method: "EchoTwo", want: v2},
			{method: "EchoThree", want: "404"},
		}},
		{"GRPCRouteHeaderMatching", "grpcroute-header-matching.yaml", "grpc-header-matching", []call{
			{method: "Echo", md: map[string]string{"Version": "one"}, want: v1},
			{method: "Echo", md: map[string]string{"Version": "two"}, want: v2},
			{method: "Echo", md: map[string]string{"Version": "two", "Color": "orange"}, want: v1},
			{method: "Echo", md: map[string]string{"Version": "two", "Color": "blue"}, want: v2},
			{method: "Echo", md: map[string]string{"Color": "orange"}, want: "404"},
			{method: "Echo", md: map[string]string{"Some-Other-Header": "one"}, want: "404"},
			{method: "Echo", md: map[string]string{"Color": "blue"}, want: v1},
			{method: "Echo", md: map[string]string{"Color": "green"}, want: v1},
			{method: "Echo", md: map[string]string{"Color": "red"}, want: v2},
			{method: "Echo", md: map[string]string{"Color": "yellow"}, want: v2},
			{method: "Echo", md: map[string]string{"Color": "purple"}, want: "404"},
		}},
		{"GRPCRouteListenerHostnameMatching", "grpcroute-listener-hostname-matching.yaml", "backend-v1", []call{
			{gw: "grpcroute-listener-hostname-matching", host: "bar.com", method: "Echo", want: v1},
			{gw: "grpcroute-listener-hostname-matching", host: "foo.bar.com", method: "Echo", want: v2},
			{gw: "grpcroute-listener-hostname-matching", host: "baz.bar.com", method: "Echo", want: v3},
			{gw: "grpcroute-listener-hostname-matching", host: "boo.bar.com", method: "Echo", want: v3},
			{gw: "grpcroute-listener-hostname-matching", host: "multiple.prefixes.bar.com", method: "Echo", want: v3},
			{gw: "grpcroute-listener-hostname-matching", host: "multiple.prefixes.foo.com", method: "Echo", want: v3},
			{gw: "grpcroute-listener-hostname-matching", host: "foo.com", method: "Echo", want: "404"},
			{gw: "grpcroute-listener-hostname-matching", host: "no.matching.host", method: "Echo", want: "404"},
		}},
		{"GRPCRouteNamedRule", "grpcroute-named-rule.yaml", "grpc-named-rules", []call{
			{method: "Echo", want: v1},
			{method: "EchoTwo", want: v2},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := loadConformance(t, tc.file)
			out := Compile(in)
			gw := "same-namespace"
			if tc.calls[0].gw != "" {
				gw = tc.calls[0].gw
			}
			gatewayReady(t, out, gw)
			checkGRPCRoute(t, out, nn(infra, tc.route), gw, accepted, resolved)
			for _, c := range tc.calls {
				if c.gw == "" {
					c.gw = "same-namespace"
				}
				r := grpcLookup(t, out, in, c.gw, c.host, c.method, c.md)
				if got := backendOf(r); got != c.want {
					t.Errorf("%s %s %v -> %s, want %s", c.host, c.method, c.md, got, c.want)
				}
				if r != nil && (!r.Action.GRPC || r.Action.Backends[0].Protocol != table.H2C) {
					t.Errorf("%s: action not gRPC over h2c: %+v", c.method, r.Action)
				}
			}
		})
	}
	t.Run("GRPCRouteWeight", func(t *testing.T) {
		in := loadConformance(t, "grpcroute-weight.yaml")
		out := Compile(in)
		checkSplit(t, grpcLookup(t, out, in, "same-namespace", "", "Echo", nil), "grpc-infra-backend")
	})
}
