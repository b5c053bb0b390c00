package controller

// BenchmarkRouteChangeServed measures what the issue calls "route change
// -> served": the time from the API server acknowledging a new HTTPRoute
// to the first 200 for it from the data plane, polled every millisecond
// as howardjohn/gateway-api-bench does (404 until then; anything else is
// an error). The gateway is the real one (controller, compile, proxy on
// 127.0.0.1) on a real kube-apiserver and etcd, with 100 and then 10,000
// HTTPRoutes attached; resident memory is read at 10,000.
//
//	go test -run '^$' -bench RouteChangeServed -benchtime 1x ./internal/gateway/controller/
//
// FLATNET_GW_ROUTES overrides the larger count, FLATNET_GW_PROBES the
// number of changes measured at each size (default 50);
// FLATNET_GW_CPUPROFILE=FILE writes the measured process's CPU profile.
//
// The API server refuses loopback endpoint addresses, so the benchmark
// runs itself again inside a network namespace of its own (lo up, plus
// 10.99.0.1/32 on lo for the backend): the control plane, the gateway and
// the backend all live there and nothing touches this machine's network.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flatnet/flatnet/internal/gateway/proxy"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/controlplane/cptest"
	"github.com/flatnet/flatnet/internal/testutil"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

const benchBackendIP = "10.99.0.1"

func BenchmarkRouteChangeServed(b *testing.B) {
	testutil.RequireRoot(b)
	if _, err := controlplane.BinDir(); err != nil {
		testutil.Skip(b, "%v (make k8s builds them)", err)
	}
	if os.Getenv("FLATNET_GW_INNER") != "1" {
		ns := testutil.NewNetNS(b)
		testutil.Run(b, "ip", "-n", testutil.NSName(ns), "addr", "add", benchBackendIP+"/32", "dev", "lo")
		args := []string{"--net=" + ns, os.Args[0], "-test.run", "^$", "-test.bench", "^BenchmarkRouteChangeServed$", "-test.benchtime", "1x", "-test.v"}
		if p := os.Getenv("FLATNET_GW_CPUPROFILE"); p != "" {
			args = append(args, "-test.cpuprofile", p)
		}
		cmd := exec.Command("nsenter", args...)
		cmd.Env = append(os.Environ(), "FLATNET_GW_INNER=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			b.Fatalf("the benchmark in its namespace: %v", err)
		}
		return
	}
	big, probes := envInt("FLATNET_GW_ROUTES", 10000), envInt("FLATNET_GW_PROBES", 50)
	kubeconfig, _ := cptest.Start(b, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := lab.EnsureCRDs(ctx, kubeconfig); err != nil {
		b.Fatal(err)
	}
	cfg, err := kube.Config(kubeconfig, "gateway-bench")
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 2000, 2000
	kc := kubernetes.NewForConfigOrDie(cfg)
	gc := gwclient.NewForConfigOrDie(jsonConfig(cfg))

	bl, err := net.Listen("tcp", benchBackendIP+":0")
	if err != nil {
		b.Fatal(err)
	}
	backend := &httptest.Server{Listener: bl, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })}}
	backend.Start()
	defer backend.Close()
	bport, _ := strconv.Atoi(backend.URL[strings.LastIndexByte(backend.URL, ':')+1:])
	bindPort := freeTCPPort(b)
	ns := "default"
	mustCreateBackend(ctx, b, kc, ns, int32(bport))
	if _, err := gc.GatewayV1().Gateways(ns).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec: gwv1.GatewaySpec{GatewayClassName: "flatnet", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType,
			AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: ptr.To(gwv1.NamespacesFromAll)}}}}},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}

	srv := proxy.New(proxy.Options{BindAddress: "127.0.0.1"})
	defer srv.Close(context.Background())
	c := New(kc, gc, srv, Options{NodeName: "bench", Namespace: "kube-system", Range: PortRange{int32(bindPort), int32(bindPort)}}, klog.Background())
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() { stop(); <-done }()

	// What a load-balancer IP allocator does for the frontend Service.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := kc.CoreV1().Services(ns).Get(ctx, "gw-flatnet-gw", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.251.0.9"}}
		_, err = kc.CoreV1().Services(ns).UpdateStatus(ctx, s, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		b.Fatalf("frontend Service: %v", err)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 2 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/", bindPort)
	created := 0
	grow := func(n int) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		next := make(chan int)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if _, err := gc.GatewayV1().HTTPRoutes(ns).Create(ctx, route(ns, fmt.Sprintf("r-%d", i), fmt.Sprintf("r-%d.example.com", i)), metav1.CreateOptions{}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		for i := created; i < n; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		created = n
		// Settled: the last one serves.
		if _, _, err := waitServed(ctx, client, url, fmt.Sprintf("r-%d.example.com", n-1), 5*time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	measure := func(size int) {
		var lat []time.Duration
		bad := 0
		for i := range probes {
			host := fmt.Sprintf("probe-%d-%d.example.com", size, i)
			if _, err := gc.GatewayV1().HTTPRoutes(ns).Create(ctx, route(ns, fmt.Sprintf("probe-%d-%d", size, i), host), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			d, other, err := waitServed(ctx, client, url, host, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, d)
			bad += other
		}
		slices.Sort(lat)
		p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
		b.ReportMetric(p(0.5), fmt.Sprintf("p50-ms@%d", size))
		b.ReportMetric(p(0.99), fmt.Sprintf("p99-ms@%d", size))
		b.ReportMetric(float64(bad), fmt.Sprintf("errors@%d", size))
		b.Logf("%d routes: route create -> served p50 %.1f ms p99 %.1f ms max %.1f ms over %d changes, %d answers other than 404/200", size, p(0.5), p(0.99), p(1), len(lat), bad)
	}
	b.ResetTimer()
	for range b.N {
		grow(100)
		measure(100)
		grow(big)
		measure(big)
		runtime.GC()
		rss := rssMiB()
		b.ReportMetric(rss, fmt.Sprintf("rss-MiB@%d", big))
		b.Logf("resident memory at %d routes: %.0f MiB (this process: the gateway's informers, tables and proxy, plus the benchmark's client)", big, rss)
	}
}

// waitServed polls url with Host host every millisecond until it answers
// 200; it returns how long that took and how many answers were neither
// 404 nor 200.
func waitServed(ctx context.Context, c *http.Client, url, host string, limit time.Duration) (time.Duration, int, error) {
	t0 := time.Now()
	other := 0
	for time.Since(t0) < limit {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Host = host
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return time.Since(t0), other, nil
			case http.StatusNotFound:
			default:
				other++
			}
		} else {
			other++
		}
		time.Sleep(time.Millisecond)
	}
	return 0, other, fmt.Errorf("%s not served after %s", host, limit)
}

func route(ns, name, host string) *gwv1.HTTPRoute {
	return &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw"}}},
			Hostnames:       []gwv1.Hostname{gwv1.Hostname(host)},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
				Name: "web", Port: ptr.To(gwv1.PortNumber(8080))}}}}}},
		},
	}
}

// mustCreateBackend makes Service web (port 8080) whose one endpoint is
// benchBackendIP:port.
func mustCreateBackend(ctx context.Context, tb testing.TB, kc kubernetes.Interface, ns string, port int32) {
	tb.Helper()
	if _, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	if _, err := kc.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{benchBackendIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Port: &port, Protocol: ptr.To(corev1.ProtocolTCP), Name: ptr.To("http")}},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("backend EndpointSlice: %v", err)
	}
}

func freeTCPPort(tb testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
