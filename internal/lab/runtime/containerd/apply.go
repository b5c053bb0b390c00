package containerd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/atomicfile"
	"github.com/flatnet/flatnet/internal/httpserver"
	"github.com/flatnet/flatnet/internal/mountinfo"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
)

// Timeouts of Up's waits and Down's stops.
const (
	ContainerdReadyTimeout = 60 * time.Second
	KubeletReadyTimeout    = 120 * time.Second
	stopGrace              = 15 * time.Second
	podRemoveTimeout       = 90 * time.Second
)

// Status is what Up found or did.
type Status struct {
	ContainerdPID, KubeletPID int
	// Started lists what Up (re)started; empty when all ran already.
	Started []string
	// ContainerdReady and KubeletReady are the time from start to ready
	// of what Up started (zero when it was running).
	ContainerdReady, KubeletReady time.Duration
	// Imported lists the image tarballs imported this time.
	Imported []string
}

// nodeBins are what hack/build-node.sh builds.
var nodeBins = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl"}

// check says what is missing to run p, and what to run to get it.
func check(p *Plan) error {
	n := p.Node
	for _, b := range nodeBins {
		if !executable(filepath.Join(n.NodeBinDir, b)) {
			return fmt.Errorf("node %s: no %s in %s: run `make node` (hack/build-node.sh builds containerd, its shim, ctr, runc and crictl)", n.Name, b, n.NodeBinDir)
		}
	}
	if !executable(filepath.Join(n.KubeletBinDir, "kubelet")) {
		return fmt.Errorf("node %s: no kubelet in %s: run `hack/build-k8s.sh kubelet`", n.Name, n.KubeletBinDir)
	}
	for _, t := range []string{"nsenter", "unshare", "mount"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("node %s: %s(1) is missing: install util-linux (make deps)", n.Name, t)
		}
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(string(fss)), "overlay") {
		return fmt.Errorf("node %s: the kernel has no overlay filesystem (containerd's snapshotter): `modprobe overlay`, or a kernel with CONFIG_OVERLAY_FS", n.Name)
	}
	if err := netns.Check(n.Netns); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if _, err := os.Stat(n.Kubeconfig); err != nil {
		return fmt.Errorf("node %s: kubelet kubeconfig: %w", n.Name, err)
	}
	return nil
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Up brings node n up, or checks that it is: its cgroups, files, mount
// namespace, containerd (with the images imported) and kubelet. What
// already runs with an unchanged config is left alone; a changed config
// restarts its daemon. log gets one line per step taken; it may be nil.
func Up(ctx context.Context, n Node, log io.Writer) (*Status, error) {
	if log == nil {
		log = io.Discard
	}
	p, err := MakePlan(n)
	if err != nil {
		return nil, err
	}
	if err := check(p); err != nil {
		return nil, err
	}
	hier, err := hostHierarchies()
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	for _, d := range append(slices.Clone(p.Dirs), p.MountPoints...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	changed := map[string]bool{}
	for _, f := range p.Files {
		c, err := writeIfChanged(f.Path, f.Data, os.FileMode(f.Mode))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		changed[f.Path] = c
	}
	host, err := os.ReadFile(n.HostResolvConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if c, err := writeIfChanged(p.ResolvConf(), NodeResolvConf(host), 0o644); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	} else if c {
		changed[p.KubeletConfig()] = true
	}
	if err := makeCgroups(hier, p.CgroupRoot, p.ShimCgroup); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if made, err := ensureMountNS(p); err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	} else if made {
		fmt.Fprintf(log, "node %s: mount namespace %s with %d binds\n", n.Name, p.MountNS, len(p.Binds))
	}
	// Before the lab's first kubelet changes them.
	if err := RecordSysctls(n.StateDir); err != nil {
		return nil, err
	}

	st := &Status{}
	env := []string{"PATH=" + n.NodeBinDir + ":" + os.Getenv("PATH")} // containerd finds its shim in PATH
	if st.ContainerdPID, st.ContainerdReady, err = bringUp(ctx, p, p.Containerd, env, changed, WaitContainerd, ContainerdReadyTimeout, st, log); err != nil {
		return nil, err
	}
	if st.Imported, err = importImages(ctx, p, log); err != nil {
		return nil, err
	}
	if st.KubeletPID, st.KubeletReady, err = bringUp(ctx, p, p.Kubelet, nil, changed, WaitKubelet, KubeletReadyTimeout, st, log); err != nil {
		return nil, err
	}
	return st, nil
}

// bringUp ensures daemon d runs and waits until ready says so; it returns
// d's PID and, when it started d, the time from start to ready.
func bringUp(ctx context.Context, p *Plan, d Daemon, env []string, changed map[string]bool,
	ready func(context.Context, *Plan, time.Duration) error, timeout time.Duration, st *Status, log io.Writer) (int, time.Duration, error) {
	pid, started, err := ensureDaemon(p, d, env, changed[d.Config], log)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := ready(ctx, p, timeout); err != nil {
		return 0, 0, err
	}
	if !started {
		return pid, 0, nil
	}
	took := time.Since(t0)
	st.Started = append(st.Started, d.Name)
	fmt.Fprintf(log, "node %s: %s ready in %v\n", p.Node.Name, d.Name, took.Round(time.Millisecond))
	return pid, took, nil
}

// writeIfChanged writes data to path unless it holds data already, and
// says whether it wrote.
func writeIfChanged(path string, data []byte, mode os.FileMode) (bool, error) {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return false, nil
	}
	return true, atomicfile.WriteFile(path, data, mode)
}

// ensureDaemon starts d in the node's namespaces unless it runs; a running
// d whose config changed is restarted. It returns d's PID and whether it
// started it.
func ensureDaemon(p *Plan, d Daemon, env []string, changed bool, log io.Writer) (int, bool, error) {
	n := p.Node
	if pid, ok := proc.Running(n.Dir, d.Name); ok {
		if !changed {
			return pid, false, nil
		}
		fmt.Fprintf(log, "node %s: %s config changed; restarting\n", n.Name, d.Name)
		if err := proc.Stop(n.Dir, d.Name, stopGrace); err != nil {
			return 0, false, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	pid, err := proc.StartVia(d.Name, p.Wrapper, d.Argv, env, n.Dir, n.Netns)
	if err != nil {
		return 0, false, fmt.Errorf("node %s: %w", n.Name, err)
	}
	fmt.Fprintf(log, "node %s: started %s (pid %d)\n", n.Name, d.Name, pid)
	return pid, true, nil
}

// ensureMountNS makes the node's mount namespace unless it exists: a
// slave copy of the host's mounts, held by a bind mount of its nsfs file
// at MountNS (no process needs to live in it), with p.Binds inside.
func ensureMountNS(p *Plan) (bool, error) {
	if isNsfs(p.MountNS) {
		return false, nil
	}
	// The nsfs file must sit on a private mount: on a shared one the bind
	// would propagate into the new namespace itself.
	if err := unix.Mount("", p.RunDir, "", unix.MS_PRIVATE, ""); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			return false, fmt.Errorf("making %s private: %w", p.RunDir, err)
		}
		if err := unix.Mount(p.RunDir, p.RunDir, "", unix.MS_BIND, ""); err != nil {
			return false, fmt.Errorf("bind-mounting %s onto itself: %w", p.RunDir, err)
		}
		if err := unix.Mount("", p.RunDir, "", unix.MS_PRIVATE, ""); err != nil {
			return false, fmt.Errorf("making %s private: %w", p.RunDir, err)
		}
	}
	if err := os.WriteFile(p.MountNS, nil, 0o644); err != nil {
		return false, err
	}
	if err := run("unshare", "--mount="+p.MountNS, "--propagation", "slave", "true"); err != nil {
		return false, fmt.Errorf("creating the node's mount namespace: %w", err)
	}
	for _, b := range p.Binds {
		if err := run("nsenter", "--mount="+p.MountNS, "--", "mount", "--bind", b.Source, b.Target); err != nil {
			_ = unix.Unmount(p.MountNS, unix.MNT_DETACH)
			return false, fmt.Errorf("bind mount in the node's mount namespace: %w", err)
		}
	}
	return true, nil
}

func isNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// crictl runs crictl against the node's containerd.
func crictl(ctx context.Context, p *Plan, args ...string) ([]byte, error) {
	argv := append([]string{"--runtime-endpoint", "unix://" + p.Socket, "--timeout", "10s"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(p.Node.NodeBinDir, "crictl"), argv...)
	cmd.Env = append(os.Environ(), "CONTAINER_RUNTIME_ENDPOINT=unix://"+p.Socket, "IMAGE_SERVICE_ENDPOINT=unix://"+p.Socket)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// WaitContainerd waits until the node's containerd answers the CRI's
// Version call on its socket.
func WaitContainerd(ctx context.Context, p *Plan, timeout time.Duration) error {
	return wait(ctx, p, p.Containerd.Name, timeout, func(ctx context.Context) error {
		_, err := crictl(ctx, p, "version")
		return err
	})
}

// WaitKubelet waits until the node's kubelet answers /healthz on
// KubeletHealthz inside the node's network namespace.
func WaitKubelet(ctx context.Context, p *Plan, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// The socket is made inside the namespace and stays there.
			var c net.Conn
			err := netns.Do(p.Node.Netns, func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	return wait(ctx, p, p.Kubelet.Name, timeout, func(ctx context.Context) error {
		return httpserver.CheckOK(ctx, client, "http://"+KubeletHealthz+"/healthz")
	})
}

// wait polls ready until it succeeds, daemon name dies, or timeout.
func wait(ctx context.Context, p *Plan, name string, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logf := proc.LogFile(p.Node.Dir, name)
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		if _, ok := proc.Running(p.Node.Dir, name); !ok {
			return fmt.Errorf("node %s: %s exited while starting; see %s:\n%s", p.Node.Name, name, logf, proc.Tail(logf, 15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s: %s not ready after %v: %v; see %s:\n%s", p.Node.Name, name, timeout, err, logf, proc.Tail(logf, 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// importImages imports each tarball not imported before into the k8s.io
// namespace (the CRI's). A stamp per tarball (path, size, modification
// time) under the node's dir skips it next time; containerd's root lives
// as long as the stamps.
func importImages(ctx context.Context, p *Plan, log io.Writer) ([]string, error) {
	var done []string
	for _, tar := range p.Node.Images {
		st, err := os.Stat(tar)
		if err != nil {
			return done, fmt.Errorf("node %s: image tarball: %w", p.Node.Name, err)
		}
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", tar, st.Size(), st.ModTime().UnixNano()))
		stamp := filepath.Join(p.ImageStamps(), hex.EncodeToString(sum[:16]))
		if _, err := os.Stat(stamp); err == nil {
			continue
		}
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, filepath.Join(p.Node.NodeBinDir, "ctr"), "--address", p.Socket, "--namespace", "k8s.io",
			"images", "import", "--snapshotter", "overlayfs", tar)
		if out, err := cmd.CombinedOutput(); err != nil {
			return done, fmt.Errorf("node %s: importing %s: %w: %s", p.Node.Name, tar, err, bytes.TrimSpace(out))
		}
		if err := os.WriteFile(stamp, []byte(tar+"\n"), 0o644); err != nil {
			return done, err
		}
		fmt.Fprintf(log, "node %s: imported %s in %v\n", p.Node.Name, filepath.Base(tar), time.Since(t0).Round(time.Millisecond))
		done = append(done, tar)
	}
	return done, nil
}

// Down takes node n down and leaves nothing of it: the kubelet stops
// first (so it restarts no pod), then every pod sandbox is removed through
// the CRI (the CNI DEL that frees its address), then containerd; what is
// left (shims, containers) is killed by the node's owner mark and cgroup;
// the mount namespace goes, and every mount made in it with it; the cgroups
// are removed depth-first in every hierarchy, and the node's dir. The host
// sysctls are the lab's: RestoreSysctls after the last node. Safe to call
// on a node half up or already down.
func Down(ctx context.Context, n Node) error {
	p, err := MakePlan(n)
	if err != nil {
		return err
	}
	var errs []error
	if err := proc.Stop(n.Dir, p.Kubelet.Name, stopGrace); err != nil {
		errs = append(errs, err)
	}
	if _, ok := proc.Running(n.Dir, p.Containerd.Name); ok {
		rctx, cancel := context.WithTimeout(ctx, podRemoveTimeout)
		if _, err := crictl(rctx, p, "rmp", "--all", "--force"); err != nil {
			errs = append(errs, fmt.Errorf("node %s: removing pods: %w", n.Name, err))
		}
		cancel()
	}
	if err := proc.Stop(n.Dir, p.Containerd.Name, stopGrace); err != nil {
		errs = append(errs, err)
	}
	// Shims (they carry containerd's environment, so its owner mark)
	// and anything else this node started.
	killAll(proc.Scan(func(pid int) bool { return proc.OwnedBy(pid, n.Dir) }))
	if hier, err := hostHierarchies(); err != nil {
		errs = append(errs, err)
	} else if err := removeCgroups(hier, p.CgroupRoot); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	if _, err := mountinfo.UnmountUnder(n.Dir); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// killAll SIGKILLs pids and waits (up to 10s) for them to be gone.
func killAll(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !slices.ContainsFunc(pids, alive) {
			return
		}
	}
}

// alive: a process that exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) <= i+2 || (b[i+2] != 'Z' && b[i+2] != 'X')
}
