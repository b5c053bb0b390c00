// Package proc starts and stops the lab's long-running daemons (etcd,
// kube-apiserver, flatnet controller and agents) as detached processes that
// outlive the command that started them, and finds them again later from
// files in a state directory:
//
//	<stateDir>/pids/<name>.pid   the PID, plus what identifies the process
//	<stateDir>/logs/<name>.log   stdout and stderr, appended across restarts
//
// Design: a PID alone is not an identity. After a reboot or a crash the
// number in a stale pid file may belong to an unrelated process, and killing
// it would be a disaster. So the pid file also records the process's start
// time (field 22 of /proc/PID/stat, in clock ticks since boot) and its
// command line (/proc/PID/cmdline right after exec);
// a process counts as ours only while both still match. Signals go through
// a pidfd opened before that check (pidfd_open, pidfd_send_signal), so the
// PID cannot be recycled between checking and signalling. Kernels without
// pidfd (before 5.3) fall back to kill(2) right after the check.
//
// A daemon can be started inside another network namespace: the fork
// happens from inside netns.Do, on the goroutine that Do locked to a thread
// in that namespace, so the child inherits it (setns affects only the
// calling thread, and fork copies the calling thread's namespaces).
package proc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flatnet/flatnet/internal/atomicfile"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netns"
)

// ErrRunning is returned (wrapped) by Start when the named daemon already
// runs.
var ErrRunning = errors.New("already running")

// PIDFile and LogFile are the paths proc uses for a daemon.
func PIDFile(stateDir, name string) string { return filepath.Join(stateDir, "pids", name+".pid") }

// LogFile is where a daemon's stdout and stderr go.
func LogFile(stateDir, name string) string { return filepath.Join(stateDir, "logs", name+".log") }

// record is what a pid file holds: the PID on the first line (so `kill
// $(head -1 x.pid)` works), then one JSON line identifying the process.
type record struct {
	PID       int      `json:"-"`
	StartTime uint64   `json:"startTime"` // /proc/PID/stat field 22
	Argv      []string `json:"argv"`
	// Cmdline is /proc/PID/cmdline as seen right after exec; it differs
	// from Argv for a script (the kernel puts the interpreter first).
	Cmdline []string `json:"cmdline,omitempty"`
	Netns   string   `json:"netns,omitempty"`
}

// Start runs argv detached as daemon name: in its own session (setsid, so
// no controlling terminal and no signals from the caller's terminal), stdin
// from /dev/null, stdout and stderr appended to LogFile. env entries are
// added to the current environment (a later KEY=... wins), and the mark
// OwnerEnv=stateDir last. argv[0] is
// looked up in PATH when it has no slash. If inNetns is not empty the
// process starts inside the network namespace at that path.
//
// Start returns once the process exists; it does not wait for the daemon
// to be ready. The daemon must keep its command line (not exec another
// program or rewrite argv): that is how Running recognises it. It fails with ErrRunning if name is already running; a stale
// pid file is replaced. When the pid file is unreadable (empty or
// truncated) and a process running exactly argv in inNetns is alive,
// Start adopts it: it writes a new pid file for it and returns its PID.
func Start(name string, argv []string, env []string, stateDir string, inNetns string) (int, error) {
	return StartVia(name, nil, argv, env, stateDir, inNetns)
}

// StartVia is Start for a daemon that a wrapper program sets up and then
// execs, such as nsenter(1) entering a mount namespace (Go cannot setns
// into one once it runs threads): it runs wrapper followed by argv, and
// the daemon is identified by argv, the command line it has once the
// wrapper has exec'd it. argv[0] should be an absolute path, since that
// is what the wrapper passes on and Running compares. An empty wrapper is
// Start.
func StartVia(name string, wrapper, argv []string, env []string, stateDir string, inNetns string) (int, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if len(argv) == 0 {
		return 0, fmt.Errorf("starting %s: empty command line", name)
	}
	if pid, ok := Running(stateDir, name); ok {
		return pid, fmt.Errorf("starting %s: %w as pid %d (pid file %s)", name, ErrRunning, pid, PIDFile(stateDir, name))
	}
	for _, d := range []string{"pids", "logs"} {
		if err := os.MkdirAll(filepath.Join(stateDir, d), 0o755); err != nil {
			return 0, fmt.Errorf("starting %s: %w", name, err)
		}
	}
	// A pid file cut short (a crash while it was written, a full disk)
	// names no process, but the daemon may still run: a live process
	// running exactly argv in that namespace is it. Adopt it rather than
	// start a second copy next to it (two agents for one node, an etcd
	// that cannot bind its port).
	if b, err := os.ReadFile(PIDFile(stateDir, name)); err == nil {
		if _, perr := parseRecord(b); perr != nil {
			if rec, ok := findRunning(argv, inNetns, b); ok {
				rec.Argv, rec.Netns = argv, inNetns
				if err := writeRecord(PIDFile(stateDir, name), rec); err != nil {
					return 0, fmt.Errorf("adopting %s (pid %d): %w", name, rec.PID, err)
				}
				return rec.PID, nil
			}
		}
	}
	full := append(slices.Clone(wrapper), argv...)
	path := full[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return 0, fmt.Errorf("starting %s: %w", name, err)
		}
		path = p
	}
	logPath := LogFile(stateDir, name)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("starting %s: opening log: %w", name, err)
	}
	defer logf.Close()
	// A header per start: the log is appended across restarts.
	fmt.Fprintf(logf, "==== flatnet proc: %s starting %s: %s\n", time.Now().Format(time.RFC3339), name, strings.Join(full, " "))

	cmd := &exec.Cmd{
		Path:   path,
		Args:   full,
		Env:    append(append(os.Environ(), env...), OwnerEntry(stateDir)),
		Stdin:  nil, // /dev/null
		Stdout: logf,
		Stderr: logf, // the same *os.File: the child gets the fd, no copying goroutine
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true,
		},
	}
	// The daemon gets 0, 1 and 2 only, not what our caller inherited
	// (see cloexec.go).
	if err := CloseOnExecFrom(3); err != nil {
		return 0, fmt.Errorf("starting %s: %w", name, err)
	}
	start := cmd.Start
	if inNetns != "" {
		start = func() error {
			return netns.Do(inNetns, cmd.Start)
		}
	}
	if err := start(); err != nil {
		where := ""
		if inNetns != "" {
			where = " in netns " + inNetns
		}
		return 0, fmt.Errorf("starting %s%s: %w", name, where, err)
	}
	pid := cmd.Process.Pid
	// Reap the child if it exits while we still run; once we exit it is
	// re-parented to init, which reaps it.
	go func() { _ = cmd.Wait() }()

	var want []string
	if len(wrapper) > 0 {
		want = argv
	}
	rec, err := identify(pid, want)
	if err != nil {
		// It already exited (a missing library, a bad flag, a wrapper
		// that failed...), or a wrapper never exec'd argv: stop it.
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, fmt.Errorf("starting %s: %w; see %s:\n%s", name, err, logPath, Tail(logPath, 10))
	}
	rec.Argv, rec.Netns = argv, inNetns
	if err := writeRecord(PIDFile(stateDir, name), rec); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return 0, fmt.Errorf("starting %s: %w", name, err)
	}
	return pid, nil
}

// identify reads what identifies the freshly started process pid. exec
// reports success to the parent before the kernel has set up the new
// program's arguments, so /proc/PID/cmdline reads empty for a moment:
// wait for it (it is empty or complete, never partial). With want set
// (a wrapper runs first), wait until the command line is want: the
// wrapper has exec'd the daemon.
func identify(pid int, want []string) (record, error) {
	limit := 2 * time.Second
	if want != nil {
		limit = 10 * time.Second // a wrapper's own work, on a loaded machine
	}
	deadline := time.Now().Add(limit)
	for {
		st, err := readStat(pid)
		if err != nil {
			return record{}, err
		}
		if st.state == 'Z' || st.state == 'X' {
			return record{}, fmt.Errorf("pid %d exited", pid)
		}
		cmdline, err := readCmdline(pid)
		if err != nil {
			return record{}, err
		}
		if len(cmdline) > 0 && (want == nil || slices.Equal(cmdline, want)) {
			return record{PID: pid, StartTime: st.startTime, Cmdline: cmdline}, nil
		}
		if time.Now().After(deadline) {
			return record{}, fmt.Errorf("pid %d: command line %q after %v, want %q", pid, cmdline, limit, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// Running reports the PID of daemon name and whether it is running: its
// pid file exists and the process with that PID is alive (not a zombie)
// with the start time and command line recorded when we started it. A
// stale pid file yields the recorded PID and false.
func Running(stateDir, name string) (int, bool) {
	rec, err := readRecord(PIDFile(stateDir, name))
	if err != nil {
		return 0, false
	}
	return rec.PID, isOurs(rec)
}

// Stop stops daemon name: SIGTERM, up to grace for it to exit, then
// SIGKILL, then removes its pid file. Only a process that still matches
// its pid file is signalled; with no pid file, or a stale one, Stop only
// removes the file and returns nil.
func Stop(stateDir, name string, grace time.Duration) error {
	pidFile := PIDFile(stateDir, name)
	rec, err := readRecord(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Unreadable: nothing we can identify, so nothing to signal.
		return removeFile(pidFile)
	}
	h, err := openProcess(rec)
	if err != nil {
		return fmt.Errorf("stopping %s (pid %d): %w", name, rec.PID, err)
	}
	if h == nil { // not running any more, or not ours
		return removeFile(pidFile)
	}
	defer h.close()
	if err := h.signal(unix.SIGTERM); err != nil {
		return fmt.Errorf("stopping %s (pid %d): SIGTERM: %w", name, rec.PID, err)
	}
	if !h.wait(grace) {
		if err := h.signal(unix.SIGKILL); err != nil {
			return fmt.Errorf("stopping %s (pid %d): SIGKILL: %w", name, rec.PID, err)
		}
		if !h.wait(10 * time.Second) {
			return fmt.Errorf("stopping %s (pid %d): still alive 10s after SIGKILL", name, rec.PID)
		}
	}
	return removeFile(pidFile)
}

// Tail returns the last n lines of the file at path, for error messages.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func checkName(name string) error {
	if name == "" || filepath.Base(name) != name || strings.HasPrefix(name, ".") {
		return fmt.Errorf("invalid daemon name %q (want a plain file name)", name)
	}
	return nil
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func writeRecord(path string, rec record) error {
	meta, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	data := fmt.Sprintf("%d\n%s\n", rec.PID, meta)
	if err := atomicfile.WriteFile(path, []byte(data), 0o644); err != nil {
		return fmt.Errorf("writing pid file: %w", err)
	}
	return nil
}

func readRecord(path string) (record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return record{}, err
	}
	return parseRecord(b)
}

func parseRecord(b []byte) (record, error) {
	first, rest, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(strings.TrimSpace(string(first)))
	if err != nil || pid <= 1 {
		return record{}, fmt.Errorf("bad pid file: first line %q is not a PID", first)
	}
	var rec record
	if err := json.Unmarshal(bytes.TrimSpace(rest), &rec); err != nil {
		return record{}, fmt.Errorf("bad pid file for pid %d: %w", pid, err)
	}
	if len(rec.Argv) == 0 || rec.StartTime == 0 {
		return record{}, fmt.Errorf("bad pid file for pid %d: no start time or argv", pid)
	}
	rec.PID = pid
	return rec, nil
}

// findRunning returns the record of a live process whose command line is
// exactly argv, in the network namespace inNetns ("" this process's).
// A PID on the first line of the unreadable pid file old is preferred
// among several.
func findRunning(argv []string, inNetns string, old []byte) (record, bool) {
	nsPath := inNetns
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	var want unix.Stat_t
	if err := unix.Stat(nsPath, &want); err != nil {
		return record{}, false
	}
	pids := Scan(func(pid int) bool {
		got, err := readCmdline(pid)
		if err != nil || !slices.Equal(got, argv) {
			return false
		}
		var st unix.Stat_t
		return unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino
	})
	first, _, _ := bytes.Cut(old, []byte("\n"))
	if pid, err := strconv.Atoi(strings.TrimSpace(string(first))); err == nil {
		if i := slices.Index(pids, pid); i > 0 {
			pids[0], pids[i] = pids[i], pids[0]
		}
	}
	for _, pid := range pids {
		if rec, err := identify(pid, nil); err == nil {
			return rec, true
		}
	}
	return record{}, false
}

// isOurs reports whether the process rec.PID is alive and is the one rec
// describes.
func isOurs(rec record) bool {
	st, err := readStat(rec.PID)
	if err != nil || st.state == 'Z' || st.state == 'X' || st.startTime != rec.StartTime {
		return false
	}
	want := rec.Cmdline
	if len(want) == 0 {
		want = rec.Argv
	}
	got, err := readCmdline(rec.PID)
	return err == nil && slices.Equal(got, want)
}

type stat struct {
	state     byte
	startTime uint64
}

func readStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	return parseStat(b)
}

// parseStat reads state (field 3) and starttime (field 22) of
// /proc/PID/stat. comm (field 2) is in parentheses and may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStat(b []byte) (stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("malformed /proc stat %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return stat{}, fmt.Errorf("malformed /proc stat %q", b)
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("malformed /proc stat starttime %q", f[19])
	}
	return stat{state: f[0][0], startTime: st}, nil
}

func readCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// handle is a process we verified as ours, to signal and wait for.
type handle struct {
	rec   record
	pidfd int // -1 without pidfd support
}

// openProcess returns a handle on rec's process, or nil if that process
// is gone or is not the one rec describes.
func openProcess(rec record) (*handle, error) {
	fd, err := unix.PidfdOpen(rec.PID, 0)
	switch {
	case err == nil:
	case errors.Is(err, unix.ESRCH):
		return nil, nil
	case errors.Is(err, unix.ENOSYS):
		fd = -1 // old kernel: kill(2) right after the identity check
	default:
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	// Checked after opening the pidfd: if the PID is ours now, the pidfd
	// refers to our process even if the PID is recycled later.
	if !isOurs(rec) {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, nil
	}
	return &handle{rec: rec, pidfd: fd}, nil
}

func (h *handle) close() {
	if h.pidfd >= 0 {
		unix.Close(h.pidfd)
	}
}

func (h *handle) signal(sig unix.Signal) error {
	var err error
	if h.pidfd >= 0 {
		err = unix.PidfdSendSignal(h.pidfd, sig, nil, 0)
	} else if isOurs(h.rec) {
		err = unix.Kill(h.rec.PID, sig)
	}
	if errors.Is(err, unix.ESRCH) {
		return nil // exited meanwhile
	}
	return err
}

// exited reports whether the process has exited (a zombie counts): the
// pidfd turns readable then. Without pidfd, /proc tells; its cmdline is
// not used here because it empties while an exiting process still runs.
func (h *handle) exited() bool {
	if h.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	}
	st, err := readStat(h.rec.PID)
	return err != nil || st.state == 'Z' || st.state == 'X' || st.startTime != h.rec.StartTime
}

// wait reports whether the process exited within d.
func (h *handle) wait(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if h.exited() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		step := 20 * time.Millisecond
		if left < step {
			step = left
		}
		if h.pidfd >= 0 {
			fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
			_, _ = unix.Poll(fds, int(step/time.Millisecond)+1)
		} else {
			time.Sleep(step)
		}
	}
}
