package e2e

// The Service proxy when things fail (issue 14, item 7), in the lab:
//
//   - AgentKilledLosesNoRequest: kill -9 of a node's agent under a steady
//     request loop loses no request; `lab up` starts it again, its first
//     (full) sync keeps the table's chains (same handles: nothing was
//     deleted and made again) and programs a Service created while it was
//     dead.
//   - APIServerOutage: the kube-apiserver stopped for a minute (a real
//     stop, SIGTERM through its pid file; `lab up` starts it again with the
//     flags it recorded) leaves every rule in place: a request loop and one
//     long-lived TCP connection through a ClusterIP both go on, the table
//     keeps its handles, and every agent keeps running. Once it is back the
//     proxy catches up: an endpoint added then is programmed, and its
//     metrics count the change.
//   - ThousandEndpointsSpread: a Service with 1,000 endpoints spreads new
//     connections within a binomial bound. The endpoints are 1,000
//     addresses of an interface in one node's namespace, served by one
//     listener (on 0.0.0.0) that answers each connection with the address
//     it was made to: like hostNetwork endpoints, cheap where 1,000 pods
//     are not.
//
// checkProxyFailure takes the lab and the agents' proxy mode, so that
// running it against every mode is one line in TestLab; the checks of the
// nftables table (its handles) run in nftables mode only.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	proxynft "github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/testutil"
)

// outageTime is how long the apiserver stays stopped.
const outageTime = 60 * time.Second

// checkProxyFailure runs the failure checks on a running lab with at
// least three nodes whose agents run the proxy in mode; clients are
// netexec pods, one per node.
func checkProxyFailure(t *testing.T, l *testLab, clients []labPod, mode string) {
	s := l.spec
	client := clients[0]
	label := "fail-" + randHex(3)
	// Two endpoints on the other nodes, and a third pod, Ready but not
	// selected until the apiserver outage is over. Each serves TCP echo on
	// 8082 too, for a long-lived connection.
	serving := map[string]string{"e2e-fail": label}
	names := []string{label + "-a", label + "-b", label + "-c"}
	for i, name := range names {
		p := netexecPod(name, s.Nodes[1+i%2].Name)
		p.Labels = map[string]string{"e2e-fail": label}
		if i == 2 {
			p.Labels["e2e-fail"] = label + "-later"
		}
		p.Spec.Containers[0].Command = []string{"flatnet", "netexec", "--http-port=8080", "--udp-port=8081", "--tcp-port=8082"}
		l.create(t, p)
	}
	t.Cleanup(func() { l.deleteAndWait(t, names...) })
	pods := map[string]labPod{}
	for _, name := range names {
		p := l.waitReady(t, name)
		n, _ := s.Node(p.Spec.NodeName)
		pods[name] = labPod{name, p.Status.PodIP, n}
	}
	svc := service(label, corev1.ServiceTypeClusterIP, serving)
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "echo", Protocol: corev1.ProtocolTCP, Port: 8082, TargetPort: intstr.FromInt32(8082)})
	svc = l.createService(t, svc)
	vip := svc.Spec.ClusterIP
	addr := net.JoinHostPort(vip, "80")
	nsPath := podNetns(t, s, client.node, "default", client.name)
	for _, want := range names[:2] {
		if err := retry(30*time.Second, func() error {
			for _, h := range hitsFrom(nsPath, addr, 10) {
				if h.err == nil && h.host == want {
					return nil
				}
			}
			return fmt.Errorf("%s does not answer", want)
		}); err != nil {
			t.Fatalf("%s -> %s: %v", client.name, addr, err)
		}
	}

	tRunIf(t, mode == "nftables", "AgentKilledLosesNoRequest", func(t *testing.T) {
		checkAgentRestart(t, l, client, svc, names[:2], syscall.SIGKILL, func(suffix string) *corev1.Service {
			return l.createService(t, service(label+"-"+suffix, corev1.ServiceTypeClusterIP, serving))
		})
	})

	t.Run("APIServerOutage", func(t *testing.T) {
		checkAPIServerOutage(t, l, client, svc, names[:2], pods[names[2]], serving, mode)
	})

	t.Run("ThousandEndpointsSpread", func(t *testing.T) { checkThousandEndpoints(t, l, client, mode) })
}

// checkAPIServerOutage stops the apiserver for outageTime while client
// requests svc's ClusterIP on port 80 (answered by the pods named want)
// in a loop and holds one TCP connection to its port 8082 open, then
// starts it again with `lab up` and adds the pod later (relabelled with
// labels) to the Service.
//
// Catching up takes a while: a client-go reflector that failed for a
// minute retries at [30, 60) s intervals (its default backoff, kube-proxy's
// too), so the agent's informers and the controller's may each see the
// apiserver again up to a minute after it is back. catchUpBound covers
// that.
func checkAPIServerOutage(t *testing.T, l *testLab, client labPod, svc *corev1.Service, want []string, later labPod, labels map[string]string, mode string) {
	const catchUpBound = 90 * time.Second
	s := l.spec
	vip := svc.Spec.ClusterIP
	key := svc.Namespace + "/" + svc.Name
	n := client.node
	nsPath := podNetns(t, s, n, "default", client.name)
	ctx := context.Background()

	// The long-lived connection, and who answers it.
	echo, err := dialIn(nsPath, net.JoinHostPort(vip, "8082"))
	if err != nil {
		t.Fatalf("TCP to %s:8082: %v", vip, err)
	}
	defer echo.Close()
	echoHost, err := echo.ask("hostname")
	if err != nil || !contains(want, echoHost) {
		t.Fatalf("the long-lived connection to %s:8082: hostname %q, %v", vip, echoHost, err)
	}

	agents := map[string]int{}
	for _, node := range s.Nodes {
		pid, ok := proc.Running(s.StateDir, lab.AgentProc(node.Name))
		if !ok {
			t.Fatalf("agent on %s not running", node.Name)
		}
		agents[node.Name] = pid
	}
	handles := func() map[string]string {
		if mode != "nftables" {
			return nil
		}
		return mustTableHandles(t, n)
	}
	handles0 := handles()
	metrics0 := proxyMetrics(t, n)
	logFile := proc.LogFile(s.StateDir, lab.AgentProc(n.Name))
	logFrom := fileSize(logFile)

	loop := startRequestLoop(nsPath, net.JoinHostPort(vip, "80"), append([]string{later.name}, want...))
	defer loop.close()
	loop.waitSent(t, 10, false)

	apiPID, _ := proc.Running(s.StateDir, controlplane.APIServerName)
	loop.setMark(true)
	t0 := time.Now()
	// SIGTERM, and SIGKILL if it is still there 5 s later (it may spend
	// longer closing its watches).
	if err := proc.Stop(s.StateDir, controlplane.APIServerName, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(t0)
	tDown := time.Now()
	// The positive signal that it is down: the API does not answer.
	if _, err := l.c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil {
		t.Fatal("the API still answers after kube-apiserver was stopped")
	}
	t.Logf("kube-apiserver (pid %d) stopped in %s; %s without it", apiPID, stopped.Round(time.Millisecond), outageTime)
	// Through the outage: the connection keeps echoing, every agent keeps
	// running, and the loop keeps requesting (it records any failure).
	echoes := 0
	for time.Since(tDown) < outageTime {
		time.Sleep(5 * time.Second)
		if got, err := echo.ask("during the outage " + strconv.Itoa(echoes)); err != nil || got != "during the outage "+strconv.Itoa(echoes) {
			t.Errorf("the long-lived connection %s after the apiserver stopped: %q, %v", time.Since(tDown).Round(time.Second), got, err)
			break
		}
		echoes++
	}
	for node, pid := range agents {
		if p, ok := proc.Running(s.StateDir, lab.AgentProc(node)); !ok || p != pid {
			t.Errorf("agent on %s (pid %d) did not outlive the apiserver outage (now pid %d, running %v)", node, pid, p, ok)
		}
	}
	_, sentDown := loop.counts()
	if d := handlesChanged(handles0, handles(), key); d != "" {
		t.Errorf("node %s's proxy table changed its handles during the outage (deleted and made again?):\n%s", n.Name, d)
	}

	// Back: `lab up` starts what is missing with the flags recorded. Once
	// more if that fails: on a loaded machine etcd, which ran on alone,
	// has been seen to stall for a minute (the new apiserver's reads timed
	// out) and recover.
	out, err := l.cli("up")
	if err != nil {
		t.Logf("lab up after the outage failed, once more: %v\n%s", err, out)
		if out, err = l.cli("up"); err != nil {
			t.Fatalf("lab up after the outage: %v\n%s", err, out)
		}
	}
	back := time.Since(tDown)
	loop.setMark(false)
	apiPID1, ok := proc.Running(s.StateDir, controlplane.APIServerName)
	if !ok || apiPID1 == apiPID {
		t.Fatalf("kube-apiserver not started again by lab up (pid %d, then %d running %v):\n%s", apiPID, apiPID1, ok, out)
	}
	var restarted []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "... done") {
			restarted = append(restarted, strings.TrimSpace(line))
		}
	}
	t.Logf("lab up %s after the stop was done started kube-apiserver again (pid %d): %q", back.Round(time.Millisecond), apiPID1, restarted)

	// The proxy catches up: the pod added to the Service now is programmed
	// on the client's node, and answers.
	p, err := l.c.CoreV1().Pods("default").Get(ctx, later.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range labels {
		p.Labels[k] = v
	}
	wctx, cancel := context.WithTimeout(ctx, catchUpBound)
	defer cancel()
	sw, err := l.c.DiscoveryV1().EndpointSlices("default").Watch(wctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		t.Fatal(err)
	}
	slicec := firstEvent(sw, func(o runtime.Object) bool {
		sl, ok := o.(*discoveryv1.EndpointSlice)
		return ok && slices.ContainsFunc(sl.Endpoints, func(ep discoveryv1.Endpoint) bool {
			return ep.TargetRef != nil && ep.TargetRef.Name == later.name
		})
	})
	t1 := time.Now()
	if _, err := l.c.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitKernelRules(n, mode, catchUpBound, func(rules string) string {
		if !hasAddr(rules, later.ip) {
			return "no " + later.ip + " (" + later.name + ") in the rules"
		}
		return ""
	}); err != nil {
		t.Fatalf("after the apiserver came back the proxy did not program the new endpoint within %s: %v", catchUpBound, err)
	}
	programmed := time.Since(t1)
	inSlice := "never seen"
	if at := <-slicec; !at.IsZero() {
		inSlice = at.Sub(t1).Round(time.Millisecond).String()
	}
	if err := retry(catchUpBound, func() error {
		for _, h := range hitsFrom(nsPath, net.JoinHostPort(vip, "80"), 10) {
			if h.err == nil && h.host == later.name {
				return nil
			}
		}
		return fmt.Errorf("%s does not answer", later.name)
	}); err != nil {
		t.Errorf("the endpoint added after the outage: %v", err)
	}
	loop.waitSent(t, 10, false)
	sent, _ := loop.counts()
	fails := loop.close()

	if got, err := echo.ask("after the outage"); err != nil || got != "after the outage" {
		t.Errorf("the long-lived connection after the outage: %q, %v", got, err)
	}
	if h, err := echo.ask("hostname"); err != nil || h != echoHost {
		t.Errorf("the long-lived connection moved from %s to %q (%v)", echoHost, h, err)
	}
	if d := handlesChanged(handles0, handles(), key); d != "" {
		t.Errorf("node %s's proxy table changed its handles after the outage:\n%s", n.Name, d)
	}
	metrics1 := proxyMetrics(t, n)
	for _, m := range []string{"flatnet_sync_proxy_rules_endpoint_changes_total", "flatnet_sync_proxy_rules_duration_seconds_count"} {
		if metrics1[m] <= metrics0[m] {
			t.Errorf("node %s: %s %v before the outage, %v after the new endpoint was programmed: want more", n.Name, m, metrics0[m], metrics1[m])
		}
	}
	if f := "flatnet_sync_proxy_rules_nftables_sync_failures_total"; mode == "nftables" && metrics1[f] != metrics0[f] {
		t.Errorf("node %s: %s went from %v to %v across the outage", n.Name, f, metrics0[f], metrics1[f])
	}
	// What the agent logged while the API was away (client-go's retries),
	// for the record: its state is what the checks above look at.
	apiErrs := 0
	for _, line := range strings.Split(readFrom(logFile, logFrom), "\n") {
		if strings.Contains(line, "connection refused") {
			apiErrs++
		}
	}
	t.Logf("apiserver outage: %d requests from %s to %s:80 (%d while it was stopped), %d failed; the long-lived connection to %s (%s) echoed %d times during it; %s in the EndpointSlice %s after the relabel, %s's proxy programmed it %s after the relabel (endpoint changes %v -> %v, syncs %v -> %v); the agent logged %d failed API calls",
		sent, client.name, vip, sentDown, len(fails), echoHost, echo.LocalAddr(), echoes, later.name, inSlice, n.Name, programmed.Round(time.Millisecond),
		metrics0["flatnet_sync_proxy_rules_endpoint_changes_total"], metrics1["flatnet_sync_proxy_rules_endpoint_changes_total"],
		metrics0["flatnet_sync_proxy_rules_duration_seconds_count"], metrics1["flatnet_sync_proxy_rules_duration_seconds_count"], apiErrs)
	if len(fails) > 0 {
		t.Errorf("%d of %d requests from %s to %s:80 failed across the apiserver outage: %s", len(fails), sent, client.name, vip, sample(fails))
	}
}

// checkThousandEndpoints: a Service without selector whose 1,000
// endpoints (10 EndpointSlices of 100, as the EndpointSlice controller cuts
// them) are addresses of an interface in client's node namespace,
// all served by one listener there. client makes spreadConns new
// connections to the ClusterIP; each is answered with the address it
// reached. Every endpoint's count is Binomial(spreadConns, 1/1000):
// spreadBounds gives the range a fair choice misses with p < 1e-6 (union
// bound over all endpoints), and Pearson's chi-square over the 1,000
// counts must stay below its 1 - 1e-6 quantile.
func checkThousandEndpoints(t *testing.T, l *testLab, client labPod, mode string) {
	const endpoints, perSlice, spreadConns, workers = 1000, 100, 30000, 8
	s := l.spec
	n := client.node
	nodeNS := lab.NetnsPath(n.Netns)
	// RFC 2544's benchmarking range, inside the node's namespace only.
	epRange := netip.MustParsePrefix("198.18.0.0/22")
	for _, p := range []netip.Prefix{s.ClusterCIDR, s.ServiceCIDR, s.Underlay, s.Underlay2, s.LBPool} {
		if p.IsValid() && p.Overlaps(epRange) {
			t.Fatalf("the endpoints' range %s overlaps the lab's %s: pick another", epRange, p)
		}
	}
	// A veth pair with both ends in the node (this kernel may have no
	// dummy driver); deleting one end removes both and the addresses.
	dev := testutil.Name("fnep")
	peer := testutil.Name("fneq")
	testutil.RunIn(t, nodeNS, "ip", "link", "add", dev, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() {
		if out, err := output("ip", "netns", "exec", n.Netns, "ip", "link", "del", dev); err != nil {
			t.Errorf("removing %s from %s: %v: %s", dev, n.Name, err, out)
		}
	})
	var batch strings.Builder
	var ips []netip.Addr
	for i := range endpoints {
		a := nthAddr(epRange, i+1)
		ips = append(ips, a)
		fmt.Fprintf(&batch, "addr add %s/32 dev %s\n", a, dev)
	}
	fmt.Fprintf(&batch, "link set %s up\nlink set %s up\n", dev, peer)
	batchFile := filepath.Join(t.TempDir(), "addrs")
	if err := os.WriteFile(batchFile, []byte(batch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.RunIn(t, nodeNS, "ip", "-batch", batchFile)

	// One listener for all of them, answering with the address reached.
	var ln net.Listener
	if err := netns.Do(nodeNS, func() error {
		var err error
		ln, err = net.Listen("tcp4", "0.0.0.0:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.LocalAddr().String())
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, host+"\n")
			c.Close()
		}
	}()

	name := "spread-" + randHex(3)
	svc := service(name, corev1.ServiceTypeClusterIP, nil)
	svc.Spec.Ports[0].TargetPort = intstr.FromInt32(int32(port))
	vip := l.createService(t, svc).Spec.ClusterIP
	ctx := context.Background()
	for i := 0; i < endpoints; i += perSlice {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%s-%d", name, i/perSlice), Namespace: "default",
				Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "e2e.flatnet.test"},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(port))}},
		}
		for _, a := range ips[i : i+perSlice] {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		if _, err := l.c.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating EndpointSlice %s: %v", sl.Name, err)
		}
		t.Cleanup(func() { _ = l.c.DiscoveryV1().EndpointSlices("default").Delete(ctx, sl.Name, metav1.DeleteOptions{}) })
	}
	// The positive signal: the client's node balances over all 1,000.
	t0 := time.Now()
	// nft: "198.18.0.1 . PORT"; iptables: "198.18.0.1:PORT".
	epRe := regexp.MustCompile(`198\.18\.\d+\.\d+(?: \. |:)` + strconv.Itoa(port) + `\b`)
	if err := waitKernelRules(n, mode, 60*time.Second, func(rules string) string {
		if got := len(uniq(epRe.FindAllString(rules, -1))); got != endpoints {
			return fmt.Sprintf("%d of %d endpoints in the table", got, endpoints)
		}
		return ""
	}); err != nil {
		t.Fatalf("Service %s (%s) with %d endpoints: %v", name, vip, endpoints, err)
	}
	programmed := time.Since(t0)

	nsPath := podNetns(t, s, client.node, "default", client.name)
	addr := net.JoinHostPort(vip, "80")
	if err := retry(60*time.Second, func() error {
		return netns.Do(nsPath, func() error { _, err := askOnce(addr); return err })
	}); err != nil {
		t.Fatalf("%s -> %s: %v", client.name, addr, err)
	}
	count := map[string]int{}
	var errs []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	t1 := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := map[string]int{}
			var failed []string
			// Every dial of this worker from one thread in the pod's
			// namespace: a socket belongs to the namespace it was made in.
			err := netns.Do(nsPath, func() error {
				for i := w; i < spreadConns; i += workers {
					got, err := askOnce(addr)
					if err != nil {
						failed = append(failed, err.Error())
						continue
					}
					local[got]++
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err.Error())
			}
			for k, v := range local {
				count[k] += v
			}
			errs = append(errs, failed...)
		}()
	}
	wg.Wait()
	took := time.Since(t1)
	if len(errs) > 0 {
		t.Errorf("%d of %d connections to %s failed: %s", len(errs), spreadConns, addr, sample(errs))
	}
	want := map[string]bool{}
	for _, a := range ips {
		want[a.String()] = true
	}
	for h := range count {
		if !want[h] {
			t.Errorf("a connection to %s reached %q, not an endpoint", addr, h)
		}
	}
	total := spreadConns - len(errs)
	lo, hi := spreadBounds(total, endpoints, 1e-6)
	mean := float64(total) / endpoints
	sd := math.Sqrt(mean * (1 - 1.0/endpoints))
	var counts []int
	chi2 := 0.0
	var out []string
	for _, a := range ips {
		c := count[a.String()]
		counts = append(counts, c)
		chi2 += (float64(c) - mean) * (float64(c) - mean) / mean
		if c < lo || c > hi {
			out = append(out, fmt.Sprintf("%s: %d", a, c))
		}
	}
	sort.Ints(counts)
	df := float64(endpoints - 1)
	chi2Max := chiSquareQuantile(df, 4.753) // z of 1 - 1e-6
	t.Logf("%d endpoints (%d EndpointSlices) programmed on %s %s after the last slice was created; %d connections from %s to %s in %s (%.0f/s, %d workers), %d failed; per endpoint: min %d, median %d, max %d (mean %.1f, sd %.2f; mean ± 6 sd %.1f..%.1f; binomial bound %d..%d for p < 1e-6); chi-square %.1f with %v degrees of freedom (1 - 1e-6 quantile %.1f)",
		endpoints, endpoints/perSlice, n.Name, programmed.Round(time.Millisecond), spreadConns, client.name, addr, took.Round(time.Millisecond), float64(spreadConns)/took.Seconds(), workers, len(errs),
		counts[0], counts[len(counts)/2], counts[len(counts)-1], mean, sd, mean-6*sd, mean+6*sd, lo, hi, chi2, df, chi2Max)
	if len(out) > 0 {
		t.Errorf("%d of %d endpoints got a count outside %d..%d of %d connections (a fair choice misses that with p < 1e-6): %s",
			len(out), endpoints, lo, hi, total, sample(out))
	}
	if chi2 > chi2Max {
		t.Errorf("chi-square of the %d counts is %.1f, above the 1 - 1e-6 quantile %.1f for %v degrees of freedom: the spread is not uniform", endpoints, chi2, chi2Max, df)
	}
}

// waitKernelRules waits until the rules the proxy in mode programmed on
// node n satisfy cond (what is missing, or ""); the userspace mode has no
// rules to read, and the caller's traffic is the signal there.
func waitKernelRules(n lab.Node, mode string, timeout time.Duration, cond func(rules string) string) error {
	if mode == "userspace" {
		return nil
	}
	return retry(timeout, func() error {
		rules, err := kernelProxyRules(n, mode)
		if err != nil {
			return err
		}
		if missing := cond(rules); missing != "" {
			return fmt.Errorf("node %s: %s", n.Name, missing)
		}
		return nil
	})
}

// chiSquareQuantile approximates the quantile of the chi-square
// distribution with df degrees of freedom at the standard normal z
// (Wilson-Hilferty; good for large df).
func chiSquareQuantile(df, z float64) float64 {
	v := 2 / (9 * df)
	return df * math.Pow(1-v+z*math.Sqrt(v), 3)
}

// askOnce makes one connection to addr (from the calling thread's
// namespace), reads the one line the server answers, and closes with a
// reset: no TIME_WAIT, so tens of thousands of connections from one
// address do not run out of ports.
func askOnce(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading from %s: %w", c.RemoteAddr(), err)
	}
	return strings.TrimSpace(line), nil
}

func uniq(list []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range list {
		m[s] = true
	}
	return m
}

// lineConn is a connection to netexec's TCP server: one line out, one
// line back.
type lineConn struct {
	net.Conn
	r *bufio.Reader
}

// dialIn connects to addr from inside the namespace at nsPath.
func dialIn(nsPath, addr string) (*lineConn, error) {
	var c net.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &lineConn{c, bufio.NewReader(c)}, nil
}

func (c *lineConn) ask(line string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	ans, err := c.r.ReadString('\n')
	return strings.TrimSpace(ans), err
}

// requestLoop requests addr's /hostname from inside nsPath, one new
// connection after another (20 ms apart), until closed, and records each
// failure: an error, or an answer from a host not in want.
type requestLoop struct {
	mu     sync.Mutex
	sent   int
	marked int  // sent while mark was set
	mark   bool // set around a disruption
	fails  []string
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

func startRequestLoop(nsPath, addr string, want []string) *requestLoop {
	r := &requestLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			at := time.Now()
			body, err := httpGet(nsPath, addr, "/hostname")
			h := strings.TrimSpace(body)
			r.mu.Lock()
			r.sent++
			if r.mark {
				r.marked++
			}
			if err != nil {
				r.fails = append(r.fails, at.Format("15:04:05.000")+" "+err.Error())
			} else if !contains(want, h) {
				r.fails = append(r.fails, at.Format("15:04:05.000")+" answered by "+h)
			}
			r.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return r
}

func (r *requestLoop) setMark(on bool) {
	r.mu.Lock()
	r.mark = on
	r.mu.Unlock()
}

// counts is how many requests were sent, and how many of them while the
// mark was set.
func (r *requestLoop) counts() (sent, marked int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent, r.marked
}

// waitSent waits until the loop has sent n more requests (of them, while
// marked, when marked): the positive signal that it covered a phase, where
// a fixed sleep might cover nothing on a loaded machine.
func (r *requestLoop) waitSent(t *testing.T, n int, marked bool) {
	t.Helper()
	pick := func() int {
		s, m := r.counts()
		if marked {
			return m
		}
		return s
	}
	from := pick()
	if err := retry(60*time.Second, func() error {
		if got := pick() - from; got < n {
			return fmt.Errorf("%d of %d requests sent", got, n)
		}
		return nil
	}); err != nil {
		t.Fatalf("request loop: %v", err)
	}
}

// close stops the loop (once) and returns its failures.
func (r *requestLoop) close() []string {
	r.once.Do(func() { close(r.stop) })
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fails
}

var handleRe = regexp.MustCompile(`^\s*(table|chain|set|map) (\S+(?: \S+)?) \{ # handle (\d+)$`)

// tableHandles is the handle of the proxy's table on node n and of each of
// its chains, sets and maps (nft -a). A table or chain deleted and made
// again gets a new handle; flushed, it keeps its own.
func tableHandles(n lab.Node) (map[string]string, error) {
	out, err := output("ip", "netns", "exec", n.Netns, "nft", "-a", "list", "table", "ip", proxynft.DefaultTable)
	if err != nil {
		return nil, fmt.Errorf("nft -a list table ip %s on %s: %w: %s", proxynft.DefaultTable, n.Name, err, out)
	}
	h := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := handleRe.FindStringSubmatch(line); m != nil {
			h[m[1]+" "+m[2]] = m[3]
		}
	}
	if len(h) == 0 {
		return nil, fmt.Errorf("no handles in nft -a list table ip %s on %s:\n%s", proxynft.DefaultTable, n.Name, out)
	}
	return h, nil
}

func mustTableHandles(t *testing.T, n lab.Node) map[string]string {
	t.Helper()
	h, err := tableHandles(n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// handlesChanged lists what of before is gone or has another handle in
// after, of the table, its base chains and the chains of the Services
// named (namespace/name): chains of other Services come and go with their
// endpoints (kubernetes' own loses its endpoint while the apiserver is
// down).
func handlesChanged(before, after map[string]string, services ...string) string {
	var d []string
	for k, v := range before {
		name, isChain := strings.CutPrefix(k, "chain ")
		ours := strings.HasPrefix(k, "table ") || isChain && !strings.Contains(name, "/")
		for _, svc := range services {
			ours = ours || isChain && strings.Contains(name, "-"+svc+"/")
		}
		if !ours {
			continue
		}
		if w, ok := after[k]; !ok {
			d = append(d, fmt.Sprintf("%s (handle %s) is gone", k, v))
		} else if w != v {
			d = append(d, fmt.Sprintf("%s: handle %s, then %s", k, v, w))
		}
	}
	sort.Strings(d)
	return strings.Join(d, "\n")
}

// proxyMetrics reads the proxy's metrics on node n (the node's loopback,
// as kube-proxy's), summed per metric name.
func proxyMetrics(t *testing.T, n lab.Node) map[string]float64 {
	t.Helper()
	body, err := httpGet(lab.NetnsPath(n.Netns), "127.0.0.1:10249", "/metrics")
	if err != nil {
		t.Fatalf("node %s: /metrics: %v", n.Name, err)
	}
	m := map[string]float64{}
	for _, name := range []string{"flatnet_sync_proxy_rules_endpoint_changes_total", "flatnet_sync_proxy_rules_duration_seconds_count", "flatnet_sync_proxy_rules_nftables_sync_failures_total"} {
		m[name] = metricSum(body, name)
	}
	return m
}

// output runs argv and returns its combined output.
func output(argv ...string) (string, error) {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom is the file at path from offset on ("" if unreadable).
func readFrom(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}
