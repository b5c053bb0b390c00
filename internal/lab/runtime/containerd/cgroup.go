package containerd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/mountinfo"
)

// Hierarchies returns the mount points of the cgroup hierarchies in a mount
// table (/proc/self/mountinfo: every v1 controller hierarchy, name=systemd, and the v2
// "unified" one of a hybrid host), mounted at their root: the kubelet
// wants its cgroupRoot in each, and runc creates cgroups in each.
func Hierarchies(table []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 5 || sep+1 >= len(f) || f[3] != "/" {
			continue
		}
		if t, mp := f[sep+1], mountinfo.Unescape(f[4]); (t == "cgroup" || t == "cgroup2") && !slices.Contains(out, mp) {
			out = append(out, mp)
		}
	}
	return out
}

func hostHierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	h := Hierarchies(b)
	if len(h) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted (want /sys/fs/cgroup)")
	}
	return h, nil
}

// makeCgroups creates each of paths in every hierarchy. A new v1 cpuset
// cgroup starts with no CPUs and no memory nodes, where no task may run:
// it gets its parent's.
func makeCgroups(hierarchies []string, paths ...string) error {
	for _, h := range hierarchies {
		for _, p := range paths {
			dir := filepath.Join(h, p)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("creating cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				cur, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil || len(bytes.TrimSpace(cur)) > 0 {
					continue // not a v1 cpuset hierarchy, or set
				}
				parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
				if err != nil {
					return fmt.Errorf("reading %s of %s's parent: %w", f, dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), bytes.TrimSpace(parent), 0o644); err != nil {
					return fmt.Errorf("setting %s of %s: %w", f, dir, err)
				}
			}
		}
	}
	return nil
}

// cgroupPIDs returns the processes in root and below, in every hierarchy.
func cgroupPIDs(hierarchies []string, root string) []int {
	var pids []int
	for _, h := range hierarchies {
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, l := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(l); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroups kills what still runs in root (the node's containers: no
// process outside the node's cgroup root is touched) and removes root's
// tree depth-first in every hierarchy.
func removeCgroups(hierarchies []string, root string) error {
	for try := 0; ; try++ {
		pids := cgroupPIDs(hierarchies, root)
		if len(pids) == 0 {
			break
		}
		if try == 50 {
			return fmt.Errorf("cgroup %s: processes %v still running 5s after SIGKILL", root, pids)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, h := range hierarchies {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		// Children before parents: WalkDir lists parents first.
		for _, d := range slices.Backward(dirs) {
			if err := rmdirRetry(d); err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// rmdirRetry removes an empty cgroup; EBUSY lasts a moment after its last
// task exited.
func rmdirRetry(dir string) error {
	for try := 0; ; try++ {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || try == 50 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
