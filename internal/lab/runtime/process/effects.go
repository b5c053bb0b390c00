package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
)

// The runtime's effects, each behind a small interface so that the worker
// can be tested with fakes: the pod network (CNI), pod network namespaces,
// and container processes.

// network attaches pod sandboxes through CNI.
type network interface {
	// ready returns nil when a network configuration exists.
	ready() error
	add(ctx context.Context, a cniAttachment) (ips []string, err error)
	del(ctx context.Context, a cniAttachment) error
	// cached returns the attachments made for the pod namespace/name
	// and not yet deleted (recovery of a lost record).
	cached(namespace, name string) ([]cniAttachment, error)
}

// namespaces makes pod network namespaces.
type namespaces interface {
	create(name string) (path string, err error) // with lo up
	remove(name string) error
	exists(name string) bool
}

// procSpec is one container process to start.
type procSpec struct {
	NetnsPath  string // "" runs in the agent's own namespace (hostNetwork)
	Argv       []string
	Env        []string
	Workdir    string
	Hostname   string
	ResolvFile string
	HostsFile  string
	LogPath    string
}

// exitInfo is how a process ended. Known is false for a process the
// runtime did not start itself (adopted after a restart): then only the
// fact that it ended is known.
type exitInfo struct {
	Code   int32
	Signal int32
	Known  bool
	At     time.Time
}

// processes starts and stops container processes.
type processes interface {
	// start runs spec and returns its identity and a channel that gets
	// its exit.
	start(spec procSpec) (procID, <-chan exitInfo, error)
	// adopt watches a process started by an earlier agent; ok is false
	// if it is not running any more. The watch ends with ctx (or the
	// exit) and then closes exits.
	adopt(ctx context.Context, p procID) (exits <-chan exitInfo, ok bool)
	// signal sends sig to the container's first process.
	signal(p procID, sig syscall.Signal) error
	// killAll kills every remaining process of the container.
	killAll(p procID)
	// killNetns kills every process in the pod network namespace; an
	// error says some are still there.
	killNetns(nsPath string) error
	// identify returns the identity of pid if it is a container's first
	// process, in the network namespace at nsPath when that is set
	// (recovery of a lost record from a pid file).
	identify(pid int, nsPath string) (procID, bool)
}

// --- CNI through libcni ---

type cniNetwork struct {
	confDir, cacheDir string
	binDirs           []string
	hostNS            string      // tests: run plugins in this netns
	metrics           *CNIMetrics // nil: not timed
}

// loadConfList loads the first network configuration in confDir in
// lexical order, as the kubelet/containerd do.
func loadConfList(confDir string) (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("reading CNI config dir %s: %w", confDir, err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI network config in %s (the agent writes it once the node has a pod CIDR)", confDir)
	}
	var errs []error
	for _, f := range files {
		var list *libcni.NetworkConfigList
		if filepath.Ext(f) == ".conflist" {
			list, err = libcni.ConfListFromFile(f)
		} else {
			var c *libcni.NetworkConfig
			if c, err = libcni.ConfFromFile(f); err == nil {
				list, err = libcni.ConfListFromConf(c)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		return list, nil
	}
	return nil, fmt.Errorf("no valid CNI network config in %s: %w", confDir, errors.Join(errs...))
}

func (n *cniNetwork) ready() error {
	_, err := loadConfList(n.confDir)
	return err
}

func (n *cniNetwork) cni() *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(n.binDirs, n.cacheDir, nil)
}

func (n *cniNetwork) inHost(fn func() error) error {
	if n.hostNS == "" {
		return fn()
	}
	return netns.Do(n.hostNS, fn)
}

func rtConf(a cniAttachment) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: a.SandboxID, NetNS: a.NetnsPath, IfName: a.IfName, Args: a.Args, CapabilityArgs: a.Caps}
}

func (n *cniNetwork) add(ctx context.Context, a cniAttachment) ([]string, error) {
	list, err := loadConfList(n.confDir)
	if err != nil {
		return nil, err
	}
	var res types.Result
	err = n.inHost(func() error {
		var err error
		start := time.Now()
		res, err = n.cni().AddNetworkList(ctx, list, rtConf(a))
		n.metrics.observe(cniAdd, time.Since(start), err)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("CNI ADD (network %q): %w", list.Name, err)
	}
	ips, err := resultIPs(res, a.IfName)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD (network %q): %w", list.Name, err)
	}
	return ips, nil
}

// resultIPs returns the pod's addresses from a CNI result: the first of
// each family on the pod's interface, IPv4 first.
func resultIPs(res types.Result, ifName string) ([]string, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("reading the result: %w", err)
	}
	var v4, v6 []string
	for _, ip := range r.IPs {
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(r.Interfaces) {
			itf := r.Interfaces[*ip.Interface]
			if itf.Sandbox == "" || itf.Name != ifName {
				continue
			}
		}
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		// The API takes one address per family, the first one.
		if a.Unmap().Is4() && v4 == nil {
			v4 = []string{a.Unmap().String()}
		} else if !a.Unmap().Is4() && v6 == nil {
			v6 = []string{a.String()}
		}
	}
	ips := append(v4, v6...)
	if len(ips) == 0 {
		return nil, errors.New("the result has no IP address for the pod")
	}
	return ips, nil
}

// del runs CNI DEL with the configuration ADD used (from libcni's cache),
// or the current one when there is no cache entry.
func (n *cniNetwork) del(ctx context.Context, a cniAttachment) error {
	c := n.cni()
	var list *libcni.NetworkConfigList
	rt := rtConf(a)
	if atts, err := c.GetCachedAttachments(a.SandboxID); err == nil {
		for _, att := range atts {
			if att.IfName != a.IfName {
				continue
			}
			if l, err := libcni.ConfListFromBytes(att.Config); err == nil {
				list = l
				rt.Args = att.CniArgs
				rt.CapabilityArgs = att.CapabilityArgs
				break
			}
		}
	}
	if list == nil {
		var err error
		if list, err = loadConfList(n.confDir); err != nil {
			return fmt.Errorf("CNI DEL: no cached config for sandbox %s and %w", a.SandboxID, err)
		}
	}
	err := n.inHost(func() error {
		start := time.Now()
		err := c.DelNetworkList(ctx, list, rt)
		n.metrics.observe(cniDel, time.Since(start), err)
		return err
	})
	if err != nil {
		return fmt.Errorf("CNI DEL (network %q): %w", list.Name, err)
	}
	return nil
}

// cached reads libcni's cache: it keeps each attachment, with its
// CNI_ARGS and netns, until DEL.
func (n *cniNetwork) cached(namespace, name string) ([]cniAttachment, error) {
	atts, err := n.cni().GetCachedAttachments("")
	if err != nil {
		return nil, fmt.Errorf("reading the CNI cache in %s: %w", n.cacheDir, err)
	}
	var out []cniAttachment
	for _, a := range atts {
		if argValue(a.CniArgs, "K8S_POD_NAMESPACE") == namespace && argValue(a.CniArgs, "K8S_POD_NAME") == name {
			out = append(out, cniAttachment{SandboxID: a.ContainerID, NetnsPath: a.NetNS, IfName: a.IfName, Args: a.CniArgs})
		}
	}
	return out, nil
}

// --- network namespaces ---

const netnsRunDir = netns.RunDir

type realNamespaces struct{}

func (realNamespaces) create(name string) (string, error) {
	path, err := netns.Create(name)
	if err != nil {
		return "", err
	}
	err = netns.Do(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		_ = netns.Delete(name)
		return "", fmt.Errorf("setting lo up in %s: %w", name, err)
	}
	return path, nil
}

func (realNamespaces) remove(name string) error { return netns.Delete(name) }

func (realNamespaces) exists(name string) bool {
	return netns.Check(filepath.Join(netnsRunDir, name)) == nil
}

// --- processes ---

type realProcesses struct {
	initBin string // the flatnet binary that has container-init
	hostNS  string // tests: where host-network containers run
	// owner is the runtime's state dir: every container carries it as
	// proc.OwnerEnv, so that whatever outlives the runtime's bookkeeping
	// (a container whose netns was deleted under it) is still found.
	owner string
}

// initBinary picks the flatnet binary for container-init: the one on the
// pods' PATH, else this very program.
func initBinary(podPath string) (string, error) {
	for _, dir := range filepath.SplitList(podPath) {
		p := filepath.Join(dir, "flatnet")
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the flatnet binary for container-init: %w", err)
	}
	return self, nil
}

func (r *realProcesses) start(spec procSpec) (procID, <-chan exitInfo, error) {
	if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o755); err != nil {
		return procID{}, nil, err
	}
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, stateFileMode)
	if err != nil {
		return procID{}, nil, fmt.Errorf("opening container log: %w", err)
	}
	defer logf.Close()
	// A log created by an older runtime (0644) is made private too.
	if err := logf.Chmod(stateFileMode); err != nil {
		return procID{}, nil, fmt.Errorf("container log %s: %w", spec.LogPath, err)
	}
	args := []string{r.initBin, "container-init", "--hostname", spec.Hostname, "--resolv", spec.ResolvFile, "--hosts", spec.HostsFile}
	if spec.Workdir != "" {
		args = append(args, "--workdir", spec.Workdir)
	}
	args = append(append(args, "--"), spec.Argv...)
	cmd := &exec.Cmd{
		Path:   r.initBin,
		Args:   args,
		Env:    append(slices.Clone(spec.Env), proc.OwnerEntry(r.owner)),
		Dir:    "/",
		Stdout: logf,
		Stderr: logf,
		// Own session (the agent's signals and process group are not the
		// container's), own mount and UTS namespaces. No Pdeathsig: the
		// containers outlive an agent restart.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS},
	}
	// The exec handshake: container-init inherits the pipe's write end as
	// fd 3 and marks it close-on-exec with every other fd; the read end
	// sees EOF once the container's command has replaced container-init
	// (or container-init died). Until then the pod's resolv.conf and
	// hosts may not be mounted yet, so the container is not started
	// before it: a pod reported Running has its files in place, as with
	// runc, whose start returns after the exec.
	execR, execW, err := os.Pipe()
	if err != nil {
		return procID{}, nil, fmt.Errorf("exec handshake pipe: %w", err)
	}
	defer execR.Close()
	cmd.ExtraFiles = []*os.File{execW}
	startFn := cmd.Start
	nsPath := spec.NetnsPath
	if nsPath == "" {
		nsPath = r.hostNS
	}
	if nsPath != "" {
		// Fork from the goroutine netns.Do locked into the namespace.
		err = netns.Do(nsPath, startFn)
	} else {
		err = startFn()
	}
	execW.Close()
	if err != nil {
		return procID{}, nil, fmt.Errorf("starting %s: %w", spec.Argv[0], err)
	}
	waitExec(execR, execWaitLimit)
	pid := cmd.Process.Pid
	id := procID{PID: pid}
	st, serr := readProcStat(pid)
	mnt, merr := nsInode(pid, "mnt")
	if serr != nil || merr != nil {
		// It died at once; Wait still reports how.
		st.startTicks, mnt = 0, 0
	}
	id.StartTicks, id.MntNS = st.startTicks, mnt
	exits := make(chan exitInfo, 1)
	go func() {
		_ = cmd.Wait()
		exits <- exitFromState(cmd.ProcessState)
	}()
	return id, exits, nil
}

// execWaitLimit bounds the wait for container-init's exec: a container-init
// stuck in a mount must not stall the pod's worker for good. Past it the
// container counts as started, as before the handshake.
const execWaitLimit = 10 * time.Second

// waitExec reads r until EOF (every write end closed: the exec happened or
// the process died) or until limit passes.
func waitExec(r *os.File, limit time.Duration) {
	_ = r.SetReadDeadline(time.Now().Add(limit))
	_, _ = io.Copy(io.Discard, r)
}

func exitFromState(ps *os.ProcessState) exitInfo {
	e := exitInfo{Known: true, At: time.Now()}
	if ps == nil {
		e.Known = false
		return e
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal = int32(ws.Signal())
		e.Code = 128 + e.Signal
		return e
	}
	e.Code = int32(ps.ExitCode())
	return e
}

func (r *realProcesses) adopt(ctx context.Context, p procID) (<-chan exitInfo, bool) {
	if !procAlive(p) {
		return nil, false
	}
	exits := make(chan exitInfo, 1)
	go func() {
		defer close(exits)
		if waitGone(p, ctx.Done()) {
			exits <- exitInfo{Known: false, At: time.Now()}
		}
	}()
	return exits, true
}

func (r *realProcesses) signal(p procID, sig syscall.Signal) error { return signalProc(p, sig) }

func (r *realProcesses) killAll(p procID) {
	// While the first process lives it pins the mount namespace, so the
	// scan (which includes it) runs first.
	leaderGone := !procAlive(p)
	if p.MntNS != 0 {
		killMembers(p.MntNS, p.PID, leaderGone)
	}
	if !leaderGone {
		_ = signalProc(p, syscall.SIGKILL)
	}
}

func (r *realProcesses) killNetns(nsPath string) error {
	return killNetnsMembers(nsPath, 2*time.Second)
}

// identify accepts pid as a container's first process if it leads its own
// process group (container-init runs in a session of its own) in a mount
// namespace other than the runtime's, and, with nsPath, in that network
// namespace. A recycled PID fails one of these.
func (r *realProcesses) identify(pid int, nsPath string) (procID, bool) {
	st, err := readProcStat(pid)
	if err != nil || st.state == 'Z' || st.pgid != pid {
		return procID{}, false
	}
	mnt, err := nsInode(pid, "mnt")
	self, serr := nsInode(os.Getpid(), "mnt")
	if err != nil || serr != nil || mnt == self {
		return procID{}, false
	}
	if nsPath != "" {
		want, err := fileInode(nsPath)
		net, nerr := nsInode(pid, "net")
		if err != nil || nerr != nil || net != want {
			return procID{}, false
		}
	}
	return procID{PID: pid, StartTicks: st.startTicks, MntNS: mnt}, true
}
