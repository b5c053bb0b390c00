package e2e

// Traffic from outside the cluster: the external host (--external) reaches
// Services through NodePorts on every node, an externalIPs address and the
// LoadBalancer IP flatnet's controller assigns (lbipam), both routed to the
// nodes by the external host's ECMP route to the lab's --lb-pool. Policy
// Cluster masquerades the client; policy Local keeps it, only nodes with a
// local endpoint answer, and the agents' healthCheckNodePort tells which.
// A deleted Service's address is free for the next one.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/controller/lbipam"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
)

// httpStatus makes one HTTP GET from inside the namespace at nsPath,
// giving up connecting after dialTimeout, and returns the status code and
// body, whatever the code.
func httpStatus(nsPath, addr, path string, dialTimeout time.Duration) (int, string, error) {
	var conn net.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, dialTimeout)
		return err
	})
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.StatusCode, b.String(), err
}

// waitLBIP waits until the controller has written one ingress IP for
// Service name and returns it.
func (l *testLab) waitLBIP(t *testing.T, name string) netip.Addr {
	t.Helper()
	var last *corev1.Service
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		svc, err := l.c.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = svc
			if ing := svc.Status.LoadBalancer.Ingress; len(ing) == 1 {
				a, err := netip.ParseAddr(ing[0].IP)
				if err != nil {
					t.Fatalf("service %s: ingress IP %q: %v", name, ing[0].IP, err)
				}
				return a
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	st := "not found"
	if last != nil {
		b, _ := json.Marshal(last.Status)
		st = string(b)
	}
	t.Fatalf("service %s got no load-balancer IP in 30s; status %s (controller log %s)", name, st, l.spec.LogDir())
	return netip.Addr{}
}

// checkExternal runs the external-traffic checks on a running lab with an
// external host and a load-balancer range: two netexec pods on nodes 1
// and 2 (none on node 3) behind a Service of policy Cluster (with an
// externalIPs address) and one of policy Local, both of type LoadBalancer.
func checkExternal(t *testing.T, l *testLab) {
	s := l.spec
	if s.External == nil || !s.LBPool.IsValid() || len(s.Nodes) < 3 {
		t.Fatalf("checkExternal needs a lab with --external, a --lb-pool and 3 nodes (external %v, pool %v, %d nodes)", s.External != nil, s.LBPool, len(s.Nodes))
	}
	ext := lab.NetnsPath(s.External.Netns)
	extIP := s.External.IP.String()
	pool, err := lbipam.ParsePool(s.LoadBalancerPool())
	if err != nil {
		t.Fatal(err)
	}
	label := "ext-" + randHex(3)
	sel := map[string]string{"e2e-external": label}
	withEP, noEP := s.Nodes[:2], s.Nodes[2]
	podOn := map[string]string{} // node IP -> its endpoint pod
	var pods []string
	for _, n := range withEP {
		p := netexecPod(label+"-"+strconv.Itoa(n.Index), n.Name)
		p.Labels = sel
		l.create(t, p)
		pods = append(pods, p.Name)
		podOn[n.IP.String()] = p.Name
	}
	t.Cleanup(func() { l.deleteAndWait(t, pods...) })
	for _, p := range pods {
		l.waitReady(t, p)
	}

	externalIP := s.ExternalIPRange().Addr().Next() // e.g. 10.251.0.129
	cluster := service(label+"-cluster", corev1.ServiceTypeLoadBalancer, sel)
	cluster.Spec.ExternalIPs = []string{externalIP.String()}
	cluster = l.createService(t, cluster)
	local := service(label+"-local", corev1.ServiceTypeLoadBalancer, sel)
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local = l.createService(t, local)
	clusterLB, localLB := l.waitLBIP(t, cluster.Name), l.waitLBIP(t, local.Name)
	for _, a := range []netip.Addr{clusterLB, localLB} {
		if !pool.Contains(a) {
			t.Errorf("load-balancer IP %s is outside the controller's pool %s", a, pool)
		}
	}
	if clusterLB == localLB {
		t.Fatalf("both Services got %s", clusterLB)
	}
	cnp, lnp, hc := cluster.Spec.Ports[0].NodePort, local.Spec.Ports[0].NodePort, local.Spec.HealthCheckNodePort
	t.Logf("services: %s LB %s externalIP %s nodePort %d; %s (Local) LB %s nodePort %d healthCheckNodePort %d; endpoints %v on %s and %s",
		cluster.Name, clusterLB, externalIP, cnp, local.Name, localLB, lnp, hc, pods, withEP[0].Name, withEP[1].Name)

	// get asks addr from the external host, retrying while the proxies
	// catch up with the new Services.
	get := func(addr, path string) (string, error) {
		var body string
		err := retry(30*time.Second, func() error {
			var err error
			body, err = httpGet(ext, addr, path)
			return err
		})
		return strings.TrimSpace(body), err
	}
	// quick asks once, connecting for at most a second: where no answer is
	// expected (a dropped SYN), so a failure costs a second, not three. A
	// SYN on this lab's veths is answered in well under a millisecond, so
	// the short timeout cannot turn a slow answer into a pass.
	quick := func(addr, path string) (string, error) {
		code, body, err := httpStatus(ext, addr, path, time.Second)
		if err == nil && code != 200 {
			err = fmt.Errorf("%d %s", code, body)
		}
		return strings.TrimSpace(body), err
	}
	hostPort := func(a string, port int32) string { return net.JoinHostPort(a, strconv.Itoa(int(port))) }
	isPod := func(name string) bool { return name == pods[0] || name == pods[1] }

	t.Run("ClusterPolicyMasqueraded", func(t *testing.T) {
		targets := []string{hostPort(clusterLB.String(), 80), hostPort(externalIP.String(), 80)}
		for _, n := range s.Nodes {
			targets = append(targets, hostPort(n.IP.String(), cnp))
		}
		for _, addr := range targets {
			name, err := get(addr, "/hostname")
			if err != nil || !isPod(name) {
				t.Errorf("external host -> %s: %q, %v; want one of %v", addr, name, err, pods)
				continue
			}
			client, err := get(addr, "/clientip")
			if err != nil || hostOf(client) == extIP || hostOf(client) == "" {
				t.Errorf("external host -> %s: /clientip %q, %v; want a masqueraded address, not the external host's %s", addr, client, err, extIP)
			}
		}
	})

	t.Run("LocalPolicyKeepsClientIP", func(t *testing.T) {
		for _, n := range withEP {
			addr := hostPort(n.IP.String(), lnp)
			name, err := get(addr, "/hostname")
			if err != nil || name != podOn[n.IP.String()] {
				t.Errorf("external host -> NodePort %s: %q, %v; want the node's own endpoint %s", addr, name, err, podOn[n.IP.String()])
			}
			client, err := get(addr, "/clientip")
			if err != nil || hostOf(client) != extIP {
				t.Errorf("external host -> NodePort %s: /clientip %q, %v; want the external host's own %s", addr, client, err, extIP)
			}
		}
		// Through the LoadBalancer IP, the ECMP route hashes each
		// connection to some node; those reaching node 3 find no local
		// endpoint and fail. Every answer keeps the client's address.
		addr := hostPort(localLB.String(), 80)
		answers, failures := 0, 0
		err := retry(30*time.Second, func() error {
			client, err := quick(addr, "/clientip")
			if err != nil {
				failures++
				return err
			}
			if hostOf(client) != extIP {
				t.Errorf("external host -> %s: /clientip %q; want the external host's own %s", addr, client, extIP)
			}
			if answers++; answers < 3 {
				return fmt.Errorf("%d answers", answers)
			}
			return nil
		})
		if err != nil {
			t.Errorf("external host -> LoadBalancer IP %s (policy Local): %d answers, %d failures; last: %v", addr, answers, failures, err)
		}
		t.Logf("LoadBalancer IP %s (policy Local): 3 answers after %d failed connections (hashed to %s)", addr, failures, noEP.Name)
	})

	t.Run("LocalPolicyNodeWithoutEndpointSilent", func(t *testing.T) {
		addr := hostPort(noEP.IP.String(), lnp)
		// Wait for node 3's proxy to know the Service (its NodePort in the
		// table: not answering proves nothing before that), then require
		// that it keeps refusing.
		np := fmt.Sprintf("tcp . %d :", lnp)
		if err := waitProxyRules(noEP, 30*time.Second, func(rules string) string {
			if !strings.Contains(rules, np) {
				return fmt.Sprintf("no %q in the table", np)
			}
			return ""
		}); err != nil {
			t.Fatalf("%s's proxy never programmed NodePort %d: %v", noEP.Name, lnp, err)
		}
		err := retry(30*time.Second, func() error {
			if body, err := quick(addr, "/hostname"); err == nil {
				return fmt.Errorf("answered %q", body)
			}
			return nil
		})
		for i := 0; err == nil && i < 3; i++ {
			if body, gerr := quick(addr, "/hostname"); gerr == nil {
				err = fmt.Errorf("answered %q", body)
			}
		}
		if err != nil {
			t.Errorf("external host -> NodePort %s on %s (no local endpoint, policy Local): %v; want no answer", addr, noEP.Name, err)
		}
	})

	t.Run("HealthCheckNodePort", func(t *testing.T) {
		if hc == 0 {
			t.Fatalf("service %s has no healthCheckNodePort", local.Name)
		}
		for _, n := range s.Nodes {
			want, wantEP := 200, 1
			if n.Name == noEP.Name {
				want, wantEP = 503, 0
			}
			addr := hostPort(n.IP.String(), hc)
			var code int
			var body string
			err := retry(30*time.Second, func() error {
				var err error
				code, body, err = httpStatus(ext, addr, "/", 3*time.Second)
				if err != nil {
					return err
				}
				var st struct {
					LocalEndpoints int `json:"localEndpoints"`
				}
				if err := json.Unmarshal([]byte(body), &st); err != nil {
					return fmt.Errorf("decoding %q: %w", body, err)
				}
				if code != want || st.LocalEndpoints != wantEP {
					return fmt.Errorf("%d with localEndpoints %d", code, st.LocalEndpoints)
				}
				return nil
			})
			if err != nil {
				t.Errorf("external host -> health check %s on %s: %v (last %d %q); want %d with localEndpoints %d", addr, n.Name, err, code, body, want, wantEP)
			}
		}
	})

	t.Run("LoadBalancerSourceRanges", func(t *testing.T) {
		ctx := context.Background()
		setRanges := func(ranges ...string) {
			t.Helper()
			svc, err := l.c.CoreV1().Services("default").Get(ctx, cluster.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			svc.Spec.LoadBalancerSourceRanges = ranges
			if _, err := l.c.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("setting loadBalancerSourceRanges %v: %v", ranges, err)
			}
		}
		lbAddr := hostPort(clusterLB.String(), 80)
		// A range without the external host: its connections to the
		// LoadBalancer IP are dropped on every node (once every node's
		// proxy has the range: the positive signal) ...
		setRanges("10.99.99.0/24")
		for _, n := range s.Nodes {
			if err := waitProxyRules(n, 30*time.Second, func(rules string) string {
				if !strings.Contains(rules, "saddr != 10.99.99.0/24 drop") {
					return "no loadBalancerSourceRanges rule in the table"
				}
				return ""
			}); err != nil {
				t.Fatal(err)
			}
		}
		err := retry(30*time.Second, func() error {
			if body, err := quick(lbAddr, "/hostname"); err == nil {
				return fmt.Errorf("answered %q", body)
			}
			return nil
		})
		for i := 0; err == nil && i < 3; i++ {
			if body, gerr := quick(lbAddr, "/hostname"); gerr == nil {
				err = fmt.Errorf("answered %q", body)
			}
		}
		if err != nil {
			t.Errorf("external host -> %s with loadBalancerSourceRanges 10.99.99.0/24: %v; want no answer", lbAddr, err)
		}
		// ... while the NodePort is not filtered, as with kube-proxy.
		if name, err := get(hostPort(s.Nodes[0].IP.String(), cnp), "/hostname"); err != nil || !isPod(name) {
			t.Errorf("external host -> NodePort with loadBalancerSourceRanges: %q, %v", name, err)
		}
		// With the external host in range it answers again.
		setRanges("10.99.99.0/24", extIP+"/32")
		if name, err := get(lbAddr, "/hostname"); err != nil || !isPod(name) {
			t.Errorf("external host -> %s with its own address in loadBalancerSourceRanges: %q, %v", lbAddr, name, err)
		}
		setRanges()
	})

	t.Run("DeletedServiceReleasesItsIP", func(t *testing.T) {
		ctx := context.Background()
		if err := l.c.CoreV1().Services("default").Delete(ctx, cluster.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		// The address stops answering ...
		addr := hostPort(clusterLB.String(), 80)
		if err := retry(30*time.Second, func() error {
			if body, err := quick(addr, "/hostname"); err == nil {
				return fmt.Errorf("still answered %q", body)
			}
			return nil
		}); err != nil {
			t.Errorf("external host -> %s after the Service's deletion: %v", addr, err)
		}
		// ... and is given to the next Service that asks for it.
		again := service(label+"-again", corev1.ServiceTypeLoadBalancer, sel)
		again.Spec.LoadBalancerIP = clusterLB.String()
		again = l.createService(t, again)
		if got := l.waitLBIP(t, again.Name); got != clusterLB {
			t.Fatalf("service %s asked for the released %s and got %s", again.Name, clusterLB, got)
		}
		if name, err := get(addr, "/hostname"); err != nil || !isPod(name) {
			t.Errorf("external host -> %s (now %s): %q, %v", addr, again.Name, name, err)
		}
	})
}
