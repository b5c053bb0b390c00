package compile

import (
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ingressService(ns, name string, ip string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080))}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{ip}}},
	}
	return svc, es
}

func ingressPath(path string, typ networkingv1.PathType, svc string) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: path, PathType: &typ, Backend: networkingv1.IngressBackend{
		Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: 80}}}}
}

func ingressInput() *Input {
	in := &Input{IngressHTTPBind: 10080, IngressHTTPSBind: 10443, IngressAddresses: []string{"10.200.0.9"},
		IngressClasses: []*networkingv1.IngressClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "flatnet"}, Spec: networkingv1.IngressClassSpec{Controller: IngressController}},
			{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}},
		}}
	for i, n := range []string{"a", "b", "c", "d", "dflt"} {
		svc, es := ingressService("default", n, "10.2.0."+string(rune('1'+i)))
		in.Services = append(in.Services, svc)
		in.EndpointSlices = append(in.EndpointSlices, es)
	}
	in.Secrets = append(in.Secrets, certSecret(nil, "default", "tls"))
	flatnet, nginx := "flatnet", "nginx"
	prefix, exact, impl := networkingv1.PathTypePrefix, networkingv1.PathTypeExact, networkingv1.PathTypeImplementationSpecific
	in.Ingresses = []*networkingv1.Ingress{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "main", CreationTimestamp: metav1.NewTime(epoch)},
			Spec: networkingv1.IngressSpec{IngressClassName: &flatnet,
				DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "dflt", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
				TLS:            []networkingv1.IngressTLS{{Hosts: []string{"foo.example.com"}, SecretName: "tls"}},
				Rules: []networkingv1.IngressRule{{Host: "foo.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{
						ingressPath("/", prefix, "a"),
						ingressPath("/api", prefix, "b"),
						ingressPath("/api/v2", impl, "c"),
						ingressPath("/api/exact", exact, "d"),
						ingressPath("/missing", prefix, "nope"),
					}}}}}}},
		// A later Ingress for the same host and path loses to the older one.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "later", CreationTimestamp: metav1.NewTime(epoch.Add(time.Hour))},
			Spec: networkingv1.IngressSpec{IngressClassName: &flatnet,
				Rules: []networkingv1.IngressRule{{Host: "foo.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{ingressPath("/api", prefix, "d")}}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other-class"},
			Spec: networkingv1.IngressSpec{IngressClassName: &nginx,
				Rules: []networkingv1.IngressRule{{Host: "nginx.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{ingressPath("/", prefix, "a")}}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "legacy", Annotations: map[string]string{annotationIngressClass: "flatnet"}},
			Spec: networkingv1.IngressSpec{
				Rules: []networkingv1.IngressRule{{Host: "legacy.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{ingressPath("/", prefix, "b")}}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-class"},
			Spec: networkingv1.IngressSpec{
				Rules: []networkingv1.IngressRule{{Host: "noclass.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{ingressPath("/", prefix, "b")}}}}}}},
	}
	return in
}

func ingressLookup(t *testing.T, out *Output, bind int32, host, path string) string {
	t.Helper()
	p := out.Table.Ports[bind]
	if p == nil {
		t.Fatalf("no port %d", bind)
	}
	h := p.Lookup(host)
	if h == nil {
		return "404"
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	return backendOf(h.Match(req))
}

func TestIngress(t *testing.T) {
	in := ingressInput()
	out := Compile(in)
	for _, tc := range []struct{ host, path, want string }{
		{"foo.example.com", "/", "default/a"},
		{"foo.example.com", "/x", "default/a"},
		{"foo.example.com", "/api", "default/b"},
		{"foo.example.com", "/api/", "default/b"},
		{"foo.example.com", "/apix", "default/a"},
		{"foo.example.com", "/api/v2/z", "default/c"},
		{"foo.example.com", "/api/exact", "default/d"},
		{"foo.example.com", "/api/exact/more", "default/b"},
		{"FOO.example.com:80", "/api", "default/b"},
		{"foo.example.com", "/missing", "500"},
		{"unknown.example.com", "/", "default/dflt"},
		{"nginx.example.com", "/", "default/dflt"}, // another class's Ingress is not ours
		{"legacy.example.com", "/", "default/b"},
		{"noclass.example.com", "/", "default/dflt"}, // no default class is ours
	} {
		if got := ingressLookup(t, out, 10080, tc.host, tc.path); got != tc.want {
			t.Errorf("http %s%s -> %s, want %s", tc.host, tc.path, got, tc.want)
		}
	}
	if got := ingressLookup(t, out, 10443, "foo.example.com", "/api"); got != "default/b" {
		t.Errorf("https foo.example.com/api -> %s", got)
	}
	p := out.Table.Ports[10443]
	if p.Protocol != "HTTPS" || p.Listen != 443 || len(p.Certs) != 1 || p.Certs[0].Hostname != "foo.example.com" {
		t.Errorf("https port %+v", p)
	}
	if p := out.Table.Ports[10080]; p.Listen != 80 || p.Gateway != "" {
		t.Errorf("http port %+v", p)
	}
	for _, n := range []string{"main", "later", "legacy"} {
		st, ok := out.Ingresses[nn("default", n)]
		if !ok || len(st.LoadBalancer.Ingress) != 1 || st.LoadBalancer.Ingress[0].IP != "10.200.0.9" {
			t.Errorf("Ingress %s status %+v", n, st)
		}
	}
	for _, n := range []string{"other-class", "no-class"} {
		if _, ok := out.Ingresses[nn("default", n)]; ok {
			t.Errorf("Ingress %s of another class got a status", n)
		}
	}

	// With flatnet the default class, an Ingress with no class is ours.
	in.IngressClasses[0].Annotations = map[string]string{annotationDefaultIngress: "true"}
	out = Compile(in)
	if got := ingressLookup(t, out, 10080, "noclass.example.com", "/"); got != "default/b" {
		t.Errorf("default class: noclass.example.com/ -> %s", got)
	}
}
