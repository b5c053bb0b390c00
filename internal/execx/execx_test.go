package execx

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// script writes an executable shell script into a temp dir.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOutput(t *testing.T) {
	p := script(t, `cat; echo " $1"`)
	out, err := Cmd{Path: p, Args: []string{"arg"}, Stdin: strings.NewReader("in")}.Output(context.Background())
	if err != nil || string(out) != "in arg\n" {
		t.Errorf("Output = %q, %v", out, err)
	}
	p = script(t, `echo "it broke" >&2; exit 3`)
	_, err = Cmd{Path: p, Args: []string{"-x"}}.Output(context.Background())
	var e *Error
	if !errors.As(err, &e) || err.Error() != "tool -x: it broke" {
		t.Errorf("failed run: %v, want an *Error with the stderr", err)
	}
	p = script(t, `exit 4`)
	if _, err = (Cmd{Path: p}).Output(context.Background()); err == nil || err.Error() != "tool: exit status 4" {
		t.Errorf("failed run without stderr: %v", err)
	}
}

// A tool that hangs, with a child of its own holding stdout, is killed at
// its deadline, child included, and the error says what timed out.
func TestTimeoutKillsTheGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	p := script(t, `sleep 60 & echo $! > `+pidFile+`
exec sleep 60`)
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		timeout time.Duration
		limit   string
	}{
		{"Timeout", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, 300 * time.Millisecond, "300ms"},
		{"context deadline first", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, time.Hour, "ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(pidFile)
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := Cmd{Path: p, Args: []string{"--wait"}, Timeout: tc.timeout, Hint: "check the lock"}.Output(ctx)
			took := time.Since(start)
			t.Logf("returned after %s: %v", took, err)
			if took > 20*time.Second {
				t.Errorf("returned after %s, want about the 300ms limit", took)
			}
			var te *TimeoutError
			if !errors.As(err, &te) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want a *TimeoutError wrapping context.DeadlineExceeded", err)
			}
			for _, want := range []string{"tool --wait did not finish within", tc.limit, "killed", "check the lock"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if !gone(pid, 10*time.Second) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("the tool's child %d outlived the kill", pid)
			}
		})
	}
}

// gone waits for pid to disappear (or become a zombie).
func gone(pid int, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return true
		}
	}
	return false
}

func TestCanceled(t *testing.T) {
	p := script(t, `exec sleep 60`)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := Cmd{Path: p}.Output(ctx)
	var te *TimeoutError
	if !errors.Is(err, context.Canceled) || errors.As(err, &te) {
		t.Errorf("err = %v, want context.Canceled and no timeout", err)
	}
}
