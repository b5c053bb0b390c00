package e2e

// TestCyclonus runs cyclonus v0.5.6's default generated NetworkPolicy test
// cases (112: `cyclonus generate` with its default excludes) against the
// lab, with cyclonus's own matcher as the oracle.
//
// Design. cyclonus's model is reused as it is: generator.TestCase (steps of
// actions: create/update/delete policies, set pod/namespace labels,
// create/delete pods and namespaces), probe.Resources (the topology as
// data, updated by each action), probe.JobBuilder (every client pod × every
// server pod × every port/protocol it serves), the SimulatedRunner over
// matcher.BuildNetworkPolicies (the expected table), compared cell by cell
// and job by job as its ComparisonTable does (pkg/connectivity itself is
// not imported: it pulls in a JUnit writer this module does not have).
// Only the two sides that touch a cluster are ours: the actions go to the
// lab's API, and the probes dial from inside the client pod's network
// namespace (TCP connect; UDP send and wait for the reply; 1 s timeout, a
// denied probe times out) instead of `kubectl exec agnhost connect`.
//
// Topology as cyclonus's default: namespaces x, y, z (label ns=x...) with
// pods a, b, c (label pod=a...) spread over the lab's nodes, each serving
// TCP and UDP on 80 and 81 (named ports serve-80-tcp...). SCTP is left
// out: this kernel has no SCTP (socket(..., IPPROTO_SCTP) fails with
// EPROTONOSUPPORT), so the pods serve none and the SCTP cases only check
// that an SCTP rule opens nothing else. Every pod has a
// Service s-NS-POD; it has no selector and its EndpointSlice is written
// here, so that a case that relabels the pod does not empty it. Each step
// is probed to the pod IPs and to the ClusterIPs; both must match the
// oracle. The topology is made once and reset between cases (policies
// deleted, labels restored, created pods and namespaces removed), as
// cyclonus does with ResetClusterBeforeTestCase.
//
// Loopback (a pod probing itself) is ignored for pod-IP probes, as the
// upstream e2e suite ignores it (kubernetes#95879): to its own pod IP the
// traffic never leaves the pod's namespace (lo), so no enforcer on the
// node sees it, and NetworkPolicy cannot block it. To its own ClusterIP it
// hairpins through the node and is compared like every other cell.
//
// Knobs: FLATNET_CYCLONUS_CASES picks cases by 1-based number ("1-56",
// "91,93-96"); -short without it runs every seventh case and the
// multi-step ones. FLATNET_CYCLONUS_LOOPBACK=1 compares pod-IP loopback
// cells too (they then fail wherever a policy denies a pod itself).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mattfenwick/cyclonus/pkg/connectivity/probe"
	"github.com/mattfenwick/cyclonus/pkg/generator"
	"github.com/mattfenwick/cyclonus/pkg/matcher"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
)

const (
	// cyProbeTimeout bounds one probe; a denied one costs all of it.
	cyProbeTimeout = time.Second
	// cySettle is the wait after a step's actions before its first probe
	// (cyclonus's --perturbation-wait-seconds, 5 s there; flatnet's
	// agent aims at 250 ms).
	cySettle = time.Second
	// cyRetries is how many times a step's table is probed again while it
	// differs from the oracle (cyclonus's --retries, 1 there).
	cyRetries = 2
	// cyParallel bounds the probes in flight (most of a denied probe is
	// waiting for its timeout, so this can be well above the cores).
	cyParallel = 128
	// cyManagedBy marks the EndpointSlices written here.
	cyManagedBy = "cyclonus.e2e.flatnet"
)

var (
	cyNamespaces = []string{"x", "y", "z"}
	cyPodNames   = []string{"a", "b", "c"}
	cyPorts      = []int{80, 81}
	cyProtocols  = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}
	// cyModes are the destinations every step is probed at.
	cyModes = []generator.ProbeMode{generator.ProbeModePodIP, generator.ProbeModeServiceIP}
	// cyExcluded are `cyclonus generate`'s default --exclude tags.
	cyExcluded = []string{generator.TagMultiPeer, generator.TagUpstreamE2E, generator.TagExample,
		generator.TagEndPort, generator.TagNamespacesByDefaultLabel}
)

// cyPod is where a pod of the topology runs.
type cyPod struct {
	netns string
	ip    string
	svcIP string
}

// cyLab is the cyclonus topology in a running lab.
type cyLab struct {
	l    *testLab
	ctx  context.Context
	base *probe.Resources // the topology every case starts from
	// pods is written by actions only, read by the probes between them.
	pods    map[string]*cyPod // by "ns/name"
	next    int               // round-robin node index for new pods
	extraNS map[string]bool   // namespaces a case created
}

func cyKey(ns, name string) string { return ns + "/" + name }

// cyPodSpec is pod ns/name: two netexec containers, one per port, each
// serving TCP and UDP on it, with cyclonus's port names.
func cyPodSpec(ns, name, node string, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr(int64(1)),
			AutomountServiceAccountToken:  ptr(false),
		},
	}
	for _, port := range cyPorts {
		c := corev1.Container{
			Name: fmt.Sprintf("cont-%d", port), Image: podImage,
			Command: []string{"flatnet", "netexec", fmt.Sprintf("--http-port=%d", port), fmt.Sprintf("--udp-port=%d", port)},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(port)}},
				PeriodSeconds: 1,
			},
		}
		for _, proto := range cyProtocols {
			c.Ports = append(c.Ports, corev1.ContainerPort{
				Name: fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto))), ContainerPort: int32(port), Protocol: proto,
			})
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// startPod creates pod ns/name on node and waits until it is Ready; it
// returns the pod's IP. It touches no shared state (setup runs it in
// parallel).
func (c *cyLab) startPod(node lab.Node, ns, name string, labels map[string]string) (string, error) {
	pods := c.l.c.CoreV1().Pods(ns)
	// A new namespace's default ServiceAccount comes a moment after it.
	err := retry(30*time.Second, func() error {
		_, err := pods.Create(c.ctx, cyPodSpec(ns, name, node.Name, labels), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("creating pod %s/%s: %w", ns, name, err)
	}
	var ip string
	err = retry(90*time.Second, func() error {
		p, err := pods.Get(c.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !running(p) || !podReady(p) {
			return fmt.Errorf("pod %s/%s not ready after 90s: phase %s", ns, name, p.Status.Phase)
		}
		ip = p.Status.PodIP
		return nil
	})
	return ip, err
}

// addPod records Ready pod ns/name and gives it its Service.
func (c *cyLab) addPod(t *testing.T, node lab.Node, ns, name, ip string) error {
	svcIP, err := c.createService(node, ns, name, ip)
	if err != nil {
		return err
	}
	c.pods[cyKey(ns, name)] = &cyPod{netns: podNetns(t, c.l.spec, node, ns, name), ip: ip, svcIP: svcIP}
	return nil
}

// createPod is a case's CreatePod: the next node in turn.
func (c *cyLab) createPod(t *testing.T, ns, name string, labels map[string]string) error {
	node := c.l.spec.Nodes[c.next%len(c.l.spec.Nodes)]
	c.next++
	ip, err := c.startPod(node, ns, name, labels)
	if err != nil {
		return err
	}
	return c.addPod(t, node, ns, name, ip)
}

// createService makes Service s-NS-POD (cyclonus's name and ports) with no
// selector and an EndpointSlice naming the pod, and returns its ClusterIP.
// The endpoint names its node, as the EndpointSlice controller writes it:
// the proxy masquerades a pod reaching itself only for its node's
// endpoints (without it, hairpin probes time out).
func (c *cyLab) createService(node lab.Node, ns, name, podIP string) (string, error) {
	svcName := fmt.Sprintf("s-%s-%s", ns, name)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: ns}}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName, discoveryv1.LabelManagedBy: cyManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{podIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			NodeName:   ptr(node.Name),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name},
		}},
	}
	if netip.MustParseAddr(podIP).Is6() {
		slice.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, port := range cyPorts {
		for _, proto := range cyProtocols {
			pn := fmt.Sprintf("service-port-%s-%d", strings.ToLower(string(proto)), port)
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: pn, Protocol: proto, Port: int32(port), TargetPort: intstr.FromInt(port)})
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr(pn), Protocol: ptr(proto), Port: ptr(int32(port))})
		}
	}
	got, err := c.l.c.CoreV1().Services(ns).Create(c.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating service %s/%s: %w", ns, svcName, err)
	}
	if _, err := c.l.c.DiscoveryV1().EndpointSlices(ns).Create(c.ctx, slice, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating endpointslice %s/%s: %w", ns, svcName, err)
	}
	return got.Spec.ClusterIP, nil
}

// deletePod deletes pod ns/name with its Service and EndpointSlice.
func (c *cyLab) deletePod(ns, name string) error {
	svcName := fmt.Sprintf("s-%s-%s", ns, name)
	var errs []error
	for _, err := range []error{
		c.l.c.CoreV1().Services(ns).Delete(c.ctx, svcName, metav1.DeleteOptions{}),
		c.l.c.DiscoveryV1().EndpointSlices(ns).Delete(c.ctx, svcName, metav1.DeleteOptions{}),
		c.l.c.CoreV1().Pods(ns).Delete(c.ctx, name, metav1.DeleteOptions{}),
	} {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	delete(c.pods, cyKey(ns, name))
	return errors.Join(errs...)
}

// nsLabels sets namespace ns's labels (nil: leaves them) and returns them
// as the API has them (it adds kubernetes.io/metadata.name).
func (c *cyLab) nsLabels(ns string, labels map[string]string) (map[string]string, error) {
	nsc := c.l.c.CoreV1().Namespaces()
	n, err := nsc.Get(c.ctx, ns, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if labels != nil && !maps.Equal(n.Labels, labels) {
		n.Labels = maps.Clone(labels)
		if n, err = nsc.Update(c.ctx, n, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("labelling namespace %s: %w", ns, err)
		}
	}
	return n.Labels, nil
}

// podLabels sets pod ns/name's labels unless they are already these.
func (c *cyLab) podLabels(ns, name string, labels map[string]string) error {
	p, err := c.l.c.CoreV1().Pods(ns).Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if maps.Equal(p.Labels, labels) {
		return nil
	}
	p.Labels = maps.Clone(labels)
	if _, err := c.l.c.CoreV1().Pods(ns).Update(c.ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("labelling pod %s/%s: %w", ns, name, err)
	}
	return nil
}

func (c *cyLab) createNamespace(ns string, labels map[string]string) (map[string]string, error) {
	if _, err := c.l.c.CoreV1().Namespaces().Create(c.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: maps.Clone(labels)}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	return c.nsLabels(ns, nil)
}

// setup makes the topology and returns it as cyclonus's Resources.
func (c *cyLab) setup(t *testing.T) (*probe.Resources, error) {
	r := &probe.Resources{Namespaces: map[string]map[string]string{}}
	for _, ns := range cyNamespaces {
		labels, err := c.createNamespace(ns, map[string]string{"ns": ns})
		if err != nil {
			return nil, err
		}
		r.Namespaces[ns] = labels
		for _, name := range cyPodNames {
			r.Pods = append(r.Pods, probe.NewDefaultPod(ns, name, cyPorts, cyProtocols, false, ""))
		}
	}
	// The pods start in parallel, spread over the nodes.
	ips, errs := make([]string, len(r.Pods)), make([]error, len(r.Pods))
	var wg sync.WaitGroup
	for i, p := range r.Pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ips[i], errs[i] = c.startPod(c.l.spec.Nodes[i%len(c.l.spec.Nodes)], p.Namespace, p.Name, p.Labels)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, p := range r.Pods {
		if err := c.addPod(t, c.l.spec.Nodes[i%len(c.l.spec.Nodes)], p.Namespace, p.Name, ips[i]); err != nil {
			return nil, err
		}
	}
	c.next = len(r.Pods)
	c.fill(r)
	return r, nil
}

// fill writes the recorded pod and Service IPs into r's pods (cyclonus's
// Resources updates drop ServiceIP and leave a created pod's IP "TODO").
func (c *cyLab) fill(r *probe.Resources) {
	for _, p := range r.Pods {
		if cp := c.pods[cyKey(p.Namespace, p.Name)]; cp != nil {
			p.IP, p.ServiceIP = cp.ip, cp.svcIP
		}
	}
}

// reset brings the cluster back to base: the pods and namespaces a case
// created are deleted, every policy is deleted, labels are restored.
func (c *cyLab) reset() error {
	var errs []error
	for key := range c.pods {
		ns, name, _ := strings.Cut(key, "/")
		if _, err := c.base.GetPod(ns, name); err != nil {
			errs = append(errs, c.deletePod(ns, name))
		}
	}
	for ns := range c.extraNS {
		if err := c.l.c.CoreV1().Namespaces().Delete(c.ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		delete(c.extraNS, ns)
	}
	for ns, labels := range c.base.Namespaces {
		errs = append(errs, c.l.c.NetworkingV1().NetworkPolicies(ns).DeleteCollection(c.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
		_, err := c.nsLabels(ns, labels)
		errs = append(errs, err)
	}
	for _, p := range c.base.Pods {
		errs = append(errs, c.podLabels(p.Namespace, p.Name, p.Labels))
	}
	return errors.Join(errs...)
}

// cyState is what a case has done so far: the topology as cyclonus models
// it and the policies in force.
type cyState struct {
	r        *probe.Resources
	policies []*networkingv1.NetworkPolicy
}

func policyIndex(ps []*networkingv1.NetworkPolicy, ns, name string) int {
	return slices.IndexFunc(ps, func(p *networkingv1.NetworkPolicy) bool { return p.Namespace == ns && p.Name == name })
}

// apply does one action in the lab and in st (as cyclonus's
// TestCaseState does against a cluster).
func (c *cyLab) apply(t *testing.T, st *cyState, a *generator.Action) error {
	var err error
	switch {
	case a.CreatePolicy != nil:
		p := a.CreatePolicy.Policy
		if _, err = c.l.c.NetworkingV1().NetworkPolicies(p.Namespace).Create(c.ctx, p.DeepCopy(), metav1.CreateOptions{}); err == nil {
			st.policies = append(st.policies, p)
		}
	case a.UpdatePolicy != nil:
		p := a.UpdatePolicy.Policy
		i := policyIndex(st.policies, p.Namespace, p.Name)
		if i < 0 {
			return fmt.Errorf("updating policy %s/%s: not created", p.Namespace, p.Name)
		}
		nps := c.l.c.NetworkingV1().NetworkPolicies(p.Namespace)
		var cur *networkingv1.NetworkPolicy
		if cur, err = nps.Get(c.ctx, p.Name, metav1.GetOptions{}); err == nil {
			cur.Labels, cur.Spec = p.Labels, *p.Spec.DeepCopy()
			if _, err = nps.Update(c.ctx, cur, metav1.UpdateOptions{}); err == nil {
				st.policies[i] = p
			}
		}
	case a.DeletePolicy != nil:
		ns, name := a.DeletePolicy.Namespace, a.DeletePolicy.Name
		i := policyIndex(st.policies, ns, name)
		if i < 0 {
			return fmt.Errorf("deleting policy %s/%s: not created", ns, name)
		}
		if err = c.l.c.NetworkingV1().NetworkPolicies(ns).Delete(c.ctx, name, metav1.DeleteOptions{}); err == nil {
			st.policies = slices.Delete(st.policies, i, i+1)
		}
	case a.CreateNamespace != nil:
		ns := a.CreateNamespace.Namespace
		var labels map[string]string
		if labels, err = c.createNamespace(ns, a.CreateNamespace.Labels); err == nil {
			c.extraNS[ns] = true
			st.r, err = st.r.CreateNamespace(ns, labels)
		}
	case a.SetNamespaceLabels != nil:
		ns := a.SetNamespaceLabels.Namespace
		var labels map[string]string
		if labels, err = c.nsLabels(ns, a.SetNamespaceLabels.Labels); err == nil {
			st.r, err = st.r.UpdateNamespaceLabels(ns, labels)
		}
	case a.DeleteNamespace != nil:
		ns := a.DeleteNamespace.Namespace
		if err = c.l.c.CoreV1().Namespaces().Delete(c.ctx, ns, metav1.DeleteOptions{}); err == nil {
			delete(c.extraNS, ns)
			for key := range c.pods {
				if strings.HasPrefix(key, ns+"/") {
					delete(c.pods, key) // the namespace's deletion takes the rest
				}
			}
			st.r, err = st.r.DeleteNamespace(ns)
		}
	case a.CreatePod != nil:
		ns, name := a.CreatePod.Namespace, a.CreatePod.Pod
		if st.r, err = st.r.CreatePod(ns, name, a.CreatePod.Labels); err == nil {
			err = c.createPod(t, ns, name, a.CreatePod.Labels)
		}
	case a.SetPodLabels != nil:
		ns, name := a.SetPodLabels.Namespace, a.SetPodLabels.Pod
		if err = c.podLabels(ns, name, a.SetPodLabels.Labels); err == nil {
			st.r, err = st.r.SetPodLabels(ns, name, a.SetPodLabels.Labels)
		}
	case a.DeletePod != nil:
		ns, name := a.DeletePod.Namespace, a.DeletePod.Pod
		if st.r, err = st.r.DeletePod(ns, name); err == nil {
			err = c.deletePod(ns, name)
		}
	default:
		return fmt.Errorf("action %+v: not supported here", a)
	}
	if err != nil {
		return err
	}
	c.fill(st.r)
	return nil
}

// cyProbe makes one probe from inside the namespace at nsPath: a TCP
// connect, or a UDP "hostname" that must be answered. A timeout is
// blocked; any other error is a failed check (a deny must drop, not
// reject), reported with its error.
func cyProbe(nsPath string, proto corev1.Protocol, addr string) (probe.Connectivity, error) {
	err := netns.Do(nsPath, func() error {
		switch proto {
		case corev1.ProtocolTCP:
			conn, err := net.DialTimeout("tcp", addr, cyProbeTimeout)
			if err == nil {
				conn.Close()
			}
			return err
		case corev1.ProtocolUDP:
			conn, err := net.Dial("udp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(cyProbeTimeout))
			if _, err := conn.Write([]byte("hostname")); err != nil {
				return err
			}
			buf := make([]byte, 512)
			n, err := conn.Read(buf)
			if err == nil && n == 0 {
				err = errors.New("empty UDP answer")
			}
			return err
		}
		return fmt.Errorf("protocol %s not probed here", proto)
	})
	switch {
	case err == nil:
		return probe.ConnectivityAllowed, nil
	case isTimeout(err):
		return probe.ConnectivityBlocked, nil
	}
	return probe.ConnectivityCheckFailed, err
}

// probeTables probes every job of each mode (in parallel, at most
// cyParallel in flight) and returns a table per mode, with the errors of
// failed checks by mode and job key.
func (c *cyLab) probeTables(r *probe.Resources, modes []generator.ProbeMode) (map[generator.ProbeMode]*probe.Table, map[string]error) {
	jb := &probe.JobBuilder{TimeoutSeconds: int(cyProbeTimeout / time.Second)}
	type work struct {
		mode generator.ProbeMode
		jr   *probe.JobResult
		err  error
	}
	var all []*work
	for _, mode := range modes {
		for _, job := range jb.GetJobsForProbeConfig(r, generator.NewAllAvailable(mode)).Valid {
			all = append(all, &work{mode: mode, jr: &probe.JobResult{Job: job}})
		}
	}
	sem := make(chan struct{}, cyParallel)
	var wg sync.WaitGroup
	for _, w := range all {
		from := c.pods[w.jr.Job.FromKey]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if from == nil {
				w.jr.Combined, w.err = probe.ConnectivityCheckFailed, fmt.Errorf("no client pod %s", w.jr.Job.FromKey)
				return
			}
			w.jr.Combined, w.err = cyProbe(from.netns, w.jr.Job.Protocol, w.jr.Job.ToAddress())
		}()
	}
	wg.Wait()
	tables, errs := map[generator.ProbeMode]*probe.Table{}, map[string]error{}
	for _, mode := range modes {
		var results []*probe.JobResult
		for _, w := range all {
			if w.mode == mode {
				results = append(results, w.jr)
				if w.err != nil {
					errs[string(mode)+" "+w.jr.Job.Key()] = w.err
				}
			}
		}
		tables[mode] = probe.NewTableFromJobResults(r, results)
	}
	return tables, errs
}

// cyDiff lists the cells where the lab's table differs from the oracle's
// (as cyclonus's ComparisonTable does, by job key), loopback cells apart
// (counted in loop by "lab X, oracle Y").
func cyDiff(lab, oracle *probe.Table, mode generator.ProbeMode, errs map[string]error, ignoreLoopback bool) (diffs []string, loop map[string]int) {
	loop = map[string]int{}
	for _, k := range lab.Wrapped.Keys() {
		want := oracle.Get(k.From, k.To).JobResults
		for key, got := range lab.Get(k.From, k.To).JobResults {
			w := probe.ConnectivityUnknown
			if want[key] != nil {
				w = want[key].Combined
			}
			if w == got.Combined {
				continue
			}
			if k.From == k.To {
				loop[fmt.Sprintf("%s: lab %s, oracle %s", mode, got.Combined, w)]++
				if ignoreLoopback && mode == generator.ProbeModePodIP {
					continue
				}
			}
			line := fmt.Sprintf("%s -> %s %s: lab %s, oracle %s", k.From, k.To, got.Job.ToAddress(), got.Combined, w)
			if err := errs[string(mode)+" "+got.Job.Key()]; err != nil {
				line += " (" + err.Error() + ")"
			}
			diffs = append(diffs, line)
		}
	}
	sort.Strings(diffs)
	return diffs, loop
}

// cyStepOutcome is one step's result in one mode.
type cyStepOutcome struct {
	passed bool
	tries  int
	diffs  []string
	loop   map[string]int
}

// runStep probes st's table in every mode until it matches the oracle or
// the retries are spent.
func (c *cyLab) runStep(st *cyState, settle time.Duration, retries int, ignoreLoopback bool) map[generator.ProbeMode]*cyStepOutcome {
	policy := matcher.BuildNetworkPolicies(true, st.policies)
	jb := &probe.JobBuilder{TimeoutSeconds: int(cyProbeTimeout / time.Second)}
	out := map[generator.ProbeMode]*cyStepOutcome{}
	pending := slices.Clone(cyModes)
	time.Sleep(settle)
	for try := 0; try <= retries && len(pending) > 0; try++ {
		if try > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		tables, errs := c.probeTables(st.r, pending)
		var still []generator.ProbeMode
		for _, mode := range pending {
			oracle := probe.NewSimulatedRunner(policy, jb).RunProbeForConfig(generator.NewAllAvailable(mode), st.r)
			diffs, loop := cyDiff(tables[mode], oracle, mode, errs, ignoreLoopback)
			out[mode] = &cyStepOutcome{passed: len(diffs) == 0, tries: try + 1, diffs: diffs, loop: loop}
			if len(diffs) > 0 {
				still = append(still, mode)
			}
		}
		pending = still
	}
	return out
}

// cySelect parses FLATNET_CYCLONUS_CASES ("1-56,91") into case numbers;
// with none set, -short runs every seventh case and the multi-step ones.
func cySelect(t *testing.T, cases []*generator.TestCase) []int {
	t.Helper()
	spec := os.Getenv("FLATNET_CYCLONUS_CASES")
	var nums []int
	if spec == "" {
		for i, tc := range cases {
			if !testing.Short() || (i+1)%7 == 0 || len(tc.Steps) > 1 {
				nums = append(nums, i+1)
			}
		}
		return nums
	}
	for _, part := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 1 || b > len(cases) || a > b {
			t.Fatalf("FLATNET_CYCLONUS_CASES=%q: %q is not a case number or range within 1-%d", spec, part, len(cases))
		}
		for n := a; n <= b; n++ {
			if !slices.Contains(nums, n) {
				nums = append(nums, n)
			}
		}
	}
	sort.Ints(nums)
	return nums
}

func cyPolicies(ps []*networkingv1.NetworkPolicy) string {
	var b strings.Builder
	for _, p := range ps {
		spec, _ := json.Marshal(p.Spec)
		fmt.Fprintf(&b, "  %s/%s: %s\n", p.Namespace, p.Name, spec)
	}
	return b.String()
}

// TestCyclonus: see the top of this file.
func TestCyclonus(t *testing.T) {
	ignoreLoopback := os.Getenv("FLATNET_CYCLONUS_LOOPBACK") != "1"
	l := startLab(t, 2)
	c := &cyLab{l: l, ctx: context.Background(), pods: map[string]*cyPod{}, extraNS: map[string]bool{}}
	t0 := time.Now()
	base, err := c.setup(t)
	if err != nil {
		t.Fatal(err)
	}
	c.base = base
	t.Logf("cyclonus topology: 3 namespaces × 3 pods over %d nodes, TCP and UDP on 80 and 81 (no SCTP: the kernel has none), ready in %s",
		len(l.spec.Nodes), time.Since(t0).Round(time.Millisecond))

	// The open cluster first: every cell allowed, to both destinations
	// (ClusterIPs may take a moment to be programmed).
	open := c.runStep(&cyState{r: base}, 0, 30, ignoreLoopback)
	for _, mode := range cyModes {
		if o := open[mode]; !o.passed {
			t.Fatalf("with no policy, %s probes differ from the oracle after %d tries:\n%s", mode, o.tries, strings.Join(o.diffs, "\n"))
		}
	}

	zc, err := base.GetPod("z", "c")
	if err != nil {
		t.Fatal(err)
	}
	cases := generator.NewTestCaseGenerator(true, zc.IP, cyNamespaces, nil, cyExcluded).GenerateTestCases()
	nums := cySelect(t, cases)
	t.Logf("cyclonus v0.5.6: %d generated cases, running %d; probes to pod IP and ClusterIP, pod-IP loopback ignored: %v", len(cases), len(nums), ignoreLoopback)

	passed := map[generator.ProbeMode]int{}
	var failures []string
	loopDiffs := map[string]int{}
	tRun := time.Now()
	for _, n := range nums {
		tc := cases[n-1]
		ok := true
		caseOK := map[generator.ProbeMode]bool{}
		t.Run(fmt.Sprintf("%03d", n), func(t *testing.T) {
			tcase := time.Now()
			if err := c.reset(); err != nil {
				t.Fatalf("resetting the cluster: %v", err)
			}
			st := &cyState{r: c.base}
			for _, mode := range cyModes {
				caseOK[mode] = true
			}
			for si, step := range tc.Steps {
				for _, a := range step.Actions {
					if err := c.apply(t, st, a); err != nil {
						t.Fatalf("%q step %d: %v", tc.Description, si+1, err)
					}
				}
				res := c.runStep(st, cySettle, cyRetries, ignoreLoopback)
				for _, mode := range cyModes {
					o := res[mode]
					for k, v := range o.loop {
						loopDiffs[k] += v
					}
					if !o.passed {
						caseOK[mode] = false
						t.Errorf("%q step %d, %s: %d cells differ from cyclonus's oracle after %d tries:\n%s\npolicies:\n%s",
							tc.Description, si+1, mode, len(o.diffs), o.tries, strings.Join(o.diffs[:min(len(o.diffs), 40)], "\n"), cyPolicies(st.policies))
					}
				}
			}
			t.Logf("case %d %q (%s): pod-ip %v, service-ip %v, %d step(s) in %s", n, tc.Description, strings.Join(slices.Sorted(maps.Keys(tc.Tags)), ","),
				caseOK[generator.ProbeModePodIP], caseOK[generator.ProbeModeServiceIP], len(tc.Steps), time.Since(tcase).Round(time.Millisecond))
		})
		for _, mode := range cyModes {
			if caseOK[mode] {
				passed[mode]++
			} else {
				ok = false
			}
		}
		if !ok {
			failures = append(failures, fmt.Sprintf("%d %q", n, tc.Description))
		}
	}
	t.Logf("cyclonus: pod IP %d/%d, ClusterIP %d/%d cases passed in %s (loopback cells that differed, pod-IP ones ignored: %v: %v); failed: %v",
		passed[generator.ProbeModePodIP], len(nums), passed[generator.ProbeModeServiceIP], len(nums), time.Since(tRun).Round(time.Second),
		ignoreLoopback, loopDiffs, failures)
}
