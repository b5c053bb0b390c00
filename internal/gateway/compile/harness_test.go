package compile

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// testAddress is the load balancer IP the tests give every Gateway.
const testAddress = "10.200.0.1"

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// loadConformance builds an Input from the suite's base manifests and the
// given test manifests, as the suite applies them: the GatewayClass
// flatnet, the Secrets the suite generates, an EndpointSlice with one ready
// endpoint per Service with a selector (what the Deployments would give),
// a bind for every listener port and an address for every Gateway.
func loadConformance(t testing.TB, files ...string) *Input {
	t.Helper()
	in := &Input{
		GatewayClasses: []*gwv1.GatewayClass{{
			ObjectMeta: metav1.ObjectMeta{Name: "flatnet", Generation: 1},
			Spec:       gwv1.GatewayClassSpec{ControllerName: ControllerName},
		}},
		Binds:     map[BindKey]int32{},
		Addresses: map[types.NamespacedName][]string{},
	}
	in.Secrets = append(in.Secrets,
		certSecret(t, "gateway-conformance-web-backend", "certificate"),
		certSecret(t, "gateway-conformance-infra", "tls-validity-checks-certificate"))
	paths := append([]string{"testdata/conformance/manifests.yaml"}, prefixAll("testdata/conformance/tests/", files)...)
	n := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.ReplaceAll(data, []byte("{GATEWAY_CLASS_NAME}"), []byte("flatnet"))
		for _, doc := range strings.Split(string(data), "\n---") {
			n++
			addObject(t, in, []byte(doc), n)
		}
	}
	ip := 0
	for _, s := range in.Services {
		if len(s.Spec.Selector) == 0 {
			continue
		}
		ip++
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name + "-auto",
				Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.1.0.%d", ip)}}},
		}
		for _, sp := range s.Spec.Ports {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptrTo(sp.Name), Port: ptrTo(sp.TargetPort.IntVal)})
		}
		in.EndpointSlices = append(in.EndpointSlices, es)
	}
	bind := int32(20000)
	for _, g := range in.Gateways {
		k := nn(g.Namespace, g.Name)
		for _, l := range g.Spec.Listeners {
			bk := BindKey{Gateway: k, Port: int32(l.Port)}
			if in.Binds[bk] == 0 {
				in.Binds[bk] = bind
				bind++
			}
		}
		in.Addresses[k] = []string{testAddress}
	}
	return in
}

func prefixAll(prefix string, s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = filepath.Join(prefix, x)
	}
	return out
}

func addObject(t testing.TB, in *Input, doc []byte, n int) {
	t.Helper()
	var head struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatal(err)
	}
	switch head.Kind {
	case "":
		return
	case "Namespace":
		o := &corev1.Namespace{}
		decode(t, doc, o)
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		o.Labels[corev1.LabelMetadataName] = o.Name
		in.Namespaces = append(in.Namespaces, o)
		return
	case "Service":
		o := &corev1.Service{}
		decode(t, doc, o)
		in.Services = append(in.Services, o)
		return
	case "EndpointSlice":
		o := &discoveryv1.EndpointSlice{}
		decode(t, doc, o)
		in.EndpointSlices = append(in.EndpointSlices, o)
		return
	case "Secret":
		o := &corev1.Secret{}
		decode(t, doc, o)
		in.Secrets = append(in.Secrets, o)
		return
	case "Gateway":
		o := &gwv1.Gateway{}
		decode(t, doc, o)
		fill(&o.ObjectMeta, n)
		in.Gateways = append(in.Gateways, o)
	case "HTTPRoute":
		o := &gwv1.HTTPRoute{}
		decode(t, doc, o)
		fill(&o.ObjectMeta, n)
		in.HTTPRoutes = append(in.HTTPRoutes, o)
	case "GRPCRoute":
		o := &gwv1.GRPCRoute{}
		decode(t, doc, o)
		fill(&o.ObjectMeta, n)
		in.GRPCRoutes = append(in.GRPCRoutes, o)
	case "ReferenceGrant":
		o := &gwv1.ReferenceGrant{}
		decode(t, doc, o)
		in.ReferenceGrants = append(in.ReferenceGrants, o)
	case "GatewayClass":
		o := &gwv1.GatewayClass{}
		decode(t, doc, o)
		fill(&o.ObjectMeta, n)
		in.GatewayClasses = append(in.GatewayClasses, o)
	case "Ingress":
		o := &networkingv1.Ingress{}
		decode(t, doc, o)
		fill(&o.ObjectMeta, n)
		in.Ingresses = append(in.Ingresses, o)
	}
}

func decode(t testing.TB, doc []byte, o any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, o); err != nil {
		t.Fatalf("%v in:\n%s", err, doc)
	}
}

// fill sets what the API server would: a generation and a creation time
// in manifest order.
func fill(m *metav1.ObjectMeta, n int) {
	if m.Generation == 0 {
		m.Generation = 1
	}
	m.CreationTimestamp = metav1.NewTime(epoch.Add(time.Duration(n) * time.Second))
}

var (
	testCertOnce sync.Once
	testCertPEM  []byte
	testKeyPEM   []byte
)

func certSecret(t testing.TB, ns, name string) *corev1.Secret {
	testCertOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "example.com"},
			DNSNames: []string{"*", "*.example.com"}, NotBefore: epoch, NotAfter: epoch.Add(100 * 365 * 24 * time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			panic(err)
		}
		testCertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		testKeyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	})
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: testCertPEM, corev1.TLSPrivateKeyKey: testKeyPEM}}
}

// lookup answers a request through the table as the data plane does: it
// returns the matched rule or nil for 404.
func lookup(t testing.TB, out *Output, in *Input, gw types.NamespacedName, port int32, host, path string, hdr http.Header) *table.Rule {
	t.Helper()
	bind := in.Binds[BindKey{Gateway: gw, Port: port}]
	p := out.Table.Ports[bind]
	if p == nil {
		return nil
	}
	h := p.Lookup(host)
	if h == nil {
		return nil
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host == "" {
		req.Host = ""
	}
	maps.Copy(req.Header, hdr)
	return h.Match(req)
}

// backendOf names the one backend a rule sends to ("" for none, "500"
// when it answers 500, "redirect" for a redirect).
func backendOf(r *table.Rule) string {
	if r == nil {
		return "404"
	}
	a := r.Action
	switch {
	case a.Redirect != nil:
		return "redirect"
	case a.Direct != 0:
		return fmt.Sprint(a.Direct)
	case len(a.Backends) == 1 && a.Backends[0].Invalid:
		return "500"
	case len(a.Backends) == 1:
		name, _, _ := strings.Cut(a.Backends[0].Name, ":")
		return name
	}
	var names []string
	for _, b := range a.Backends {
		names = append(names, b.Name)
	}
	return strings.Join(names, ",")
}
