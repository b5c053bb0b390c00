package e2e

// Cluster DNS in the lab (issue 10): every agent answers on the kube-dns
// ClusterIP (and 169.254.20.10), taken on its node's lo with nothing
// tracked, and forwards other names to the external host's DNS server
// (zone external.test). Pods ask it with the C library's resolver, as real
// workloads do: getent and curl by name in the pod (lab exec). A Go client
// (miekg/dns) asks from inside a pod's network namespace only what glibc
// cannot: SRV records, the 20 ms polls of the timing checks and the 1,000
// parallel A+AAAA lookups.
//
// Timing. The bounds are asserted as it states them (a Service
// answered within a second of its creation, NXDOMAIN within a second of its
// deletion; no lookup slower than a second); the measured figures are
// logged. Where a name is merely expected to resolve, the checks retry for
// a few seconds: the index follows the API through informers.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/runtime/process"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
)

// clusterDomain is the lab agents' --cluster-domain (their default).
const clusterDomain = "cluster.local"

// fqdn is a Service's name in the cluster zone, with the trailing dot.
func fqdn(svc, ns string) string { return svc + "." + ns + ".svc." + clusterDomain + "." }

// podExec runs cmd in pod (lab exec) and returns its output and exit code.
func (l *testLab) podExec(pod string, cmd ...string) (string, int) {
	out, err := l.cli(append([]string{"exec", pod, "--"}, cmd...)...)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &ee):
		return out, ee.ExitCode()
	default:
		return out + err.Error(), -1
	}
}

// getent runs `getent db name` in pod and returns the addresses it
// printed (each once, in order), its exit code and its output.
func (l *testLab) getent(pod, db, name string) ([]string, int, string) {
	out, code := l.podExec(pod, "getent", db, name)
	var addrs []string
	for _, line := range nonEmptyLines(out) {
		if f := strings.Fields(line); len(f) > 0 && !slices.Contains(addrs, f[0]) {
			if _, err := netip.ParseAddr(f[0]); err == nil {
				addrs = append(addrs, f[0])
			}
		}
	}
	return addrs, code, out
}

// resolvesTo retries `getent db name` in pod until it prints exactly the
// addresses want (in any order).
func (l *testLab) resolvesTo(t *testing.T, pod, db, name string, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	var last string
	err := retry(10*time.Second, func() error {
		addrs, code, out := l.getent(pod, db, name)
		slices.Sort(addrs)
		last = fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(out))
		if code != 0 || !slices.Equal(addrs, want) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: getent %s %s: %s; want %v", pod, db, name, last, want)
	}
}

// podResolver asks the cluster DNS from inside a pod's network namespace
// over one UDP socket (opened there; usable from any goroutine after).
type podResolver struct {
	co *dns.Conn
	c  *dns.Client
}

func newPodResolver(t *testing.T, nsPath string, server netip.Addr) *podResolver {
	t.Helper()
	var conn net.Conn
	if err := netns.Do(nsPath, func() error {
		var err error
		conn, err = net.Dial("udp", net.JoinHostPort(server.String(), "53"))
		return err
	}); err != nil {
		t.Fatalf("a UDP socket to %s:53 in %s: %v", server, nsPath, err)
	}
	t.Cleanup(func() { conn.Close() })
	return &podResolver{co: &dns.Conn{Conn: conn}, c: &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond}}
}

func (r *podResolver) ask(name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	resp, _, err := r.c.ExchangeWithConn(m, r.co)
	return resp, err
}

// pollUntil asks name every 20 ms until done holds for an answer or
// timeout passes, and returns when it first held.
func (r *podResolver) pollUntil(name string, qtype uint16, timeout time.Duration, done func(*dns.Msg) bool) (time.Time, *dns.Msg, error) {
	deadline := time.Now().Add(timeout)
	var last *dns.Msg
	var lastErr error
	for tick := time.NewTicker(20 * time.Millisecond); time.Now().Before(deadline); <-tick.C {
		m, err := r.ask(name, qtype)
		now := time.Now()
		if err == nil && done(m) {
			tick.Stop()
			return now, m, nil
		}
		if err == nil {
			last = m
		}
		lastErr = err
	}
	return time.Time{}, last, fmt.Errorf("not within %s (last answer %v, last error %v)", timeout, last, lastErr)
}

// aRecords is the addresses of the A records in an answer section.
func aRecords(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

// waitEndpoints polls the EndpointSlices of Service svc until cond holds
// for them (ready and not-ready endpoint addresses).
func (l *testLab) waitEndpoints(t *testing.T, svc string, cond func(ready, notReady map[string]bool) bool) {
	t.Helper()
	var ready, notReady map[string]bool
	err := retry(60*time.Second, func() error {
		list, err := l.c.DiscoveryV1().EndpointSlices("default").List(context.Background(),
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			return err
		}
		ready, notReady = map[string]bool{}, map[string]bool{}
		for _, sl := range list.Items {
			for _, e := range sl.Endpoints {
				for _, a := range e.Addresses {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready[a] = true
					} else {
						notReady[a] = true
					}
				}
			}
		}
		if !cond(ready, notReady) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("EndpointSlices of %s: ready %v, not ready %v; the expected state was not reached in 60s", svc, ready, notReady)
	}
}

// checkDNS runs the cluster DNS checks on a running lab with an external
// host; pods are netexec pods (label app=netexec), one per node.
func checkDNS(t *testing.T, l *testLab, pods []labPod) {
	s := l.spec
	if s.External == nil {
		t.Fatal("checkDNS needs a lab with --external (the upstream DNS server)")
	}
	ctx := context.Background()
	dnsIP := s.KubeDNSIP()
	extIP := s.External.IP.String()
	tag := "dns-" + randHex(3)
	sel := map[string]string{"app": "netexec"}

	// Everything made here goes at the end (pods first: their Services'
	// deletions are registered by createService, and run after this).
	var made []string
	t.Cleanup(func() { l.deleteAndWait(t, made...) })
	newPod := func(p *corev1.Pod) {
		t.Helper()
		made = append(made, p.Name)
		l.create(t, p)
	}

	kube, err := l.c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web := l.createService(t, service(tag+"-web", corev1.ServiceTypeClusterIP, sel))
	unnamedSvc := service(tag+"-unnamed", corev1.ServiceTypeClusterIP, sel)
	unnamedSvc.Spec.Ports[0].Name = ""
	unnamed := l.createService(t, unnamedSvc)
	headlessSvc := service(tag+"-hl", corev1.ServiceTypeClusterIP, sel)
	headlessSvc.Spec.ClusterIP = corev1.ClusterIPNone
	headless := l.createService(t, headlessSvc)
	ext := l.createService(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: tag + "-ext", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: lab.ExternalDNSZone},
	})

	// A Service in another namespace.
	otherNS := tag
	if _, err := l.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", otherNS, err)
	}
	t.Cleanup(func() { deleteNamespace(t, l, otherNS) })
	otherSvc := service("other", corev1.ServiceTypeClusterIP, nil)
	otherSvc.Namespace = otherNS
	other, err := l.c.CoreV1().Services(otherNS).Create(ctx, otherSvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s/other: %v", otherNS, err)
	}

	// Two more pods the Services select: one whose readiness probe never
	// passes, one with a hostname in the headless Service's subdomain.
	unready := netexecPod(tag+"-unready", s.Nodes[0].Name)
	unready.Spec.Containers[0].ReadinessProbe.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}
	named := netexecPod(tag+"-named", s.Nodes[1%len(s.Nodes)].Name)
	named.Spec.Hostname, named.Spec.Subdomain = "web-0", headless.Name
	newPod(unready)
	newPod(named)
	unreadyIP := l.waitRunning(t, unready.Name).Status.PodIP
	namedIP := l.waitReady(t, named.Name).Status.PodIP

	// The Ready pods the Services select, by IP: their hostnames answer.
	readyPods := map[string]string{}
	list, err := l.c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=netexec"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if running(&p) && podReady(&p) {
			h := p.Name
			if p.Spec.Hostname != "" {
				h = p.Spec.Hostname
			}
			readyPods[p.Status.PodIP] = h
		}
	}
	for _, p := range pods {
		if readyPods[p.ip] == "" {
			t.Fatalf("netexec pod %s (%s) is not Ready", p.name, p.ip)
		}
	}
	if readyPods[unreadyIP] != "" {
		t.Fatalf("pod %s is Ready, though its probe is false", unready.Name)
	}
	readyIPs := slices.Sorted(maps.Keys(readyPods))
	readyNames := slices.Sorted(maps.Values(readyPods))
	// The positive signal for the headless checks: the controller lists
	// every Ready pod ready and the unready one not ready.
	l.waitEndpoints(t, headless.Name, func(ready, notReady map[string]bool) bool {
		for _, ip := range readyIPs {
			if !ready[ip] {
				return false
			}
		}
		return notReady[unreadyIP] && len(ready) == len(readyIPs)
	})
	t.Logf("services: %s %s, %s %s (unnamed port), %s headless, %s -> %s, %s/other %s; ready pods %v, unready %s %s",
		web.Name, web.Spec.ClusterIP, unnamed.Name, unnamed.Spec.ClusterIP, headless.Name, ext.Name, lab.ExternalDNSZone,
		otherNS, other.Spec.ClusterIP, readyPods, unready.Name, unreadyIP)

	t.Run("ServiceNames", func(t *testing.T) {
		for _, p := range pods {
			for _, name := range []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain} {
				l.resolvesTo(t, p.name, "hosts", name, kube.Spec.ClusterIP)
			}
			l.resolvesTo(t, p.name, "hosts", "other."+otherNS, other.Spec.ClusterIP)
			l.resolvesTo(t, p.name, "hosts", web.Name, web.Spec.ClusterIP)
			var last string
			err := retry(30*time.Second, func() error {
				out, code := l.podExec(p.name, "curl", "-sS", "--max-time", "5", "http://"+web.Name+":80/hostname")
				last = fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(out))
				if code != 0 || !slices.Contains(readyNames, strings.TrimSpace(out)) {
					return errors.New(last)
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: curl http://%s:80/hostname: %s; want one of %v", p.name, web.Name, last, readyNames)
			}
		}
	})

	t.Run("SRV", func(t *testing.T) {
		for _, p := range pods {
			r := newPodResolver(t, podNetns(t, s, p.node, "default", p.name), dnsIP)
			name := "_http._tcp." + fqdn(web.Name, "default")
			m, err := r.ask(name, dns.TypeSRV)
			if err != nil {
				t.Errorf("%s: SRV %s: %v", p.name, name, err)
				continue
			}
			var srvs []string
			for _, rr := range m.Answer {
				if srv, ok := rr.(*dns.SRV); ok {
					srvs = append(srvs, fmt.Sprintf("%d %s", srv.Port, srv.Target))
				}
			}
			if want := []string{"80 " + fqdn(web.Name, "default")}; m.Rcode != dns.RcodeSuccess || !slices.Equal(srvs, want) {
				t.Errorf("%s: SRV %s: %s %v; want NOERROR %v\n%v", p.name, name, dns.RcodeToString[m.Rcode], srvs, want, m)
			}
			// A Service whose one port has no name has no SRV records:
			// none at its name, no _tcp name under it.
			bare := fqdn(unnamed.Name, "default")
			if m, err := r.ask(bare, dns.TypeSRV); err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
				t.Errorf("%s: SRV %s (a Service with an unnamed port): %v %v; want NOERROR and no answer", p.name, bare, err, m)
			}
			if m, err := r.ask("_tcp."+bare, dns.TypeSRV); err != nil || m.Rcode != dns.RcodeNameError {
				t.Errorf("%s: SRV _tcp.%s: %v %v; want NXDOMAIN", p.name, bare, err, m)
			}
		}
	})

	t.Run("HeadlessListsReadyPods", func(t *testing.T) {
		for _, p := range pods {
			l.resolvesTo(t, p.name, "ahosts", headless.Name, readyIPs...)
			l.resolvesTo(t, p.name, "hosts", "web-0."+strings.TrimSuffix(fqdn(headless.Name, "default"), "."), namedIP)
		}
	})

	t.Run("ExternalName", func(t *testing.T) {
		name := strings.TrimSuffix(fqdn(ext.Name, "default"), ".")
		for _, p := range pods {
			l.resolvesTo(t, p.name, "hosts", name, extIP)
		}
		// On the wire: the CNAME, then the target's address from upstream.
		r := newPodResolver(t, podNetns(t, s, pods[0].node, "default", pods[0].name), dnsIP)
		m, err := r.ask(name, dns.TypeA)
		if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 2 {
			t.Fatalf("A %s: %v %v; want the CNAME and an A", name, err, m)
		}
		if c, ok := m.Answer[0].(*dns.CNAME); !ok || c.Target != lab.ExternalDNSZone+"." {
			t.Errorf("A %s: first answer %v, want a CNAME to %s.", name, m.Answer[0], lab.ExternalDNSZone)
		}
		if got := aRecords(m); !slices.Equal(got, []string{extIP}) {
			t.Errorf("A %s: addresses %v, want the external host's %s", name, got, extIP)
		}
	})

	t.Run("Forwarding", func(t *testing.T) {
		wantHost, err := httpGet(lab.NetnsPath(s.External.Netns), net.JoinHostPort(extIP, "8080"), "/hostname")
		if err != nil {
			t.Fatalf("the external host's own /hostname: %v", err)
		}
		for _, p := range pods {
			l.resolvesTo(t, p.name, "hosts", lab.ExternalDNSZone, extIP)
			url := "http://" + lab.ExternalDNSZone + ":8080/hostname"
			if out, code := l.podExec(p.name, "curl", "-sS", "--max-time", "5", url); code != 0 || strings.TrimSpace(out) != strings.TrimSpace(wantHost) {
				t.Errorf("%s: curl %s: exit %d: %q; want the external host's %q", p.name, url, code, out, wantHost)
			}
			if addrs, code, out := l.getent(p.name, "hosts", "nope.invalid"); code != 2 || len(addrs) != 0 {
				t.Errorf("%s: getent hosts nope.invalid: exit %d: %q; want exit 2 (not found)", p.name, code, out)
			}
		}
	})

	t.Run("CreatedAndDeletedWithinASecond", func(t *testing.T) {
		checkDNSTiming(t, l, pods, tag)
	})

	t.Run("ResolvConf", func(t *testing.T) {
		checkResolvConf(t, l, pods[0], tag, newPod, kube.Spec.ClusterIP)
	})

	t.Run("ParallelLookups", func(t *testing.T) {
		p := pods[0]
		want := map[string]string{
			"kubernetes.default.svc." + clusterDomain + ".": kube.Spec.ClusterIP,
			fqdn(web.Name, "default"):                       web.Spec.ClusterIP,
		}
		podNS, nodeNS := podNetns(t, s, p.node, "default", p.name), lab.NetnsPath(p.node.Netns)
		pod0, node0 := udpRcvbufErrors(t, podNS), udpRcvbufErrors(t, nodeNS)
		took, fails, err := parallelLookups(podNS, dnsIP, want, 1000)
		if err != nil {
			t.Fatal(err)
		}
		// Where a datagram was dropped for a full socket buffer: the
		// server's socket is in the node's namespace, the client's in the pod's.
		t.Logf("UDP receive buffer errors during the lookups: %d in %s's namespace (the DNS server's sockets), %d in the pod's",
			udpRcvbufErrors(t, nodeNS)-node0, p.node.Name, udpRcvbufErrors(t, podNS)-pod0)
		slices.Sort(took)
		if len(took) > 0 {
			t.Logf("%d parallel A+AAAA lookups from %s: %d answered, p50 %s, p99 %s, max %s; %d failed",
				1000, p.name, len(took), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], len(fails))
			if slowest := took[len(took)-1]; slowest > time.Second {
				t.Errorf("the slowest lookup took %s, over the 1s bound", slowest)
			}
		}
		if len(fails) > 0 {
			t.Errorf("%d of 1000 lookups failed (no answer within 5s or a wrong one), e.g.:\n%s", len(fails), strings.Join(fails[:min(5, len(fails))], "\n"))
		}
	})

	t.Run("NothingTracked", func(t *testing.T) {
		checkDNSUntracked(t, s)
	})
}

// deleteNamespace deletes namespace ns and waits until the namespace
// controller (kube-controller-manager) has emptied and removed it.
func deleteNamespace(t *testing.T, l *testLab, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := l.c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	err := retry(60*time.Second, func() error {
		n, err := l.c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("namespace %s still exists (%s, conditions %v)", ns, n.Status.Phase, n.Status.Conditions)
	})
	if err != nil {
		t.Errorf("removing namespace %s: %v", ns, err)
	}
}

// checkDNSTiming creates a Service while a pod on every node asks for its
// name every 20 ms, then deletes it: each node's DNS must answer it within
// a second of the creation and NXDOMAIN within a second of the deletion.
func checkDNSTiming(t *testing.T, l *testLab, pods []labPod, tag string) {
	s := l.spec
	ctx := context.Background()
	name := tag + "-timing"
	q := fqdn(name, "default")
	resolvers := make([]*podResolver, len(pods))
	for i, p := range pods {
		resolvers[i] = newPodResolver(t, podNetns(t, s, p.node, "default", p.name), s.KubeDNSIP())
		// Before: the name does not exist (and the socket works).
		if m, err := resolvers[i].ask(q, dns.TypeA); err != nil || m.Rcode != dns.RcodeNameError {
			t.Fatalf("%s: A %s before its creation: %v %v; want NXDOMAIN", p.name, q, err, m)
		}
	}
	// poll asks from every pod at once until done holds for each, and
	// returns how long after t0 each first saw it.
	poll := func(t0 time.Time, done func(*dns.Msg) bool) ([]time.Duration, []*dns.Msg, []error) {
		took, msgs, errs := make([]time.Duration, len(pods)), make([]*dns.Msg, len(pods)), make([]error, len(pods))
		var wg sync.WaitGroup
		for i, r := range resolvers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var at time.Time
				at, msgs[i], errs[i] = r.pollUntil(q, dns.TypeA, 10*time.Second, done)
				took[i] = at.Sub(t0)
			}()
		}
		wg.Wait()
		return took, msgs, errs
	}
	report := func(what string, took []time.Duration, errs []error) {
		var figures []string
		for i, p := range pods {
			switch {
			case errs[i] != nil:
				t.Errorf("%s on %s: %v", what, p.node.Name, errs[i])
			case took[i] > time.Second:
				t.Errorf("%s on %s after %s, over the 1s bound", what, p.node.Name, took[i].Round(time.Millisecond))
			}
			figures = append(figures, fmt.Sprintf("%s %s", p.node.Name, took[i].Round(time.Millisecond)))
		}
		t.Logf("%s after: %s", what, strings.Join(figures, ", "))
	}

	var svc *corev1.Service
	var created []time.Duration
	var msgs []*dns.Msg
	var errs []error
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(done)
		created, msgs, errs = poll(t0, func(m *dns.Msg) bool { return m.Rcode == dns.RcodeSuccess && len(aRecords(m)) > 0 })
	}()
	svc = l.createService(t, service(name, corev1.ServiceTypeClusterIP, nil))
	<-done
	report("Service "+name+" answered", created, errs)
	for i, m := range msgs {
		if errs[i] == nil && !slices.Equal(aRecords(m), []string{svc.Spec.ClusterIP}) {
			t.Errorf("%s: A %s: %v, want its ClusterIP %s", pods[i].name, q, aRecords(m), svc.Spec.ClusterIP)
		}
	}

	done = make(chan struct{})
	var deleted []time.Duration
	t0 = time.Now()
	go func() {
		defer close(done)
		deleted, _, errs = poll(t0, func(m *dns.Msg) bool { return m.Rcode == dns.RcodeNameError })
	}()
	if err := l.c.CoreV1().Services("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting service %s: %v", name, err)
	}
	<-done
	report("Service "+name+" deleted, NXDOMAIN", deleted, errs)
}

// checkResolvConf makes a pod of each dnsPolicy on client's node and
// compares its /etc/resolv.conf with what the lab runtime's pure function
// forms from the node's file (read where the node's agent reads it) and
// the agents' --cluster-dns and --cluster-domain; the cluster's part is
// also checked literally.
func checkResolvConf(t *testing.T, l *testLab, client labPod, tag string, newPod func(*corev1.Pod), kubeIP string) {
	s := l.spec
	n := client.node
	dnsIP := s.KubeDNSIP()
	agent, ok := proc.Running(s.StateDir, lab.AgentProc(n.Name))
	if !ok {
		t.Fatalf("the agent of %s is not running", n.Name)
	}
	nodeResolv := fmt.Sprintf("/proc/%d/root/etc/resolv.conf", agent)
	if s.Containerd() {
		// A real node's kubelet forms pods' files from its resolvConf.
		nodeResolv = filepath.Join(s.ContainerdDir(n), "resolv.conf")
	}
	nodeFile, err := os.ReadFile(nodeResolv)
	if err != nil {
		t.Fatalf("the node's resolv.conf, as %s's agent sees it: %v", n.Name, err)
	}
	clusterSearch := "search default.svc." + clusterDomain + " svc." + clusterDomain + " " + clusterDomain
	sleeper := func(suffix string, policy corev1.DNSPolicy, hostNet bool, cfg *corev1.PodDNSConfig) *corev1.Pod {
		p := sleepPod(tag+"-"+suffix, n.Name, "86406")
		p.Spec.DNSPolicy, p.Spec.HostNetwork, p.Spec.DNSConfig = policy, hostNet, cfg
		return p
	}
	cases := []struct {
		pod *corev1.Pod
		// lines the file must have (besides matching the pure function)
		lines []string
	}{
		{nil, []string{clusterSearch, "nameserver " + dnsIP.String(), "options ndots:5"}}, // client, ClusterFirst
		{sleeper("cf-config", corev1.DNSClusterFirst, false, &corev1.PodDNSConfig{
			Searches: []string{"extra.example"},
			Options:  []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("3")}, {Name: "single-request-reopen"}},
		}), []string{"nameserver " + dnsIP.String(), "options ndots:3 single-request-reopen"}},
		{sleeper("default", corev1.DNSDefault, false, nil), nil},
		{sleeper("none", corev1.DNSNone, false, &corev1.PodDNSConfig{
			Nameservers: []string{"198.51.100.53"},
			Searches:    []string{"s1.example", "s2.example"},
			Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("2")}, {Name: "edns0"}},
		}), []string{"search s1.example s2.example", "nameserver 198.51.100.53", "options ndots:2 edns0"}},
		{sleeper("hostnet-cf", corev1.DNSClusterFirst, true, nil), nil}, // the node's
		{sleeper("hostnet-cfwhn", corev1.DNSClusterFirstWithHostNet, true, nil),
			[]string{clusterSearch, "nameserver " + dnsIP.String(), "options ndots:5"}},
	}
	for _, c := range cases {
		if c.pod != nil {
			newPod(c.pod)
		}
	}
	for _, c := range cases {
		name := client.name
		if c.pod != nil {
			name = c.pod.Name
			l.waitRunning(t, name)
		}
		pod, err := l.c.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("pod %s (dnsPolicy %s, hostNetwork %v)", name, pod.Spec.DNSPolicy, pod.Spec.HostNetwork)
		got, code := l.podExec(name, "cat", "/etc/resolv.conf")
		if code != 0 {
			t.Errorf("%s: cat /etc/resolv.conf: exit %d: %s", what, code, got)
			continue
		}
		want := string(process.PodResolvConf(pod, []netip.Addr{dnsIP}, clusterDomain, nodeFile))
		if got != want {
			t.Errorf("%s: /etc/resolv.conf:\n%s\nwant (the runtime's pure function, node file %q):\n%s", what, got, nodeFile, want)
		}
		lines := nonEmptyLines(got)
		for _, w := range c.lines {
			if !slices.ContainsFunc(lines, func(l string) bool { return l == w || strings.HasPrefix(l, w+" ") }) {
				t.Errorf("%s: /etc/resolv.conf has no line %q:\n%s", what, w, got)
			}
		}
		if pod.Spec.DNSPolicy == corev1.DNSNone && len(lines) != len(c.lines) {
			t.Errorf("%s: /etc/resolv.conf is not exactly its dnsConfig:\n%s", what, got)
		}
		// A host-network pod asks the cluster DNS from the node's own
		// namespace (NothingTracked checks that this is not tracked either).
		if pod.Spec.DNSPolicy == corev1.DNSClusterFirstWithHostNet {
			l.resolvesTo(t, name, "hosts", "kubernetes.default", kubeIP)
		}
	}
}

// parallelLookups makes n lookups at once from the namespace at nsPath, as
// glibc makes them: per lookup one UDP socket, the A and the AAAA query
// sent back to back on it, then both answers read. Each lookup asks one of
// the names of want (FQDN -> its one A) and must get that A and a NOERROR
// AAAA answer. It returns how long each answered lookup took, and what
// went wrong with the others.
func parallelLookups(nsPath string, server netip.Addr, want map[string]string, n int) ([]time.Duration, []string, error) {
	names := slices.Sorted(maps.Keys(want))
	// The sockets are made inside the pod's namespace, on netns.Do's
	// locked thread; they stay there when used from other goroutines.
	conns := make([]*net.UDPConn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(server, 53))
	if err := netns.Do(nsPath, func() error {
		for range n {
			c, err := net.DialUDP("udp", nil, to)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("opening %d UDP sockets in %s: %w", n, nsPath, err)
	}
	var (
		mu    sync.Mutex
		took  []time.Duration
		fails []string
		wg    sync.WaitGroup
	)
	start := make(chan struct{})
	for i, c := range conns {
		name := names[i%len(names)]
		var queries [2][]byte
		for j, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			m := new(dns.Msg)
			m.SetQuestion(name, qt)
			m.Id = uint16(2*i + j)
			b, err := m.Pack()
			if err != nil {
				return nil, nil, err
			}
			queries[j] = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d, err := lookup(c, queries, uint16(2*i), want[name])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fails = append(fails, fmt.Sprintf("%s: %v", name, err))
				return
			}
			took = append(took, d)
		}()
	}
	close(start)
	wg.Wait()
	return took, fails, nil
}

// lookup sends the A query (id) and the AAAA query (id+1) on c and reads
// both answers: the A must be wantA.
func lookup(c *net.UDPConn, queries [2][]byte, id uint16, wantA string) (time.Duration, error) {
	t0 := time.Now()
	_ = c.SetDeadline(t0.Add(5 * time.Second))
	for _, q := range queries {
		if _, err := c.Write(q); err != nil {
			return 0, err
		}
	}
	buf := make([]byte, 1500)
	got := map[uint16]bool{}
	for len(got) < 2 {
		k, err := c.Read(buf)
		if err != nil {
			return 0, fmt.Errorf("after %s, %d of 2 answers: %w", time.Since(t0).Round(time.Millisecond), len(got), err)
		}
		var m dns.Msg
		if err := m.Unpack(buf[:k]); err != nil {
			return 0, fmt.Errorf("unpacking an answer: %w", err)
		}
		if m.Id != id && m.Id != id+1 {
			continue
		}
		if m.Rcode != dns.RcodeSuccess {
			return 0, fmt.Errorf("%s answered %s", dns.TypeToString[m.Question[0].Qtype], dns.RcodeToString[m.Rcode])
		}
		if m.Id == id && !slices.Equal(aRecords(&m), []string{wantA}) {
			return 0, fmt.Errorf("A answered %v, want %s", aRecords(&m), wantA)
		}
		got[m.Id] = true
	}
	return time.Since(t0), nil
}

// udpRcvbufErrors is the UDP RcvbufErrors counter of the namespace at
// nsPath: datagrams dropped because a socket's receive buffer was full.
func udpRcvbufErrors(t *testing.T, nsPath string) int {
	t.Helper()
	var snmp []byte
	if err := netns.Do(nsPath, func() error {
		var err error
		snmp, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}); err != nil {
		t.Fatalf("reading the UDP counters of %s: %v", nsPath, err)
	}
	var head []string
	for _, line := range strings.Split(string(snmp), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		if i := slices.Index(head, "RcvbufErrors"); i > 0 && i < len(f) {
			n, _ := strconv.Atoi(f[i])
			return n
		}
	}
	t.Fatalf("no Udp RcvbufErrors in %s's /proc/net/snmp:\n%s", nsPath, snmp)
	return 0
}

// checkDNSUntracked checks every node's conntrack table after the
// lookups: no flow to or from the cluster DNS addresses; the only DNS
// flows tracked are the node's own forwards to the external host.
func checkDNSUntracked(t *testing.T, s *lab.Spec) {
	local := []string{s.KubeDNSIP().String(), lab.NodeLocalDNS}
	for _, n := range s.Nodes {
		// stdout only: the count conntrack writes to stderr would cut
		// into a line.
		cmd := exec.Command("ip", "netns", "exec", n.Netns, "conntrack", "-L")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("conntrack -L on %s: %v\n%s", n.Name, err, stderr.String())
		}
		forwards := 0
		for _, line := range nonEmptyLines(string(out)) {
			f := conntrackFields(line)
			if slices.Contains(local, f["src"]) || slices.Contains(local, f["dst"]) {
				t.Errorf("%s: a flow of the cluster DNS is tracked: %s", n.Name, line)
				continue
			}
			if f["dport"] != "53" && f["sport"] != "53" {
				continue
			}
			if f["src"] != n.IP.String() || f["dst"] != s.External.IP.String() || f["dport"] != "53" {
				t.Errorf("%s: a DNS flow other than the node's forward to %s:53 is tracked: %s", n.Name, s.External.IP, line)
				continue
			}
			forwards++
		}
		t.Logf("%s: %d tracked forwards to the upstream %s:53, nothing else on port 53", n.Name, forwards, s.External.IP)
	}
}

// conntrackFields is a conntrack -L line's original direction: the first
// src=, dst=, sport= and dport=.
func conntrackFields(line string) map[string]string {
	f := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			if _, seen := f[k]; !seen {
				f[k] = v
			}
		}
	}
	return f
}
