package e2e

// The L7 gateway (`flatnet gateway` on every node, docs/gateway.md) from
// the external host, as a client outside the cluster sees it: requests go
// to the Gateway's status.addresses (its Service's LoadBalancer IP, routed
// to the nodes by the external host's ECMP route, DNATed by each node's
// Service proxy to the node's own gateway) and are answered by netexec
// pods, whose /request tells what the backend got (proto, host, path,
// headers) and whose /ws echoes WebSocket messages.
//
// One Gateway with an HTTP listener and two HTTPS listeners (a.gw.test and
// b.gw.test, certificates made here) serves every case; each case has its
// own HTTPRoute (its own hostname), so the cases can run alone (-run
// 'TestLab/Gateway/Canary'). Backends: Service gw-a (pods on nodes 1 and
// 2 and 3), gw-b (node 3) and gw-h2c (gw-b's pod, appProtocol kubernetes.io/h2c).

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/netns"
)

const gwNS = "default"

// gwEnv is what the gateway cases share.
type gwEnv struct {
	l     *testLab
	gw    gwclient.Interface
	ext   string // the external host's netns path
	addr  string // the Gateway's address
	roots *x509.CertPool
	// pods by Service: gw-a's two, gw-b's one.
	podsA, podsB []string
}

// extDialer dials from the external host's namespace to ip, keeping the
// port asked for (the URL's host names the virtual host, not the address).
func extDialer(ext, ip string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 3 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var c net.Conn
		err = netns.Do(ext, func() error {
			var err error
			c, err = d.DialContext(ctx, network, net.JoinHostPort(ip, port))
			return err
		})
		return c, err
	}
}

// client is an HTTP client from the external host to the Gateway; with
// keepAlive false every request opens a connection (and the ECMP route
// spreads them over the nodes).
func (e *gwEnv) client(keepAlive bool) *http.Client {
	tr := &http.Transport{
		DialContext:         extDialer(e.ext, e.addr),
		TLSClientConfig:     &tls.Config{RootCAs: e.roots},
		ForceAttemptHTTP2:   true,
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: 8,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// ask makes one request to url (http://host/path, https://...) and
// decodes netexec's /request answer; a status other than 200 is an error.
func ask(c *http.Client, url string, hdr map[string]string) (*netexec.RequestInfo, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading: %w", url, err)
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %s: %q", url, resp.Status, body)
	}
	var ri netexec.RequestInfo
	if err := json.Unmarshal(body, &ri); err != nil {
		return nil, fmt.Errorf("GET %s: decoding %q: %w", url, body, err)
	}
	return &ri, nil
}

// waitServed asks url until the answer passes check (routes reach every
// node's gateway within moments, but not at once).
func waitServed(t *testing.T, c *http.Client, url string, hdr map[string]string, check func(*netexec.RequestInfo) error) *netexec.RequestInfo {
	t.Helper()
	var ri *netexec.RequestInfo
	err := retry(30*time.Second, func() error {
		var err error
		if ri, err = ask(c, url, hdr); err == nil {
			err = check(ri)
		}
		return err
	})
	if err != nil {
		t.Fatalf("external host -> %s (headers %v): %v", url, hdr, err)
	}
	return ri
}

func servedBy(pods []string) func(*netexec.RequestInfo) error {
	return func(ri *netexec.RequestInfo) error {
		if !slices.Contains(pods, ri.Hostname) {
			return fmt.Errorf("answered by %s, want one of %v", ri.Hostname, pods)
		}
		return nil
	}
}

// upstreamErrors is every node's gateway's flatnet_gateway_upstream_errors_total
// series, to say why a request failed.
func (e *gwEnv) upstreamErrors() string {
	var b strings.Builder
	for _, n := range e.l.spec.Nodes {
		body, err := httpGet(lab.NetnsPath(n.Netns), "127.0.0.1:9082", "/metrics")
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", n.Name, err)
			continue
		}
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "flatnet_gateway_upstream_errors_total") {
				fmt.Fprintf(&b, "%s: %s\n", n.Name, line)
			}
		}
	}
	return b.String()
}

// ---- objects

func gwPathPrefix(p string) gwv1.HTTPRouteMatch {
	return gwv1.HTTPRouteMatch{Path: &gwv1.HTTPPathMatch{Type: ptr(gwv1.PathMatchPathPrefix), Value: ptr(p)}}
}

func gwBackend(svc string, weight int32) gwv1.HTTPBackendRef {
	return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{
		BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(svc), Port: ptr(gwv1.PortNumber(80))},
		Weight:                 ptr(weight),
	}}
}

func gwRoute(name string, hostnames []string, rules ...gwv1.HTTPRouteRule) *gwv1.HTTPRoute {
	r := &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: gwNS},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw"}}},
			Rules:           rules,
		},
	}
	for _, h := range hostnames {
		r.Spec.Hostnames = append(r.Spec.Hostnames, gwv1.Hostname(h))
	}
	return r
}

func (e *gwEnv) createRoute(t *testing.T, r *gwv1.HTTPRoute) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.gw.GatewayV1().HTTPRoutes(gwNS).Create(ctx, r, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating HTTPRoute %s: %v", r.Name, err)
	}
	t.Cleanup(func() { _ = e.gw.GatewayV1().HTTPRoutes(gwNS).Delete(ctx, r.Name, metav1.DeleteOptions{}) })
}

// tlsSecrets makes a CA and, for each host, a Secret of type
// kubernetes.io/tls with a certificate for it signed by that CA.
func tlsSecrets(t *testing.T, hosts map[string]string) (*x509.CertPool, []*corev1.Secret) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flatnet e2e CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	var secrets []*corev1.Secret
	serial := int64(2)
	for secret, host := range hosts {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		serial++
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: gwNS},
			Type:       corev1.SecretTypeTLS,
			Data: map[string][]byte{
				corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
				corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			},
		})
	}
	return roots, secrets
}

func httpsListener(name, host, secret string) gwv1.Listener {
	return gwv1.Listener{
		Name: gwv1.SectionName(name), Port: 443, Protocol: gwv1.HTTPSProtocolType, Hostname: ptr(gwv1.Hostname(host)),
		TLS: &gwv1.ListenerTLSConfig{
			Mode:            ptr(gwv1.TLSModeTerminate),
			CertificateRefs: []gwv1.SecretObjectReference{{Name: gwv1.ObjectName(secret)}},
		},
	}
}

// setupGateway makes the backends, the certificates and the Gateway, and
// waits until the Gateway is Programmed with an address.
func setupGateway(t *testing.T, l *testLab) *gwEnv {
	t.Helper()
	s := l.spec
	if s.External == nil || !s.LBPool.IsValid() || len(s.Nodes) < 3 {
		t.Fatalf("the gateway tests need a lab with --external, a --lb-pool and 3 nodes")
	}
	ctx := context.Background()
	rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 1000, 1000 // the route churn patches as fast as the API takes it
	gc, err := gwclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	e := &gwEnv{l: l, gw: gc, ext: lab.NetnsPath(s.External.Netns)}

	type backend struct{ pod, app, node string }
	backends := []backend{
		{"gw-a1", "gw-a", s.Nodes[0].Name}, {"gw-a2", "gw-a", s.Nodes[1].Name}, {"gw-a3", "gw-a", s.Nodes[2].Name},
		{"gw-b1", "gw-b", s.Nodes[2].Name},
	}
	var pods []string
	for _, b := range backends {
		p := netexecPod(b.pod, b.node)
		p.Labels = map[string]string{"app": b.app}
		l.create(t, p)
		pods = append(pods, b.pod)
		if b.app == "gw-a" {
			e.podsA = append(e.podsA, b.pod)
		} else {
			e.podsB = append(e.podsB, b.pod)
		}
	}
	t.Cleanup(func() {
		var left []string
		for _, p := range pods {
			if _, err := l.c.CoreV1().Pods(gwNS).Get(ctx, p, metav1.GetOptions{}); err == nil {
				left = append(left, p)
			}
		}
		l.deleteAndWait(t, left...)
	})
	l.createService(t, service("gw-a", corev1.ServiceTypeClusterIP, map[string]string{"app": "gw-a"}))
	l.createService(t, service("gw-b", corev1.ServiceTypeClusterIP, map[string]string{"app": "gw-b"}))
	h2c := service("gw-h2c", corev1.ServiceTypeClusterIP, map[string]string{"app": "gw-b"})
	h2c.Spec.Ports[0].AppProtocol = ptr("kubernetes.io/h2c")
	l.createService(t, h2c)

	var secrets []*corev1.Secret
	e.roots, secrets = tlsSecrets(t, map[string]string{"gw-cert-a": "a.gw.test", "gw-cert-b": "b.gw.test"})
	for _, sec := range secrets {
		if _, err := l.c.CoreV1().Secrets(gwNS).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Secret %s: %v", sec.Name, err)
		}
		t.Cleanup(func() { _ = l.c.CoreV1().Secrets(gwNS).Delete(ctx, sec.Name, metav1.DeleteOptions{}) })
	}

	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw", Namespace: gwNS},
		Spec: gwv1.GatewaySpec{
			GatewayClassName: "flatnet",
			Listeners: []gwv1.Listener{
				{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
				httpsListener("https-a", "a.gw.test", "gw-cert-a"),
				httpsListener("https-b", "b.gw.test", "gw-cert-b"),
			},
		},
	}
	if _, err := gc.GatewayV1().Gateways(gwNS).Create(ctx, gw, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Gateway gw: %v", err)
	}
	t.Cleanup(func() { _ = gc.GatewayV1().Gateways(gwNS).Delete(ctx, "gw", metav1.DeleteOptions{}) })
	for _, p := range pods {
		l.waitReady(t, p)
	}

	t0 := time.Now()
	var last *gwv1.Gateway
	err = retry(60*time.Second, func() error {
		g, err := gc.GatewayV1().Gateways(gwNS).Get(ctx, "gw", metav1.GetOptions{})
		if err != nil {
			return err
		}
		last = g
		if !meta.IsStatusConditionTrue(g.Status.Conditions, string(gwv1.GatewayConditionProgrammed)) || len(g.Status.Addresses) == 0 {
			return errors.New("not programmed with an address")
		}
		return nil
	})
	if err != nil {
		st, _ := json.MarshalIndent(last, "", "  ")
		t.Fatalf("Gateway gw not Programmed with an address in 60s: %v\n%s\n(gateway logs: %s/gateway-*.log)", err, st, s.LogDir())
	}
	e.addr = last.Status.Addresses[0].Value
	programmed := time.Since(t0)
	// The address answers (404: no route yet) on every node's gateway
	// (new connections spread over the nodes), or no case can pass.
	c := e.client(false)
	answers := 0
	err = retry(30*time.Second, func() error {
		_, err := ask(c, "http://nothing.gw.test/", nil)
		if err == nil || !strings.Contains(err.Error(), "404") {
			answers = 0
			return fmt.Errorf("want 404, got %v", err)
		}
		if answers++; answers < 6 {
			return errors.New("again")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Gateway gw's address %s does not answer from the external host: %v (gateway logs: %s/gateway-*.log)", e.addr, err, s.LogDir())
	}
	t.Logf("Gateway gw Programmed with address %s after %s, answering after %s", e.addr, programmed.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	return e
}

// ---- the cases

func checkGateway(t *testing.T, l *testLab) {
	e := setupGateway(t, l)
	t.Run("Routing", e.routing)
	t.Run("Canary", e.canary)
	t.Run("TLSBySNI", e.tlsBySNI)
	t.Run("WebSocket", e.webSocket)
	t.Run("H2C", e.h2c)
	t.Run("RouteChurn", e.routeChurn)
	t.Run("EndpointRemoval", e.endpointRemoval)
	t.Run("Ingress", e.ingress)
}

// routing: by host, by path, by header, with a URL rewrite and request
// header filters the backend sees.
func (e *gwEnv) routing(t *testing.T) {
	e.createRoute(t, gwRoute("gw-hosts-a", []string{"a.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}}))
	e.createRoute(t, gwRoute("gw-hosts-b", []string{"b.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-b", 1)}}))
	headerB := gwPathPrefix("/request")
	headerB.Headers = []gwv1.HTTPHeaderMatch{{Name: "X-Backend", Value: "b"}}
	e.createRoute(t, gwRoute("gw-paths", []string{"paths.gw.test"},
		gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{gwPathPrefix("/request/b")}, BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-b", 1)}},
		gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{headerB}, BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-b", 1)}},
		gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{gwPathPrefix("/rewrite")},
			Filters: []gwv1.HTTPRouteFilter{
				{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{
					Hostname: ptr(gwv1.PreciseHostname("rewritten.gw.test")),
					Path:     &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr("/request/rewritten")},
				}},
				{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
					Set:    []gwv1.HTTPHeader{{Name: "X-Gw-Set", Value: "set"}},
					Add:    []gwv1.HTTPHeader{{Name: "X-Gw-Add", Value: "added"}},
					Remove: []string{"X-Gw-Remove"},
				}},
			},
			BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)},
		},
		gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}},
	))
	c := e.client(false)
	for _, tc := range []struct {
		url  string
		hdr  map[string]string
		pods []string
		path string // the path the backend must see ("" = the request's)
	}{
		{"http://a.gw.test/request/x", nil, e.podsA, ""},
		{"http://b.gw.test/request/x", nil, e.podsB, ""},
		{"http://paths.gw.test/request/b/1", nil, e.podsB, ""},
		{"http://paths.gw.test/request/a", nil, e.podsA, ""},
		{"http://paths.gw.test/request/a", map[string]string{"X-Backend": "b"}, e.podsB, ""},
		{"http://paths.gw.test/request/a", map[string]string{"X-Backend": "c"}, e.podsA, ""},
	} {
		ri := waitServed(t, c, tc.url, tc.hdr, servedBy(tc.pods))
		host := strings.TrimPrefix(tc.url, "http://")
		host, path, _ := strings.Cut(host, "/")
		if ri.Host != host || ri.Path != "/"+path {
			t.Errorf("%s: the backend saw host %q path %q, want %q %q", tc.url, ri.Host, ri.Path, host, "/"+path)
		}
	}
	ri := waitServed(t, c, "http://paths.gw.test/rewrite/z", map[string]string{"X-Gw-Remove": "1", "X-Gw-Set": "client", "X-Gw-Add": "client"}, servedBy(e.podsA))
	if ri.Host != "rewritten.gw.test" || ri.Path != "/request/rewritten/z" {
		t.Errorf("URLRewrite: the backend saw host %q path %q, want rewritten.gw.test /request/rewritten/z", ri.Host, ri.Path)
	}
	if got := ri.Headers["X-Gw-Set"]; !slices.Equal(got, []string{"set"}) {
		t.Errorf("RequestHeaderModifier set: the backend saw X-Gw-Set %q, want [set]", got)
	}
	if got := ri.Headers["X-Gw-Add"]; !slices.Equal(got, []string{"client", "added"}) {
		t.Errorf("RequestHeaderModifier add: the backend saw X-Gw-Add %q, want [client added]", got)
	}
	if got, ok := ri.Headers["X-Gw-Remove"]; ok {
		t.Errorf("RequestHeaderModifier remove: the backend saw X-Gw-Remove %q", got)
	}
	if _, err := ask(c, "http://nowhere.gw.test/request", nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a host no route has: %v, want 404", err)
	}
}

// canary: weights 80/20 over 1,000 requests.
func (e *gwEnv) canary(t *testing.T) {
	e.createRoute(t, gwRoute("gw-canary", []string{"canary.gw.test"},
		gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 80), gwBackend("gw-b", 20)}}))
	c := e.client(true)
	const url = "http://canary.gw.test/request/canary"
	// Served by both on every node first (new connections spread over
	// the nodes).
	nc := e.client(false)
	waitServed(t, nc, url, nil, servedBy(e.podsB))
	waitServed(t, nc, url, nil, servedBy(e.podsA))
	const n, workers = 1000, 4
	var mu sync.Mutex
	counts := map[string]int{}
	var failures []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / workers {
				cl := c
				if w == 0 {
					cl = nc // one worker on new connections: every node's gateway takes part
				}
				ri, err := ask(cl, url, nil)
				mu.Lock()
				if err != nil {
					failures = append(failures, err.Error())
				} else {
					counts[ri.Hostname]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	a, b := 0, 0
	for pod, k := range counts {
		switch {
		case slices.Contains(e.podsA, pod):
			a += k
		case slices.Contains(e.podsB, pod):
			b += k
		default:
			t.Errorf("%d answers from %s, which is no backend", k, pod)
		}
	}
	t.Logf("canary 80/20 over %d requests: gw-a %d, gw-b %d (by pod %v), %d failed", n, a, b, counts, len(failures))
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed; first: %s", len(failures), n, failures[0])
	}
	// Smooth WRR is exact per gateway instance; three instances each
	// off by at most one cycle: 5 % is generous.
	if a < 750 || a > 850 || a+b != n-len(failures) {
		t.Errorf("gw-a got %d and gw-b %d of %d; want 800/200 within 50", a, b, n)
	}
}

// tlsBySNI: each HTTPS listener serves its own certificate, chosen by SNI,
// and routes to its own backend.
func (e *gwEnv) tlsBySNI(t *testing.T) {
	e.createRoute(t, gwRoute("gw-tls-a", []string{"a.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}}))
	e.createRoute(t, gwRoute("gw-tls-b", []string{"b.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-b", 1)}}))
	dial := extDialer(e.ext, e.addr)
	for host, pods := range map[string][]string{"a.gw.test": e.podsA, "b.gw.test": e.podsB} {
		var names []string
		err := retry(30*time.Second, func() error {
			conn, err := dial(context.Background(), "tcp", "x:443")
			if err != nil {
				return err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			tc := tls.Client(conn, &tls.Config{ServerName: host, RootCAs: e.roots})
			if err := tc.Handshake(); err != nil {
				return err // verification against our CA included
			}
			names = tc.ConnectionState().PeerCertificates[0].DNSNames
			if !slices.Equal(names, []string{host}) {
				return fmt.Errorf("certificate for %v", names)
			}
			return nil
		})
		if err != nil {
			t.Errorf("TLS to %s:443 with SNI %s: %v", e.addr, host, err)
			continue
		}
		ri := waitServed(t, e.client(false), "https://"+host+"/request/tls", nil, servedBy(pods))
		if ri.Host != host {
			t.Errorf("https://%s: the backend saw host %q", host, ri.Host)
		}
	}
}

// wsDial opens a WebSocket to url from the external host.
func (e *gwEnv) wsDial(url string) (*websocket.Conn, error) {
	cfg, err := websocket.NewConfig(url, "http://"+strings.Split(strings.TrimPrefix(url, "ws://"), "/")[0])
	if err != nil {
		return nil, err
	}
	conn, err := extDialer(e.ext, e.addr)(context.Background(), "tcp", "x:80")
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ws, nil
}

// wsEcho sends msg on ws and checks that it comes back, within 5 s.
func wsEcho(ws *websocket.Conn, msg string) error {
	_ = ws.SetDeadline(time.Now().Add(5 * time.Second))
	if err := websocket.Message.Send(ws, msg); err != nil {
		return err
	}
	var got string
	if err := websocket.Message.Receive(ws, &got); err != nil {
		return err
	}
	if got != msg {
		return fmt.Errorf("sent %q, got %q back", msg, got)
	}
	return nil
}

func (e *gwEnv) webSocket(t *testing.T) {
	e.createRoute(t, gwRoute("gw-ws", []string{"ws.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}}))
	waitServed(t, e.client(false), "http://ws.gw.test/request", nil, servedBy(e.podsA))
	// The gateway's address is routed over every node, and each new
	// connection may reach a node whose gateway has not read the route yet
	// (it answers 404, no upgrade): dial until one upgrades, as waitServed
	// asks until one request is served.
	var ws *websocket.Conn
	err := retry(30*time.Second, func() error {
		var err error
		ws, err = e.wsDial("ws://ws.gw.test/ws")
		return err
	})
	if err != nil {
		t.Fatalf("WebSocket through the gateway: %v", err)
	}
	defer ws.Close()
	for i, msg := range []string{"hello", strings.Repeat("x", 100_000), "bye"} {
		if err := wsEcho(ws, msg); err != nil {
			t.Errorf("message %d (%d bytes): %v", i, len(msg), err)
		}
	}
}

// h2c: a backend port with appProtocol kubernetes.io/h2c gets HTTP/2 with
// prior knowledge, though the client spoke HTTP/1.1; the same pod behind a
// plain port gets HTTP/1.1.
func (e *gwEnv) h2c(t *testing.T) {
	e.createRoute(t, gwRoute("gw-h2c", []string{"h2c.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-h2c", 1)}}))
	e.createRoute(t, gwRoute("gw-h1", []string{"h1.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-b", 1)}}))
	c := e.client(false)
	ri := waitServed(t, c, "http://h2c.gw.test/request/h2c", nil, servedBy(e.podsB))
	if ri.Proto != "HTTP/2.0" {
		t.Errorf("backend port with appProtocol kubernetes.io/h2c saw %s, want HTTP/2.0", ri.Proto)
	}
	ri = waitServed(t, c, "http://h1.gw.test/request/h1", nil, servedBy(e.podsB))
	if ri.Proto != "HTTP/1.1" {
		t.Errorf("backend port without appProtocol saw %s, want HTTP/1.1", ri.Proto)
	}
}

// load runs requests to url on keep-alive and new connections, and
// WebSockets echoing every 10 ms, until stop is closed; the function it
// returns waits for them and returns what they saw.
type loadResult struct {
	requests, wsMessages int
	failures, wsDropped  []string
	latencies            []time.Duration
	// served is each answer's start time and pod, for the removal check.
	served []servedAt
}

type servedAt struct {
	at  time.Time
	pod string
}

func (e *gwEnv) load(url, wsURL string, workers, sockets int, check func(*netexec.RequestInfo) error, stop <-chan struct{}) func() loadResult {
	var mu sync.Mutex
	var res loadResult
	var wg sync.WaitGroup
	keep, fresh := e.client(true), e.client(false)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Paced: the load must leave the 2 cores to the API server
			// and the gateways, and new connections from one client
			// address must not wrap its ephemeral ports within
			// TIME_WAIT (a SYN meeting an old flow's state was lost).
			c, pace := keep, 2*time.Millisecond
			if w%2 == 1 {
				c, pace = fresh, 20*time.Millisecond
			}
			for {
				select {
				case <-stop:
					return
				case <-time.After(pace):
				}
				t0 := time.Now()
				ri, err := ask(c, url, nil)
				if err == nil {
					err = check(ri)
				}
				d := time.Since(t0)
				mu.Lock()
				res.requests++
				res.latencies = append(res.latencies, d)
				if err != nil {
					res.failures = append(res.failures, err.Error())
				} else {
					res.served = append(res.served, servedAt{t0, ri.Hostname})
				}
				mu.Unlock()
			}
		}()
	}
	var opened sync.WaitGroup
	for k := range sockets {
		wg.Add(1)
		opened.Add(1)
		go func() {
			defer wg.Done()
			// Opened with retries: a node's gateway may not have the
			// route yet. Only what happens after the opening counts.
			var ws *websocket.Conn
			err := retry(30*time.Second, func() error {
				var err error
				ws, err = e.wsDial(wsURL)
				return err
			})
			opened.Done()
			if err != nil {
				mu.Lock()
				res.wsDropped = append(res.wsDropped, "open: "+err.Error())
				mu.Unlock()
				return
			}
			defer ws.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				err := wsEcho(ws, fmt.Sprintf("socket %d message %d", k, i))
				mu.Lock()
				if err != nil {
					res.wsDropped = append(res.wsDropped, fmt.Sprintf("socket %d after %d messages: %v", k, i, err))
				} else {
					res.wsMessages++
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	opened.Wait()
	return func() loadResult {
		wg.Wait()
		keep.CloseIdleConnections()
		return res
	}
}

// routeChurn: 1,000 changes of one HTTPRoute (its header filter's value
// every time, its path match every other time) while requests run on
// keep-alive and new connections and WebSockets echo: nothing fails,
// nothing drops, and every tenth change is timed until it is served.
func (e *gwEnv) routeChurn(t *testing.T) {
	rules := func(gen int) []gwv1.HTTPRouteRule {
		prefix := "/request"
		if gen%2 == 1 {
			prefix = "/request/churn"
		}
		return []gwv1.HTTPRouteRule{
			{
				Matches: []gwv1.HTTPRouteMatch{gwPathPrefix(prefix)},
				Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
					Set: []gwv1.HTTPHeader{{Name: "X-Gen", Value: strconv.Itoa(gen)}},
				}}},
				BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)},
			},
			{Matches: []gwv1.HTTPRouteMatch{gwPathPrefix("/ws")}, BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}},
		}
	}
	e.createRoute(t, gwRoute("gw-churn", []string{"churn.gw.test"}, rules(0)...))
	const url = "http://churn.gw.test/request/churn/x"
	probe := e.client(true)
	waitServed(t, e.client(false), url, nil, servedBy(e.podsA))
	waitServed(t, probe, url, nil, servedBy(e.podsA))

	stop := make(chan struct{})
	finish := e.load(url, "ws://churn.gw.test/ws", 4, 4, func(ri *netexec.RequestInfo) error {
		if !strings.HasPrefix(ri.Hostname, "gw-a") || ri.Headers.Get("X-Gen") == "" {
			return fmt.Errorf("answered by %s with X-Gen %q", ri.Hostname, ri.Headers.Get("X-Gen"))
		}
		return nil
	}, stop)
	ctx := context.Background()
	const changes = 1000
	// served: from the PATCH call; afterWrite: from its return (the API
	// has the change), which is what the gateway can be held to.
	var served, afterWrite, patches []time.Duration
	var patchErr error
	t0 := time.Now()
	for gen := 1; gen <= changes; gen++ {
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"rules": rules(gen)}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := e.gw.GatewayV1().HTTPRoutes(gwNS).Patch(ctx, "gw-churn", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			patchErr = fmt.Errorf("change %d: %w", gen, err)
			break
		}
		applied := time.Now()
		patches = append(patches, applied.Sub(start))
		if gen%10 != 0 {
			continue
		}
		// Change -> served: until an answer carries this generation (on
		// the probe's one connection, so one node's gateway).
		want := strconv.Itoa(gen)
		for {
			ri, err := ask(probe, url, nil)
			if err == nil && ri.Headers.Get("X-Gen") == want {
				served = append(served, time.Since(start))
				afterWrite = append(afterWrite, time.Since(applied))
				break
			}
			if time.Since(start) > 10*time.Second {
				patchErr = fmt.Errorf("change %d not served in 10 s (last %v, %v)", gen, ri, err)
				break
			}
			time.Sleep(time.Millisecond)
		}
		if patchErr != nil {
			break
		}
	}
	took := time.Since(t0)
	close(stop)
	res := finish()
	t.Logf("%d route changes in %s (the API's PATCH p50 %s); change -> served (%d samples, one node): p50 %s p99 %s max %s, from the PATCH's return p50 %s p99 %s; during them %d requests (p50 %s p99 %s), %d failed; %d WebSocket echoes on 4 sockets, %d dropped",
		changes, took.Round(time.Millisecond), percentile(patches, 0.5).Round(time.Microsecond), len(served), percentile(served, 0.5).Round(time.Microsecond), percentile(served, 0.99).Round(time.Microsecond),
		percentile(served, 1).Round(time.Microsecond), percentile(afterWrite, 0.5).Round(time.Microsecond), percentile(afterWrite, 0.99).Round(time.Microsecond), res.requests, percentile(res.latencies, 0.5).Round(time.Microsecond),
		percentile(res.latencies, 0.99).Round(time.Microsecond), len(res.failures), res.wsMessages, len(res.wsDropped))
	if patchErr != nil {
		t.Error(patchErr)
	}
	if len(res.failures) > 0 {
		t.Errorf("%d of %d requests failed during the route changes; first: %s\nthe gateways' upstream errors:\n%s", len(res.failures), res.requests, res.failures[0], e.upstreamErrors())
	}
	if len(res.wsDropped) > 0 {
		t.Errorf("%d WebSockets dropped during the route changes: %v", len(res.wsDropped), res.wsDropped)
	}
	if res.requests < 100 || res.wsMessages < 100 {
		t.Errorf("only %d requests and %d WebSocket messages ran during the changes", res.requests, res.wsMessages)
	}
}

// endpointRemoval: while requests run, one pod of gw-a leaves the
// Service (relabelled: scaled down, it keeps running), then another is
// deleted while still an endpoint: no request fails, and none reaches a
// removed pod later than 1 s after its EndpointSlice stopped listing it
// ready.
func (e *gwEnv) endpointRemoval(t *testing.T) {
	if len(e.podsA) < 3 {
		t.Fatalf("gw-a has %v; the removal needs three pods", e.podsA)
	}
	e.createRoute(t, gwRoute("gw-removal", []string{"removal.gw.test"}, gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{gwBackend("gw-a", 1)}}))
	const url = "http://removal.gw.test/request/removal"
	nc := e.client(false)
	for _, p := range e.podsA {
		waitServed(t, nc, url, nil, servedBy([]string{p}))
	}
	ctx := context.Background()
	pods := e.l.c.CoreV1().Pods(gwNS)
	for _, step := range []struct {
		how    string
		victim string
		remove func(victim string) error
	}{
		{"relabelled out of the Service", e.podsA[1], func(victim string) error {
			_, err := pods.Patch(ctx, victim, types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"gw-a-removed"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"deleted", e.podsA[2], func(victim string) error { return pods.Delete(ctx, victim, metav1.DeleteOptions{}) }},
	} {
		pod, err := pods.Get(ctx, step.victim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		finish := e.load(url, "", 4, 0, servedBy(e.podsA), stop)
		time.Sleep(500 * time.Millisecond)
		removed := time.Now()
		err = step.remove(step.victim)
		// When the EndpointSlice stops listing it ready (polled every 20 ms).
		var changed time.Time
		for err == nil && changed.IsZero() && time.Since(removed) < 30*time.Second {
			list, lerr := e.l.c.DiscoveryV1().EndpointSlices(gwNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=gw-a"})
			if lerr == nil && !readyIn(list.Items, pod.Status.PodIP) {
				changed = time.Now()
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err == nil && changed.IsZero() {
			err = fmt.Errorf("gw-a's EndpointSlice still lists %s ready 30 s later", pod.Status.PodIP)
		}
		if err == nil {
			time.Sleep(3 * time.Second)
		}
		close(stop)
		res := finish()
		if err != nil {
			t.Fatalf("%s %s: %v", step.how, step.victim, err)
		}
		var late []string
		var last time.Time
		for _, s := range res.served {
			if s.pod == step.victim {
				last = s.at
				if s.at.After(changed.Add(time.Second)) {
					late = append(late, s.at.Sub(changed).Round(time.Millisecond).String())
				}
			}
		}
		lastS := "none during the run"
		if !last.IsZero() {
			lastS = last.Sub(changed).Round(time.Millisecond).String() + " after"
		}
		t.Logf("%s %s: EndpointSlice changed %s later; %d requests (p99 %s), %d failed; its last answer started %s the change",
			step.how, step.victim, changed.Sub(removed).Round(time.Millisecond), res.requests,
			percentile(res.latencies, 0.99).Round(time.Microsecond), len(res.failures), lastS)
		if len(res.failures) > 0 {
			t.Errorf("%s %s: %d of %d requests failed; first: %s\nthe gateways' upstream errors:\n%s", step.how, step.victim, len(res.failures), res.requests, res.failures[0], e.upstreamErrors())
		}
		if len(late) > 0 {
			t.Errorf("%s %s: %d requests reached it more than 1 s after its EndpointSlice change: %v", step.how, step.victim, len(late), late)
		}
	}
	e.l.deleteAndWait(t, e.podsA[1], e.podsA[2])
	e.podsA = e.podsA[:1]
}

func readyIn(list []discoveryv1.EndpointSlice, ip string) bool {
	for _, sl := range list {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready && slices.Contains(ep.Addresses, ip) {
				return true
			}
		}
	}
	return false
}

// ingress: an Ingress of class flatnet routes by host and path and gets
// the Ingress Service's address in status.loadBalancer.
func (e *gwEnv) ingress(t *testing.T) {
	ctx := context.Background()
	prefix := networkingv1.PathTypePrefix
	path := func(p, svc string) networkingv1.HTTPIngressPath {
		return networkingv1.HTTPIngressPath{Path: p, PathType: &prefix, Backend: networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: 80}},
		}}
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-ing", Namespace: gwNS},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr("flatnet"),
			Rules: []networkingv1.IngressRule{{
				Host: "ing.gw.test",
				IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{path("/request/a", "gw-a"), path("/request/b", "gw-b")},
				}},
			}},
		},
	}
	if _, err := e.l.c.NetworkingV1().Ingresses(gwNS).Create(ctx, ing, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Ingress: %v", err)
	}
	t.Cleanup(func() { _ = e.l.c.NetworkingV1().Ingresses(gwNS).Delete(ctx, ing.Name, metav1.DeleteOptions{}) })
	var ip string
	var last *networkingv1.Ingress
	if err := retry(30*time.Second, func() error {
		got, err := e.l.c.NetworkingV1().Ingresses(gwNS).Get(ctx, ing.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		last = got
		if lb := got.Status.LoadBalancer.Ingress; len(lb) > 0 && lb[0].IP != "" {
			ip = lb[0].IP
			return nil
		}
		return errors.New("no status.loadBalancer.ingress")
	}); err != nil {
		t.Fatalf("Ingress gw-ing: %v after 30 s; status %+v", err, last.Status)
	}
	// The address is the Ingress Service's LoadBalancer IP.
	var svcIPs []string
	if svcs, err := e.l.c.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=flatnet-ingress"}); err == nil {
		for _, s := range svcs.Items {
			for _, in := range s.Status.LoadBalancer.Ingress {
				svcIPs = append(svcIPs, in.IP)
			}
		}
	}
	if !slices.Contains(svcIPs, ip) {
		t.Errorf("Ingress status.loadBalancer %s is not an address of Service flatnet-ingress (%v)", ip, svcIPs)
	}
	c := (&gwEnv{ext: e.ext, addr: ip, roots: e.roots}).client(false)
	for _, tc := range []struct {
		path string
		pods []string
	}{{"/request/a/1", e.podsA}, {"/request/b/1", e.podsB}} {
		ri := waitServed(t, c, "http://ing.gw.test"+tc.path, nil, servedBy(tc.pods))
		if ri.Host != "ing.gw.test" || ri.Path != tc.path {
			t.Errorf("Ingress %s: the backend saw host %q path %q", tc.path, ri.Host, ri.Path)
		}
	}
	if _, err := ask(c, "http://ing.gw.test/other", nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Ingress, a path no rule has: %v, want 404", err)
	}
	t.Logf("Ingress gw-ing at %s", ip)
}
