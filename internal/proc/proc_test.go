package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func alive(pid int) bool {
	st, err := readStat(pid)
	return err == nil && st.state != 'Z' && st.state != 'X'
}

func stopOnCleanup(t *testing.T, dir, name string) {
	t.Cleanup(func() {
		if err := Stop(dir, name, time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

func TestStartRunningStop(t *testing.T) {
	dir := t.TempDir()
	pid, err := Start("sleeper", []string{"sleep", "300"}, []string{"FLATNET_PROC_TEST=1"}, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "sleeper")
	got, ok := Running(dir, "sleeper")
	if !ok || got != pid {
		t.Fatalf("Running = %d, %v; want %d, true", got, ok, pid)
	}
	// Detached: its own session, stdin is /dev/null, env passed.
	sid, err := unix.Getsid(pid)
	if err != nil || sid != pid {
		t.Errorf("session id %d (%v), want %d (setsid)", sid, err, pid)
	}
	if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pid)); err != nil || l != "/dev/null" {
		t.Errorf("stdin is %q (%v), want /dev/null", l, err)
	}
	for _, fd := range []int{1, 2} {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		if err != nil || l != LogFile(dir, "sleeper") {
			t.Errorf("fd %d is %q (%v), want the log file", fd, l, err)
		}
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || !strings.Contains(string(env), "FLATNET_PROC_TEST=1\x00") {
		t.Errorf("env does not hold FLATNET_PROC_TEST=1 (%v)", err)
	}
	b, err := os.ReadFile(PIDFile(dir, "sleeper"))
	if err != nil || !strings.HasPrefix(string(b), fmt.Sprintf("%d\n", pid)) {
		t.Errorf("pid file %q (%v) does not start with the pid", b, err)
	}

	// A second Start of the same name refuses.
	if _, err := Start("sleeper", []string{"sleep", "300"}, nil, dir, ""); !errors.Is(err, ErrRunning) {
		t.Errorf("second Start: %v, want ErrRunning", err)
	}

	if err := Stop(dir, "sleeper", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("pid %d still alive after Stop", pid)
	}
	if _, err := os.Stat(PIDFile(dir, "sleeper")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file left after Stop: %v", err)
	}
	if _, ok := Running(dir, "sleeper"); ok {
		t.Error("Running after Stop")
	}
	// Stop again: nothing to do.
	if err := Stop(dir, "sleeper", time.Second); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestLogAppends(t *testing.T) {
	dir := t.TempDir()
	for i, word := range []string{"first", "second"} {
		if _, err := Start("echo", []string{"sh", "-c", "echo " + word + "; echo err" + word + " >&2; sleep 300"}, nil, dir, ""); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(Tail(LogFile(dir, "echo"), 100), "\nerr"+word) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if err := Stop(dir, "echo", time.Second); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(LogFile(dir, "echo"))
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		if c := strings.Count(log, "==== flatnet proc:"); c != i+1 {
			t.Errorf("log has %d start headers after start %d:\n%s", c, i+1, log)
		}
		if !strings.Contains(log, "\n"+word+"\n") || !strings.Contains(log, "\nerr"+word+"\n") {
			t.Errorf("log lacks stdout/stderr of start %d:\n%s", i+1, log)
		}
	}
}

// A daemon that ignores SIGTERM is killed after the grace period.
func TestStopEscalatesToKill(t *testing.T) {
	dir := t.TempDir()
	pid, err := Start("stubborn", []string{"sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.05; done"}, nil, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "stubborn")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(Tail(LogFile(dir, "stubborn"), 10), "\ntrapped") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	if err := Stop(dir, "stubborn", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatalf("pid %d alive after Stop", pid)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Stop took %v: it did not wait for the grace period before SIGKILL", d)
	}
}

// A pid file whose PID now belongs to another process (recycled PID, or a
// different start time or command line) is not ours: Running says so and
// Stop does not signal that process.
func TestStalePIDFileNeverKills(t *testing.T) {
	dir := t.TempDir()
	// A process we did not start through proc stands for the unrelated one.
	other := exec.Command("sleep", "300")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	st, err := readStat(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := map[string]record{
		"recycled pid, other start time": {PID: other.Process.Pid, StartTime: st.startTime + 1, Argv: []string{"sleep", "300"}},
		"same start, other cmdline":      {PID: other.Process.Pid, StartTime: st.startTime, Argv: []string{"etcd", "--name", "lab"}},
	}
	for name, rec := range cases {
		if err := writeRecord(PIDFile(dir, "victim"), rec); err != nil {
			t.Fatal(err)
		}
		if pid, ok := Running(dir, "victim"); ok || pid != other.Process.Pid {
			t.Errorf("%s: Running = %d, %v; want %d, false", name, pid, ok, other.Process.Pid)
		}
		if err := Stop(dir, "victim", 100*time.Millisecond); err != nil {
			t.Errorf("%s: Stop: %v", name, err)
		}
		if !alive(other.Process.Pid) {
			t.Fatalf("%s: Stop killed a process it did not start", name)
		}
		if _, err := os.Stat(PIDFile(dir, "victim")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: stale pid file not removed", name)
		}
	}
	// The control: the exact record does identify it.
	exact := record{PID: other.Process.Pid, StartTime: st.startTime, Argv: []string{"sleep", "300"}}
	if err := writeRecord(PIDFile(dir, "victim"), exact); err != nil {
		t.Fatal(err)
	}
	if _, ok := Running(dir, "victim"); !ok {
		t.Error("exact record not recognised as running")
	}
	os.Remove(PIDFile(dir, "victim"))
}

// A pid file cut short while its daemon runs: Running says "not
// running" (nothing identifies the process), and Start adopts the live
// process running the same command line instead of starting a second
// one. With nothing running, Start starts it.
func TestTruncatedPIDFile(t *testing.T) {
	dir := t.TempDir()
	// A command line no other test or helper runs.
	argv := []string{"sleep", fmt.Sprintf("%d.%d", 3000+os.Getpid()%1000, time.Now().UnixNano()%1000000)}
	pid, err := Start("daemon", argv, nil, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "daemon")
	full, err := os.ReadFile(PIDFile(dir, "daemon"))
	if err != nil {
		t.Fatal(err)
	}
	for name, cut := range map[string][]byte{"empty": nil, "truncated": full[:len(full)/2], "pid only": []byte(strconv.Itoa(pid) + "\n")} {
		if err := os.WriteFile(PIDFile(dir, "daemon"), cut, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, ok := Running(dir, "daemon"); ok || got != 0 {
			t.Errorf("%s: Running = %d, %v; want 0, false", name, got, ok)
		}
		got, err := Start("daemon", argv, nil, dir, "")
		if err != nil || got != pid {
			t.Fatalf("%s: Start = %d, %v; want the running pid %d adopted", name, got, err, pid)
		}
		if got, ok := Running(dir, "daemon"); !ok || got != pid {
			t.Errorf("%s: after adoption Running = %d, %v; want %d, true", name, got, ok, pid)
		}
	}
	if n := len(Scan(func(p int) bool { c, err := readCmdline(p); return err == nil && slices.Equal(c, argv) })); n != 1 {
		t.Errorf("%d processes run %v, want 1", n, argv)
	}
	// Nothing runs: a truncated pid file is replaced by a new start.
	if err := Stop(dir, "daemon", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(PIDFile(dir, "daemon"), full[:3], 0o644); err != nil {
		t.Fatal(err)
	}
	pid2, err := Start("daemon", argv, nil, dir, "")
	if err != nil || pid2 == pid {
		t.Fatalf("Start with nothing running = %d, %v", pid2, err)
	}
}

// A pid file left by a process that died is stale, and a new Start
// replaces it.
func TestDeadPIDFile(t *testing.T) {
	dir := t.TempDir()
	pid, err := Start("short", []string{"sleep", "300"}, nil, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "short")
	if err := unix.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got, ok := Running(dir, "short"); ok || got != pid {
		t.Errorf("Running after kill = %d, %v; want %d, false", got, ok, pid)
	}
	pid2, err := Start("short", []string{"sleep", "300"}, nil, dir, "")
	if err != nil {
		t.Fatalf("Start over a stale pid file: %v", err)
	}
	if got, ok := Running(dir, "short"); !ok || got != pid2 {
		t.Errorf("Running = %d, %v; want %d, true", got, ok, pid2)
	}
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Start("x", []string{"/nonexistent/flatnet-no-such-binary"}, nil, dir, ""); err == nil {
		t.Error("Start of a missing binary succeeded")
	}
	if _, err := Start("x", []string{"flatnet-no-such-binary-in-path"}, nil, dir, ""); err == nil {
		t.Error("Start of a binary not in PATH succeeded")
	}
	if _, err := Start("../x", []string{"sleep", "1"}, nil, dir, ""); err == nil {
		t.Error("Start accepted a name with a slash")
	}
	if _, err := Start("x", nil, nil, dir, ""); err == nil {
		t.Error("Start accepted an empty argv")
	}
	if _, err := Start("x", []string{"sleep", "1"}, nil, dir, "/nonexistent/netns"); err == nil || !strings.Contains(err.Error(), "/nonexistent/netns") {
		t.Errorf("Start in a missing netns: %v, want an error naming it", err)
	}
	if _, err := os.Stat(PIDFile(dir, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Error("failed Start left a pid file")
	}
}

func TestParseStat(t *testing.T) {
	line := "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	st, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.state != 'S' || st.startTime != 987654 {
		t.Errorf("parseStat = %c %d, want S 987654", st.state, st.startTime)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

func TestParseRecord(t *testing.T) {
	rec, err := parseRecord([]byte("123\n{\"startTime\":5,\"argv\":[\"a\",\"b\"]}\n"))
	if err != nil || rec.PID != 123 || rec.StartTime != 5 || len(rec.Argv) != 2 {
		t.Errorf("parseRecord = %+v, %v", rec, err)
	}
	for _, bad := range []string{"", "abc\n{}", "1\n{\"startTime\":5,\"argv\":[\"a\"]}", "123\n", "123\n{\"argv\":[\"a\"]}", "123\n{\"startTime\":5}"} {
		if _, err := parseRecord([]byte(bad)); err == nil {
			t.Errorf("parseRecord(%q) succeeded", bad)
		}
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add([]byte("123\n{\"startTime\":5,\"argv\":[\"a\",\"b\"]}\n"))
	f.Add([]byte("1 (x) S"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseRecord(b)
		_, _ = parseStat(b)
	})
}

// A script's /proc cmdline starts with its interpreter; it is still
// recognised as ours.
func TestScriptDaemon(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "daemon.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nwhile :; do sleep 1; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "script")
	// Several rounds: exec reports success before the kernel sets up the
	// new cmdline, a race Start must wait out.
	for range 10 {
		pid, err := Start("script", []string{script, "--flag"}, nil, dir, "")
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := Running(dir, "script"); !ok || got != pid {
			t.Fatalf("Running = %d, %v; want %d, true", got, ok, pid)
		}
		if err := Stop(dir, "script", 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if alive(pid) {
			t.Fatalf("pid %d alive after Stop", pid)
		}
	}
}
