package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/mountinfo"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
)

// Down stops and removes lab name: agents, pods (by the runtime's state
// and by namespace, so pods of a dead agent go too), the controller, the
// control plane, the external host's server, any process still marked as
// the lab's (proc.OwnerEnv), the node namespaces, the router and external
// host, the underlay bridge and the state dir. It works from lab.json when
// there is one and from the names the lab would use otherwise, so a
// half-made or half-removed lab goes too.
func Down(root, name string, out io.Writer) error {
	if out == nil {
		out = io.Discard
	}
	if err := ValidateName(name); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("flatnet lab needs root (network namespaces, interfaces, netlink): run it with sudo")
	}
	if root == "" {
		root = DefaultStateRoot
	}
	// Without a state root there is nothing to lock, but kernel objects
	// of the lab may still exist: they are looked for all the same.
	if _, err := os.Stat(root); err == nil {
		unlock, err := lockRoot(root, out)
		if err != nil {
			return err
		}
		defer unlock()
	}
	s := &Spec{Name: name, StateDir: filepath.Join(root, name), Bridge: BridgeName(name), PodNetnsPrefix: PodNetnsPrefix(name)}
	if rec, err := loadRecord(root, name); err == nil {
		s = &rec.Spec
	}
	nodes := discoverNodes(s)
	podNS := discoverPodNetns(s, nodes)
	k := newKernel("")
	bridge, err := k.linkExists(s.Bridge)
	if err != nil {
		return err
	}
	extras := extraNetns(name)
	marked := proc.Scan(func(pid int) bool { return proc.OwnedBy(pid, s.StateDir) })
	if !fileExists(s.StateDir) && len(nodes) == 0 && len(podNS) == 0 && !bridge && len(extras) == 0 && len(marked) == 0 {
		fmt.Fprintf(out, "lab %s: nothing to remove (no state dir %s, no namespaces, no bridge %s)\n", name, s.StateDir, s.Bridge)
		return nil
	}

	var errs []error
	step := func(what string, fn func() (string, error)) {
		t0 := time.Now()
		fmt.Fprintf(out, "%-16s ...", what)
		detail, err := fn()
		if err != nil {
			fmt.Fprintf(out, " failed: %v\n", err)
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			return
		}
		if detail != "" {
			detail = ": " + detail
		}
		fmt.Fprintf(out, " done%s (%s)\n", detail, roundDur(time.Since(t0)))
	}

	step("real nodes", func() (string, error) {
		// containerd and the kubelet first: removing pods through the CRI
		// runs CNI DEL, which frees their addresses and veths.
		n, err := downKubelets(context.Background(), s, nodes)
		return fmt.Sprintf("%d", n), err
	})
	step("agents", func() (string, error) {
		var errs []error
		n := 0
		for _, p := range append(pidFiles(s.StateDir, "agent-"), pidFiles(s.StateDir, "gateway-")...) {
			if _, ok := proc.Running(s.StateDir, p); ok {
				n++
			}
			errs = append(errs, proc.Stop(s.StateDir, p, 10*time.Second))
		}
		// Daemons whose pid files were lost or cut short are found by
		// their command lines, here and below.
		stray, err := stopDaemonsOf(s.StateDir, flatnetDaemon("agent"), 10*time.Second)
		gstray, gerr := stopDaemonsOf(s.StateDir, flatnetDaemon("gateway"), 10*time.Second)
		return fmt.Sprintf("%d stopped%s%s", n, stray, gstray), errors.Join(append(errs, err, gerr)...)
	})
	step("pods", func() (string, error) {
		inodes := map[uint64]bool{}
		for _, ns := range podNS {
			if ino, err := netnsInode(NetnsPath(ns)); err == nil {
				inodes[ino] = true
			}
		}
		stopped, err := stopInNetns(inodes, 5*time.Second)
		if err != nil {
			// Deleted, a namespace would leave what survived SIGKILL
			// running where nothing finds it: kept for the next down.
			return fmt.Sprintf("%d namespaces kept", len(podNS)), err
		}
		var errs []error
		for _, ns := range podNS {
			errs = append(errs, netns.Delete(ns))
		}
		return fmt.Sprintf("%d namespaces, %d processes", len(podNS), len(stopped)), errors.Join(errs...)
	})
	step("controller", func() (string, error) {
		err := proc.Stop(s.StateDir, ProcController, 10*time.Second)
		stray, serr := stopDaemonsOf(s.StateDir, flatnetDaemon("controller"), 10*time.Second)
		return strings.TrimPrefix(stray, ", "), errors.Join(err, serr)
	})
	step("control plane", func() (string, error) {
		return "", controlplane.Down(s.StateDir)
	})
	step("other daemons", func() (string, error) {
		// Anything else the lab started through proc (a pid file left by
		// a failed down, a future daemon).
		var errs []error
		left := pidFiles(s.StateDir, "")
		for _, p := range left {
			errs = append(errs, proc.Stop(s.StateDir, p, 10*time.Second))
		}
		stray, err := stopDaemonsOf(s.StateDir, anyDaemon, 10*time.Second)
		return fmt.Sprintf("%d%s", len(left), stray), errors.Join(append(errs, err)...)
	})
	step("stragglers", func() (string, error) {
		// Whatever still carries the lab's mark: a container whose pod
		// namespace was deleted under it (no inode leads to it any more),
		// a daemon's child.
		stopped, err := stopMatching(func(pid int) bool { return proc.OwnedBy(pid, s.StateDir) }, 5*time.Second)
		if len(stopped) == 0 {
			return "none", err
		}
		return fmt.Sprintf("%d stopped (%s)", len(stopped), strings.Join(stopped, "; ")), err
	})
	step("nodes", func() (string, error) {
		inodes := map[uint64]bool{}
		for _, n := range nodes {
			if ino, err := netnsInode(NetnsPath(n.Netns)); err == nil {
				inodes[ino] = true
			}
		}
		stopped, err := stopInNetns(inodes, 5*time.Second)
		errs := []error{err}
		for _, n := range nodes {
			errs = append(errs, k.removeNode(n, RouterNetns(name)))
		}
		detail := fmt.Sprintf("%d namespaces", len(nodes))
		if len(stopped) > 0 {
			detail += fmt.Sprintf(", %d stray processes stopped (%s)", len(stopped), strings.Join(stopped, "; "))
		}
		return detail, errors.Join(errs...)
	})
	step("router, external", func() (string, error) {
		// The external host's server stopped with the other daemons;
		// anything else inside these namespaces is a stray.
		inodes := map[uint64]bool{}
		for _, ns := range extras {
			if ino, err := netnsInode(NetnsPath(ns)); err == nil {
				inodes[ino] = true
			}
		}
		stopped, err := stopInNetns(inodes, 5*time.Second)
		errs := []error{err, k.removeRouter(name), k.removeExternal(name)}
		detail := fmt.Sprintf("%d namespaces", len(extras))
		if len(stopped) > 0 {
			detail += fmt.Sprintf(", %d stray processes stopped (%s)", len(stopped), strings.Join(stopped, "; "))
		}
		return detail, errors.Join(errs...)
	})
	step("underlay", func() (string, error) {
		return s.Bridge, k.removeBridge(s)
	})
	step("mounts", func() (string, error) {
		n, err := mountinfo.UnmountUnder(s.StateDir)
		return fmt.Sprintf("%d", n), err
	})
	if len(errs) == 0 {
		step("state dir", func() (string, error) {
			return s.StateDir, os.RemoveAll(s.StateDir)
		})
	}
	if len(errs) > 0 {
		return fmt.Errorf("lab %s: down did not finish (the state dir %s is kept so that `flatnet lab down%s` can try again): %w", name, s.StateDir, nameFlag(name), errors.Join(errs...))
	}
	if left := leftovers(k, s); len(left) > 0 {
		return fmt.Errorf("lab %s: still present after down: %s", name, strings.Join(left, ", "))
	}
	fmt.Fprintf(out, "lab %s removed\n", name)
	return nil
}

// extraNetns lists the router and external host namespaces of lab name
// that exist.
func extraNetns(name string) []string {
	var out []string
	for _, ns := range []string{RouterNetns(name), ExternalNetns(name)} {
		if fileExists(NetnsPath(ns)) {
			out = append(out, ns)
		}
	}
	return out
}

// pidFiles lists the daemon names with pid files starting with prefix.
func pidFiles(stateDir, prefix string) []string {
	m, _ := filepath.Glob(filepath.Join(stateDir, "pids", prefix+"*.pid"))
	var out []string
	for _, p := range m {
		out = append(out, strings.TrimSuffix(filepath.Base(p), ".pid"))
	}
	return out
}

// discoverNodes is s's nodes plus any node namespace of the lab that
// exists (a lab.json that is lost or older than the last up).
func discoverNodes(s *Spec) []Node {
	seen := map[string]bool{}
	var nodes []Node
	for _, n := range s.Nodes {
		nodes = append(nodes, n)
		seen[n.Netns] = true
	}
	re := nodeNetnsPattern(s.Name)
	ents, _ := os.ReadDir(netns.RunDir)
	for _, e := range ents {
		m := re.FindStringSubmatch(e.Name())
		if m == nil || seen[e.Name()] {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		nodes = append(nodes, Node{Index: i, Name: NodeName(s.Name, i), Netns: e.Name(),
			HostVeth: ifName("fl-", s.Name, "-n"+strconv.Itoa(i))})
	}
	return nodes
}

// discoverPodNetns lists the lab's pod namespaces: those the runtime
// recorded (pods/<ns>_<name>/netns under each node's runtime dir) and
// those in /run/netns named like the lab's pods.
func discoverPodNetns(s *Spec, nodes []Node) []string {
	set := map[string]bool{}
	for _, n := range nodes {
		m, _ := filepath.Glob(filepath.Join(s.RuntimeDir(n), "pods", "*", "netns"))
		for _, f := range m {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			v := strings.TrimSpace(string(b))
			if v == "" {
				continue
			}
			if strings.HasPrefix(v, "/") {
				if filepath.Dir(v) != netns.RunDir {
					continue
				}
				v = filepath.Base(v)
			}
			set[v] = true
		}
	}
	re := podNetnsPattern(s.Name)
	ents, _ := os.ReadDir(netns.RunDir)
	for _, e := range ents {
		if re.MatchString(e.Name()) {
			set[e.Name()] = true
		}
	}
	var out []string
	for ns := range set {
		out = append(out, ns)
	}
	sort.Strings(out)
	return out
}

// leftovers names what of lab s still exists.
func leftovers(k kernel, s *Spec) []string {
	var left []string
	if ok, _ := k.linkExists(s.Bridge); ok {
		left = append(left, "bridge "+s.Bridge)
	}
	for _, n := range discoverNodes(&Spec{Name: s.Name, StateDir: s.StateDir}) {
		left = append(left, "netns "+n.Netns)
	}
	for _, ns := range extraNetns(s.Name) {
		left = append(left, "netns "+ns)
	}
	for _, n := range s.Nodes {
		if ok, _ := k.linkExists(n.HostVeth); ok {
			left = append(left, "interface "+n.HostVeth)
		}
	}
	for _, v := range []string{RouterVeth(s.Name), ExternalVeth(s.Name)} {
		if ok, _ := k.linkExists(v); ok {
			left = append(left, "interface "+v)
		}
	}
	for _, ns := range discoverPodNetns(&Spec{Name: s.Name, StateDir: s.StateDir}, nil) {
		left = append(left, "netns "+ns)
	}
	if fileExists(s.StateDir) {
		left = append(left, "state dir "+s.StateDir)
	}
	for _, pid := range proc.Scan(func(pid int) bool { return proc.OwnedBy(pid, s.StateDir) }) {
		left = append(left, fmt.Sprintf("process %d %s", pid, cmdline(pid)))
	}
	return left
}
