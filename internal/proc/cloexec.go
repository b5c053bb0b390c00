package proc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Inherited file descriptors. Go opens every fd close-on-exec, but a
// process inherits whatever its parent left open without that flag (a
// shell's redirections, `flock FILE cmd`'s lock), and os/exec passes all of
// them on to its children: a lab daemon or a container would hold the
// user's lock file or socket for as long as it runs. Real runtimes (runc,
// systemd, containerd) close everything but 0, 1 and 2; here every fd from
// 3 up is marked close-on-exec instead, so that this process keeps using
// what it has and no program it execs gets any of it.

// CloseOnExecFrom marks every open fd >= from close-on-exec: with
// close_range(2) (Linux 5.11), else fd by fd through /proc/self/fd.
func CloseOnExecFrom(from int) error {
	err := unix.CloseRange(uint(from), math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("close_range(%d, ~0, CLOSE_RANGE_CLOEXEC): %w", from, err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("marking inherited fds close-on-exec: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < from {
			continue
		}
		// EBADF: the fd ReadDir itself used, closed since.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("marking fd %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}

// FDs returns the open fds of process pid and what each refers to (the
// target of /proc/PID/fd/N: a path, "socket:[...]", "pipe:[...]").
func FDs(pid int) (map[int]string, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil {
			out[fd] = l
		}
	}
	return out, nil
}
