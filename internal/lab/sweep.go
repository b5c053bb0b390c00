package lab

// Processes inside the lab's namespaces. Everything running in a node's
// or a pod's network namespace was started by the lab (agents) or by its
// runtime (containers), so `down` stops those processes by namespace: it
// still works when an agent died and left its pods behind. A process is
// identified by the namespace inode its /proc/PID/ns/net points to, and it
// is signalled through a pidfd opened before that check, so a recycled PID
// is never hit.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/proc"
)

// netnsInode returns the inode of a named namespace's bind mount, the
// same number /proc/PID/ns/net links to ("net:[INODE]").
func netnsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// pidNetns returns the namespace inode of pid.
func pidNetns(pid int) (uint64, bool) {
	l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return 0, false
	}
	l = strings.TrimSuffix(strings.TrimPrefix(l, "net:["), "]")
	ino, err := strconv.ParseUint(l, 10, 64)
	return ino, err == nil
}

// cmdline returns a process's command line for messages.
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// stopInNetns stops every process inside the namespaces with the given
// inodes: SIGTERM, up to grace to exit, then SIGKILL. It returns the
// command lines of the processes it signalled.
func stopInNetns(inodes map[uint64]bool, grace time.Duration) ([]string, error) {
	if len(inodes) == 0 {
		return nil, nil
	}
	return stopMatching(func(pid int) bool {
		ino, ok := pidNetns(pid)
		return ok && inodes[ino]
	}, grace)
}

// stopDaemonsOf stops the daemons of the lab with state dir dir (see
// daemonOf) whose command line is accepts, as stopInNetns does: down
// calls it for those whose pid files were lost or cut short. It says what
// it stopped, for down's report.
func stopDaemonsOf(dir string, is func(argv []string) bool, grace time.Duration) (string, error) {
	stopped, err := stopMatching(func(pid int) bool {
		argv := daemonOf(pid, dir)
		return argv != nil && is(argv)
	}, grace)
	if len(stopped) == 0 {
		return "", err
	}
	return fmt.Sprintf(", %d without a usable pid file stopped (%s)", len(stopped), strings.Join(stopped, "; ")), err
}

// flatnetDaemon matches the lab's flatnet daemons of one kind (its first
// argument: "agent", "controller").
func flatnetDaemon(kind string) func(argv []string) bool {
	return func(argv []string) bool {
		return len(argv) > 1 && filepath.Base(argv[0]) == "flatnet" && argv[1] == kind
	}
}

func anyDaemon([]string) bool { return true }

// daemonOf returns the command line of process pid when it is a daemon of
// the lab with state dir dir: it runs one of the lab's copies of flatnet
// (under dir), or it is etcd or kube-apiserver with an argument under dir.
// Anything else naming the dir (a `tail -f` of a log) is not.
func daemonOf(pid int, dir string) []string {
	argv, err := readArgv(pid)
	if err != nil || len(argv) == 0 {
		return nil
	}
	if strings.HasPrefix(argv[0], dir+"/") {
		return argv
	}
	switch filepath.Base(argv[0]) {
	case "etcd", "kube-apiserver":
		if slices.ContainsFunc(argv[1:], func(a string) bool { return strings.Contains(a, dir+"/") }) {
			return argv
		}
	}
	return nil
}

// stopMatching stops every process (but this one) for which match is
// true: SIGTERM, up to grace to exit, then SIGKILL. It returns the command
// lines of the processes it signalled.
func stopMatching(match func(pid int) bool, grace time.Duration) ([]string, error) {
	type target struct {
		pid, fd int
	}
	var targets []target
	var stopped []string
	for _, pid := range proc.Scan(match) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		// Checked after opening the pidfd, so the pidfd is this process.
		if !match(pid) {
			unix.Close(fd)
			continue
		}
		stopped = append(stopped, fmt.Sprintf("%d %s", pid, cmdline(pid)))
		targets = append(targets, target{pid, fd})
	}
	defer func() {
		for _, t := range targets {
			unix.Close(t.fd)
		}
	}()
	signal := func(sig unix.Signal) {
		for _, t := range targets {
			_ = unix.PidfdSendSignal(t.fd, sig, nil, 0)
		}
	}
	exited := func(fd int) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	}
	waitAll := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for {
			all := true
			for _, t := range targets {
				if !exited(t.fd) {
					all = false
					break
				}
			}
			if all {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if len(targets) == 0 {
		return nil, nil
	}
	signal(unix.SIGTERM)
	if waitAll(grace) {
		return stopped, nil
	}
	signal(unix.SIGKILL)
	if !waitAll(10 * time.Second) {
		return stopped, errors.New("processes still alive 10s after SIGKILL")
	}
	return stopped, nil
}
