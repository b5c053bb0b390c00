// Package e2e runs flatnet's lab end to end: a real kube-apiserver and
// etcd, three nodes as network namespaces with their agents, pods as
// processes, and traffic between them. It needs root, the upstream
// binaries (`make k8s`) and builds bin/flatnet and bin/flatnet-cni from
// this tree. One lab with a unique name serves every subtest; it is torn
// down (and checked to leave nothing) at the end, or by cleanup on failure.
package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// requireLab skips (or fails in CI) when the lab cannot run here, and
// returns the directory with freshly built flatnet and flatnet-cni.
func requireLab(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := controlplane.BinDir(); err != nil {
		testutil.Skip(t, "the lab tests need the upstream binaries (make k8s): %v", err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatalf("nsenter (util-linux) is missing: %v", err)
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "flatnet-e2e-bin-")
		if buildErr != nil {
			return
		}
		// flatnet-pause goes into the image real nodes import, and
		// flatnet-cni starts faster: both static, as make build makes
		// them.
		for _, c := range []struct{ out, pkg string }{{"flatnet", "./cmd/flatnet"}, {"flatnet-cni", "./cmd/flatnet-cni"}, {"flatnet-pause", "./cmd/flatnet-pause"}} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, c.out), c.pkg)
			cmd.Dir = repoRoot()
			if c.out != "flatnet" {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("building %s: %v\n%s", c.pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// testLab is one running lab.
type testLab struct {
	name    string
	root    string // --state-dir
	flatnet string
	spec    *lab.Spec
	c       kubernetes.Interface
	down    bool
	failed  func() bool // the owning test's t.Failed
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// cli runs `flatnet lab --state-dir R --name N args...`.
func (l *testLab) cli(args ...string) (string, error) {
	argv := append([]string{"lab", "--state-dir", l.root, "--name", l.name}, args...)
	out, err := exec.Command(l.flatnet, argv...).CombinedOutput()
	return string(out), err
}

func (l *testLab) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := l.cli(args...)
	if err != nil {
		t.Fatalf("flatnet lab %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// newLab names a lab (unique per run) and registers its removal.
func newLab(t *testing.T) *testLab {
	t.Helper()
	bin := requireLab(t)
	// A short state root: a real node's containerd socket is under it,
	// and a unix socket path has at most 107 bytes (t.TempDir's names
	// grow with the subtest's).
	root, err := os.MkdirTemp("", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	l := &testLab{name: "e2e" + randHex(3), root: root, flatnet: filepath.Join(bin, "flatnet"), failed: t.Failed}
	t.Cleanup(func() {
		if t.Failed() && !l.down {
			l.keepLogs(t)
		}
		if !l.down {
			if out, err := l.cli("down"); err != nil {
				t.Errorf("cleanup: lab down: %v\n%s", err, out)
			}
		}
		checkNoProcessLeft(t, l.root)
	})
	return l
}

// keepLogs copies a failed test's lab logs (every daemon's and agent's)
// out of the state root, which the cleanup removes, to
// $FLATNET_E2E_LOGS (default: the temp dir)/flatnet-e2e-<lab>-logs, and
// says where: a failure that shows once in many runs needs them.
func (l *testLab) keepLogs(t *testing.T) {
	if l.spec == nil {
		return
	}
	base := os.Getenv("FLATNET_E2E_LOGS")
	if base == "" {
		base = os.TempDir()
	}
	dst := filepath.Join(base, "flatnet-e2e-"+l.name+"-logs")
	if err := os.CopyFS(dst, os.DirFS(l.spec.LogDir())); err != nil {
		t.Logf("keeping the lab's logs: %v (what was copied is in %s)", err, dst)
		return
	}
	t.Logf("the lab's logs are kept in %s", dst)
}

// takeDown runs lab down as a test's own step, keeping the logs first
// when the lab's test has failed so far: its cleanup would find them
// gone.
func (l *testLab) takeDown(t *testing.T) string {
	t.Helper()
	if l.failed() {
		l.keepLogs(t)
	}
	out := l.mustCLI(t, "down")
	l.down = true
	return out
}

// labProcesses lists the processes (but this one) that a lab under root
// started and that still run: those carrying the lab's mark
// (proc.OwnerEnv), and, independent of that mark, those whose stdin,
// stdout, stderr or working directory is under root (a daemon's or a
// container's log, deleted or not).
func labProcesses(root string) map[int]string {
	out := map[int]string{}
	for _, pid := range proc.Scan(func(int) bool { return true }) {
		why := ""
		if proc.OwnedBy(pid, root) {
			why = proc.OwnerEnv
		}
		fds, _ := proc.FDs(pid)
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		for what, path := range map[string]string{"fd 0": fds[0], "fd 1": fds[1], "fd 2": fds[2], "cwd": cwd} {
			if strings.HasPrefix(path, root+"/") {
				why += " " + what + " " + path
			}
		}
		if why != "" {
			net, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
			out[pid] = fmt.Sprintf("%d %s (%s; netns %s)", pid, strings.TrimSpace(cmdlineOf(pid)), strings.TrimSpace(why), net)
		}
	}
	return out
}

// checkNoProcessLeft fails the test if a process the lab under root
// started outlived `lab down`, and kills it (by PID, SIGKILL).
func checkNoProcessLeft(t *testing.T, root string) {
	t.Helper()
	left := labProcesses(root)
	if len(left) == 0 {
		return
	}
	var list []string
	for pid, desc := range left {
		list = append(list, desc)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	sort.Strings(list)
	t.Errorf("processes started by the lab outlived lab down (killed now):\n%s", strings.Join(list, "\n"))
}

// up brings the lab up and returns how long that took.
func (l *testLab) up(t *testing.T, nodes int, extra ...string) time.Duration {
	t.Helper()
	args := []string{"up", "--nodes", strconv.Itoa(nodes)}
	if rt := e2eRuntime(t); rt != lab.RuntimeProcess {
		args = append(args, "--runtime", rt)
	}
	t0 := time.Now()
	out := l.mustCLI(t, append(args, extra...)...)
	took := time.Since(t0)
	t.Logf("lab up %s (%d nodes, runtime %s) took %s:\n%s", l.name, nodes, e2eRuntime(t), took.Round(time.Millisecond), out)
	var err error
	if l.spec, err = lab.LoadSpec(l.root, l.name); err != nil {
		t.Fatal(err)
	}
	if l.c, _, err = lab.Client(l.spec.Kubeconfig()); err != nil {
		t.Fatal(err)
	}
	return took
}

func startLab(t *testing.T, nodes int, extra ...string) *testLab {
	t.Helper()
	l := newLab(t)
	l.up(t, nodes, extra...)
	return l
}

// ---- pods

func netexecPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "netexec"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr(int64(5)),
			Containers: []corev1.Container{{
				Name: "netexec", Image: podImage,
				Command: []string{"flatnet", "netexec", "--http-port=8080", "--udp-port=8081"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func sleepPod(name, node, marker string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr(int64(2)),
			Containers:                    []corev1.Container{{Name: "sleep", Image: podImage, Command: []string{"sleep", marker}}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

func (l *testLab) create(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := l.c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", p.Name, err)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func running(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" }

// wait polls pod ns/name until cond holds.
func (l *testLab) wait(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		p, err := l.c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = p
			if cond(p) {
				return p
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	st := "not found"
	if last != nil {
		b, _ := json.MarshalIndent(last.Status, "", "  ")
		st = string(b)
	}
	t.Fatalf("pod %s/%s not %s after %s; status: %s", ns, name, what, timeout, st)
	return nil
}

func (l *testLab) waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return l.wait(t, "default", name, 60*time.Second, "running", running)
}

func (l *testLab) waitReady(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return l.wait(t, "default", name, 60*time.Second, "ready", func(p *corev1.Pod) bool { return running(p) && podReady(p) })
}

// deleteAndWait deletes pods and waits until the API no longer has them
// (the runtime deletes a pod once its processes and network are gone).
func (l *testLab) deleteAndWait(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := l.c.CoreV1().Pods("default").Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting %s: %v", n, err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, n := range names {
		for {
			_, err := l.c.CoreV1().Pods("default").Get(context.Background(), n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s still exists 90s after deletion (err %v)", n, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The runtime removes a pod's directory (stops its sandbox) after its
	// network is torn down and the Pod is gone from the API: wait for that
	// too, so that the next check does not see this pod's teardown still
	// in flight.
	for _, n := range names {
		for {
			var left []string
			for _, node := range l.spec.Nodes {
				if !podGone(t, l.spec, node, n) {
					left = append(left, node.Name)
				}
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s deleted, but the runtime of %v still has it 90s later", n, left)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// ---- traffic

// httpGet makes one HTTP GET from inside the namespace at nsPath. The
// connection is dialled inside netns.Do (net/http would dial on another
// goroutine, in the wrong namespace) and the request written on it.
func httpGet(nsPath, addr, path string) (string, error) {
	var conn net.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		return "", err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = bufio.NewReader(resp.Body).WriteTo(&b)
	if resp.StatusCode != 200 {
		return b.String(), fmt.Errorf("GET %s%s: %s: %s", addr, path, resp.Status, b.String())
	}
	return b.String(), err
}

// dial asks the netexec pod at fromIP (reached from node netns nodeNS) to
// make request to host:port over HTTP, and returns its one answer.
func dial(nodeNS, fromIP, host string, port int, request string) (string, error) {
	path := fmt.Sprintf("/dial?request=%s&protocol=http&host=%s&port=%d&tries=1", request, host, port)
	body, err := httpGet(nodeNS, net.JoinHostPort(fromIP, "8080"), path)
	if err != nil {
		return "", err
	}
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return "", fmt.Errorf("decoding /dial answer %q: %w", body, err)
	}
	if len(r.Responses) != 1 {
		return "", fmt.Errorf("/dial from %s to %s:%d: responses %q, errors %q", fromIP, host, port, r.Responses, r.Errors)
	}
	return r.Responses[0], nil
}

func hostOf(ipPort string) string {
	h, _, err := net.SplitHostPort(strings.TrimSpace(ipPort))
	if err != nil {
		return strings.TrimSpace(ipPort)
	}
	return h
}

// retry runs fn until it succeeds or timeout passes (a route or ARP entry
// may take a moment after a pod turns Ready on another node).
func retry(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- the test

func TestLab(t *testing.T) {
	l := newLab(t)
	before := snapshotHost(t, l.name, l.root)
	upTime := l.up(t, 3, "--node-cidr-mask-size", "27", "--external")
	t.Logf("lab up for 3 nodes: %s", upTime)
	s := l.spec

	t.Run("UpAgainChangesNothing", func(t *testing.T) {
		k0 := kernelDump(t, s)
		p0 := pidFiles(t, s)
		out := l.mustCLI(t, "up")
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "[") && !strings.Contains(line, ": present") && !strings.Contains(line, " ready ") {
				t.Errorf("second up did something: %s", line)
			}
		}
		if k1 := kernelDump(t, s); k1 != k0 {
			t.Errorf("second up changed the kernel:\nbefore:\n%s\nafter:\n%s", k0, k1)
		}
		if p1 := pidFiles(t, s); p1 != p0 {
			t.Errorf("second up changed the processes:\nbefore:\n%s\nafter:\n%s", p0, p1)
		}
	})

	// Kernel drift is listed by status and repaired by up; a lab.json
	// and pid files cut short are reported by path and rebuilt from what
	// runs, and no daemon is started twice.
	t.Run("UpRepairsDriftAndCutShortState", func(t *testing.T) {
		n2 := s.Nodes[1]
		testutil.RunIn(t, lab.NetnsPath(n2.Netns), "ip", "route", "del", s.ServiceCIDR.String())
		drift := fmt.Sprintf("node %s: route %s dev eth0 in netns %s", n2.Name, s.ServiceCIDR, n2.Netns)
		if out := l.mustCLI(t, "status"); !strings.Contains(out, drift) || !strings.Contains(out, n2.Netns+" (MISSING)") {
			t.Errorf("status does not show the drift %q:\n%s", drift, out)
		}
		repaired := false
		out := l.mustCLI(t, "up")
		for _, line := range strings.Split(out, "\n") {
			repaired = repaired || strings.Contains(line, n2.Name+": netns "+n2.Netns) && strings.Contains(line, "... done")
		}
		if !repaired {
			t.Errorf("up did not repair node 2:\n%s", out)
		}
		if out := l.mustCLI(t, "status"); strings.Contains(out, "missing in the kernel") {
			t.Errorf("drift left after up:\n%s", out)
		}

		p0 := pidFiles(t, s)
		record, err := os.ReadFile(s.SpecFile())
		if err != nil {
			t.Fatal(err)
		}
		agentPID := proc.PIDFile(s.StateDir, lab.AgentProc(s.Nodes[0].Name))
		ctlPID := proc.PIDFile(s.StateDir, lab.ProcController)
		ctl, _ := os.ReadFile(ctlPID)
		for path, content := range map[string][]byte{s.SpecFile(): record[:len(record)/2], agentPID: nil, ctlPID: ctl[:len(ctl)/3]} {
			if err := os.WriteFile(path, content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out = l.mustCLI(t, "up")
		for _, want := range []string{"unusable lab record " + s.SpecFile(), "pid file " + agentPID, "pid file " + ctlPID} {
			if !strings.Contains(out, want) {
				t.Errorf("up does not report %q:\n%s", want, out)
			}
		}
		if got, _ := os.ReadFile(s.SpecFile()); string(got) != string(record) {
			t.Errorf("lab.json rebuilt as:\n%s\nwant:\n%s", got, record)
		}
		if p1 := pidFiles(t, s); p1 != p0 {
			t.Errorf("up started daemons again instead of adopting them:\nbefore:\n%s\nafter:\n%s", p0, p1)
		}
	})

	t.Run("NodesReadyWithSubnets", func(t *testing.T) {
		nodes, err := l.c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 3 {
			t.Fatalf("%d nodes", len(nodes.Items))
		}
		seen := map[string]bool{}
		for _, n := range nodes.Items {
			want, ok := s.Node(n.Name)
			if !ok {
				t.Fatalf("unknown node %s", n.Name)
			}
			var ip string
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					ip = a.Address
				}
			}
			cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if ip != want.IP.String() || err != nil || cidr.Bits() != 27 || !s.ClusterCIDR.Contains(cidr.Addr()) || seen[n.Spec.PodCIDR] {
				t.Errorf("node %s: InternalIP %s (want %s), podCIDR %q", n.Name, ip, want.IP, n.Spec.PodCIDR)
			}
			seen[n.Spec.PodCIDR] = true
		}
		out := l.mustCLI(t, "status")
		for _, n := range s.Nodes {
			if !strings.Contains(out, n.Name) || !strings.Contains(out, n.IP.String()) {
				t.Errorf("status lacks %s:\n%s", n.Name, out)
			}
		}
		kc := strings.TrimSpace(l.mustCLI(t, "kubeconfig"))
		if kc != s.Kubeconfig() {
			t.Errorf("kubeconfig %q, want %q", kc, s.Kubeconfig())
		}
		if out := l.mustCLI(t, "kubectl", "--", "get", "nodes", "-o", "name"); strings.Count(out, "node/") != 3 {
			t.Errorf("lab kubectl get nodes:\n%s", out)
		}
	})

	// One netexec pod per node.
	type podInfo struct {
		name, ip string
		node     lab.Node
	}
	var pods []podInfo
	for _, n := range s.Nodes {
		l.create(t, netexecPod("netexec-"+strconv.Itoa(n.Index), n.Name))
	}
	for _, n := range s.Nodes {
		p := l.waitReady(t, "netexec-"+strconv.Itoa(n.Index))
		kn, err := l.c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cidr := netip.MustParsePrefix(kn.Spec.PodCIDR); !cidr.Contains(netip.MustParseAddr(p.Status.PodIP)) {
			t.Fatalf("pod %s IP %s is outside its node's pod CIDR %s", p.Name, p.Status.PodIP, cidr)
		}
		pods = append(pods, podInfo{p.Name, p.Status.PodIP, n})
	}
	statusOut := l.mustCLI(t, "status")
	for _, p := range pods {
		if !strings.Contains(statusOut, p.name) || !strings.Contains(statusOut, p.ip) {
			t.Errorf("status lacks pod %s %s:\n%s", p.name, p.ip, statusOut)
		}
	}

	t.Run("PodToPodAcrossNodes", func(t *testing.T) {
		for _, a := range pods {
			for _, b := range pods {
				if a.name == b.name {
					continue
				}
				var got string
				err := retry(30*time.Second, func() error {
					var err error
					got, err = dial(lab.NetnsPath(a.node.Netns), a.ip, b.ip, 8080, "hostname")
					return err
				})
				if err != nil || got != b.name {
					t.Errorf("%s -> %s (%s): %q, %v", a.name, b.name, b.ip, got, err)
				}
			}
		}
	})

	t.Run("SourceIPPreserved", func(t *testing.T) {
		for _, a := range pods {
			for _, b := range pods {
				if a.name == b.name {
					continue
				}
				got, err := dial(lab.NetnsPath(a.node.Netns), a.ip, b.ip, 8080, "clientip")
				if err != nil || hostOf(got) != a.ip {
					t.Errorf("%s -> %s: clientip %q (%v), want the client pod's IP %s", a.name, b.name, got, err, a.ip)
				}
			}
		}
	})

	var labPods []labPod
	for _, p := range pods {
		labPods = append(labPods, labPod{p.name, p.ip, p.node})
	}

	t.Run("EgressFromNodeAddress", func(t *testing.T) { checkEgress(t, s, labPods) })

	t.Run("Services", func(t *testing.T) { checkServices(t, l, labPods, "nftables") })

	// The same Service checks with the agents in the other proxy modes;
	// back to auto (nftables here) after them, with nothing of the other
	// modes left.
	t.Run("ServicesInIPTablesMode", func(t *testing.T) { checkProxyMode(t, l, labPods, "iptables") })
	t.Run("ServicesInUserspaceMode", func(t *testing.T) { checkProxyMode(t, l, labPods, "userspace") })
	t.Run("ProxyModeBackToAuto", func(t *testing.T) { switchProxyMode(t, l, "auto", "nftables") })

	t.Run("ProxyFailure", func(t *testing.T) { checkProxyFailure(t, l, labPods, "nftables") })

	t.Run("External", func(t *testing.T) { checkExternal(t, l) })

	t.Run("Gateway", func(t *testing.T) { checkGateway(t, l) })

	t.Run("DNS", func(t *testing.T) { checkDNS(t, l, labPods) })

	t.Run("FullSizePacket", func(t *testing.T) {
		// host-gw adds no header: pods get the underlay's MTU, and a
		// packet of that size with DF set crosses to another node.
		for _, n := range s.Nodes {
			if got := conflistMTU(t, s, n); got != 1500 {
				t.Errorf("node %s: conflist mtu %d, want the underlay's 1500", n.Name, got)
			}
		}
		if got := l.podMTU(t, pods[0].name); got != 1500 {
			t.Errorf("pod eth0 MTU %d, want 1500", got)
		}
		to := netip.AddrPortFrom(netip.MustParseAddr(pods[1].ip), 8081)
		if got := l.dfProbe(t, pods[0].name, to, 1500); got.Result != netexec.ProbeDelivered {
			t.Errorf("1500 bytes with DF to a pod on another node: %+v", got)
		}
		if got := l.dfProbe(t, pods[0].name, to, 1501); got.Result != netexec.ProbeLocalTooBig || got.MTU != 1500 {
			t.Errorf("1501 bytes with DF: %+v; want refused by the pod's eth0 (1500)", got)
		}
	})

	t.Run("NodeToPod", func(t *testing.T) {
		for _, n := range s.Nodes {
			for _, p := range pods {
				got, err := httpGet(lab.NetnsPath(n.Netns), net.JoinHostPort(p.ip, "8080"), "/clientip")
				if err != nil {
					t.Errorf("node %s -> pod %s: %v", n.Name, p.name, err)
					continue
				}
				src := netip.MustParseAddr(hostOf(got))
				if p.node.Name != n.Name && src != n.IP {
					t.Errorf("node %s -> pod %s on %s: the pod saw %s, want the node's InternalIP %s", n.Name, p.name, p.node.Name, src, n.IP)
				}
			}
		}
	})

	// The apiserver (root namespace) reaches every pod over the lab's
	// routes to the pod CIDRs: pods/proxy, as the upstream DNS specs use.
	t.Run("APIServerProxiesToPods", func(t *testing.T) {
		for _, p := range pods {
			b, err := l.c.CoreV1().Pods("default").ProxyGet("http", p.name, "8080", "/hostname", nil).DoRaw(context.Background())
			if err != nil || string(b) != p.name {
				t.Errorf("pods/proxy to %s on %s: %q, %v", p.name, p.node.Name, b, err)
			}
		}
	})

	t.Run("TwoContainersOverLocalhost", func(t *testing.T) {
		p := netexecPod("duo", s.Nodes[0].Name)
		p.Spec.Containers[0].Name = "a"
		p.Spec.Containers[0].Command = []string{"flatnet", "netexec", "--http-port=8080", "--udp-port=-1"}
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name: "b", Image: podImage, Command: []string{"flatnet", "netexec", "--http-port=8090", "--udp-port=-1"},
		})
		l.create(t, p)
		ip := l.waitReady(t, "duo").Status.PodIP
		var got string
		err := retry(30*time.Second, func() error {
			var err error
			got, err = dial(lab.NetnsPath(s.Nodes[0].Netns), ip, "127.0.0.1", 8090, "clientip")
			return err
		})
		if err != nil || hostOf(got) != "127.0.0.1" {
			t.Errorf("container a -> container b over 127.0.0.1:8090: %q, %v", got, err)
		}
		// lab exec into the second container: its hostname is the pod's.
		out, err := l.cli("exec", "duo", "-c", "b", "--", "hostname")
		if err != nil || strings.TrimSpace(out) != "duo" {
			t.Errorf("lab exec duo -c b -- hostname: %q, %v", out, err)
		}
		l.deleteAndWait(t, "duo")
	})

	t.Run("ExecPassesExitCode", func(t *testing.T) {
		out, err := l.cli("exec", "-n", "default", pods[1].name, "--", "sh", "-c", "echo in-pod; exit 7")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(out, "in-pod") {
			t.Errorf("lab exec ... exit 7: %v, output %q", err, out)
		}
		// Inside the pod's network namespace: eth0 holds the pod IP.
		out, err = l.cli("exec", pods[1].name, "--", "ip", "-4", "-o", "addr", "show", "eth0")
		if err != nil || !strings.Contains(out, pods[1].ip+"/") {
			t.Errorf("lab exec ip addr: %q, %v", out, err)
		}
		if out, err := l.cli("exec", "no-such-pod", "--", "true"); err == nil {
			t.Errorf("exec into a missing pod succeeded: %s", out)
		}
	})

	t.Run("ReadinessProbeGatesReady", func(t *testing.T) {
		dir := t.TempDir()
		flag, runs := filepath.Join(dir, "ready"), filepath.Join(dir, "runs")
		p := netexecPod("probe", s.Nodes[1].Name)
		shareDir(s, p, dir)
		// Each run of the probe leaves a line in runs: the positive signal
		// that it ran and failed, before the check that the pod stayed
		// unready (a fixed sleep could end before the first run).
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo >> " + runs + "; test -e " + flag}}},
			PeriodSeconds: 1,
		}
		l.create(t, p)
		l.waitRunning(t, "probe")
		if err := retry(60*time.Second, func() error {
			b, _ := os.ReadFile(runs)
			if n := strings.Count(string(b), "\n"); n < 3 {
				return fmt.Errorf("the readiness probe ran %d times", n)
			}
			return nil
		}); err != nil {
			t.Fatalf("waiting for 3 failed readiness probes: %v", err)
		}
		if got, err := l.c.CoreV1().Pods("default").Get(context.Background(), "probe", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		} else if podReady(got) {
			t.Fatal("pod Ready while its readiness probe fails (3 runs failed)")
		}
		if err := os.WriteFile(flag, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		l.wait(t, "default", "probe", 60*time.Second, "ready after the probe passes", podReady)
		if err := os.Remove(flag); err != nil {
			t.Fatal(err)
		}
		l.wait(t, "default", "probe", 60*time.Second, "unready after the probe fails again", func(p *corev1.Pod) bool { return !podReady(p) })
		l.deleteAndWait(t, "probe")
	})

	t.Run("DeletedPodIPFreedAndReused", func(t *testing.T) {
		n := s.Nodes[2]
		kn, err := l.c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidr := netip.MustParsePrefix(kn.Spec.PodCIDR)
		// host-local's range in the /27: .2 to .30 (.1 is the gateway).
		capacity := 1<<(32-cidr.Bits()) - 3
		used := ipamIPs(t, s, n)
		free := capacity - len(used)
		if free < 2 {
			t.Fatalf("node %s has %d free pod IPs; the test needs 2", n.Name, free)
		}
		var names []string
		for i := range free {
			name := fmt.Sprintf("fill-%d", i)
			names = append(names, name)
			l.create(t, sleepPod(name, n.Name, "86401"))
		}
		ips := map[string]string{}
		for _, name := range names {
			ips[name] = l.waitRunning(t, name).Status.PodIP
		}
		if got := len(ipamIPs(t, s, n)); got != capacity {
			t.Fatalf("after filling: %d IPs allocated on %s, want all %d", got, n.Name, capacity)
		}
		victim := names[len(names)/2]
		freed := ips[victim]
		l.deleteAndWait(t, victim)
		if ipamIPs(t, s, n)[freed] {
			t.Fatalf("deleted pod %s's IP %s is still allocated", victim, freed)
		}
		l.create(t, sleepPod("reuse", n.Name, "86401"))
		got := l.waitRunning(t, "reuse").Status.PodIP
		if got != freed {
			t.Errorf("new pod got %s, want the freed (and only free) %s", got, freed)
		}
		t.Logf("node %s (%s): filled the last %d of %d pod IPs; deleting %s freed %s; the next pod got %s", n.Name, cidr, free, capacity, victim, freed, got)
		rest := []string{"reuse"}
		for _, name := range names {
			if name != victim {
				rest = append(rest, name)
			}
		}
		l.deleteAndWait(t, rest...)
	})

	t.Run("ThirtyPodsLeaveNothing", func(t *testing.T) {
		const marker = "987654"
		base := nodeSnapshot(t, s)
		var names []string
		for i := range 30 {
			name := fmt.Sprintf("many-%02d", i)
			names = append(names, name)
			l.create(t, sleepPod(name, "", marker)) // the controller binds them
		}
		onNode := map[string]int{}
		for _, name := range names {
			p := l.waitRunning(t, name)
			onNode[p.Spec.NodeName]++
		}
		if len(onNode) != 3 {
			t.Errorf("30 unbound pods went to %v, want all 3 nodes", onNode)
		}
		t.Logf("30 unbound pods bound to %v", onNode)
		// A pod is Running once its container's process started; that
		// process becomes `sleep` when the lab's container init has
		// exec'd it, a moment later on a busy machine.
		if first := countProcs("sleep " + marker); first != 30 {
			t.Logf("%d of 30 pod processes were sleep when the last pod was Running; waiting for the others' exec", first)
		}
		if err := retry(10*time.Second, func() error {
			if got := countProcs("sleep " + marker); got != 30 {
				return fmt.Errorf("%d processes for 30 pods", got)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		l.deleteAndWait(t, names...)
		if got := countProcs("sleep " + marker); got != 0 {
			t.Errorf("%d pod processes left after deleting the pods", got)
		}
		if after := nodeSnapshot(t, s); after != base {
			t.Errorf("30 pods left something behind:\nbefore:\n%s\nafter:\n%s", base, after)
		}
	})

	t.Run("AgentRestartKeepsPods", func(t *testing.T) {
		n, target := s.Nodes[1], pods[1]
		from := pods[0]
		pid0 := containerPID(t, s, n, target.name)
		if err := stopAgent(s, n); err != nil {
			t.Fatal(err)
		}
		// The pod keeps serving while its node's agent is down.
		if got, err := dial(lab.NetnsPath(from.node.Netns), from.ip, target.ip, 8080, "hostname"); err != nil || got != target.name {
			t.Errorf("with the agent stopped: %q, %v", got, err)
		}
		out := l.mustCLI(t, "up")
		if !strings.Contains(out, "agent on "+n.Name+" ("+agentRole(s)+", host-gw) ... done") {
			t.Errorf("up did not restart the agent:\n%s", out)
		}
		// The restarted agent logs each container it adopts: the positive
		// signal that it decided to keep them, before the check that the
		// container was kept (one it cannot adopt is killed, not logged).
		// On real nodes the kubelet runs the containers and the agent
		// adopts none: there the check is that the PID stays the same.
		logFile := proc.LogFile(s.StateDir, lab.AgentProc(n.Name))
		if err := retry(60*time.Second, func() error {
			if s.Containerd() {
				return nil
			}
			b, err := os.ReadFile(logFile)
			if err != nil {
				return err
			}
			run := string(b)
			if i := strings.LastIndex(run, "==== flatnet proc:"); i >= 0 {
				run = run[i:] // this start's lines
			}
			for _, line := range strings.Split(run, "\n") {
				if strings.Contains(line, "Adopted running container") && strings.Contains(line, `pod="default/`+target.name+`"`) {
					return nil
				}
			}
			return fmt.Errorf("no %q for %s in %s since the restart", "Adopted running container", target.name, logFile)
		}); err != nil {
			t.Fatalf("the restarted agent did not adopt %s: %v", target.name, err)
		}
		if pid1 := containerPID(t, s, n, target.name); pid1 != pid0 {
			t.Errorf("the container was restarted (pid %d -> %d); the agent should adopt it", pid0, pid1)
		}
		p := l.waitReady(t, target.name)
		if p.Status.PodIP != target.ip {
			t.Errorf("pod IP changed from %s to %s", target.ip, p.Status.PodIP)
		}
		if got, err := dial(lab.NetnsPath(from.node.Netns), from.ip, target.ip, 8080, "hostname"); err != nil || got != target.name {
			t.Errorf("after the agent restart: %q, %v", got, err)
		}
		// The restarted agent runs new pods.
		l.create(t, netexecPod("after-restart", n.Name))
		ip := l.waitReady(t, "after-restart").Status.PodIP
		if err := retry(30*time.Second, func() error {
			got, err := dial(lab.NetnsPath(from.node.Netns), from.ip, ip, 8080, "hostname")
			if err == nil && got != "after-restart" {
				err = fmt.Errorf("answer %q", got)
			}
			return err
		}); err != nil {
			t.Errorf("new pod after the restart: %v", err)
		}
		l.deleteAndWait(t, "after-restart")
	})

	t.Run("ConflistPassesCheck", func(t *testing.T) {
		n := s.Nodes[0]
		if err := cniCheck(t, s, n, "default", pods[0].name); err != nil {
			t.Errorf("CHECK of a healthy pod: %v", err)
		}
		// CHECK can fail: a pod whose address was removed does not pass.
		l.create(t, netexecPod("broken", n.Name))
		ip := l.waitRunning(t, "broken").Status.PodIP
		nsPath := podNetns(t, s, n, "default", "broken")
		runInNS(t, nsPath, "ip", "addr", "del", ip+"/27", "dev", "eth0")
		if err := cniCheck(t, s, n, "default", "broken"); err == nil {
			t.Error("CHECK passed for a pod whose eth0 lost its address")
		}
		l.deleteAndWait(t, "broken")
	})

	t.Run("DeployManifestsDryRun", func(t *testing.T) {
		dir := filepath.Join(repoRoot(), "deploy")
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("deploy/ is missing: %v", err)
		}
		out, err := l.cli("kubectl", "--", "apply", "--dry-run=server", "-f", dir)
		if err != nil {
			t.Errorf("kubectl apply --dry-run=server -f deploy/: %v\n%s", err, out)
		}
	})

	t.Run("SecondLabSideBySide", func(t *testing.T) {
		l2 := startLab(t, 1)
		if l2.spec.Underlay.Overlaps(s.Underlay) || l2.spec.Bridge == s.Bridge {
			t.Errorf("second lab shares the underlay %s / bridge %s", l2.spec.Underlay, l2.spec.Bridge)
		}
		l2.create(t, netexecPod("other", l2.spec.Nodes[0].Name))
		ip := l2.waitReady(t, "other").Status.PodIP
		// The labs are separate networks: lab 1's nodes cannot reach it.
		if _, err := httpGet(lab.NetnsPath(s.Nodes[0].Netns), net.JoinHostPort(ip, "8080"), "/hostname"); err == nil && !s.ClusterCIDR.Contains(netip.MustParseAddr(ip)) {
			t.Errorf("lab %s reached a pod of lab %s", l.name, l2.name)
		}
		// up --nodes grows a running lab.
		out := l2.mustCLI(t, "up", "--nodes", "2")
		steps := 3 // node 2, its agent, ready
		if !l2.spec.Manifest() {
			steps++ // its flatnet gateway (a DaemonSet's pod with --install manifest)
		}
		if l2.spec.Containerd() {
			steps += 2 // the images for node 2's kubelet, the kubelet
		}
		if strings.Count(out, "... done") != steps {
			t.Errorf("growing to 2 nodes did more (or less) than node 2's steps:\n%s", out)
		}
		if l2.spec, _ = lab.LoadSpec(l2.root, l2.name); len(l2.spec.Nodes) != 2 {
			t.Fatalf("lab.json has %d nodes after growing", len(l2.spec.Nodes))
		}
		l2.create(t, netexecPod("other-2", l2.spec.Nodes[1].Name))
		ip2 := l2.waitReady(t, "other-2").Status.PodIP
		n1 := lab.NetnsPath(l2.spec.Nodes[0].Netns)
		if err := retry(30*time.Second, func() error {
			got, err := dial(n1, ip, ip2, 8080, "hostname")
			if err == nil && got != "other-2" {
				err = fmt.Errorf("answer %q", got)
			}
			return err
		}); err != nil {
			t.Errorf("pod on the added node: %v", err)
		}
		if out, err := l2.cli("up", "--nodes", "1"); err == nil || !strings.Contains(out, "never removes") {
			t.Errorf("up --nodes 1 on a 2-node lab: %v\n%s", err, out)
		}
		l2.takeDown(t)
		// The first lab is untouched.
		if got, err := dial(lab.NetnsPath(pods[0].node.Netns), pods[0].ip, pods[2].ip, 8080, "hostname"); err != nil || got != pods[2].name {
			t.Errorf("first lab after the second went down: %q, %v", got, err)
		}
	})

	t.Run("RefusesHostRange", func(t *testing.T) {
		l3 := &testLab{name: "e2e" + randHex(3), root: l.root, flatnet: l.flatnet, failed: t.Failed}
		host := hostPrefix(t)
		out, err := l3.cli("up", "--nodes", "1", "--underlay-cidr", host.String())
		if err == nil || !strings.Contains(out, "overlaps") {
			t.Errorf("up on the host's own range %s: %v\n%s", host, err, out)
		}
		if _, err := os.Stat(filepath.Join(l.root, l3.name)); err == nil {
			t.Errorf("a refused up left a state dir")
		}
		l3.down = true
	})

	t.Run("SwitchBackendToVXLAN", func(t *testing.T) {
		// Another backend on a running lab: up restarts the agents with
		// it; each removes the host-gw routes and programs VXLAN. Pods
		// made from now on get the overlay's MTU; the old ones keep
		// theirs (and still talk: small packets).
		out := l.mustCLI(t, "up", "--backend", "vxlan")
		if n := strings.Count(out, "("+agentRole(s)+", vxlan; was host-gw) ... done"); n != 3 {
			t.Errorf("up --backend vxlan restarted %d agents, want 3:\n%s", n, out)
		}
		l.waitBackend(t, "vxlan")
		vx := l.netexecPods(t, "vx")
		if got := l.podMTU(t, vx[0].name); got != 1450 {
			t.Errorf("a new pod's MTU under vxlan: %d, want 1450", got)
		}
		checkPodToPod(t, vx)
		checkPaths(t, s, "vxlan", l.podCIDRs(t))
		checkPodToPod(t, []labPod{labPods[0], vx[1], labPods[2]})
		for _, n := range s.Nodes {
			// No host-gw route is left: every route to a pod subnet goes
			// through the VXLAN device.
			for _, r := range nonEmptyLines(testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "-4", "route", "show", "proto", "0x66")) {
				if !strings.Contains(r, "dev flatnet.1") {
					t.Errorf("%s: route left from host-gw: %s", n.Name, r)
				}
			}
		}
		l.deleteAndWait(t, vx[0].name, vx[1].name, vx[2].name)
	})

	t.Run("UpRestartsWhatDied", func(t *testing.T) {
		if err := proc.Stop(s.StateDir, lab.ProcController, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		out := l.mustCLI(t, "up")
		if !strings.Contains(out, "flatnet controller (node IPAM, EndpointSlices) ... done") {
			t.Errorf("up did not restart the controller:\n%s", out)
		}
		if _, ok := proc.Running(s.StateDir, lab.ProcController); !ok {
			t.Error("controller not running after up")
		}
		// The restarted controller binds pods.
		l.create(t, sleepPod("bound-again", "", "86402"))
		l.waitRunning(t, "bound-again")
		l.deleteAndWait(t, "bound-again")
	})

	t.Run("DownLeavesNothing", func(t *testing.T) {
		// An agent that died leaves its pods running: down removes them
		// all the same.
		n3 := s.Nodes[2]
		pid, ok := proc.Running(s.StateDir, lab.AgentProc(n3.Name))
		if !ok {
			t.Fatalf("agent of %s not running", n3.Name)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		orphan := containerPID(t, s, n3, pods[2].name)
		// A controller whose pid file was cut short is found by its
		// command line and stopped too.
		ctl, ok := proc.Running(s.StateDir, lab.ProcController)
		if !ok {
			t.Fatal("controller not running")
		}
		if err := os.WriteFile(proc.PIDFile(s.StateDir, lab.ProcController), []byte("12"), 0o644); err != nil {
			t.Fatal(err)
		}
		// An agent whose pid file was emptied is still stopped before the
		// pods: alive, it would restart a container that down has just
		// stopped (quick, while down waits for stubborn) in the namespace
		// down then deletes, and that process would run on (seen: a
		// netexec with PPID 1 in a deleted namespace).
		n1 := s.Nodes[0]
		restarts := sleepPod("restarts", n1.Name, "86403")
		restarts.Spec.Containers[0].Name = "quick"
		restarts.Spec.Containers = append(restarts.Spec.Containers, corev1.Container{
			Name: "stubborn", Image: podImage, Command: []string{"sh", "-c", "trap '' TERM; sleep 86404 & wait"},
		})
		// A container that left its pod's network namespace (root in a
		// lab container can): no namespace leads to it, its mark does.
		escapes := sleepPod("escapes", n1.Name, "")
		escapes.Spec.Containers[0].Command = []string{"unshare", "--net", "sleep", "86405"}
		if s.Containerd() {
			// runc gives a container no CAP_SYS_ADMIN unless privileged.
			escapes.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
		}
		for _, p := range []*corev1.Pod{restarts, escapes} {
			l.create(t, p)
			l.waitRunning(t, p.Name)
		}
		if err := os.WriteFile(proc.PIDFile(s.StateDir, lab.AgentProc(n1.Name)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		out := l.takeDown(t)
		t.Logf("lab down:\n%s", out)
		checkNoProcessLeft(t, l.root)
		after := snapshotHost(t, l.name, l.root)
		if d := before.diff(after); d != "" {
			t.Errorf("lab down left things behind:\n%s", d)
		}
		if _, err := os.Stat(s.StateDir); err == nil {
			t.Errorf("state dir %s still exists", s.StateDir)
		}
		// Real nodes: no containerd, shim, runc or kubelet, no cgroup of
		// the lab; the sysctls the kubelets set are compared by the
		// snapshot (and the mounts under the state dir).
		if left := realNodeLeftovers(l.name, l.root); len(left) > 0 {
			t.Errorf("real nodes left:\n%s", strings.Join(left, "\n"))
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); err == nil && strings.Contains(cmdlineOf(orphan), "netexec") {
			t.Errorf("pod %s of the killed agent still runs (pid %d)", pods[2].name, orphan)
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(ctl)); err == nil && strings.Contains(cmdlineOf(ctl), s.StateDir) {
			t.Errorf("the controller without a usable pid file still runs (pid %d)", ctl)
		}
		if out, err := l.cli("status"); err == nil {
			t.Errorf("status after down succeeded:\n%s", out)
		}
		// down on a removed lab is fine.
		l.mustCLI(t, "down")
	})
}

// ---- helpers reading the lab's state

// ipamIPs lists the IPs host-local has allocated on node n.
func ipamIPs(t *testing.T, s *lab.Spec, n lab.Node) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	dirs := []string{s.CNIDataDir(n)}
	if s.Containerd() {
		// Without a dataDir in the conflist host-local uses its default,
		// /var/lib/cni/networks: in a real node's mount namespace, a
		// directory of the node.
		dirs = append(dirs, filepath.Join(s.ContainerdDir(n), "var-lib-cni", "networks"))
	}
	for _, dir := range dirs {
		nets, _ := os.ReadDir(dir)
		for _, d := range nets {
			ents, _ := os.ReadDir(filepath.Join(dir, d.Name()))
			for _, e := range ents {
				if _, err := netip.ParseAddr(e.Name()); err == nil {
					out[e.Name()] = true
				}
			}
		}
	}
	return out
}

// nodeSnapshot is what pods leave on the nodes: links in each node
// namespace, host-local allocations, runtime pod dirs (real nodes: ready
// sandboxes), pod namespaces.
func nodeSnapshot(t *testing.T, s *lab.Spec) string {
	t.Helper()
	var b strings.Builder
	for _, n := range s.Nodes {
		links := testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "-o", "link", "show")
		var names []string
		for _, line := range strings.Split(links, "\n") {
			if f := strings.Fields(line); len(f) > 1 {
				names = append(names, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
			}
		}
		sort.Strings(names)
		var ips []string
		for ip := range ipamIPs(t, s, n) {
			ips = append(ips, ip)
		}
		sort.Strings(ips)
		podDirs, _ := filepath.Glob(filepath.Join(s.RuntimeDir(n), "pods", "*"))
		if s.Containerd() {
			podDirs = readySandboxes(t, s, n, "", "")
			sort.Strings(podDirs)
		}
		fmt.Fprintf(&b, "%s links %v\n%s ips %v\n%s pods %v\n", n.Name, names, n.Name, ips, n.Name, podDirs)
	}
	ents, _ := os.ReadDir(netns.RunDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), s.PodNetnsPrefix) {
			fmt.Fprintf(&b, "netns %s\n", e.Name())
		}
	}
	return b.String()
}

func cmdlineOf(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// countProcs counts processes whose command line is exactly cmd.
func countProcs(cmd string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ") == cmd {
			n++
		}
	}
	return n
}

type runtimeState struct {
	UID        string `json:"uid"`
	Netns      string `json:"netns"`
	SandboxID  string `json:"sandboxID"`
	Containers []struct {
		Name string `json:"name"`
		Proc *struct {
			PID int `json:"pid"`
		} `json:"proc"`
	} `json:"containers"`
}

func readRuntimeState(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string) runtimeState {
	t.Helper()
	var st runtimeState
	b, err := os.ReadFile(filepath.Join(s.RuntimeDir(n), "pods", ns+"_"+pod, "state.json"))
	if err != nil {
		t.Fatalf("runtime state of %s/%s: %v", ns, pod, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// hostPrefix is a network the machine's root namespace is on.
func hostPrefix(t *testing.T) netip.Prefix {
	t.Helper()
	out := testutil.Run(t, "ip", "-4", "-o", "addr", "show", "scope", "global")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil && p.Bits() >= 8 && p.Bits() <= 24 {
					return p.Masked()
				}
			}
		}
	}
	testutil.Skip(t, "no global IPv4 address of /8../24 in the root namespace to test the refusal with")
	return netip.Prefix{}
}

// kernelDump is the lab's kernel objects, for comparing two moments.
func kernelDump(t *testing.T, s *lab.Spec) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(testutil.Run(t, "ip", "-o", "link", "show", "master", s.Bridge))
	b.WriteString(testutil.Run(t, "ip", "-o", "addr", "show", "dev", s.Bridge))
	for _, n := range s.Nodes {
		ns := lab.NetnsPath(n.Netns)
		b.WriteString(testutil.RunIn(t, ns, "ip", "-o", "addr"))
		b.WriteString(testutil.RunIn(t, ns, "ip", "route"))
	}
	return b.String()
}

func pidFiles(t *testing.T, s *lab.Spec) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(s.StateDir, "pids", "*.pid"))
	var b strings.Builder
	for _, p := range m {
		c, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %s\n", filepath.Base(p), strings.SplitN(string(c), "\n", 2)[0])
	}
	return b.String()
}
