package e2e

// Services in the lab: the controller's EndpointSlices (--endpointslices)
// and every agent's nftables proxy (--proxy), end to end: ClusterIP from a
// pod on every node to every endpoint, an even spread over the endpoints,
// ClientIP session affinity, an immediate refusal for a Service without
// endpoints, NodePort from one node to another node's InternalIP, an agent
// restart under a steady request loop, a deleted endpoint dropped, scaling
// a set of pods up and down (how fast the proxy follows, and that nothing
// fails while a Ready backend remains), and a UDP client keeping one socket
// across the replacement of its only endpoint (conntrack cleanup).
//
// Timing. These checks run on a loaded 2-core machine: they assert
// generous bounds and log the measured figures (make bench-proxy measures
// the tight ones). None sleeps and then asserts that something did not
// happen: each waits first for a positive signal (the proxy's table on the
// node has the change, a count of requests reached), then asserts.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	proxynft "github.com/flatnet/flatnet/internal/proxy/nftables"
)

// dialAll asks the netexec pod client to make tries HTTP requests for its
// hostname to host:port, and returns the answers and the errors.
func dialAll(client labPod, host string, port, tries int) (answers, errs []string, err error) {
	path := fmt.Sprintf("/dial?request=hostname&protocol=http&host=%s&port=%d&tries=%d", host, port, tries)
	body, err := httpGet(lab.NetnsPath(client.node.Netns), net.JoinHostPort(client.ip, "8080"), path)
	if err != nil {
		return nil, nil, err
	}
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, nil, fmt.Errorf("decoding /dial answer %q: %w", body, err)
	}
	return r.Responses, r.Errors, nil
}

// answeredByEndpoint polls addr's /hostname from node's namespace until
// one of backends answers, and returns who did.
func answeredByEndpoint(from lab.Node, addr string, backends []string) (string, error) {
	var h string
	err := retry(30*time.Second, func() error {
		body, err := httpGet(lab.NetnsPath(from.Netns), addr, "/hostname")
		if err != nil {
			return err
		}
		if h = strings.TrimSpace(body); !contains(backends, h) {
			return fmt.Errorf("answer %q is not an endpoint", h)
		}
		return nil
	})
	return h, err
}

// checkRefused polls client's /dial to vip:port until one try is refused:
// a TCP reset from the proxy, not a dial timeout.
func checkRefused(t *testing.T, client labPod, from, vip string, port int) {
	t.Helper()
	var last string
	err := retry(30*time.Second, func() error {
		answers, errs, err := dialAll(client, vip, port, 1)
		if err != nil {
			return err
		}
		last = fmt.Sprintf("answers %q, errors %q", answers, errs)
		if len(answers) != 0 || len(errs) != 1 || !strings.Contains(errs[0], "connection refused") {
			return errors.New("not refused")
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s -> %s:%d: want connection refused: %v (%s)", from, vip, port, err, last)
	}
}

func (l *testLab) createService(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	got, err := l.c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() { _ = l.c.CoreV1().Services("default").Delete(ctx, svc.Name, metav1.DeleteOptions{}) })
	return got
}

func service(name string, typ corev1.ServiceType, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkServices runs the Services checks on a running lab; clients are
// netexec pods, one per node.
func checkServices(t *testing.T, l *testLab, clients []labPod, mode string) {
	s := l.spec
	label := "svc-" + randHex(3)
	sel := map[string]string{"e2e-service": label}
	// The endpoints: one netexec pod per node, labelled for this test only;
	// those not on clients[0]'s node are also labelled remote.
	remoteSel := map[string]string{"e2e-service": label, "e2e-remote": "yes"}
	var backends, remote []string
	for _, n := range s.Nodes {
		p := netexecPod(label+"-"+strconv.Itoa(n.Index), n.Name)
		p.Labels = map[string]string{"e2e-service": label, "e2e-pod": p.Name}
		if n.Name != clients[0].node.Name {
			p.Labels["e2e-remote"] = "yes"
			remote = append(remote, p.Name)
		}
		l.create(t, p)
		backends = append(backends, p.Name)
	}
	deleted := map[string]bool{}
	t.Cleanup(func() {
		var left []string
		for _, b := range backends {
			if !deleted[b] {
				left = append(left, b)
			}
		}
		l.deleteAndWait(t, left...)
	})
	backendPods := map[string]labPod{}
	for _, b := range backends {
		p := l.waitReady(t, b)
		n, _ := s.Node(p.Spec.NodeName)
		backendPods[b] = labPod{b, p.Status.PodIP, n}
	}
	web := l.createService(t, service(label+"-web", corev1.ServiceTypeClusterIP, sel))
	empty := l.createService(t, service(label+"-none", corev1.ServiceTypeClusterIP, map[string]string{"e2e-service": label + "-nothing"}))
	np := l.createService(t, service(label+"-np", corev1.ServiceTypeNodePort, sel))
	vip := web.Spec.ClusterIP
	t.Logf("services: %s %s (%v), %s %s, %s nodePort %d", web.Name, vip, backends, empty.Name, empty.Spec.ClusterIP, np.Name, np.Spec.Ports[0].NodePort)

	// seenFrom polls client's /dial to ip:80 until every wanted hostname
	// has answered (and, with exclusive, a round answered only by them,
	// every try).
	seenFrom := func(t *testing.T, client labPod, ip string, want []string, exclusive bool) {
		t.Helper()
		seen := map[string]int{}
		var last string
		err := retry(30*time.Second, func() error {
			answers, errs, err := dialAll(client, ip, 80, 30)
			if err != nil {
				return err
			}
			round := map[string]int{}
			for _, a := range answers {
				round[strings.TrimSpace(a)]++
				seen[strings.TrimSpace(a)]++
			}
			last = fmt.Sprintf("last round: answers %v, errors %q", round, errs)
			for _, w := range want {
				if seen[w] == 0 {
					return fmt.Errorf("%s not seen yet", w)
				}
			}
			if exclusive {
				if len(errs) > 0 || len(answers) != 30 {
					return fmt.Errorf("errors in the round")
				}
				for h := range round {
					if !contains(want, h) {
						return fmt.Errorf("%s still answers", h)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s on %s -> %s:80: want answers from %v: %v (all answers %v; %s)", client.name, client.node.Name, ip, want, err, keys(seen), last)
		}
	}

	t.Run("ClusterIPFromEveryNodeReachesEveryEndpoint", func(t *testing.T) {
		for _, c := range clients {
			seenFrom(t, c, vip, backends, true)
		}
	})

	t.Run("EvenSpread", func(t *testing.T) {
		// 300 new connections from one client, each balanced on its own
		// (numgen random): every endpoint's count is Binomial(300, 1/3).
		// spreadBounds picks [lo, hi] so that each of the 2x3 tails has
		// probability <= 1e-6/6 under a fair choice, so a fair proxy fails
		// this with probability < 1e-6 (union bound). For 300 and 3 it
		// is [60, 143], 20% to 47.7% (mean 100, sd 8.2).
		const tries, batch = 300, 100
		lo, hi := spreadBounds(tries, len(backends), 1e-6)
		seenFrom(t, clients[0], vip, backends, true) // the client's proxy has all three
		count := map[string]int{}
		var errs []string
		for range tries / batch {
			answers, e, err := dialAll(clients[0], vip, 80, batch)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range answers {
				count[strings.TrimSpace(a)]++
			}
			errs = append(errs, e...)
		}
		if len(errs) > 0 {
			t.Errorf("%d of %d requests failed: %s", len(errs), tries, sample(errs))
		}
		for h := range count {
			if !contains(backends, h) {
				t.Errorf("answer from %q, not an endpoint", h)
			}
		}
		for _, b := range backends {
			if c := count[b]; c < lo || c > hi {
				t.Errorf("%s got %d of %d requests, want %d..%d (a fair choice misses that with p < 1e-6)", b, c, tries, lo, hi)
			}
		}
		t.Logf("%d requests from %s to %s: %v (bound %d..%d each)", tries, clients[0].name, vip, count, lo, hi)
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		svc := service(label+"-aff", corev1.ServiceTypeClusterIP, sel)
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
		aff := l.createService(t, svc)
		ip := aff.Spec.ClusterIP
		// sticky: 50 requests (new connections) from client all land on
		// one endpoint. Without affinity that happens with p = 3^-49.
		sticky := func(client labPod) {
			t.Helper()
			if err := retry(30*time.Second, func() error {
				_, err := dial(lab.NetnsPath(client.node.Netns), client.ip, ip, 80, "hostname")
				return err
			}); err != nil {
				t.Fatalf("%s -> %s (affinity ClientIP): %v", client.name, ip, err)
			}
			answers, errs, err := dialAll(client, ip, 80, 50)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for _, a := range answers {
				got[strings.TrimSpace(a)]++
			}
			if len(errs) > 0 || len(got) != 1 || !contains(backends, keys(got)[0]) {
				t.Errorf("50 requests from %s to %s (affinity ClientIP): answers %v, errors %q; want all from one endpoint", client.name, ip, got, errs)
			}
			t.Logf("affinity: %s (on %s) -> %v", client.name, client.node.Name, got)
		}
		sticky(clients[0])
		sticky(clients[1]) // may land on another endpoint or the same: not asserted
		// Back to None: the same client spreads again.
		cur, err := l.c.CoreV1().Services("default").Get(context.Background(), aff.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.SessionAffinity, cur.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
		if _, err := l.c.CoreV1().Services("default").Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		var last map[string]int
		err = retry(15*time.Second, func() error {
			answers, _, err := dialAll(clients[0], ip, 80, 30)
			if err != nil {
				return err
			}
			last = map[string]int{}
			for _, a := range answers {
				last[strings.TrimSpace(a)]++
			}
			if len(last) < 2 {
				return fmt.Errorf("one endpoint only")
			}
			return nil
		})
		if err != nil {
			t.Errorf("after switching %s to affinity None, %s still lands on one endpoint: %v", aff.Name, clients[0].name, last)
		} else {
			t.Logf("affinity None again: 30 requests from %s -> %v", clients[0].name, last)
		}
	})

	// Hairpin: a pod reaching itself through a Service whose only endpoint
	// it is. Without masquerade its reply would go straight to itself
	// from its own address and the connection would never complete.
	t.Run("Hairpin", func(t *testing.T) {
		self := backendPods[backends[0]]
		hp := l.createService(t, service(label+"-hairpin", corev1.ServiceTypeClusterIP, map[string]string{"e2e-pod": self.name}))
		var answers, errs []string
		err := retry(30*time.Second, func() error {
			var err error
			answers, errs, err = dialAll(self, hp.Spec.ClusterIP, 80, 3)
			if err == nil && (len(answers) != 3 || len(errs) != 0) {
				err = errors.New("not every try answered")
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s -> its own Service %s:80: answers %q, errors %q: %v", self.name, hp.Spec.ClusterIP, answers, errs, err)
		}
		for _, a := range answers {
			if strings.TrimSpace(a) != self.name {
				t.Errorf("%s -> its own Service: answered by %q", self.name, a)
			}
		}
		// The server saw a masqueraded source, not the pod's own address.
		body, err := httpGet(lab.NetnsPath(self.node.Netns), net.JoinHostPort(self.ip, "8080"),
			fmt.Sprintf("/dial?request=clientip&protocol=http&host=%s&port=80&tries=1", hp.Spec.ClusterIP))
		if err != nil || strings.Contains(body, `"`+self.ip+`:`) || !strings.Contains(body, "responses") {
			t.Errorf("%s -> its own Service, /clientip: %q (%v); want an address other than the pod's %s", self.name, body, err, self.ip)
		}
	})

	t.Run("NoEndpointsRefusedAtOnce", func(t *testing.T) {
		for _, c := range clients {
			checkRefused(t, c, c.name, empty.Spec.ClusterIP, 80)
		}
	})

	// A port the Service does not have: refused at once too, not routed
	// to nowhere.
	t.Run("ClusterIPOtherPortRefused", func(t *testing.T) {
		checkRefused(t, clients[0], clients[0].name, vip, 81)
	})

	t.Run("NodePortFromAnotherNode", func(t *testing.T) {
		port := int(np.Spec.Ports[0].NodePort)
		for i, from := range s.Nodes {
			to := s.Nodes[(i+1)%len(s.Nodes)]
			addr := net.JoinHostPort(to.IP.String(), strconv.Itoa(port))
			if seen, err := answeredByEndpoint(from, addr, backends); err != nil {
				t.Errorf("node %s -> %s (NodePort): %v", from.Name, addr, err)
			} else {
				t.Logf("node %s -> %s answered by %v", from.Name, addr, seen)
			}
		}
	})

	// The restart check reads the nftables table; the other modes get
	// their restarts in checkProxyMode.
	nft := mode == "nftables"
	tRunIf(t, nft, "AgentRestartLosesNoRequest", func(t *testing.T) {
		c := clients[0]
		rsvc := l.createService(t, service(label+"-remote", corev1.ServiceTypeClusterIP, remoteSel))
		seenFrom(t, c, rsvc.Spec.ClusterIP, remote, true)
		checkAgentRestart(t, l, c, rsvc, remote, syscall.SIGTERM, func(suffix string) *corev1.Service {
			return l.createService(t, service(label+"-"+suffix, corev1.ServiceTypeClusterIP, remoteSel))
		})
	})

	t.Run("DeletedEndpointNoLongerAnswers", func(t *testing.T) {
		gone := backends[len(backends)-1]
		l.deleteAndWait(t, gone)
		deleted[gone] = true
		for _, c := range clients {
			seenFrom(t, c, vip, backends[:len(backends)-1], true)
		}
	})

	// Scale-down measures when the endpoint leaves the kernel's rules,
	// which the userspace mode has none of.
	tRunIf(t, mode != "userspace", "ScaleUpAndDown", func(t *testing.T) { checkScale(t, l, clients[0], mode) })

	t.Run("UDPAcrossEndpointReplacement", func(t *testing.T) { checkUDPReplacement(t, l, clients[0]) })

	// After all the above every node's proxy has synced and programmed
	// endpoint changes: its metrics (on the node's loopback, as
	// kube-proxy's) say so, including the network programming latency,
	// measured from the EndpointSlice's last-change-trigger-time.
	t.Run("Metrics", func(t *testing.T) {
		for _, n := range s.Nodes {
			body, err := httpGet(lab.NetnsPath(n.Netns), "127.0.0.1:10249", "/metrics")
			if err != nil {
				t.Errorf("node %s: /metrics: %v", n.Name, err)
				continue
			}
			for _, m := range []string{"flatnet_sync_proxy_rules_duration_seconds_count", "flatnet_network_programming_duration_seconds_count"} {
				if c := metricSum(body, m); c <= 0 {
					t.Errorf("node %s: %s = %v, want > 0", n.Name, m, c)
				}
			}
			if c := metricSum(body, "flatnet_network_programming_duration_seconds_count"); c > 0 {
				t.Logf("node %s: %v endpoint changes programmed, %.0f ms after their trigger time on average", n.Name, c,
					1000*metricSum(body, "flatnet_network_programming_duration_seconds_sum")/c)
			}
			if c := metricSum(body, "flatnet_sync_proxy_rules_last_timestamp_seconds"); c <= 0 {
				t.Errorf("node %s: flatnet_sync_proxy_rules_last_timestamp_seconds = %v, want a time", n.Name, c)
			}
		}
	})
}

// metricSum adds up the samples of metric (any labels) in a Prometheus
// text exposition.
func metricSum(body, metric string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		name, rest, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if base, _, _ := strings.Cut(name, "{"); base != metric {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			sum += v
		}
	}
	return sum
}

// proxyRules is the Service proxy's nftables table on node n.
func proxyRules(n lab.Node) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "nft", "list", "table", "ip", proxynft.DefaultTable).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list table ip %s on %s: %w: %s", proxynft.DefaultTable, n.Name, err, out)
	}
	return string(out), nil
}

// kernelProxyRules is what the proxy in mode (nftables or iptables)
// programmed on node n, as text.
func kernelProxyRules(n lab.Node, mode string) (string, error) {
	if mode == "nftables" {
		return proxyRules(n)
	}
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "iptables-save", "-t", "nat").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("iptables-save -t nat on %s: %w: %s", n.Name, err, out)
	}
	return string(out), nil
}

// tRunIf runs a subtest only when ok: the checks that do not apply to a
// proxy mode are left out (logged), not skipped.
func tRunIf(t *testing.T, ok bool, name string, f func(t *testing.T)) {
	if !ok {
		t.Logf("%s: not checked in this proxy mode", name)
		return
	}
	t.Run(name, f)
}

// waitProxyRules waits until the proxy's table on node n satisfies cond
// (what is missing, or ""): the positive signal that the proxy programmed
// a change, before a check that something no longer happens.
func waitProxyRules(n lab.Node, timeout time.Duration, cond func(rules string) string) error {
	return waitKernelRules(n, "nftables", timeout, cond)
}

// hasAddr reports whether text mentions the address a as a whole (not
// 10.0.0.1 inside 10.0.0.12).
func hasAddr(text string, a string) bool {
	return regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(a) + `([^0-9]|$)`).MatchString(text)
}

// spreadBounds returns [lo, hi] for the count X ~ Binomial(n, 1/k) of one
// of k equally likely endpoints such that P(X < lo) and P(X > hi) are each
// at most alpha/(2k): a fair choice puts some endpoint outside with
// probability at most alpha.
func spreadBounds(n, k int, alpha float64) (lo, hi int) {
	p, each := 1/float64(k), alpha/float64(2*k)
	lg := func(v int) float64 { r, _ := math.Lgamma(float64(v + 1)); return r }
	pmf := func(x int) float64 {
		return math.Exp(lg(n) - lg(x) - lg(n-x) + float64(x)*math.Log(p) + float64(n-x)*math.Log1p(-p))
	}
	for cum := 0.0; lo < n && cum+pmf(lo) <= each; lo++ {
		cum += pmf(lo)
	}
	hi = n
	for cum := 0.0; hi > 0 && cum+pmf(hi) <= each; hi-- {
		cum += pmf(hi)
	}
	return lo, hi
}

// hit is one request: when it was sent, who answered, or how it failed.
type hit struct {
	at   time.Time
	host string
	err  error
}

// hitsFrom makes n concurrent GET /hostname requests to addr from inside
// the namespace nsPath; each is its own connection, balanced on its own.
func hitsFrom(nsPath, addr string, n int) []hit {
	out := make([]hit, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := time.Now()
			body, err := httpGet(nsPath, addr, "/hostname")
			out[i] = hit{at, strings.TrimSpace(body), err}
		}()
	}
	wg.Wait()
	return out
}

// firstEvent reports when watch w first delivers an object for which cond
// holds (the zero time if the watch ends first). It stops w.
func firstEvent(w watch.Interface, cond func(runtime.Object) bool) <-chan time.Time {
	c := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if cond(ev.Object) {
				c <- time.Now()
				return
			}
		}
		c <- time.Time{}
	}()
	return c
}

// drainingNetexec is netexec behind a shell that, on SIGTERM, keeps it
// serving drainTime before stopping it: the lab runtime has no preStop
// hook, and it sends SIGTERM as soon as it sees the deletion, at the same
// moment the controller marks the endpoint terminating. As with a preStop
// sleep in Kubernetes, the delay lets every proxy drop the endpoint before
// the pod stops answering; without it a request could reach a closed port
// in between, whatever the proxy does. It is generous: a loaded machine's
// proxy must always make it. (The pod's grace period is longer.)
const drainTime = 10 * time.Second

var drainingNetexec = []string{"sh", "-c",
	fmt.Sprintf("flatnet netexec --http-port=8080 --udp-port=8081 & pid=$!; trap 'sleep %d; kill $pid' TERM; wait $pid; wait $pid", int(drainTime.Seconds()))}

// checkScale scales a deployment-like set of labelled pods behind a
// ClusterIP up and down while client keeps requesting it.
//
// Scale up: the time from seeing the new pod Ready (a watch event, a few ms
// after the kubelet-like runtime writes the status; the status's
// lastTransitionTime has only whole seconds) to the first request it
// answers is logged, and must be within scaleBound. The path: runtime ->
// API -> EndpointSlice controller -> API -> proxy's watch -> nft
// transaction, the proxy's syncs spaced by ten times their own duration
// (no fixed minimum since --proxy-min-sync-period is 0 by default); an
// idle machine takes under a second.
//
// Scale down: once the client's node has dropped the deleted pod from its
// table (the positive signal, logged and bounded by scaleBound), no
// request sent after that reaches it; none fails at any time (the other
// pod stays Ready, the deleted one drains for drainTime). A pod whose
// readiness probe always fails never gets a request.
func checkScale(t *testing.T, l *testLab, client labPod, mode string) {
	const scaleBound = 10 * time.Second
	s := l.spec
	label := "scale-" + randHex(3)
	sel := map[string]string{"e2e-scale": label}
	first, added, unready := label+"-a", label+"-b", label+"-unready"
	t.Cleanup(func() { l.deleteAndWait(t, first, added, unready) })
	pod := func(name string, n lab.Node) *corev1.Pod {
		p := netexecPod(name, n.Name)
		p.Labels = sel
		p.Spec.Containers[0].Command = drainingNetexec
		p.Spec.TerminationGracePeriodSeconds = ptr(int64((drainTime + 5*time.Second) / time.Second))
		return p
	}
	l.create(t, pod(first, s.Nodes[1]))
	up := pod(unready, s.Nodes[1])
	up.Spec.Containers[0].ReadinessProbe.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}
	l.create(t, up)
	firstIP := l.waitReady(t, first).Status.PodIP
	l.waitRunning(t, unready)
	svc := l.createService(t, service(label, corev1.ServiceTypeClusterIP, sel))
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	nsPath := podNetns(t, s, client.node, "default", client.name)
	if err := retry(30*time.Second, func() error {
		body, err := httpGet(nsPath, addr, "/hostname")
		if err == nil && strings.TrimSpace(body) != first {
			err = fmt.Errorf("answer %q", body)
		}
		return err
	}); err != nil {
		t.Fatalf("%s -> %s (%s): %v", client.name, addr, first, err)
	}

	var all []hit
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pw, err := l.c.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + added})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := l.c.DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		t.Fatal(err)
	}
	readyc := firstEvent(pw, func(o runtime.Object) bool { p, ok := o.(*corev1.Pod); return ok && podReady(p) })
	slicec := firstEvent(sw, func(o runtime.Object) bool {
		sl, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			return false
		}
		for _, ep := range sl.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Name == added && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				return true
			}
		}
		return false
	})
	created := time.Now()
	l.create(t, pod(added, s.Nodes[2]))
	var firstAdded time.Time
	for firstAdded.IsZero() && time.Since(created) < 60*time.Second {
		for _, h := range hitsFrom(nsPath, addr, 4) {
			all = append(all, h)
			if h.err == nil && h.host == added && (firstAdded.IsZero() || h.at.Before(firstAdded)) {
				firstAdded = h.at
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if firstAdded.IsZero() {
		t.Fatalf("scale up: %s never answered %s within 60 s", added, addr)
	}
	readyAt, sliceAt := <-readyc, <-slicec
	if readyAt.IsZero() || sliceAt.IsZero() {
		t.Fatalf("scale up: no watch event for %s Ready (%v) or in the slice (%v)", added, readyAt, sliceAt)
	}
	lat := firstAdded.Sub(readyAt)
	t.Logf("scale up: %s Ready %s after create; in the EndpointSlice %s after Ready; first answer %s after Ready (%s after the slice)",
		added, readyAt.Sub(created).Round(time.Millisecond), sliceAt.Sub(readyAt).Round(time.Millisecond), lat.Round(time.Millisecond), firstAdded.Sub(sliceAt).Round(time.Millisecond))
	if lat > scaleBound {
		t.Errorf("scale up: %s first answered %s after it was seen Ready, want within %s", added, lat.Round(time.Millisecond), scaleBound)
	}
	if errs := failed(all); len(errs) > 0 {
		t.Errorf("scale up: %d of %d requests failed while %s was Ready: %s", len(errs), len(all), first, sample(errs))
	}

	// Scale down: requests until the pod is gone from the API, which is
	// drainTime after the delete, long after the proxy dropped it.
	var down []hit
	deleteAt := time.Now()
	if err := l.c.CoreV1().Pods("default").Delete(context.Background(), first, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := false
	var droppedAt time.Time // the client's node no longer sends to first
	for !gone || droppedAt.IsZero() {
		if time.Since(deleteAt) > drainTime+60*time.Second {
			t.Fatalf("scale down: %s still exists (gone %v) or is still in %s's proxy table (dropped %v) %s after deletion",
				first, gone, client.node.Name, !droppedAt.IsZero(), time.Since(deleteAt).Round(time.Second))
		}
		down = append(down, hitsFrom(nsPath, addr, 4)...)
		if droppedAt.IsZero() {
			if rules, err := kernelProxyRules(client.node, mode); err == nil && !hasAddr(rules, firstIP) {
				droppedAt = time.Now()
			}
		}
		if !gone {
			_, err := l.c.CoreV1().Pods("default").Get(context.Background(), first, metav1.GetOptions{})
			gone = apierrors.IsNotFound(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var lastFirst time.Time
	count := map[string]int{}
	var late []string
	for _, h := range down {
		if h.err == nil {
			count[h.host]++
			if h.host == first && h.at.After(lastFirst) {
				lastFirst = h.at
			}
			if h.host == first && h.at.After(droppedAt) {
				late = append(late, h.at.Format("15:04:05.000"))
			}
		}
	}
	drop := droppedAt.Sub(deleteAt)
	t.Logf("scale down: %d requests until %s was gone (%s): %v; %s's proxy dropped %s (%s) %s after the delete; the last answer from it was sent %s after the delete",
		len(down), first, time.Since(deleteAt).Round(time.Millisecond), count, client.node.Name, first, firstIP, drop.Round(time.Millisecond), lastFirst.Sub(deleteAt).Round(time.Millisecond))
	if drop > scaleBound {
		t.Errorf("scale down: %s's proxy dropped the deleted %s %s after the delete, want within %s", client.node.Name, first, drop.Round(time.Millisecond), scaleBound)
	}
	if len(late) > 0 {
		t.Errorf("scale down: %s answered %d requests sent after %s's proxy had dropped it (at %s): %v",
			first, len(late), client.node.Name, droppedAt.Format("15:04:05.000"), late)
	}
	if errs := failed(down); len(errs) > 0 {
		t.Errorf("scale down: %d of %d requests failed while %s stayed Ready: %s", len(errs), len(down), added, sample(errs))
	}
	all = append(all, down...)
	for _, h := range all {
		if h.err == nil && !contains([]string{first, added}, h.host) {
			t.Errorf("answer from %q (the never-Ready %s must get no traffic)", h.host, unready)
			break
		}
	}
}

// sample is the first and last few of a long list of errors.
func sample(errs []string) string {
	if len(errs) <= 6 {
		return fmt.Sprintf("%q", errs)
	}
	return fmt.Sprintf("%q ... %q", errs[:3], errs[len(errs)-3:])
}

func failed(hits []hit) []string {
	var out []string
	for _, h := range hits {
		if h.err != nil {
			out = append(out, h.at.Format("15:04:05.000")+" "+h.err.Error())
		}
	}
	return out
}

// checkUDPReplacement: a UDP client on one socket (one source port, so one
// conntrack entry) keeps asking a UDP Service for its hostname while the
// only endpoint is deleted and a new pod (on another node) replaces it. The
// same socket must get answers from the new pod within 30 s of it being
// seen Ready (about a second on an idle machine; logged): the proxy has to remove the conntrack entries that DNAT to
// the deleted endpoint, or the client's packets (each one refreshing the
// entry) keep going to the old pod's IP forever. kube's e2e checks the
// same ("should be able to preserve UDP traffic when server pod cycles").
// The client is this test process, with a socket opened in the client
// pod's network namespace.
func checkUDPReplacement(t *testing.T, l *testLab, client labPod) {
	s := l.spec
	label := "udp-" + randHex(3)
	sel := map[string]string{"e2e-udp": label}
	old, repl := label+"-old", label+"-new"
	t.Cleanup(func() { l.deleteAndWait(t, old, repl) })
	p := netexecPod(old, s.Nodes[1].Name)
	p.Labels = sel
	l.create(t, p)
	l.waitReady(t, old)
	svc := service(label, corev1.ServiceTypeClusterIP, sel)
	svc.Spec.Ports = []corev1.ServicePort{{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 8081, TargetPort: intstr.FromInt32(8081)}}
	vip := netip.MustParseAddr(l.createService(t, svc).Spec.ClusterIP)
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(vip, 8081))

	nsPath := podNetns(t, s, client.node, "default", client.name)
	open := func() (*net.UDPConn, error) {
		var conn *net.UDPConn
		err := netns.Do(nsPath, func() error {
			var err error
			conn, err = net.DialUDP("udp", nil, to)
			return err
		})
		return conn, err
	}
	buf := make([]byte, 512)
	ask := func(conn *net.UDPConn) (string, error) {
		if _, err := conn.Write([]byte("hostname")); err != nil {
			return "", err
		}
		_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	// Until the client's proxy serves the Service, with a new socket (a
	// new conntrack entry) each try: a packet sent before the proxy knows
	// the Service leaves an entry without DNAT that the socket's later
	// packets would follow, which is not the case tested here.
	if err := retry(30*time.Second, func() error {
		c, err := open()
		if err != nil {
			return err
		}
		defer c.Close()
		got, err := ask(c)
		if err == nil && got != old {
			err = fmt.Errorf("answer %q", got)
		}
		return err
	}); err != nil {
		t.Fatalf("UDP from %s -> %s: want %s: %v", client.name, to, old, err)
	}
	// The one socket of the test.
	conn, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := retry(5*time.Second, func() error {
		got, err := ask(conn)
		if err == nil && got != old {
			err = fmt.Errorf("answer %q", got)
		}
		return err
	}); err != nil {
		t.Fatalf("UDP %s -> %s: want %s: %v", conn.LocalAddr(), to, old, err)
	}

	// From now on one goroutine asks every 100 ms on the same socket.
	var mu sync.Mutex
	var hits []hit
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			at := time.Now()
			got, err := ask(conn)
			mu.Lock()
			hits = append(hits, hit{at, got, err})
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()
	deleteAt := time.Now()
	if err := l.c.CoreV1().Pods("default").Delete(context.Background(), old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p = netexecPod(repl, s.Nodes[2].Name)
	p.Labels = sel
	l.create(t, p)
	l.waitReady(t, repl)
	readyAt := time.Now()
	var firstNew time.Time
	for time.Since(readyAt) < 30*time.Second && firstNew.IsZero() {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		for _, h := range hits {
			if h.err == nil && h.host == repl {
				firstNew = h.at
				break
			}
		}
		mu.Unlock()
	}
	close(stop)
	<-done
	answers := map[string]int{}
	lost := 0
	for _, h := range hits {
		if h.err != nil {
			lost++
		} else {
			answers[h.host]++
		}
	}
	if firstNew.IsZero() {
		t.Errorf("UDP %s -> %s: no answer from the new endpoint %s within 30 s of it being Ready (answers %v, %d unanswered): a stale conntrack entry still sends the socket's packets to the deleted %s?",
			conn.LocalAddr(), to, repl, answers, lost, old)
		return
	}
	t.Logf("UDP %s -> %s on one socket: %s deleted, %s answered %s after the delete, %s after it was seen Ready (answers %v, %d unanswered)",
		conn.LocalAddr(), to, old, repl, firstNew.Sub(deleteAt).Round(time.Millisecond), firstNew.Sub(readyAt).Round(time.Millisecond), answers, lost)
}

// checkAgentRestart: client requests svc's ClusterIP on port 80 (its
// endpoints are on other nodes) in a steady loop while its node's agent is taken
// away with sig (SIGTERM through its pid file, as `lab up` restarts an
// agent; SIGKILL, a crash) and started again by `lab up`. No request may
// fail: the proxy's rules stay in the kernel while the agent is away, and
// the restarted proxier's first (full) sync rewrites them in one
// transaction, never deleting the table or a chain (their handles stay).
// Then a Service created while the agent was away and one created after
// it returned (by newService, with a name suffix) must work: the restarted
// proxier is in charge.
func checkAgentRestart(t *testing.T, l *testLab, client labPod, svc *corev1.Service, want []string, sig syscall.Signal, newService func(suffix string) *corev1.Service) {
	s := l.spec
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	n := client.node
	nsPath := podNetns(t, s, n, "default", client.name)
	loop := startRequestLoop(nsPath, addr, want)
	defer loop.close()
	loop.waitSent(t, 10, false)
	handles0 := mustTableHandles(t, n)
	pid0, _ := proc.Running(s.StateDir, lab.AgentProc(n.Name))
	loop.setMark(true)
	t0 := time.Now()
	if err := takeAgent(s, n, sig); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(t0)
	loop.waitSent(t, 10, true) // requests while no agent runs
	down := newService("while-down")
	out, err := l.cli("up")
	if err != nil {
		t.Fatalf("lab up: %v\n%s", err, out)
	}
	pid1, ok := proc.Running(s.StateDir, lab.AgentProc(n.Name))
	if !ok || pid1 == pid0 {
		t.Fatalf("agent on %s not restarted (pid %d, then %d running=%v):\n%s", n.Name, pid0, pid1, ok, out)
	}
	restartTook := time.Since(t0)
	after := newService("after")
	t1 := time.Now()
	for _, fresh := range []*corev1.Service{down, after} {
		// In service-ips, mapped to the Service's chain: the same key in
		// no-endpoint-services (goto reject-chain) is the Service before
		// its EndpointSlice arrived, which rejects.
		key := fresh.Spec.ClusterIP + " . tcp . 80 : goto sv"
		if err := waitProxyRules(n, 30*time.Second, func(rules string) string {
			if !strings.Contains(rules, key) {
				return fmt.Sprintf("no %q in the table", key)
			}
			return ""
		}); err != nil {
			t.Errorf("the restarted agent's proxy never programmed Service %s: %v", fresh.Name, err)
		}
		faddr := net.JoinHostPort(fresh.Spec.ClusterIP, "80")
		if body, err := httpGet(nsPath, faddr, "/hostname"); err != nil || !contains(want, strings.TrimSpace(body)) {
			t.Errorf("Service %s (%s) after the agent restart: %q, %v", fresh.Name, faddr, body, err)
		}
	}
	freshTook := time.Since(t1)
	if d := handlesChanged(handles0, mustTableHandles(t, n), svc.Namespace+"/"+svc.Name); d != "" {
		t.Errorf("the restarted agent deleted and made again the proxy's table or chains on %s:\n%s", n.Name, d)
	}
	loop.setMark(false)
	loop.waitSent(t, 10, false)
	fails := loop.close()
	sent, during := loop.counts()
	t.Logf("agent on %s: %s (pid %d) in %s, started again by lab up (pid %d) %s after that; Services created while it was away and after, programmed %s after the restart; %d requests, %d of them while restarting, %d failed",
		n.Name, sig, pid0, stopped.Round(time.Millisecond), pid1, restartTook.Round(time.Millisecond), freshTook.Round(time.Millisecond), sent, during, len(fails))
	if len(fails) > 0 {
		t.Errorf("%d of %d requests from %s to %s failed across the agent restart: %s", len(fails), sent, client.name, addr, sample(fails))
	}
}

// takeAgent takes node n's agent away: SIGTERM as stopAgent does, or
// another signal (SIGKILL), waiting until it is gone.
func takeAgent(s *lab.Spec, n lab.Node, sig syscall.Signal) error {
	if sig == syscall.SIGTERM {
		return stopAgent(s, n)
	}
	pid, ok := proc.Running(s.StateDir, lab.AgentProc(n.Name))
	if !ok {
		return fmt.Errorf("agent on %s is not running", n.Name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("%s to the agent on %s (pid %d): %w", sig, n.Name, pid, err)
	}
	return retry(10*time.Second, func() error {
		if _, ok := proc.Running(s.StateDir, lab.AgentProc(n.Name)); ok {
			return fmt.Errorf("agent on %s (pid %d) still runs after %s", n.Name, pid, sig)
		}
		return nil
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
