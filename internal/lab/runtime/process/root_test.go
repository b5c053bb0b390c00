package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	apitypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// buildFlatnet builds cmd/flatnet (netexec and container-init) into a
// temporary PodPath dir.
func buildFlatnet(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "flatnet"), "./cmd/flatnet")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building flatnet: %v\n%s", err, out)
	}
	return dir
}

// rootLab is a test "node" namespace with a CNI config (bridge +
// host-local, portmap, bandwidth) and a runtime running against a fake
// clientset, with every node-side effect inside the node namespace.
type rootLab struct {
	*harness
	nodeNS   string
	prefix   string
	dataDir  string
	subnet   string
	gateway  string
	network  string
	d        deps
	podPath  string
	bridge   string
	nodeName string
}

func newRootLab(t *testing.T, objs ...kruntime.Object) *rootLab {
	t.Helper()
	testutil.RequireRoot(t)
	third := 100 + int(time.Now().UnixNano()%100)
	subnet := fmt.Sprintf("10.213.%d.0/24", third)
	testutil.RequireFreeRange(t, subnet)
	l := &rootLab{
		nodeNS:  testutil.NewNetNS(t),
		prefix:  testutil.Name("fntp") + "-",
		dataDir: t.TempDir(),
		subnet:  subnet,
		gateway: fmt.Sprintf("10.213.%d.1", third),
		network: testutil.Name("fntnet"),
		bridge:  testutil.Name("fnb"),
		podPath: buildFlatnet(t),
	}
	confDir := t.TempDir()
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": l.network,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": l.bridge, "isGateway": true,
				"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": subnet}}}, "dataDir": l.dataDir},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
			map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
		},
	}
	b, _ := json.Marshal(conf)
	if err := os.WriteFile(filepath.Join(confDir, "10-lab.conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Whatever a failed test leaves is removed: pod namespaces and the
	// processes in them and in the node namespace (host-network pods), all
	// started by this test.
	t.Cleanup(func() {
		_ = killNetnsMembers(l.nodeNS, 2*time.Second)
		paths, _ := filepath.Glob(filepath.Join(netns.RunDir, l.prefix+"*"))
		for _, p := range paths {
			_ = killNetnsMembers(p, 2*time.Second)
			_ = netns.Delete(filepath.Base(p))
			t.Errorf("pod netns %s was left behind", p)
		}
	})
	client := fake.NewClientset(objs...)
	l.harness = &harness{t: t, client: client}
	l.cfg = Config{
		NodeName: "lab-node1", NodeIP: l.gateway, Client: client,
		StateDir: t.TempDir(), NetnsPrefix: l.prefix, PodPath: l.podPath,
		CNIConfDir: confDir, CNIBinDir: testutil.CNIPath(t), CNICacheDir: t.TempDir(),
	}
	d, err := realDeps(l.cfg, l.nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	d.heartbeat, d.netPoll = time.Second, 100*time.Millisecond
	l.d = d
	l.startRuntime()
	return l
}

// adoptions reports the outcome of each adoption of a running container.
type adoptions struct {
	processes
	ok chan<- bool
}

func (a adoptions) adopt(ctx context.Context, p procID) (<-chan exitInfo, bool) {
	exits, ok := a.processes.adopt(ctx, p)
	select {
	case a.ok <- ok:
	default:
	}
	return exits, ok
}

func (l *rootLab) startRuntime() {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan error, 1)
	go func() { l.done <- run(ctx, l.cfg, l.d) }()
	l.t.Cleanup(l.stop)
}

// nodeHTTP makes a GET from the node namespace.
func (l *rootLab) nodeHTTP(url string) (string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(l.nodeNS, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return string(b), err
}

func netexecPod(name string) *v1.Pod {
	grace := int64(5)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: "c0ffee00-1111-2222-3333-444444444444",
			Annotations: map[string]string{ingressBandwidthAnnotation: "10M"}},
		Spec: v1.PodSpec{
			NodeName:                      "lab-node1",
			TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{
				{
					Name: "web", Image: "flatnet", Command: []string{"flatnet", "netexec", "--http-port=8080", "--udp-port=8081"},
					Ports: []v1.ContainerPort{{ContainerPort: 8080, HostPort: 30080}},
					Env:   []v1.EnvVar{{Name: "MY_POD_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
					ReadinessProbe: &v1.Probe{PeriodSeconds: 1,
						ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
					LivenessProbe: &v1.Probe{PeriodSeconds: 1,
						ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(8080)}}},
				},
				{
					Name: "side", Image: "flatnet", Command: []string{"flatnet", "netexec", "--http-port=8090", "--udp-port=-1"},
					ReadinessProbe: &v1.Probe{PeriodSeconds: 1,
						ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"grep", "-q", name, "/etc/hosts"}}}},
				},
			},
		},
	}
}

func TestRootPodLifecycle(t *testing.T) {
	kube := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Name: "https", Port: 443}}},
	}
	pod := netexecPod("web")
	l := newRootLab(t, pod, kube)

	got := l.waitPod("default", "web", "Running and Ready", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && podReady(p)
	})
	ip := got.Status.PodIP
	if _, ipnet, _ := net.ParseCIDR(l.subnet); !ipnet.Contains(net.ParseIP(ip)) {
		t.Fatalf("pod IP %q is not in %s", ip, l.subnet)
	}
	nsName := l.prefix + "c0ffee00"
	if err := netns.Check(filepath.Join(netns.RunDir, nsName)); err != nil {
		t.Fatalf("pod netns: %v", err)
	}

	// From the node: the pod answers with its own hostname, and sees the
	// node's address as the client (no NAT).
	if h, err := l.nodeHTTP("http://" + ip + ":8080/hostname"); err != nil || h != "web" {
		t.Fatalf("/hostname from the node: %q %v", h, err)
	}
	if c, err := l.nodeHTTP("http://" + ip + ":8080/clientip"); err != nil || !strings.HasPrefix(c, l.gateway+":") {
		t.Errorf("/clientip from the node: %q %v (want %s:port)", c, err, l.gateway)
	}
	// The two containers talk over localhost.
	var dial netexec.DialResult
	out, err := l.nodeHTTP("http://" + ip + ":8080/dial?host=127.0.0.1&port=8090&request=hostname")
	if err != nil || json.Unmarshal([]byte(out), &dial) != nil || len(dial.Responses) != 1 || dial.Responses[0] != "web" {
		t.Errorf("web -> side over localhost: %q %v", out, err)
	}
	// The host port reaches the pod through portmap.
	if h, err := l.nodeHTTP("http://" + l.gateway + ":30080/hostname"); err != nil || h != "web" {
		t.Errorf("hostPort 30080 from the node: %q %v", h, err)
	}
	// The ingress-bandwidth annotation became a TBF on the host side.
	if q := testutil.RunIn(t, l.nodeNS, "tc", "qdisc", "show"); !strings.Contains(q, "tbf") || !strings.Contains(q, "rate 10Mbit") {
		t.Errorf("no 10Mbit tbf in the node namespace:\n%s", q)
	}

	// The container: its own hostname, hosts, env; `lab exec`'s way in.
	pid, err := ContainerPID(l.cfg.StateDir, "default", "web", "side")
	if err != nil {
		t.Fatal(err)
	}
	nsenter := func(args ...string) string {
		return testutil.Run(t, append([]string{"nsenter", "-t", strconv.Itoa(pid), "-n", "-m", "-u", "--"}, args...)...)
	}
	if h := strings.TrimSpace(nsenter("hostname")); h != "web" {
		t.Errorf("hostname inside: %q", h)
	}
	if hosts := nsenter("cat", "/etc/hosts"); !strings.Contains(hosts, ip+"\tweb\n") {
		t.Errorf("/etc/hosts inside:\n%s", hosts)
	}
	if hosts, _ := os.ReadFile("/etc/hosts"); strings.Contains(string(hosts), "Kubernetes-managed") {
		t.Fatal("the pod's hosts file leaked into the host's /etc/hosts")
	}
	webPID, err := ContainerPID(l.cfg.StateDir, "default", "web", "")
	if err != nil {
		t.Fatal(err)
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", webPID))
	for _, want := range []string{"MY_POD_IP=" + ip, "KUBERNETES_SERVICE_HOST=10.96.0.1", "PATH=" + l.podPath + ":", "HOSTNAME=web"} {
		if !strings.Contains(string(environ), want) {
			t.Errorf("web's environment lacks %q", want)
		}
	}
	if !proc.OwnedBy(webPID, l.cfg.StateDir) {
		t.Errorf("web's environment lacks the lab's mark %s", proc.OwnerEntry(l.cfg.StateDir))
	}

	// Restarting the agent keeps the pod: same processes, still reachable.
	l.stop()
	// Each adoption's outcome is the positive signal that the restarted
	// runtime has decided about a running container, before the checks
	// that it kept them.
	adopted := make(chan bool, 10)
	l.d.procs = adoptions{l.d.procs, adopted}
	l.startRuntime()
	for range len(pod.Spec.Containers) {
		select {
		case ok := <-adopted:
			if !ok {
				t.Error("the restarted runtime could not adopt a running container")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the restarted runtime adopted no container within 30s")
		}
	}
	if p2, err := ContainerPID(l.cfg.StateDir, "default", "web", "side"); err != nil || p2 != pid {
		t.Errorf("after an agent restart side is pid %d (%v), was %d", p2, err, pid)
	}
	if h, err := l.nodeHTTP("http://" + ip + ":8080/hostname"); err != nil || h != "web" {
		t.Errorf("/hostname after an agent restart: %q %v", h, err)
	}
	got = l.waitPod("default", "web", "still Ready", podReady)
	for _, cs := range got.Status.ContainerStatuses {
		if cs.RestartCount != 0 {
			t.Errorf("container %s restarted across an agent restart: %+v", cs.Name, cs)
		}
	}

	// Deletion leaves nothing: processes, netns, IP, host veth.
	hostLinks := testutil.RunIn(t, l.nodeNS, "ip", "-o", "link", "show", "master", l.bridge)
	if !strings.Contains(hostLinks, "veth") {
		t.Fatalf("no host veth on the bridge:\n%s", hostLinks)
	}
	l.deleteGracefully("default", "web", 5)
	l.waitFor("pod deleted by the runtime", func() (bool, string) {
		_, err := l.pod("default", "web")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	for _, p := range []int{pid, webPID} {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/ns", p)); err == nil {
			if st, err := readProcStat(p); err == nil && st.state != 'Z' {
				t.Errorf("process %d still runs after the pod's deletion", p)
			}
		}
	}
	if err := netns.Check(filepath.Join(netns.RunDir, nsName)); !errors.Is(err, netns.ErrNotExist) {
		t.Errorf("pod netns still there: %v", err)
	}
	ipFiles, _ := filepath.Glob(filepath.Join(l.dataDir, l.network, "10.*"))
	if len(ipFiles) != 0 {
		t.Errorf("host-local still holds %v", ipFiles)
	}
	// DEL parks the host veth (down, internal/cni/parking); the kernel
	// removes the pair with the pod's netns, in the background.
	l.waitFor("host veth gone from the bridge", func() (bool, string) {
		links := testutil.RunIn(t, l.nodeNS, "ip", "-o", "link", "show", "master", l.bridge)
		return !strings.Contains(links, "veth"), links
	})
	// The worker removes the pod's dir just after its last API call.
	l.waitFor("pod state dir removed", func() (bool, string) {
		_, err := os.Stat(podDir(l.cfg.StateDir, "default", "web"))
		return errors.Is(err, os.ErrNotExist), fmt.Sprint(err)
	})
}

func simplePod(name, uid string, policy v1.RestartPolicy, command ...string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: apitypes.UID(uid)},
		Spec: v1.PodSpec{
			NodeName: "lab-node1", RestartPolicy: policy,
			Containers: []v1.Container{{Name: "c", Image: "host", Command: command}},
		},
	}
}

func TestRootExitsLogsAndHostNetwork(t *testing.T) {
	job := simplePod("job", "0b000001-0000-0000-0000-000000000000", v1.RestartPolicyNever, "sh", "-c", "echo hello from $HOSTNAME; exit 0")
	crash := simplePod("crash", "0b000002-0000-0000-0000-000000000000", v1.RestartPolicyOnFailure, "sh", "-c", "echo crashing; exit 3")
	missing := simplePod("missing", "0b000003-0000-0000-0000-000000000000", v1.RestartPolicyNever, "no-such-program-here")
	hostnet := simplePod("hostnet", "0b000004-0000-0000-0000-000000000000", v1.RestartPolicyAlways, "flatnet", "netexec", "--http-port=18080", "--udp-port=-1")
	hostnet.Spec.HostNetwork = true
	l := newRootLab(t, job, crash, missing, hostnet)

	// A job: Succeeded with its output in the log; its network is
	// released but the Pod stays until deleted.
	got := l.waitPod("default", "job", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if term := got.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Errorf("job: %s", describe(got))
	}
	l.waitFor("the job's netns released", func() (bool, string) {
		err := netns.Check(filepath.Join(netns.RunDir, l.prefix+"0b000001"))
		return errors.Is(err, netns.ErrNotExist), fmt.Sprint(err)
	})
	logb, err := os.ReadFile(filepath.Join(podDir(l.cfg.StateDir, "default", "job"), "containers", "c", "log"))
	if err != nil || string(logb) != "hello from job\n" {
		t.Errorf("job log: %q %v", logb, err)
	}
	if st, err := os.Stat(filepath.Join(podDir(l.cfg.StateDir, "default", "job"), "containers", "c", "log")); err != nil {
		t.Error(err)
	} else if st.Mode().Perm() != 0o600 {
		t.Errorf("job log mode %v, want 0600", st.Mode().Perm())
	}

	// A crash with OnFailure: restarted, the exit code kept as last state.
	l.waitPod("default", "crash", "restarted after exit 3", func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].LastTerminationState.Terminated != nil &&
			cs[0].LastTerminationState.Terminated.ExitCode == 3 && cs[0].LastTerminationState.Terminated.Reason == "Error"
	})

	// A program that is not there: StartError 128, and Never means Failed.
	got = l.waitPod("default", "missing", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if term := got.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 128 || term.Reason != "StartError" ||
		!strings.Contains(term.Message, "no-such-program-here") {
		t.Errorf("missing program: %+v", got.Status.ContainerStatuses[0].State)
	}

	// Host network: the node's address, the node's name, no netns.
	got = l.waitPod("default", "hostnet", "hostNetwork pod running", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && podReady(p)
	})
	if got.Status.PodIP != l.gateway {
		t.Errorf("hostNetwork pod IP %q, want the node's %s", got.Status.PodIP, l.gateway)
	}
	var h string
	l.waitFor("hostNetwork netexec answers on the node's address", func() (bool, string) {
		h, err = l.nodeHTTP("http://" + l.gateway + ":18080/hostname")
		return err == nil, fmt.Sprint(err)
	})
	if h != "lab-node1" {
		t.Errorf("hostNetwork hostname %q, want the node name", h)
	}

	for _, name := range []string{"job", "crash", "missing", "hostnet"} {
		l.deleteGracefully("default", name, 2)
	}
	for _, name := range []string{"job", "crash", "missing", "hostnet"} {
		l.waitFor(name+" deleted", func() (bool, string) {
			_, err := l.pod("default", name)
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}
	l.waitFor("pod state dirs removed", func() (bool, string) {
		ents, _ := os.ReadDir(filepath.Join(l.cfg.StateDir, "pods"))
		return len(ents) == 0, fmt.Sprint(ents)
	})
}

// A pod whose state.json was cut short while the runtime was down is
// recovered with the real CNI plugins: its old sandbox and processes are
// torn down (host-local frees the IP, the veth goes), it runs again in a
// new one, and its deletion then leaves nothing.
func TestRootRecoversUnreadableRecord(t *testing.T) {
	pod := simplePod("web", "0c000001-0000-0000-0000-000000000000", v1.RestartPolicyAlways, "flatnet", "netexec", "--http-port=8080", "--udp-port=-1")
	l := newRootLab(t, pod)
	running := func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return p.Status.Phase == v1.PodRunning && p.Status.PodIP != "" && len(cs) == 1 && cs[0].State.Running != nil
	}
	before := l.waitPod("default", "web", "Running", running)
	pid, err := ContainerPID(l.cfg.StateDir, "default", "web", "")
	if err != nil {
		t.Fatal(err)
	}
	st, err := readProcStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	old := procID{PID: pid, StartTicks: st.startTicks}

	l.stop()
	state := filepath.Join(podDir(l.cfg.StateDir, "default", "web"), "state.json")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, b[:len(b)/3], 0o600); err != nil {
		t.Fatal(err)
	}
	l.startRuntime()

	after := l.waitPod("default", "web", "running again in a new sandbox", func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID
	})
	if procAlive(old) {
		t.Errorf("the container's old process %d still runs", pid)
	}
	l.waitFor("the web pod answers at its new address", func() (bool, string) {
		h, err := l.nodeHTTP("http://" + after.Status.PodIP + ":8080/hostname")
		return err == nil && h == "web", fmt.Sprint(h, err)
	})
	ipFiles, _ := filepath.Glob(filepath.Join(l.dataDir, l.network, "10.*"))
	if len(ipFiles) != 1 {
		t.Errorf("after recovery host-local holds %v, want one address", ipFiles)
	}
	// The old sandbox's host veth is parked (down, internal/cni/parking)
	// and goes with its netns, which the kernel removes in the background.
	l.waitFor("one veth on the bridge after recovery", func() (bool, string) {
		links := testutil.RunIn(t, l.nodeNS, "ip", "-o", "link", "show", "master", l.bridge)
		return strings.Count(links, "veth") == 1, links
	})

	l.deleteGracefully("default", "web", 2)
	l.waitFor("pod state dir removed", func() (bool, string) {
		_, err := os.Stat(podDir(l.cfg.StateDir, "default", "web"))
		return errors.Is(err, os.ErrNotExist), fmt.Sprint(err)
	})
	ipFiles, _ = filepath.Glob(filepath.Join(l.dataDir, l.network, "10.*"))
	if len(ipFiles) != 0 {
		t.Errorf("after deletion host-local holds %v", ipFiles)
	}
	l.waitFor("host veth gone from the bridge", func() (bool, string) {
		links := testutil.RunIn(t, l.nodeNS, "ip", "-o", "link", "show", "master", l.bridge)
		return !strings.Contains(links, "veth"), links
	})
}

// TestRootStartWaitsForExec: start returns only once container-init has
// mounted the pod's files and exec'd the command (a pod reported Running
// right after start has its resolv.conf: TestLab/DNS/ResolvConf once read
// the node's), and promptly when container-init fails instead.
func TestRootStartWaitsForExec(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	t.Cleanup(func() { _ = killNetnsMembers(ns, 2*time.Second) })
	dir := t.TempDir()
	resolv, hosts := filepath.Join(dir, "resolv.conf"), filepath.Join(dir, "hosts")
	const resolvText = "nameserver 10.213.0.53\nsearch exec-handshake.test\n"
	if err := os.WriteFile(resolv, []byte(resolvText), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &realProcesses{initBin: filepath.Join(buildFlatnet(t), "flatnet"), owner: dir}
	spec := procSpec{NetnsPath: ns, Argv: []string{"sleep", "60"}, Env: []string{"PATH=/usr/bin:/bin"},
		Hostname: "exec-handshake", ResolvFile: resolv, HostsFile: hosts, LogPath: filepath.Join(dir, "log")}
	for i := range 5 { // the race, when there was one, was lost most of the time
		id, exits, err := r.start(spec)
		if err != nil {
			t.Fatal(err)
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", id.PID))
		got, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/etc/resolv.conf", id.PID))
		r.killAll(id)
		<-exits
		if filepath.Base(exe) != "sleep" {
			t.Errorf("start %d: returned while pid %d still ran %q, not the container's sleep", i, id.PID, exe)
		}
		if err != nil || string(got) != resolvText {
			t.Errorf("start %d: the container's /etc/resolv.conf right after start: %q, %v; want the pod's %q", i, got, err, resolvText)
		}
	}

	spec.Argv = []string{"no-such-command-exec-handshake"}
	began := time.Now()
	_, exits, err := r.start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(began); waited >= execWaitLimit/2 {
		t.Errorf("start of a command container-init cannot find took %v: the handshake's EOF on its exit was missed", waited)
	}
	if e := <-exits; e.Code != 128 {
		t.Errorf("container-init's exit for a missing command: %+v, want code 128", e)
	}
}
