package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/images"
	"github.com/flatnet/flatnet/internal/mountinfo"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// The test's pods and node addresses; never on the host (checked).
const testRange = "10.123.0.0/16"

// binDirs returns the node and kubelet bin dirs, or skips with what to
// build.
func binDirs(t *testing.T) (node, kube string) {
	t.Helper()
	node, err := BinDir()
	if err != nil {
		testutil.Skip(t, "%v", err)
	}
	kube, err = KubeletBinDir()
	if err != nil {
		testutil.Skip(t, "%v", err)
	}
	if _, err := controlplane.BinDir(); err != nil {
		testutil.Skip(t, "%v", err)
	}
	return node, kube
}

// forward makes addr (the apiserver on 127.0.0.1 of the root namespace)
// reachable at the same address inside the namespace nsPath: a listener
// made in the namespace, and connections copied to the root one. No
// interface or route is added anywhere.
func forward(t *testing.T, nsPath, addr string) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(nsPath, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, nsPath, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

type testNode struct {
	Node
	nsName string
}

// TestTwoNodes brings two real nodes up side by side against a real
// control plane, runs a pause pod on each through a bridge conflist of
// flatnet-cni, checks that a second Up changes nothing, then takes both
// down and checks that nothing is left.
func TestTwoNodes(t *testing.T) {
	testutil.RequireRoot(t)
	nodeBin, kubeBin := binDirs(t)
	testutil.RequireFreeRange(t, testRange)
	cniBin := testutil.CNIPath(t)
	ctx := context.Background()

	sysBefore := map[string]string{}
	for _, k := range KubeletSysctls {
		v, err := sysctl.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		sysBefore[k] = v
	}

	state := t.TempDir()
	t.Cleanup(func() {
		if err := controlplane.Down(state); err != nil {
			t.Errorf("control plane down: %v", err)
		}
	})
	var cpLog strings.Builder
	info, err := controlplane.Up(ctx, controlplane.Config{StateDir: state, BinDir: kubeBin, Addr: netip.MustParseAddr("127.0.0.1")}, &cpLog)
	if err != nil {
		t.Fatalf("control plane: %v\n%s", err, cpLog.String())
	}
	cs, err := controlplane.Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(info.Server)
	if err != nil {
		t.Fatal(err)
	}

	// The pause image, from a static flatnet-pause.
	pauseBin := filepath.Join(t.TempDir(), "flatnet-pause")
	build := exec.Command("go", "build", "-o", pauseBin, "../../../../cmd/flatnet-pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building flatnet-pause: %v\n%s", err, out)
	}
	img, err := images.Build(images.Pause(pauseBin))
	if err != nil {
		t.Fatal(err)
	}
	pauseTar := filepath.Join(t.TempDir(), "pause.tar")
	if err := images.Write(pauseTar, map[string]v1.Image{images.PauseRef: img}); err != nil {
		t.Fatal(err)
	}

	lab := testutil.Name("fnt")
	var nodes []testNode
	for i, name := range []string{"n1", "n2"} {
		nsPath := testutil.NewNetNS(t)
		nsName := testutil.NSName(nsPath)
		ip := fmt.Sprintf("10.123.%d.1", 250+i)
		testutil.Run(t, "ip", "-n", nsName, "addr", "add", ip+"/32", "dev", "lo")
		forward(t, nsPath, u.Host)
		dir := filepath.Join(state, "nodes", name, "containerd")
		confDir := filepath.Join(state, "nodes", name, "cni", "net.d")
		if err := os.MkdirAll(confDir, 0o755); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"fntest","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,`+
			`"ipam":{"type":"host-local","ranges":[[{"subnet":"10.123.%d.0/24"}]],"dataDir":%q}}]}`,
			i, filepath.Join(state, "nodes", name, "cni", "networks"))
		if err := os.WriteFile(filepath.Join(confDir, "10-fntest.conflist"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		n := testNode{Node: Node{
			Name: name, Lab: lab, StateDir: state, Dir: dir, Netns: nsPath,
			IP: netip.MustParseAddr(ip), Kubeconfig: info.Kubeconfig,
			CNIConfDir: confDir, CNIBinDir: cniBin,
			ClusterDNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, ClusterDomain: "cluster.local",
			NodeBinDir: nodeBin, KubeletBinDir: kubeBin, Images: []string{pauseTar},
		}, nsName: nsName}
		nodes = append(nodes, n)
		// Whatever happens, the node goes (Down is safe to repeat).
		t.Cleanup(func() {
			if err := Down(context.Background(), n.Node); err != nil {
				t.Errorf("cleanup Down %s: %v", n.Name, err)
			}
		})
	}
	t.Cleanup(func() {
		if err := RestoreSysctls(state); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	var logs strings.Builder
	for _, n := range nodes {
		t0 := time.Now()
		st, err := Up(ctx, n.Node, &logs)
		if err != nil {
			t.Fatalf("Up %s: %v\n%s", n.Name, err, logs.String())
		}
		t.Logf("node %s up in %v: containerd ready %v after start, kubelet healthy %v after start, imported %d",
			n.Name, time.Since(t0).Round(time.Millisecond), st.ContainerdReady.Round(time.Millisecond),
			st.KubeletReady.Round(time.Millisecond), len(st.Imported))
	}
	t.Logf("Up:\n%s", logs.String())

	// A second Up changes nothing.
	for _, n := range nodes {
		before, _ := Up(ctx, n.Node, nil)
		if before == nil || len(before.Started) != 0 || len(before.Imported) != 0 {
			t.Errorf("second Up of %s did something: %+v", n.Name, before)
		}
	}

	// Each Node registers and turns Ready; a pause pod on each runs with
	// an address of its node's range.
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	no := false
	for i, n := range nodes {
		waitFor(t, 90*time.Second, "node "+n.Name+" Ready", func() error {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("conditions %v", node.Status.Conditions)
		})
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "pause-" + n.Name},
			Spec: corev1.PodSpec{
				NodeName:                     n.Name,
				AutomountServiceAccountToken: &no,
				Containers:                   []corev1.Container{{Name: "pause", Image: images.PauseRef, ImagePullPolicy: corev1.PullNever}},
			},
		}
		t0 := time.Now()
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 90*time.Second, "pod "+pod.Name+" Running", func() error {
			p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				return fmt.Errorf("phase %s, IP %q, %v", p.Status.Phase, p.Status.PodIP, p.Status.ContainerStatuses)
			}
			want := netip.MustParsePrefix(fmt.Sprintf("10.123.%d.0/24", i))
			if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !want.Contains(ip) {
				return fmt.Errorf("pod IP %s not in %s", p.Status.PodIP, want)
			}
			return nil
		})
		t.Logf("pod on %s Running in %v", n.Name, time.Since(t0).Round(time.Millisecond))
	}
	// The kubelets of the host do not see each other's device-plugin
	// socket or logs: each healthz is still fine with two up.
	for _, n := range nodes {
		p, _ := MakePlan(n.Node)
		if err := WaitKubelet(ctx, p, 5*time.Second); err != nil {
			t.Errorf("%s: %v", n.Name, err)
		}
	}

	checkIsolation(t, nodes)

	// A dead kubelet: Up starts it again, and only it.
	p1, _ := MakePlan(nodes[0].Node)
	if err := proc.Stop(nodes[0].Dir, p1.Kubelet.Name, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := Up(ctx, nodes[0].Node, nil); err != nil || strings.Join(st.Started, ",") != "kubelet" {
		t.Errorf("Up after the kubelet stopped: %+v, %v; want kubelet started", st, err)
	}
	// A changed kubelet config restarts the kubelet, and only it.
	changed := nodes[0].Node
	changed.ClusterDNS = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	if st, err := Up(ctx, changed, nil); err != nil || strings.Join(st.Started, ",") != "kubelet" {
		t.Errorf("Up with another cluster DNS: %+v, %v; want kubelet restarted", st, err)
	}
	// A containerd killed outright leaves its shims and pods running:
	// Down must find them (by owner mark and cgroup).
	p2, _ := MakePlan(nodes[1].Node)
	if pid, ok := proc.Running(nodes[1].Dir, p2.Containerd.Name); !ok || unix.Kill(pid, unix.SIGKILL) != nil {
		t.Fatalf("killing n2's containerd (pid %d)", pid)
	}

	// Down leaves nothing.
	hier, err := hostHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		p, _ := MakePlan(n.Node)
		t0 := time.Now()
		if err := Down(ctx, n.Node); err != nil {
			t.Fatalf("Down %s: %v", n.Name, err)
		}
		t.Logf("node %s down in %v", n.Name, time.Since(t0).Round(time.Millisecond))
		if pids := proc.Scan(func(pid int) bool { return proc.OwnedBy(pid, n.Dir) }); len(pids) != 0 {
			t.Errorf("%s: processes left: %v", n.Name, pids)
		}
		if mps, _ := mountinfo.Under(filepath.Dir(n.Dir)); len(mps) != 0 {
			t.Errorf("%s: mounts left: %v", n.Name, mps)
		}
		for _, h := range hier {
			if _, err := os.Stat(filepath.Join(h, p.CgroupRoot)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: cgroup %s left in %s (%v)", n.Name, p.CgroupRoot, h, err)
			}
		}
		if _, err := os.Stat(n.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: dir %s left (%v)", n.Name, n.Dir, err)
		}
		// A pod netns freed with its last process takes its veth along,
		// asynchronously.
		waitFor(t, 10*time.Second, n.Name+": no veth left", func() error {
			if out := testutil.Run(t, "ip", "-n", n.nsName, "-o", "link", "show", "type", "veth"); strings.TrimSpace(out) != "" {
				return errors.New(out)
			}
			return nil
		})
	}
	if err := RestoreSysctls(state); err != nil {
		t.Fatal(err)
	}
	for k, v := range sysBefore {
		if got, _ := sysctl.Get(k); got != v {
			t.Errorf("sysctl %s = %s after restore, was %s", k, got, v)
		}
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkIsolation: each node's containerd, kubelet and shims share one
// mount namespace, not the host's nor another node's; the shims run in
// the node's shim cgroup; the host's mount table holds no mount of the
// nodes but their run dirs and namespace files.
func checkIsolation(t *testing.T, nodes []testNode) {
	t.Helper()
	host := nsInode(t, os.Getpid())
	seen := map[string]string{}
	for _, n := range nodes {
		p, _ := MakePlan(n.Node)
		cpid, _ := proc.Running(n.Dir, p.Containerd.Name)
		kpid, _ := proc.Running(n.Dir, p.Kubelet.Name)
		mnt := nsInode(t, cpid)
		if mnt == host || nsInode(t, kpid) != mnt {
			t.Errorf("%s: containerd's mount namespace %s, kubelet's %s, host's %s", n.Name, mnt, nsInode(t, kpid), host)
		}
		if other, ok := seen[mnt]; ok {
			t.Errorf("%s shares its mount namespace with %s", n.Name, other)
		}
		seen[mnt] = n.Name
		shims := proc.Scan(func(pid int) bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			return strings.Contains(string(b), "containerd-shim-runc-v2") && proc.OwnedBy(pid, n.Dir)
		})
		if len(shims) == 0 {
			t.Errorf("%s: no shim carries the node's owner mark", n.Name)
		}
		for _, pid := range shims {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if !strings.Contains(string(b), ":"+p.ShimCgroup+"\n") || nsInode(t, pid) != mnt {
				t.Errorf("%s: shim %d not in %s or not in the node's mount namespace:\n%s", n.Name, pid, p.ShimCgroup, b)
			}
		}
		mps, _ := mountinfo.Under(filepath.Dir(n.Dir))
		if len(mps) != 2 || mps[0] != p.MountNS || mps[1] != p.RunDir {
			t.Errorf("%s: host mounts under the node: %v, want %s and %s", n.Name, mps, p.MountNS, p.RunDir)
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " - overlay ") || strings.Contains(l, "/kubelet/pods/") {
			t.Errorf("a container mount in the host's mount table: %s", l)
		}
	}
	for _, k := range KubeletSysctls {
		v, _ := sysctl.Get(k)
		t.Logf("with kubelets up: %s = %s", k, v)
	}
}

func nsInode(t *testing.T, pid int) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		t.Errorf("mount namespace of %d: %v", pid, err)
	}
	return l
}
