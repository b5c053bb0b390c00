package e2e

// The suite runs on either lab runtime: FLATNET_E2E_RUNTIME=containerd
// (make test-e2e-containerd) brings every lab up with --runtime
// containerd (upstream containerd, runc and kubelet per node), anything
// else or nothing with the process runtime. What the tests need from a
// pod beyond the API (its network namespace, a container's PID, whether
// its sandbox is gone) comes from the helpers here, which ask the
// process runtime's state files or, on real nodes, the node's containerd
// through crictl (its socket is reachable from the root namespace).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/runtime/containerd"
)

// podImage is the image of the tests' pods: the lab's Debian root with
// flatnet, sh, coreutils, curl, dig, ip (imported into every real node as
// docker.io/library/flatnet:dev; the process runtime ignores images). Its
// tag is not latest, so the kubelet's pull policy is IfNotPresent: never
// pulled.
const podImage = "flatnet:dev"

// runtimeEnv selects the runtime of the suite's labs.
const runtimeEnv = "FLATNET_E2E_RUNTIME"

// e2eRuntime is the runtime named by FLATNET_E2E_RUNTIME (default process).
func e2eRuntime(t *testing.T) string {
	t.Helper()
	switch v := os.Getenv(runtimeEnv); v {
	case "", lab.RuntimeProcess:
		return lab.RuntimeProcess
	case lab.RuntimeContainerd:
		return v
	default:
		t.Fatalf("%s=%q: want %s or %s", runtimeEnv, v, lab.RuntimeProcess, lab.RuntimeContainerd)
		return ""
	}
}

// nodeSocket is containerd's socket on node n (containerd.Plan.Socket).
func nodeSocket(t *testing.T, s *lab.Spec, n lab.Node) string {
	t.Helper()
	return filepath.Join(s.ContainerdDir(n), "run", "containerd.sock")
}

// crictl runs crictl against node n's containerd and returns its output.
func crictl(t *testing.T, s *lab.Spec, n lab.Node, args ...string) (string, error) {
	t.Helper()
	bin, err := containerd.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"--runtime-endpoint", "unix://" + nodeSocket(t, s, n), "--timeout", "10s"}, args...)
	out, err := exec.Command(filepath.Join(bin, "crictl"), argv...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
	}
	return string(out), err
}

// readySandboxes lists the IDs of node n's ready pod sandboxes, of pod
// ns/name or (name "") every pod.
func readySandboxes(t *testing.T, s *lab.Spec, n lab.Node, ns, name string) []string {
	t.Helper()
	args := []string{"pods", "--state", "ready", "-q"}
	if name != "" {
		args = append(args, "--namespace", ns, "--name", "^"+name+"$")
	}
	out, err := crictl(t, s, n, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(out)
}

// inspectPID is the .info.pid of crictl inspect or inspectp of id.
func inspectPID(t *testing.T, s *lab.Spec, n lab.Node, verb, id string) int {
	t.Helper()
	out, err := crictl(t, s, n, verb, id)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Info struct {
			PID int `json:"pid"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Info.PID == 0 {
		t.Fatalf("crictl %s %s: no pid (%v):\n%s", verb, id, err, out)
	}
	return v.Info.PID
}

// sandbox is where pod ns/name runs on node n: its sandbox ID and network
// namespace (a path netns.Do and nsenter --net accept).
type sandbox struct{ ID, Netns string }

func podSandbox(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string) sandbox {
	t.Helper()
	if !s.Containerd() {
		st := readRuntimeState(t, s, n, ns, pod)
		if st.Netns == "" {
			t.Fatalf("pod %s/%s has no netns in the runtime state", ns, pod)
		}
		return sandbox{ID: st.SandboxID, Netns: lab.NetnsPath(st.Netns)}
	}
	// The sandbox's namespace file lives in containerd's state, inside
	// the node's mount namespace; its pause process's is the same one.
	ids := readySandboxes(t, s, n, ns, pod)
	if len(ids) != 1 {
		t.Fatalf("pod %s/%s has %d ready sandboxes on %s: %v", ns, pod, len(ids), n.Name, ids)
	}
	return sandbox{ID: ids[0], Netns: fmt.Sprintf("/proc/%d/ns/net", inspectPID(t, s, n, "inspectp", ids[0]))}
}

// podNetns is pod ns/name's network namespace on node n.
func podNetns(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string) string {
	t.Helper()
	return podSandbox(t, s, n, ns, pod).Netns
}

// containerPID is the PID of pod's (namespace default) first container.
func containerPID(t *testing.T, s *lab.Spec, n lab.Node, pod string) int {
	t.Helper()
	if !s.Containerd() {
		st := readRuntimeState(t, s, n, "default", pod)
		if len(st.Containers) == 0 || st.Containers[0].Proc == nil {
			t.Fatalf("pod %s has no running container in the runtime state", pod)
		}
		return st.Containers[0].Proc.PID
	}
	sb := podSandbox(t, s, n, "default", pod)
	out, err := crictl(t, s, n, "ps", "--pod", sb.ID, "--state", "running", "-q")
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		t.Fatalf("pod %s has no running container on %s", pod, n.Name)
	}
	// One container per pod where this is used; the first is as good.
	return inspectPID(t, s, n, "inspect", ids[0])
}

// podGone reports whether node n's runtime has finished with pod
// default/name: no pod dir (process runtime), no ready sandbox (real
// nodes: the kubelet stopped it, CNI DEL has run; it removes stopped
// sandboxes later, in its garbage collection).
func podGone(t *testing.T, s *lab.Spec, n lab.Node, name string) bool {
	t.Helper()
	if s.Containerd() {
		return len(readySandboxes(t, s, n, "default", name)) == 0
	}
	_, err := os.Stat(filepath.Join(s.RuntimeDir(n), "pods", "default_"+name))
	return err != nil
}

// runInNS runs argv in the network namespace at nsPath (a /run/netns file
// or /proc/PID/ns/net) and returns its output.
func runInNS(t *testing.T, nsPath string, argv ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + nsPath, "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter --net=%s %s: %v\n%s", nsPath, strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// shareDir lets pod's containers see dir at the same path: a process
// runtime's containers see the machine's files, a real node's do not.
func shareDir(s *lab.Spec, p *corev1.Pod, dir string) {
	if !s.Containerd() {
		return
	}
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "shared",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}})
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "shared", MountPath: dir})
	}
}

// labSysctls are the host sysctls a kubelet sets; down puts them back.
var labSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// sysctlValues reads labSysctls as "name=value" lines.
func sysctlValues() []string {
	var out []string
	for _, k := range labSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		v := strings.TrimSpace(string(b))
		if err != nil {
			v = err.Error()
		}
		out = append(out, strings.ReplaceAll(k, "/", ".")+"="+v)
	}
	return out
}

// realNodeLeftovers lists what real nodes of lab name under root may
// leave: containerd, shim, runc and kubelet processes started for it
// (named by their command line or cgroup), and cgroup dirs
// flatnet-<lab>-* in any hierarchy.
func realNodeLeftovers(name, root string) []string {
	var left []string
	cg := "/flatnet-" + name + "-"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink("/proc/" + e.Name() + "/exe")
		switch filepath.Base(exe) {
		case "containerd", "containerd-shim-runc-v2", "runc", "kubelet", "pause":
		default:
			continue
		}
		cgroups, _ := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if cmd := cmdlineOf(pid); strings.Contains(cmd, root) || strings.Contains(string(cgroups), cg) {
			left = append(left, fmt.Sprintf("process %d %s", pid, cmd))
		}
	}
	for _, pat := range []string{"/sys/fs/cgroup" + cg + "*", "/sys/fs/cgroup/*" + cg + "*"} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			left = append(left, "cgroup "+d)
		}
	}
	return left
}

// agentRole is how lab up names what the agents do (its step lines).
func agentRole(s *lab.Spec) string {
	if s.Containerd() {
		return "CNI config"
	}
	return "lab runtime"
}
