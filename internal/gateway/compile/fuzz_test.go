package compile

import (
	"net/http"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// FuzzCompileRoute feeds user-written route values (hostnames, a path of
// each type, a header match, a redirect path, a timeout, a gRPC method)
// through Compile and a lookup: nothing may panic, and a route is either
// accepted with its rules in the table or rejected with a reason.
func FuzzCompileRoute(f *testing.F) {
	f.Add("foo.example.com", "*.example.com", "/api", "Exact", "x-version", "v[0-9]+", "/new", "10s", "svc.Echo", "/api/x")
	f.Add("", "", "", "RegularExpression", "", "(", "", "-1s", "", "/")
	f.Add("*.a", "a", "/%2F..", "PathPrefix", "Host", ".*", "//", "1h2m", "[", "/%zz")
	f.Fuzz(func(t *testing.T, routeHost, listenerHost, path, pathType, header, headerValue, replace, timeout, method, reqPath string) {
		l := httpListener("http", 80, listenerHost, gwv1.NamespacesFromAll)
		in := world(l)
		r := httpRoute("a", "r", svcRef("", "svc", 80, 1))
		if routeHost != "" {
			r.Spec.Hostnames = []gwv1.Hostname{gwv1.Hostname(routeHost)}
		}
		pt := gwv1.PathMatchType(pathType)
		ht := gwv1.HeaderMatchRegularExpression
		rule := &r.Spec.Rules[0]
		rule.Matches = []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: &pt, Value: &path},
			Headers: []gwv1.HTTPHeaderMatch{{Type: &ht, Name: gwv1.HTTPHeaderName(header), Value: headerValue}}}}
		rule.Filters = []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{
			Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: &replace}}}}
		rule.Timeouts = &gwv1.HTTPRouteTimeouts{Request: ptrTo(gwv1.Duration(timeout))}
		in.HTTPRoutes = []*gwv1.HTTPRoute{r}
		gr := &gwv1.GRPCRoute{ObjectMeta: r.ObjectMeta, Spec: gwv1.GRPCRouteSpec{CommonRouteSpec: r.Spec.CommonRouteSpec,
			Rules: []gwv1.GRPCRouteRule{{Matches: []gwv1.GRPCRouteMatch{{Method: &gwv1.GRPCMethodMatch{
				Type: ptrTo(gwv1.GRPCMethodMatchRegularExpression), Service: &method, Method: &method}}}}}}}
		gr.Name = "g"
		in.GRPCRoutes = []*gwv1.GRPCRoute{gr}
		out := Compile(in)
		st := out.HTTPRoutes[nn("a", "r")]
		if len(st.Parents) != 1 || len(st.Parents[0].Conditions) < 2 || st.Parents[0].Conditions[0].Reason == "" {
			t.Fatalf("status %+v", st)
		}
		if p := out.Table.Ports[20000]; p != nil {
			if h := p.Lookup(routeHost); h != nil {
				req, err := http.NewRequest(http.MethodGet, "http://x/", nil)
				if err == nil {
					req.URL.Path = reqPath
					h.Match(req)
				}
			}
		}
	})
}
