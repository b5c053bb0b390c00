package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

// liveWith returns the live (not zombie) processes whose command line has
// arg as one of its words.
func liveWith(arg string) []int {
	return proc.Scan(func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains("\x00"+string(b), "\x00"+arg+"\x00") {
			return false
		}
		st, err := readProcStat(pid)
		return err == nil && st.state != 'Z'
	})
}

// An exec probe whose command leaves a child holding its stdout, or runs
// past its timeout, returns within a bound and leaves no process behind
// (before: the first waited for the child, 1000 s; the second killed only
// the shell and then waited for the sleep).
func TestRootExecProbeLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	// The "container": a process in our own namespaces, which nsenter
	// can enter as root.
	ctr := exec.Command("sleep", "1000")
	if err := ctr.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ctr.Process.Kill(); _ = ctr.Wait() })

	for _, tc := range []struct {
		name   string
		script string // %s is the probe's unique sleep argument
		wantOK bool
		msg    string
	}{
		{"a background child keeps stdout", "sleep %s & exit 0", true, ""},
		{"runs past the timeout", "sleep %s", false, "timed out"},
		{"its child runs past the timeout", "sleep %s; true", false, "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A sleep argument no other process has (GNU sleep takes fractions).
			mark := fmt.Sprintf("1000.%d%d", os.Getpid(), time.Now().UnixNano()%1e6)
			t.Cleanup(func() {
				for _, pid := range liveWith(mark) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			p := &v1.Probe{TimeoutSeconds: 1, ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{
				Command: []string{"sh", "-c", fmt.Sprintf(tc.script, mark)}}}}
			type result struct {
				ok  bool
				msg string
			}
			done := make(chan result, 1)
			start := time.Now()
			go func() {
				ok, msg := realProber{}.probe(context.Background(), p, probeTarget{PID: ctr.Process.Pid, Container: &v1.Container{Name: "c"}})
				done <- result{ok, msg}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the probe has not returned after 30s (timeout 1s); left: %v", liveWith(mark))
			}
			t.Logf("probe returned in %v: ok=%v %q", time.Since(start).Round(time.Millisecond), r.ok, r.msg)
			if r.ok != tc.wantOK || !strings.Contains(r.msg, tc.msg) {
				t.Errorf("probe: ok=%v msg=%q, want ok=%v msg containing %q", r.ok, r.msg, tc.wantOK, tc.msg)
			}
			// SIGKILLed orphans are reaped by init: give it a moment.
			deadline := time.Now().Add(5 * time.Second)
			for len(liveWith(mark)) > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if left := liveWith(mark); len(left) > 0 {
				t.Errorf("the probe left processes %v", left)
			}
		})
	}
}
