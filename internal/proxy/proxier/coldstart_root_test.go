package proxier

// BenchmarkColdStart measures the proxy's cold start without the kernel:
// a real kube-apiserver and etcd (cptest.Start) hold N Services (a mix of
// ClusterIP with 1-3 ports, NodePort and LoadBalancer, some with
// externalTrafficPolicy Local or source ranges) with one EndpointSlice of
// 3-10 endpoints each; then the test binary runs itself again, and that
// fresh process starts one nftables-mode proxier whose transactions are
// rendered to nft's text (nft.Render, as the nft runner does) and thrown
// away. It reports, from process start to the first full sync done: CPU
// (getrusage), bytes and objects allocated, resident memory and live heap,
// and the first sync's render time.
//
//	go test -run '^$' -bench ColdStart -benchtime 1x ./internal/proxy/proxier/
//
// FLATNET_COLD_STATE=DIR keeps the control plane and its objects in DIR
// between runs (FLATNET_COLD_DOWN=1 stops it).
// FLATNET_COLD_SERVICES overrides N (10000), FLATNET_COLD_RUNS the number of
// cold starts measured (3; medians reported); FLATNET_COLD_CPUPROFILE=FILE
// and FLATNET_COLD_HEAPPROFILE=FILE write the last run's CPU profile (the
// whole process) and its heap profile at the first sync.
//
// When kube-proxy is built (hack/bench-proxy.sh puts it next to the
// control plane's binaries), the same number of cold starts of kube-proxy
// v1.37.2 in nftables mode follow, on the same objects, each in a network
// namespace of its own with the real kernel (FLATNET_COLD_KUBEPROXY=0
// leaves them out): its CPU and resident memory at its first sync.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/controlplane/cptest"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/testutil"
)

const coldNode = "cold-node"

func coldEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// coldResult is what one cold start reports to the parent.
type coldResult struct {
	DoneUnixNano  int64   // first full sync done
	CPUTotal      float64 // s, process start -> first sync done
	CPUProxier    float64 // s, proxier start -> first sync done
	CachesSynced  float64 // s, proxier start -> first sync started
	SyncSeconds   float64 // first sync, render + text
	TextSeconds   float64 // of which nft.Render (the transaction's text)
	Operations    int
	AllocBytes    uint64 // proxier start -> first sync done
	AllocObjects  uint64
	RSSBytes      uint64 // at the first sync done
	HeapInuse     uint64 // at the first sync done
	LiveHeapBytes uint64 // after a GC at the first sync done
	Services      int
}

func BenchmarkColdStart(b *testing.B) {
	if kc := os.Getenv("FLATNET_COLD_KUBECONFIG"); kc != "" {
		coldChild(b, kc)
		return
	}
	n, runs := coldEnvInt("FLATNET_COLD_SERVICES", 10000), coldEnvInt("FLATNET_COLD_RUNS", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	kubeconfig := coldControlPlane(ctx, b)
	if kubeconfig == "" {
		return
	}
	cfg, err := kube.Config(kubeconfig, "coldstart-bench")
	if err != nil {
		b.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 2000, 4000
	kc := kubernetes.NewForConfigOrDie(cfg)
	// A kept control plane (FLATNET_COLD_STATE) has them from before.
	marker := fmt.Sprintf("created-%d", n)
	if _, err := kc.CoreV1().ConfigMaps("cold").Get(ctx, marker, metav1.GetOptions{}); err != nil {
		start := time.Now()
		if err := createColdObjects(ctx, kc, n); err != nil {
			b.Fatal(err)
		}
		b.Logf("created %d Services and EndpointSlices in %v", n, time.Since(start).Round(time.Second))
		if _, err := kc.CoreV1().ConfigMaps("cold").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: marker}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	var results []coldResult
	b.ResetTimer()
	for range b.N {
		for run := range runs {
			out := fmt.Sprintf("%s/result-%d.json", b.TempDir(), run)
			args := []string{"-test.run", "^$", "-test.bench", "^BenchmarkColdStart$", "-test.benchtime", "1x"}
			if p := os.Getenv("FLATNET_COLD_CPUPROFILE"); p != "" && run == runs-1 {
				args = append(args, "-test.cpuprofile", p)
			}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "FLATNET_COLD_KUBECONFIG="+kubeconfig, "FLATNET_COLD_RESULT="+out)
			if run != runs-1 {
				cmd.Env = append(cmd.Env, "FLATNET_COLD_HEAPPROFILE=")
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			t0 := time.Now()
			if err := cmd.Run(); err != nil {
				b.Fatalf("cold start %d: %v\n%s", run, err, stderr.String())
			}
			var r coldResult
			data, err := os.ReadFile(out)
			if err == nil {
				err = json.Unmarshal(data, &r)
			}
			if err != nil {
				b.Fatalf("cold start %d result: %v\n%s", run, err, stderr.String())
			}
			if r.Services < n {
				b.Fatalf("cold start %d saw %d services, want at least %d", run, r.Services, n)
			}
			wall := time.Unix(0, r.DoneUnixNano).Sub(t0)
			b.Logf("run %d: exec -> first sync %v, CPU %.2f s (proxier %.2f s), caches synced %.2f s, first sync %.0f ms (text %.0f ms, %d operations), "+
				"allocated %.0f MiB in %.1f M objects, RSS %.0f MiB, heap in use %.0f MiB, live heap %.0f MiB",
				run, wall.Round(time.Millisecond), r.CPUTotal, r.CPUProxier, r.CachesSynced, r.SyncSeconds*1000, r.TextSeconds*1000, r.Operations,
				mib(r.AllocBytes), float64(r.AllocObjects)/1e6, mib(r.RSSBytes), mib(r.HeapInuse), mib(r.LiveHeapBytes))
			results = append(results, r)
		}
	}
	// The same cold start by kube-proxy, same objects, same run.
	var kpCPU, kpRSS []float64
	if bin, err := controlplane.BinDir(); err == nil && os.Getenv("FLATNET_COLD_KUBEPROXY") != "0" {
		if _, err := os.Stat(bin + "/kube-proxy"); err == nil {
			ensureColdNode(ctx, b, kc)
			for run := range runs {
				cpu, rss, wall := kubeProxyColdStart(ctx, b, bin+"/kube-proxy", kubeconfig)
				b.Logf("kube-proxy run %d: start -> first sync %v, CPU %.2f s, RSS %.0f MiB", run, wall.Round(time.Millisecond), cpu, mib(rss))
				kpCPU, kpRSS = append(kpCPU, cpu), append(kpRSS, mib(rss))
			}
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 {
		slices.Sort(v)
		return v[len(v)/2]
	}
	med := func(f func(coldResult) float64) float64 {
		v := make([]float64, len(results))
		for i, r := range results {
			v[i] = f(r)
		}
		return median(v)
	}
	if len(kpCPU) > 0 {
		b.ReportMetric(median(kpCPU), "kube-proxy-cpu-s")
		b.ReportMetric(median(kpRSS), "kube-proxy-rss-MiB")
	}
	b.ReportMetric(med(func(r coldResult) float64 { return r.CPUTotal }), "cpu-s")
	b.ReportMetric(med(func(r coldResult) float64 { return r.SyncSeconds * 1000 }), "sync-ms")
	b.ReportMetric(med(func(r coldResult) float64 { return r.TextSeconds * 1000 }), "text-ms")
	b.ReportMetric(med(func(r coldResult) float64 { return mib(r.AllocBytes) }), "alloc-MiB")
	b.ReportMetric(med(func(r coldResult) float64 { return float64(r.AllocObjects) / 1e6 }), "Mallocs")
	b.ReportMetric(med(func(r coldResult) float64 { return mib(r.RSSBytes) }), "rss-MiB")
	b.ReportMetric(med(func(r coldResult) float64 { return mib(r.LiveHeapBytes) }), "live-MiB")
}

// coldControlPlane starts the control plane: the test's own, or with
// FLATNET_COLD_STATE=DIR one kept running in DIR between runs (creating
// 10,000 Services takes minutes on a busy 2-core machine), which
// FLATNET_COLD_DOWN=1 stops ("" then).
func coldControlPlane(ctx context.Context, b *testing.B) string {
	state := os.Getenv("FLATNET_COLD_STATE")
	if state == "" {
		kubeconfig, _ := cptest.Start(b, 2*time.Minute)
		return kubeconfig
	}
	testutil.RequireRoot(b)
	if os.Getenv("FLATNET_COLD_DOWN") == "1" {
		if err := controlplane.Down(state); err != nil {
			b.Fatal(err)
		}
		return ""
	}
	bin, err := controlplane.BinDir()
	if err != nil {
		testutil.Skip(b, "%v (make k8s builds them)", err)
	}
	var log strings.Builder
	info, err := controlplane.Up(ctx, controlplane.Config{StateDir: state, BinDir: bin, Addr: netip.MustParseAddr("127.0.0.1")}, &log)
	if err != nil {
		b.Fatalf("control plane up: %v\n%s", err, log.String())
	}
	return info.Kubeconfig
}

func mib(v uint64) float64 { return float64(v) / (1 << 20) }

// ensureColdNode gives kube-proxy its Node, with an address (it waits
// for one at start).
func ensureColdNode(ctx context.Context, b *testing.B, kc kubernetes.Interface) {
	n, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: coldNode}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return
	}
	if err != nil {
		b.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.127.0.1"}, {Type: corev1.NodeHostName, Address: coldNode}}
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// createColdObjects creates Services svc-00000.. with their slices, 16 at
// a time.
func createColdObjects(ctx context.Context, kc kubernetes.Interface, n int) error {
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cold"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	next := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				// A busy machine's etcd times out now and then: retried.
				err := createColdService(ctx, kc, i)
				for try := 0; err != nil && try < 5; try++ {
					time.Sleep(time.Second << try)
					err = createColdService(ctx, kc, i)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

// createColdService creates Service i: one in 20 a NodePort, one in 20 a
// LoadBalancer (half of those with externalTrafficPolicy Local, a third
// with source ranges), the rest ClusterIP; 1-3 ports (1-2 for node ports,
// whose range is small); a slice of 3-10 endpoints, one in four on this
// node.
func createColdService(ctx context.Context, kc kubernetes.Interface, i int) error {
	svc, slice := coldObjects(i)
	got, err := kc.CoreV1().Services("cold").Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) { // from an interrupted run
		got, err = kc.CoreV1().Services("cold").Get(ctx, svc.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("service %s: %w", svc.Name, err)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer && len(got.Status.LoadBalancer.Ingress) == 0 {
		got.Status = coldStatus(i)
		if _, err := kc.CoreV1().Services("cold").UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("service %s status: %w", svc.Name, err)
		}
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("cold").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("endpointslice %s: %w", slice.Name, err)
	}
	return nil
}

// coldObjects returns Service i and its slice as created (see
// createColdService): the API server adds the ClusterIP and NodePorts.
func coldObjects(i int) (*corev1.Service, *discovery.EndpointSlice) {
	name := fmt.Sprintf("svc-%05d", i)
	typ, nports := corev1.ServiceTypeClusterIP, 1+i%3
	switch i % 20 {
	case 7:
		typ, nports = corev1.ServiceTypeNodePort, 1+i%2
	case 13:
		typ, nports = corev1.ServiceTypeLoadBalancer, 1+i%2
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "cold", Labels: map[string]string{"app": name, "tier": "bench"}},
		Spec:       corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": name}},
	}
	var eports []discovery.EndpointPort
	for p := range nports {
		pn := fmt.Sprintf("p%d", p)
		proto := corev1.ProtocolTCP
		if p == 2 {
			proto = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: pn, Port: int32(80 + p), Protocol: proto, TargetPort: intstr.FromInt32(int32(8080 + p))})
		eports = append(eports, discovery.EndpointPort{Name: &pn, Port: new(int32(8080 + p)), Protocol: &proto})
	}
	if typ == corev1.ServiceTypeLoadBalancer {
		if i%40 == 13 {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		if i%60 == 13 {
			svc.Spec.LoadBalancerSourceRanges = []string{"192.168.0.0/16", "172.16.0.0/12"}
		}
	}
	eps := make([]discovery.Endpoint, 3+i%8)
	for j := range eps {
		// 10.128.0.0/9: room for every endpoint of 10,000 services.
		v := uint32(i)*10 + uint32(j) + 1
		node := fmt.Sprintf("node-%d", j%4)
		if j%4 == 0 {
			node = coldNode
		}
		eps[j] = discovery.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{10, 128 + byte(v>>16), byte(v >> 8), byte(v)}).String()},
			Conditions: discovery.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "cold", Name: fmt.Sprintf("%s-%d", name, j)},
		}
	}
	slice := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: "cold",
			Labels: map[string]string{
				discovery.LabelServiceName: name,
				discovery.LabelManagedBy:   "coldstart.flatnet.io",
			},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       eports,
	}
	return svc, slice
}

// coldStatus is LoadBalancer Service i's status, as a load-balancer
// controller would write it.
func coldStatus(i int) corev1.ServiceStatus {
	lb := netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})
	return corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: lb.String()}}}}
}

// nullNFT renders each transaction to nft's text and drops it: what the
// nft runner costs in this process, without nft and the kernel.
type nullNFT struct {
	txs  *knftables.Fake
	text time.Duration
}

func (n *nullNFT) NewTransaction() *knftables.Transaction { return n.txs.NewTransaction() }

func (n *nullNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	t0 := time.Now()
	_, err := nft.Render(tx)
	n.text += time.Since(t0)
	return err
}

func (n *nullNFT) ListAll(context.Context) (map[string][]string, error) { return nil, nil }

// firstSync wraps a backend and says when its first sync is done.
type firstSync struct {
	proxy.Backend
	once     sync.Once
	started  time.Time
	took     time.Duration
	ops      int
	services int
	done     chan struct{}
}

func (f *firstSync) Sync(ctx context.Context, services []*proxy.Service, changed proxy.Changes, full bool) (proxy.SyncResult, error) {
	t0 := time.Now()
	res, err := f.Backend.Sync(ctx, services, changed, full)
	f.once.Do(func() {
		f.started, f.took, f.ops, f.services = t0, time.Since(t0), res.Operations, len(services)
		close(f.done)
	})
	return res, err
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func rssBytes() uint64 {
	data, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// coldChild is one cold start, in a process of its own.
func coldChild(b *testing.B, kubeconfig string) {
	client, err := kube.Client(kubeconfig, "coldstart-proxy")
	if err != nil {
		b.Fatal(err)
	}
	null := &nullNFT{txs: knftables.NewFake(knftables.IPv4Family, nftables.DefaultTable)}
	fs := &firstSync{done: make(chan struct{}), Backend: nftables.NewBackend(null, nftables.Config{
		Family: knftables.IPv4Family, NodeName: coldNode, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")},
	})}
	p := New(Config{Client: client, Backend: fs, NodeName: coldNode, MinSyncInterval: time.Second, MaxSyncInterval: 30 * time.Second})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	defer cancel()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0, t0 := cpuSeconds(), time.Now()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	select {
	case <-fs.done:
	case err := <-errc:
		b.Fatalf("proxier stopped: %v", err)
	case <-time.After(10 * time.Minute):
		b.Fatal("no sync in 10 minutes")
	}
	r := coldResult{DoneUnixNano: time.Now().UnixNano(), CPUTotal: cpuSeconds(), RSSBytes: rssBytes()}
	r.CPUProxier = r.CPUTotal - cpu0
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.AllocBytes, r.AllocObjects, r.HeapInuse = ms.TotalAlloc-ms0.TotalAlloc, ms.Mallocs-ms0.Mallocs, ms.HeapInuse
	r.CachesSynced, r.SyncSeconds, r.TextSeconds = fs.started.Sub(t0).Seconds(), fs.took.Seconds(), null.text.Seconds()
	r.Operations, r.Services = fs.ops, fs.services
	runtime.GC()
	runtime.ReadMemStats(&ms)
	r.LiveHeapBytes = ms.HeapAlloc
	if path := os.Getenv("FLATNET_COLD_HEAPPROFILE"); path != "" {
		writeHeapProfile(b, path)
	}
	data, _ := json.Marshal(r)
	if err := os.WriteFile(os.Getenv("FLATNET_COLD_RESULT"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	// Keep the proxier's objects alive through the measurement.
	runtime.KeepAlive(p)
}

// kubeProxyConfig is test/bench/proxy's KubeProxyConfiguration (nftables
// mode, kube-proxy's defaults otherwise), for coldNode.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
  qps: 50
  burst: 100
hostnameOverride: ` + coldNode + `
clusterCIDR: 10.128.0.0/9
mode: nftables
nftables:
  minSyncPeriod: 1s
  syncPeriod: 30s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: ["0.0.0.0/0"]
detectLocalMode: ClusterCIDR
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

// kubeProxyColdStart runs upstream kube-proxy (nftables mode, the real
// kernel) in a network namespace of its own until its first sync and
// returns its CPU and resident memory then, read from /proc (nft's own
// CPU, a child process, is not counted, as flatnet's nft is not). The
// namespace reaches the apiserver on 127.0.0.1 through a forwarder of the
// test's: a listener inside it, dialling out from the test's namespace,
// so nothing is routed.
func kubeProxyColdStart(ctx context.Context, b *testing.B, bin, kubeconfig string) (cpu float64, rss uint64, wall time.Duration) {
	b.Helper()
	ns := testutil.NewNetNS(b)
	raw, err := os.ReadFile(kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	server := regexp.MustCompile(`server: https://([0-9.]+:[0-9]+)`).FindStringSubmatch(string(raw))
	if server == nil {
		b.Fatalf("no server in %s", kubeconfig)
	}
	var ln net.Listener
	if err := netns.Do(ns, func() (err error) { ln, err = net.Listen("tcp", server[1]); return err }); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", server[1])
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c); s.Close() }()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	dir := b.TempDir()
	cfg := dir + "/config.yaml"
	if err := os.WriteFile(cfg, fmt.Appendf(nil, kubeProxyConfig, kubeconfig), 0o600); err != nil {
		b.Fatal(err)
	}
	logf, err := os.Create(dir + "/kube-proxy.log")
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", "--net="+ns, bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = netns.Do(ns, func() error { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
		return c, err
	}}}
	// The IPv4 proxier's first successful sync (kube-proxy runs an IPv6
	// one too, with nothing to do). Polled twice a second: each scrape
	// costs kube-proxy a little CPU.
	synced := regexp.MustCompile(`(?m)^kubeproxy_sync_proxy_rules_last_timestamp_seconds(?:\{ip_family="IPv4"\})? ([0-9.e+]+)$`)
	deadline := time.Now().Add(20 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(500 * time.Millisecond)
		resp, err := client.Get("http://127.0.0.1:10249/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := synced.FindSubmatch(body); m != nil && string(m[1]) != "0" {
			wall = time.Since(t0)
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
			if err != nil {
				b.Fatal(err)
			}
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
			ut, _ := strconv.ParseFloat(f[11], 64)
			st, _ := strconv.ParseFloat(f[12], 64)
			status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
			for line := range strings.SplitSeq(string(status), "\n") {
				if fs := strings.Fields(line); len(fs) >= 2 && fs[0] == "VmRSS:" {
					kb, _ := strconv.ParseUint(fs[1], 10, 64)
					rss = kb << 10
				}
			}
			return (ut + st) / 100, rss, wall // USER_HZ
		}
	}
	log, _ := os.ReadFile(dir + "/kube-proxy.log")
	b.Fatalf("kube-proxy: no sync in 20 minutes\n%s", log)
	return 0, 0, 0
}

// writeHeapProfile writes the heap profile (in-use and allocated) to path.
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
