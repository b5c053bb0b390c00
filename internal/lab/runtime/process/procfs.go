package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/proc"
)

// Process identity through /proc: a PID counts as ours only while its
// start time (and for members of a container, its mount namespace) still
// match what was recorded. Signals go through a pidfd opened before the
// check, so the PID cannot be recycled in between.

type procStat struct {
	state      byte
	pgid       int
	startTicks uint64
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) may hold spaces and parens: split after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field N is f[N-3].
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	pgid, _ := strconv.Atoi(f[2])
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return procStat{state: f[0][0], pgid: pgid, startTicks: ticks}, nil
}

// nsInode returns the inode of /proc/PID/ns/<kind> (mnt, net).
func nsInode(pid int, kind string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/"+kind, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func fileInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// procAlive reports whether p still runs (not a zombie) with its recorded
// start time.
func procAlive(p procID) bool {
	st, err := readProcStat(p.PID)
	return err == nil && st.startTicks == p.StartTicks && st.state != 'Z' && st.state != 'X'
}

// pidfdFor opens a pidfd for p and checks, after opening, that it is
// still the recorded process. The caller closes the fd.
func pidfdFor(p procID) (int, error) {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return -1, err
	}
	if !procAlive(p) {
		unix.Close(fd)
		return -1, unix.ESRCH
	}
	return fd, nil
}

// signalProc sends sig to p if it is still the recorded process; a
// process that is gone is not an error.
func signalProc(p procID, sig syscall.Signal) error {
	fd, err := pidfdFor(p)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("opening pid %d: %w", p.PID, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signalling pid %d: %w", p.PID, err)
	}
	return nil
}

// waitGone blocks until p has exited (or is a zombie), and reports true,
// or until stop closes, and reports false (checked every half second). It
// polls a pidfd, which becomes readable at exit.
func waitGone(p procID, stop <-chan struct{}) bool {
	fd, err := pidfdFor(p)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 500)
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return true
		}
		if !procAlive(p) {
			return true
		}
		select {
		case <-stop:
			return false
		default:
		}
	}
}

// killMembers sends SIGKILL to every process in the mount namespace mntNS
// (a container's) and, when leaderGone, only to those that are also in the
// process group pgid: once the container's first process is gone its
// namespace inode is no longer pinned, so a second fact is required.
func killMembers(mntNS uint64, pgid int, leaderGone bool) int {
	var victims []procID
	proc.Scan(func(pid int) bool {
		ino, err := nsInode(pid, "mnt")
		if err != nil || ino != mntNS {
			return false
		}
		st, err := readProcStat(pid)
		if err != nil || (leaderGone && st.pgid != pgid) {
			return false
		}
		victims = append(victims, procID{PID: pid, StartTicks: st.startTicks})
		return true
	})
	for _, v := range victims {
		_ = signalProc(v, syscall.SIGKILL)
	}
	return len(victims)
}

// killNetnsMembers kills every process whose network namespace is the one
// bind-mounted at nsPath (a pod's: everything in it belongs to the pod,
// including commands entered with `lab exec`), and waits up to wait for
// them to go. It fails if some are still there then (stuck in the kernel,
// say): the caller must keep the namespace, since deleting it would leave
// them running on in a namespace that nothing names or finds any more.
func killNetnsMembers(nsPath string, wait time.Duration) error {
	ino, err := fileInode(nsPath)
	if err != nil {
		return nil // no namespace, no members
	}
	deadline := time.Now().Add(wait)
	for {
		var victims []procID
		proc.Scan(func(pid int) bool {
			n, err := nsInode(pid, "net")
			if err != nil || n != ino {
				return false
			}
			st, err := readProcStat(pid)
			if err != nil || st.state == 'Z' {
				return false
			}
			victims = append(victims, procID{PID: pid, StartTicks: st.startTicks})
			return true
		})
		if len(victims) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			pids := make([]int, len(victims))
			for i, v := range victims {
				pids[i] = v.PID
			}
			return fmt.Errorf("processes %v still in the network namespace %s %s after SIGKILL", pids, nsPath, wait)
		}
		for _, v := range victims {
			_ = signalProc(v, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
