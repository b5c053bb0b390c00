package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The benchmark's namespaces: workload ones (pods and the policy mix),
// the prober's client, the probe targets, and a canary that tells when an
// enforcer has caught up with everything.
const (
	clientNS = "pb-client"
	probeNS  = "pb-probe"
	canaryNS = "pb-canary"
	port     = 8080
	nameLbl  = "kubernetes.io/metadata.name"
)

var apps = []string{"web", "api", "db", "cache", "worker"}

func workloadNS(i int) string { return fmt.Sprintf("pb-w%03d", i) }

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// Bulk creation: the admin user is exempt from priority and fairness;
	// the client's own limiter is set out of the way.
	cfg.QPS, cfg.Burst = 2000, 4000
	return kubernetes.NewForConfig(cfg)
}

// workload is every object of the benchmark as plain data.
type workload struct {
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod
	Policies   []*netv1.NetworkPolicy
}

// layout says where pods go: the client on clientNode, the probe targets,
// the rate target and the canary on enforcerNode, workload pods round-robin
// over all nodes.
type layout struct {
	namespaces, pods, policies int
	targets                    int
	nodes                      []string
	clientNode, enforcerNode   string
}

// build computes the workload. Namespaces carry team and env labels; each
// has pods/namespaces pods (apps cycled), and policies are dealt round-robin
// over the namespaces, each from the next of ten templates that real
// clusters use (default deny, same-namespace, app to app by label, by
// namespace label, namespace and pod selector together, matchExpressions,
// named ports, endPort ranges, ipBlock with except, egress with DNS).
func build(l layout) workload {
	var w workload
	team := func(i int) string { return fmt.Sprintf("team-%d", i%5) }
	env := func(i int) string { return []string{"prod", "staging", "dev"}[i%3] }
	for i := range l.namespaces {
		w.Namespaces = append(w.Namespaces, namespace(workloadNS(i), map[string]string{"team": team(i), "env": env(i)}))
	}
	for _, n := range []string{clientNS, probeNS, canaryNS} {
		w.Namespaces = append(w.Namespaces, namespace(n, map[string]string{"bench": "policy"}))
	}
	for j := range l.pods {
		ns := j % l.namespaces
		app := apps[(j/l.namespaces)%len(apps)]
		name := fmt.Sprintf("%s-%d", app, j/l.namespaces)
		tier := "backend"
		if app == "web" {
			tier = "frontend"
		}
		w.Pods = append(w.Pods, server(workloadNS(ns), name, l.nodes[j%len(l.nodes)], map[string]string{"app": app, "tier": tier}))
	}
	w.Pods = append(w.Pods, server(clientNS, "client", l.clientNode, map[string]string{"app": "client"}))
	w.Pods = append(w.Pods, server(probeNS, "rate", l.enforcerNode, map[string]string{"app": "rate"}))
	for t := range l.targets {
		w.Pods = append(w.Pods, server(probeNS, target(t), l.enforcerNode, map[string]string{"app": "target", "pod": target(t)}))
	}
	w.Pods = append(w.Pods, server(canaryNS, "canary", l.enforcerNode, map[string]string{"app": "canary"}))

	// The probe namespace gets its share of the mix (selecting app=rate,
	// one of them letting the client in); the canary namespace denies all.
	w.Policies = append(w.Policies, ratePolicies()...)
	w.Policies = append(w.Policies, &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: canaryNS, Name: "default-deny"},
		Spec:       netv1.NetworkPolicySpec{PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress}},
	})
	for k := range l.policies - len(w.Policies) {
		ns := k % l.namespaces
		w.Policies = append(w.Policies, templatePolicy(k/l.namespaces, ns, team(ns+1), env(ns)))
	}
	return w
}

func target(t int) string { return fmt.Sprintf("t-%d", t) }

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// server is a pod answering TCP on port (flatnet netexec, on the pods'
// PATH in the lab's process runtime), pinned to node.
func server(ns, name, node string, labels map[string]string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:    "server",
				Image:   "flatnet:dev",
				Command: []string{"flatnet", "netexec", fmt.Sprintf("--http-port=%d", port), "--udp-port=-1"},
				Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
}

func tcp(p int) netv1.NetworkPolicyPort {
	proto, v := corev1.ProtocolTCP, intstr.FromInt32(int32(p))
	return netv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func ingress(ns, name string, pods metav1.LabelSelector, rules ...netv1.NetworkPolicyIngressRule) *netv1.NetworkPolicy {
	return &netv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: netv1.NetworkPolicySpec{
			PodSelector: pods,
			PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeIngress},
			Ingress:     rules,
		},
	}
}

// templatePolicy is the round-th policy of workload namespace ns.
func templatePolicy(round, ns int, otherTeam, env string) *netv1.NetworkPolicy {
	n := workloadNS(ns)
	name := func(s string) string {
		if round < 10 {
			return s
		}
		return fmt.Sprintf("%s-%d", s, round/10)
	}
	named := intstr.FromString("http")
	proto := corev1.ProtocolTCP
	end := int32(9000)
	switch round % 10 {
	case 0:
		if ns%3 == 0 {
			return ingress(n, name("default-deny"), metav1.LabelSelector{})
		}
		return ingress(n, name("allow-same-namespace"), metav1.LabelSelector{},
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}})
	case 1:
		return ingress(n, name("web-from-all-namespaces"), *sel("app", "web"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}, Ports: []netv1.NetworkPolicyPort{tcp(port)}})
	case 2:
		return ingress(n, name("api-from-web"), *sel("app", "api"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{PodSelector: sel("app", "web")}}, Ports: []netv1.NetworkPolicyPort{tcp(port)}})
	case 3:
		return ingress(n, name("db-from-api"), *sel("app", "db"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{PodSelector: sel("app", "api")}}, Ports: []netv1.NetworkPolicyPort{tcp(5432)}})
	case 4:
		return ingress(n, name("api-from-team"), *sel("app", "api"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", otherTeam)}},
				Ports: []netv1.NetworkPolicyPort{{Protocol: &proto, Port: &named}}})
	case 5:
		return ingress(n, name("cache-from-prod-api"), *sel("app", "cache"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel("env", env), PodSelector: sel("app", "api")}}, Ports: []netv1.NetworkPolicyPort{tcp(6379)}})
	case 6:
		p := tcp(8000)
		p.EndPort = &end
		return ingress(n, name("backends-range"),
			metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"worker", "cache"}}}},
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"frontend"}}}}}},
				Ports: []netv1.NetworkPolicyPort{p}})
	case 7:
		udp, dns := corev1.ProtocolUDP, intstr.FromInt32(53)
		return &netv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: name("web-egress")},
			Spec: netv1.NetworkPolicySpec{
				PodSelector: *sel("app", "web"),
				PolicyTypes: []netv1.PolicyType{netv1.PolicyTypeEgress},
				Egress: []netv1.NetworkPolicyEgressRule{
					{To: []netv1.NetworkPolicyPeer{{PodSelector: sel("app", "api")}}, Ports: []netv1.NetworkPolicyPort{tcp(port)}},
					{To: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel(nameLbl, "kube-system")}}, Ports: []netv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}}},
				},
			},
		}
	case 8:
		return ingress(n, name("web-from-office"), *sel("app", "web"),
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{IPBlock: &netv1.IPBlock{CIDR: "172.16.0.0/12", Except: []string{"172.16.1.0/24"}}}}, Ports: []netv1.NetworkPolicyPort{tcp(port)}})
	default:
		return ingress(n, name("metrics-from-monitoring"), metav1.LabelSelector{},
			netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel(nameLbl, "monitoring")}}, Ports: []netv1.NetworkPolicyPort{tcp(9090)}})
	}
}

// ratePolicies select the connection-rate target with peers that do not
// match the client, and one that lets the client in: a new connection to
// it is decided among several policies, as in the workload namespaces.
func ratePolicies() []*netv1.NetworkPolicy {
	rate := *sel("app", "rate")
	from := func(p netv1.NetworkPolicyPeer) netv1.NetworkPolicyIngressRule {
		return netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{p}, Ports: []netv1.NetworkPolicyPort{tcp(port)}}
	}
	return []*netv1.NetworkPolicy{
		ingress(probeNS, "rate-from-team", rate, from(netv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "team-1")})),
		ingress(probeNS, "rate-from-web", rate, from(netv1.NetworkPolicyPeer{PodSelector: sel("app", "web")})),
		ingress(probeNS, "rate-from-office", rate, from(netv1.NetworkPolicyPeer{IPBlock: &netv1.IPBlock{CIDR: "172.16.0.0/12"}})),
		ingress(probeNS, "rate-from-prod-api", rate, from(netv1.NetworkPolicyPeer{NamespaceSelector: sel("env", "prod"), PodSelector: sel("app", "api")})),
		ingress(probeNS, "rate-from-client", rate, from(netv1.NetworkPolicyPeer{NamespaceSelector: sel(nameLbl, clientNS)})),
	}
}

// denyPolicy selects probe target t and admits nothing; allowPolicy lets
// the client's namespace in on port.
func denyPolicy(name string, t int) *netv1.NetworkPolicy {
	return ingress(probeNS, name, *sel("pod", target(t)))
}

func allowPolicy(name string, t int) *netv1.NetworkPolicy {
	return ingress(probeNS, name, *sel("pod", target(t)),
		netv1.NetworkPolicyIngressRule{From: []netv1.NetworkPolicyPeer{{NamespaceSelector: sel(nameLbl, clientNS)}}, Ports: []netv1.NetworkPolicyPort{tcp(port)}})
}

// create makes the workload's objects, workers at a time; a pod whose
// namespace has no default service account yet (the ServiceAccount
// admission plugin waits for the controller manager) is retried.
func create(ctx context.Context, c kubernetes.Interface, w workload, workers int) error {
	var jobs []func() error
	for _, ns := range w.Namespaces {
		jobs = append(jobs, func() error {
			_, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
			return err
		})
	}
	if err := parallel(jobs, workers); err != nil {
		return fmt.Errorf("namespaces: %w", err)
	}
	jobs = nil
	for _, p := range w.Pods {
		jobs = append(jobs, func() error {
			for {
				_, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
				if err == nil || apierrors.IsAlreadyExists(err) || !apierrors.IsForbidden(err) || ctx.Err() != nil {
					return ignoreExists(err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
	for _, np := range w.Policies {
		jobs = append(jobs, func() error {
			_, err := c.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
			return ignoreExists(err)
		})
	}
	return parallel(jobs, workers)
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// parallel runs jobs, workers at a time, and returns the first error.
func parallel(jobs []func() error, workers int) error {
	ch := make(chan func() error)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				if err := j(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	return first
}

// waitPods waits until every pod of the workload runs with an IP and
// returns the IPs by namespace/name.
func waitPods(ctx context.Context, c kubernetes.Interface, w workload, timeout time.Duration) (map[string]string, error) {
	want := map[string]bool{}
	for _, p := range w.Pods {
		want[p.Namespace+"/"+p.Name] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		ips, running := map[string]string{}, 0
		for _, p := range list.Items {
			k := p.Namespace + "/" + p.Name
			if !want[k] {
				continue
			}
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				ips[k] = p.Status.PodIP
				running++
			}
		}
		if running == len(want) {
			return ips, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d pods running with an IP after %s", running, len(want), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
