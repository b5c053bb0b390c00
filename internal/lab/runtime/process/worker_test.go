package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// harness runs the runtime against a fake clientset and fake effects.
type harness struct {
	t      *testing.T
	client *fake.Clientset
	cfg    Config
	net    *fakeNet
	ns     *fakeNS
	procs  *fakeProcs
	prober *fakeProber
	// realProcs, when set, are the processes instead of procs.
	realProcs processes
	cancel    context.CancelFunc
	done      chan error
}

func newHarness(t *testing.T, objs ...kruntime.Object) *harness {
	t.Helper()
	h := &harness{
		t:      t,
		client: fake.NewClientset(objs...),
		net:    newFakeNet(),
		ns:     newFakeNS(),
		procs:  newFakeProcs(),
		prober: &fakeProber{ok: map[string]bool{}},
	}
	h.cfg = Config{
		NodeName: "lab-node1", NodeIP: "10.250.0.11", Client: h.client,
		StateDir: t.TempDir(), NetnsPrefix: "fntp-", PodPath: "/lab/bin",
		CNIConfDir: "/nonexistent/conf", CNIBinDir: "/nonexistent/bin",
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.255.255.53\nsearch example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.start(resolv)
	return h
}

func (h *harness) start(resolv string) {
	d := deps{
		net: h.net, ns: h.ns, procs: h.procs, prober: h.prober, now: time.Now,
		heartbeat: 50 * time.Millisecond, netPoll: 10 * time.Millisecond, resolvConf: resolv,
	}
	if h.realProcs != nil {
		d.procs = h.realProcs
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- run(ctx, h.cfg, d) }()
	h.t.Cleanup(h.stop)
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Error("run did not return after cancel")
	}
	h.cancel = nil
}

func (h *harness) waitFor(what string, cond func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("timed out waiting for %s; last state: %s", what, last)
}

func (h *harness) pod(ns, name string) (*v1.Pod, error) {
	return h.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
}

func (h *harness) waitPod(ns, name, what string, cond func(p *v1.Pod) bool) *v1.Pod {
	h.t.Helper()
	var got *v1.Pod
	h.waitFor(what, func() (bool, string) {
		p, err := h.pod(ns, name)
		if err != nil {
			return false, err.Error()
		}
		got = p
		return cond(p), describe(p)
	})
	return got
}

func describe(p *v1.Pod) string {
	var b strings.Builder
	b.WriteString(string(p.Status.Phase) + " ip=" + p.Status.PodIP)
	for _, c := range p.Status.Conditions {
		b.WriteString(" " + string(c.Type) + "=" + string(c.Status))
	}
	for _, cs := range p.Status.ContainerStatuses {
		b.WriteString(" [" + cs.Name)
		switch {
		case cs.State.Running != nil:
			b.WriteString(" running")
		case cs.State.Waiting != nil:
			b.WriteString(" waiting " + cs.State.Waiting.Reason + " " + cs.State.Waiting.Message)
		case cs.State.Terminated != nil:
			b.WriteString(" terminated " + cs.State.Terminated.Reason)
		}
		if cs.Ready {
			b.WriteString(" ready")
		}
		b.WriteString("]")
	}
	return b.String()
}

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// deleteGracefully does what the apiserver does for a bound pod:
// deletionTimestamp and grace set, the object stays until the node deletes
// it with grace 0.
func (h *harness) deleteGracefully(ns, name string, grace int64) {
	h.t.Helper()
	p, err := h.pod(ns, name)
	if err != nil {
		h.t.Fatal(err)
	}
	now := metav1.Now()
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
	if _, err := h.client.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func webPod(name string, uid types.UID) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: uid},
		Spec: v1.PodSpec{
			NodeName: "lab-node1",
			Containers: []v1.Container{
				{
					Name: "web", Image: "flatnet", Command: []string{"sleep"}, Args: []string{"$(WAIT)"},
					Env:            []v1.EnvVar{{Name: "WAIT", Value: "1001"}},
					Ports:          []v1.ContainerPort{{ContainerPort: 8080, HostPort: 30080}},
					ReadinessProbe: &v1.Probe{PeriodSeconds: 1, ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz"}}},
				},
				{Name: "side", Image: "flatnet", Command: []string{"sleep", "1000"}},
			},
		},
	}
}

func TestWorkerPodLifecycle(t *testing.T) {
	pod := webPod("web-1", "11111111-2222-3333-4444-555555555555")
	other := webPod("elsewhere", "99999999-2222-3333-4444-555555555555")
	other.Spec.NodeName = "lab-node2"
	kube := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []v1.ServicePort{{Name: "https", Port: 443}}},
	}
	h := newHarness(t, pod, other, kube)
	h.procs.exitOnTerm = true

	// The node registers Ready (the fake network has a config).
	h.waitFor("node Ready", func() (bool, string) {
		n, err := h.client.CoreV1().Nodes().Get(context.Background(), "lab-node1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				return n.Status.Addresses[0].Address == "10.250.0.11" && n.Labels["kubernetes.io/hostname"] == "lab-node1", "addresses/labels"
			}
		}
		return false, "not ready"
	})

	// Running with an IP, not Ready until the readiness probe passes.
	got := h.waitPod("app", "web-1", "Running with an IP", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && p.Status.PodIP == "10.244.1.2" && len(p.Status.ContainerStatuses) == 2 &&
			p.Status.ContainerStatuses[0].State.Running != nil && p.Status.ContainerStatuses[1].State.Running != nil
	})
	if podReady(got) {
		t.Fatalf("Ready before the probe passed: %s", describe(got))
	}
	h.prober.set("web", true)
	h.waitPod("app", "web-1", "Ready", podReady)

	adds, _, _ := h.net.snapshot()
	if len(adds) != 1 {
		t.Fatalf("%d CNI ADDs, want 1 (other nodes' pods are not ours)", len(adds))
	}
	a := adds[0]
	if a.NetnsPath != "/run/netns/fntp-11111111" || a.Args[2] != [2]string{"K8S_POD_NAME", "web-1"} {
		t.Errorf("CNI attachment: %+v", a)
	}
	if pm, ok := a.Caps["portMappings"].([]portMapping); !ok || len(pm) != 1 || pm[0].HostPort != 30080 {
		t.Errorf("portMappings: %#v", a.Caps)
	}
	procs := h.procs.list()
	if len(procs) != 2 {
		t.Fatalf("%d processes, want 2", len(procs))
	}
	web := procs[0].spec
	if web.NetnsPath != a.NetnsPath || web.Hostname != "web-1" || !slices.Equal(web.Argv, []string{"sleep", "1001"}) {
		t.Errorf("web process: %+v", web)
	}
	for _, want := range []string{"PATH=/lab/bin:" + defaultPath, "KUBERNETES_SERVICE_HOST=10.96.0.1", "HOSTNAME=web-1"} {
		if !slices.Contains(web.Env, want) {
			t.Errorf("web env lacks %s: %v", want, web.Env)
		}
	}
	hosts, err := os.ReadFile(web.HostsFile)
	if err != nil || !strings.Contains(string(hosts), "10.244.1.2\tweb-1\n") {
		t.Errorf("hosts file %s: %q %v", web.HostsFile, hosts, err)
	}
	if resolv, _ := os.ReadFile(web.ResolvFile); string(resolv) != "search example\nnameserver 10.255.255.53\n" {
		t.Errorf("resolv.conf: %q", resolv)
	}
	pid, err := ContainerPID(h.cfg.StateDir, "app", "web-1", "side")
	if err == nil || !errors.Is(err, ErrNotRunning) || pid != 0 {
		// The fake processes are not in /proc: ContainerPID checks that.
		t.Errorf("ContainerPID of a fake process: %d %v", pid, err)
	}
	if _, err := ContainerPID(h.cfg.StateDir, "app", "web-1", "nope"); err == nil || !strings.Contains(err.Error(), "has no container \"nope\" (it has: web, side)") {
		t.Errorf("ContainerPID of an unknown container: %v", err)
	}

	// A crash: restarted at once, restartCount 1, last state kept.
	if !h.procs.exit("side", 3) {
		t.Fatal("no live side process")
	}
	h.waitPod("app", "web-1", "side restarted", func(p *v1.Pod) bool {
		cs := p.Status.ContainerStatuses[1]
		return cs.RestartCount == 1 && cs.State.Running != nil && cs.LastTerminationState.Terminated != nil &&
			cs.LastTerminationState.Terminated.ExitCode == 3
	})

	// Graceful deletion: SIGTERM, CNI DEL, netns removed, Pod deleted.
	h.deleteGracefully("app", "web-1", 5)
	h.waitFor("pod deleted", func() (bool, string) {
		_, err := h.pod("app", "web-1")
		return apierrors.IsNotFound(err), "still there"
	})
	h.waitFor("pod dir removed", func() (bool, string) {
		_, err := os.Stat(podDir(h.cfg.StateDir, "app", "web-1"))
		return errors.Is(err, os.ErrNotExist), "pod dir still there"
	})
	_, dels, attached := h.net.snapshot()
	if len(dels) != 1 || dels[0].SandboxID != a.SandboxID || attached != 0 {
		t.Errorf("CNI DELs %+v, still attached %d", dels, attached)
	}
	if h.ns.count() != 0 || h.procs.alive() != 0 {
		t.Errorf("left behind: %d netns, %d processes", h.ns.count(), h.procs.alive())
	}
	// web and the second side run were stopped: SIGTERM first.
	procs = h.procs.list()
	if len(procs) != 3 {
		t.Fatalf("%d processes, want 3 (web, side, side restarted)", len(procs))
	}
	for _, p := range []fakeProc{procs[0], procs[2]} {
		if len(p.signals) == 0 || p.signals[0] != syscall.SIGTERM {
			t.Errorf("process %d (%s) signals %v, want SIGTERM first", p.id.PID, p.spec.Argv, p.signals)
		}
	}
}

func TestWorkerRestartPolicyNeverAndSandboxRetry(t *testing.T) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "job", UID: "abcdef12-0000-0000-0000-000000000000"},
		Spec: v1.PodSpec{
			NodeName: "lab-node1", RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{Name: "job", Image: "x", Command: []string{"true"}}},
		},
	}
	h := newHarnessNoStart(t, pod)
	h.net.setReady(errors.New("no CNI network config in /x"))
	h.net.setAddErr(errors.New("CNI ADD (network \"lab\"): plugin says no"))
	h.start(filepath.Join(t.TempDir(), "absent-resolv.conf"))

	h.waitFor("node NotReady with the network reason", func() (bool, string) {
		n, err := h.client.CoreV1().Nodes().Get(context.Background(), "lab-node1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				tainted := len(n.Spec.Taints) == 1 && n.Spec.Taints[0].Key == v1.TaintNodeNotReady
				return c.Status == v1.ConditionFalse && strings.Contains(c.Message, "no CNI network config") && tainted,
					fmt.Sprintf("%s taints=%v", c.Message, n.Spec.Taints)
			}
		}
		return false, "no Ready condition"
	})
	h.waitPod("app", "job", "sandbox failure reported", func(p *v1.Pod) bool {
		c := cond(p.Status, v1.PodReadyToStartContainers)
		return p.Status.Phase == v1.PodPending && c.Status == v1.ConditionFalse && strings.Contains(c.Message, "plugin says no")
	})
	if h.ns.count() != 0 {
		t.Errorf("a failed sandbox left %d netns", h.ns.count())
	}
	h.net.setReady(nil)
	h.net.setAddErr(nil)
	h.waitFor("node Ready", func() (bool, string) {
		n, _ := h.client.CoreV1().Nodes().Get(context.Background(), "lab-node1", metav1.GetOptions{})
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				return c.Status == v1.ConditionTrue && len(n.Spec.Taints) == 0, fmt.Sprintf("%s taints=%v", c.Message, n.Spec.Taints)
			}
		}
		return false, ""
	})
	h.waitPod("app", "job", "running after the retry", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	h.procs.exit("job", 0)
	got := h.waitPod("app", "job", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if cs := got.Status.ContainerStatuses[0]; cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" || cs.RestartCount != 0 {
		t.Errorf("job status: %+v", cs)
	}
	// Finished: its network is released, the Pod object stays.
	h.waitFor("network released", func() (bool, string) {
		_, _, attached := h.net.snapshot()
		return attached == 0 && h.ns.count() == 0, "still attached"
	})
	// Stopped, every worker has returned: whatever it would do after the
	// teardown is done, so the checks below cannot come too early.
	h.stop()
	if _, err := h.pod("app", "job"); err != nil {
		t.Errorf("a finished pod was deleted: %v", err)
	}
	if n := len(h.procs.list()); n != 1 {
		t.Errorf("restartPolicy Never restarted: %d processes", n)
	}
}

func newHarnessNoStart(t *testing.T, objs ...kruntime.Object) *harness {
	h := &harness{
		t: t, client: fake.NewClientset(objs...),
		net: newFakeNet(), ns: newFakeNS(), procs: newFakeProcs(), prober: &fakeProber{ok: map[string]bool{}},
	}
	h.cfg = Config{
		NodeName: "lab-node1", NodeIP: "10.250.0.11", Client: h.client,
		StateDir: t.TempDir(), NetnsPrefix: "fntp-", PodPath: "/lab/bin",
		CNIConfDir: "/nonexistent/conf", CNIBinDir: "/nonexistent/bin",
	}
	return h
}

func TestWorkerAdoptsAndCleansUp(t *testing.T) {
	kept := webPod("kept", "aaaaaaaa-0000-0000-0000-000000000000")
	kept.Spec.Containers = kept.Spec.Containers[1:] // just "side"
	h := newHarnessNoStart(t, kept)

	// Records left by an earlier agent: one for a pod the API still has
	// (its process lives), one for a pod deleted meanwhile.
	recKept := newRecord(kept, time.Now())
	recKept.Netns, recKept.SandboxID, recKept.IPs = "fntp-aaaaaaaa", "sb-kept", []string{"10.244.1.50"}
	recKept.Containers[0].Proc = &procID{PID: 501, StartTicks: 7, MntNS: 501}
	recKept.Containers[0].ID, recKept.Containers[0].StartedAt = "kept-side", time.Now()
	goneP := webPod("gone", "bbbbbbbb-0000-0000-0000-000000000000")
	recGone := newRecord(goneP, time.Now())
	recGone.Netns, recGone.SandboxID, recGone.IPs = "fntp-bbbbbbbb", "sb-gone", []string{"10.244.1.51"}
	recGone.Containers[0].Proc = &procID{PID: 502, StartTicks: 7, MntNS: 502}
	recGone.Containers[1].Proc = &procID{PID: 503, StartTicks: 7, MntNS: 503} // died while the agent was away
	for _, r := range []*podRecord{recKept, recGone} {
		if err := r.save(podDir(h.cfg.StateDir, r.Namespace, r.Name)); err != nil {
			t.Fatal(err)
		}
		_, _ = h.ns.create(r.Netns)
		h.net.attached[r.SandboxID] = r.IPs[0]
	}
	h.procs.add(procID{PID: 501, StartTicks: 7, MntNS: 501})
	h.procs.add(procID{PID: 502, StartTicks: 7, MntNS: 502})
	h.procs.exitOnTerm = false
	h.start(filepath.Join(t.TempDir(), "resolv.conf"))

	got := h.waitPod("app", "kept", "adopted and running", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && p.Status.PodIP == "10.244.1.50" && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].ContainerID == "flatnet://kept-side"
	})
	if got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("adopted container restarted: %+v", got.Status.ContainerStatuses[0])
	}
	h.waitFor("gone pod cleaned", func() (bool, string) {
		_, err := os.Stat(podDir(h.cfg.StateDir, "app", "gone"))
		return errors.Is(err, os.ErrNotExist) && !h.ns.exists("fntp-bbbbbbbb"), "still there"
	})
	adds, dels, attached := h.net.snapshot()
	if len(adds) != 0 || len(dels) != 1 || dels[0].SandboxID != "sb-gone" || attached != 1 {
		t.Errorf("CNI: adds %v dels %v attached %d", adds, dels, attached)
	}
	if pid, err := ContainerPID(h.cfg.StateDir, "app", "gone", ""); err == nil {
		t.Errorf("ContainerPID of a cleaned pod: %d", pid)
	}
	for _, p := range h.procs.list() {
		switch p.id.PID {
		case 501:
			if !p.alive || len(p.signals) != 0 {
				t.Errorf("adopted process disturbed: %+v", p)
			}
		case 502:
			if p.alive || len(p.signals) == 0 || p.signals[0] != 15 {
				t.Errorf("orphan process not stopped with SIGTERM first: %+v", p)
			}
		}
	}
	if n := len(h.procs.list()); n != 2 {
		t.Errorf("%d processes, want the 2 from before (nothing started)", n)
	}
}

func TestSameNameNewPodWaitsForOld(t *testing.T) {
	old := webPod("p", "00000001-0000-0000-0000-000000000000")
	old.Spec.Containers = old.Spec.Containers[1:]
	h := newHarness(t, old)
	h.procs.exitOnTerm = true
	h.waitPod("app", "p", "old running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	// Force-deleted and recreated at once under the same name.
	if err := h.client.CoreV1().Pods("app").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := old.DeepCopy()
	fresh.UID, fresh.Status = "00000002-0000-0000-0000-000000000000", v1.PodStatus{}
	fresh.ResourceVersion = ""
	if _, err := h.client.CoreV1().Pods("app").Create(context.Background(), fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitPod("app", "p", "new pod running", func(p *v1.Pod) bool {
		return p.UID == fresh.UID && p.Status.Phase == v1.PodRunning && p.Status.PodIP == "10.244.1.3"
	})
	_, dels, attached := h.net.snapshot()
	if len(dels) != 1 || attached != 1 || h.ns.count() != 1 {
		t.Errorf("old sandbox not cleaned before the new one: dels %d attached %d netns %d", len(dels), attached, h.ns.count())
	}
}

// realAdopter is the fake processes with the real adopt, for processes an
// "earlier runtime" left running.
type realAdopter struct {
	*fakeProcs
	real *realProcesses
}

func (r realAdopter) adopt(ctx context.Context, p procID) (<-chan exitInfo, bool) {
	return r.real.adopt(ctx, p)
}

// goroutinesIn returns the stacks of the live goroutines that have fn in
// their stack.
func goroutinesIn(fn string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			out = append(out, g)
		}
	}
	return out
}

// The goroutines that watch an adopted container end when the runtime
// stops (before: the process watcher polled until the container exited,
// one goroutine leaked per adopted container and restart).
func TestAdoptedWatchersStopWithTheRuntime(t *testing.T) {
	kept := webPod("kept", "aaaaaaaa-0000-0000-0000-000000000000")
	kept.Spec.Containers = kept.Spec.Containers[1:] // just "side"
	h := newHarnessNoStart(t, kept)
	h.realProcs = realAdopter{fakeProcs: h.procs, real: &realProcesses{}}

	// The container an earlier runtime started: a real process.
	sleep := exec.Command("sleep", "1000")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	st, err := readProcStat(sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	mnt, err := nsInode(sleep.Process.Pid, "mnt")
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecord(kept, time.Now())
	rec.Netns, rec.SandboxID, rec.IPs = "fntp-aaaaaaaa", "sb-kept", []string{"10.244.1.50"}
	rec.Containers[0].Proc = &procID{PID: sleep.Process.Pid, StartTicks: st.startTicks, MntNS: mnt}
	rec.Containers[0].ID, rec.Containers[0].StartedAt = "kept-side", time.Now()
	if err := rec.save(podDir(h.cfg.StateDir, rec.Namespace, rec.Name)); err != nil {
		t.Fatal(err)
	}
	_, _ = h.ns.create(rec.Netns)
	h.net.attached[rec.SandboxID] = rec.IPs[0]

	h.start(filepath.Join(t.TempDir(), "resolv.conf"))
	h.waitPod("app", "kept", "adopted and running", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].ContainerID == "flatnet://kept-side"
	})
	if n := len(goroutinesIn("process.waitGone(")); n != 1 {
		t.Fatalf("%d goroutines watch the adopted process, want 1", n)
	}
	h.stop()
	for _, fn := range []string{"process.waitGone(", "process.(*worker)."} {
		if g := goroutinesIn(fn); len(g) > 0 {
			t.Errorf("%d goroutines in %s outlived the runtime:\n%s", len(g), fn, strings.Join(g, "\n\n"))
		}
	}
	if !procAlive(*rec.Containers[0].Proc) {
		t.Error("the container stopped with the runtime; it should keep running")
	}
}

// A pod dir whose state.json is empty or truncated (a crash, a full disk)
// is reported and recovered: the sandbox found in the CNI cache and the
// processes found through the pid files are torn down, and a pod the API
// still has starts again; one it does not have is cleaned up. Nothing
// leaks. A truncated side file next to a good record is rewritten.
// (Before: the record was skipped, the pod got a second netns and IP, the
// old ones and the old processes were left.)
func TestUnreadableRecordsAreRecovered(t *testing.T) {
	grace := int64(1)
	mk := func(name string, uid types.UID) *v1.Pod {
		p := webPod(name, uid)
		p.Spec.Containers = p.Spec.Containers[1:] // just "side"
		p.Spec.TerminationGracePeriodSeconds = &grace
		return p
	}
	empty := mk("empty", "aaaaaaaa-0000-0000-0000-000000000000")
	trunc := mk("trunc", "bbbbbbbb-0000-0000-0000-000000000000")
	orphan := mk("orphan", "cccccccc-0000-0000-0000-000000000000") // gone from the API
	valid := mk("valid", "dddddddd-0000-0000-0000-000000000000")
	h := newHarnessNoStart(t, empty, trunc, valid)

	// What an earlier runtime left: for each pod a netns, a CNI
	// attachment (in libcni's cache) and a running process.
	type leftover struct {
		pod     *v1.Pod
		sandbox string
		pid     int
		damage  func(dir string)
	}
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	left := []leftover{
		{empty, "sb-empty", 501, func(dir string) { write(filepath.Join(dir, "state.json"), "") }},
		{trunc, "sb-trunc", 502, func(dir string) {
			b, _ := os.ReadFile(filepath.Join(dir, "state.json"))
			write(filepath.Join(dir, "state.json"), string(b[:len(b)/2]))
			write(filepath.Join(dir, "netns"), "")
		}},
		{orphan, "sb-orphan", 503, func(dir string) { write(filepath.Join(dir, "state.json"), "") }},
		{valid, "sb-valid", 504, func(dir string) { write(filepath.Join(dir, "containers", "side", "pid"), "5") }},
	}
	for i, l := range left {
		rec := newRecord(l.pod, time.Now())
		rec.Netns, rec.SandboxID, rec.IPs = "fntp-"+string(l.pod.UID)[:8], l.sandbox, []string{fmt.Sprintf("10.244.1.%d", 50+i)}
		rec.Containers[0].Proc = &procID{PID: l.pid, StartTicks: 7, MntNS: uint64(l.pid)}
		rec.Containers[0].ID, rec.Containers[0].StartedAt = "old-"+l.pod.Name, time.Now()
		dir := podDir(h.cfg.StateDir, rec.Namespace, rec.Name)
		if err := rec.save(dir); err != nil {
			t.Fatal(err)
		}
		l.damage(dir)
		_, _ = h.ns.create(rec.Netns)
		h.net.attached[l.sandbox] = rec.IPs[0]
		h.net.cache[l.sandbox] = cniAttachment{
			SandboxID: l.sandbox, NetnsPath: filepath.Join(netnsRunDir, rec.Netns), IfName: podIfName,
			Args: [][2]string{{"K8S_POD_NAMESPACE", "app"}, {"K8S_POD_NAME", l.pod.Name}, {"K8S_POD_UID", string(l.pod.UID)}},
		}
		h.procs.add(*rec.Containers[0].Proc)
	}
	h.start(filepath.Join(t.TempDir(), "resolv.conf"))

	for _, name := range []string{"empty", "trunc"} {
		h.waitPod("app", name, name+" running again in a new sandbox", func(p *v1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return p.Status.Phase == v1.PodRunning && len(cs) == 1 && cs[0].State.Running != nil &&
				cs[0].ContainerID != "flatnet://old-"+name && p.Status.PodIP != ""
		})
	}
	h.waitFor("orphan cleaned up", func() (bool, string) {
		_, err := os.Stat(podDir(h.cfg.StateDir, "app", "orphan"))
		return errors.Is(err, os.ErrNotExist) && !h.ns.exists("fntp-cccccccc"), fmt.Sprint(err)
	})
	h.waitFor("old sandboxes released", func() (bool, string) {
		_, dels, attached := h.net.snapshot()
		return len(dels) == 3 && attached == 3 && h.ns.count() == 3, fmt.Sprintf("dels %v attached %d netns %d", dels, attached, h.ns.count())
	})
	_, dels, _ := h.net.snapshot()
	var delIDs []string
	for _, d := range dels {
		delIDs = append(delIDs, d.SandboxID)
	}
	slices.Sort(delIDs)
	if want := []string{"sb-empty", "sb-orphan", "sb-trunc"}; !slices.Equal(delIDs, want) {
		t.Errorf("CNI DEL for %v, want %v", delIDs, want)
	}
	for _, p := range h.procs.list() {
		if p.id.PID >= 501 && p.id.PID <= 503 && p.alive {
			t.Errorf("process %d of a recovered pod still runs", p.id.PID)
		}
		if p.id.PID == 504 && (!p.alive || len(p.signals) > 0) {
			t.Errorf("the valid pod's process was disturbed: %+v", p)
		}
	}
	for _, name := range []string{"empty", "trunc"} {
		rec, err := loadRecord(podDir(h.cfg.StateDir, "app", name))
		if err != nil || rec.SandboxID == "" || rec.SandboxID == "sb-"+name {
			t.Errorf("%s: state.json after recovery: %+v %v", name, rec, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(podDir(h.cfg.StateDir, "app", "valid"), "containers", "side", "pid")); err != nil || string(b) != "504\n" {
		t.Errorf("the valid pod's truncated pid file: %q %v, want it rewritten", b, err)
	}
	h.waitFor("StateRecovered events for the two pods in the API", func() (bool, string) {
		evs, _ := h.client.CoreV1().Events("app").List(context.Background(), metav1.ListOptions{})
		var got []string
		for _, e := range evs.Items {
			if e.Reason == "StateRecovered" && strings.Contains(e.Message, "state.json") {
				got = append(got, e.InvolvedObject.Name)
			}
		}
		slices.Sort(got)
		return slices.Equal(got, []string{"empty", "trunc"}), fmt.Sprint(got)
	})
}

// A pod whose namespace still holds a process after SIGKILL keeps its
// namespace (and its network, and its Pod object) until the process is
// gone: removed, it would leave the process running in a namespace that
// nothing names, that no later teardown or `lab down` finds.
func TestTeardownKeepsNetnsWhileProcessesRemain(t *testing.T) {
	pod := webPod("stuck", "12121212-2222-3333-4444-555555555555")
	h := newHarness(t, pod)
	h.procs.exitOnTerm = true
	h.waitPod("app", "stuck", "Running", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })
	h.procs.setNetnsStuck(true)
	h.deleteGracefully("app", "stuck", 1)
	// A failed teardown is retried (after 1 s, then 2 s): the second try
	// is the positive signal that the first one kept everything.
	h.waitFor("the teardown retried", func() (bool, string) {
		n := h.procs.netnsKillCount()
		return n >= 2, fmt.Sprintf("%d tries", n)
	})
	_, dels, attached := h.net.snapshot()
	if h.ns.count() != 1 || len(dels) != 0 || attached != 1 {
		t.Errorf("while a process remains: %d netns (want 1), CNI DELs %d (want 0), attached %d (want 1)", h.ns.count(), len(dels), attached)
	}
	if _, err := h.pod("app", "stuck"); err != nil {
		t.Errorf("the Pod was deleted while its sandbox remains: %v", err)
	}
	h.procs.setNetnsStuck(false)
	h.waitFor("pod deleted", func() (bool, string) {
		_, err := h.pod("app", "stuck")
		return apierrors.IsNotFound(err), "still there"
	})
	if _, _, attached := h.net.snapshot(); h.ns.count() != 0 || attached != 0 {
		t.Errorf("left behind: %d netns, %d attached", h.ns.count(), attached)
	}
}
