// Package execx runs the short-lived tools flatnet drives (nft,
// iptables-save, iptables-restore) so that none of them can hang its
// caller: a CNI ADD or DEL that waits forever on a stuck xtables lock or a
// wedged nft blocks the runtime's pod setup with it.
//
// Every run has a deadline: the caller's, or DefaultTimeout from the start
// of the run when that comes first. The tool runs in its own process group,
// and on expiry the whole group is killed, so a helper it started cannot
// keep our pipes open; Wait then gives the pipes WaitDelay to close and
// returns. The error is a *TimeoutError that names the command, the limit
// and the caller's hint for what to do, and wraps context.DeadlineExceeded
// (CNI plugins turn it into code 11, try again later).
package execx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultTimeout bounds a run when neither Cmd.Timeout nor the context
// sets a shorter limit. Generous: a full iptables-restore or nft
// transaction takes well under a second even on a loaded node.
const DefaultTimeout = 30 * time.Second

// WaitDelay is how long, after the kill (or after the tool exits), a run
// waits for the tool's pipes to close before it returns anyway.
const WaitDelay = 2 * time.Second

// Cmd is one run of a tool.
type Cmd struct {
	Path  string
	Args  []string
	Stdin io.Reader // nil: no input
	// Timeout bounds the run; 0 means DefaultTimeout. A context deadline
	// that comes sooner wins.
	Timeout time.Duration
	// Hint says what to do when the run times out (what may hold the
	// tool up, how to find it).
	Hint string
}

// String is the command line as messages show it.
func (c Cmd) String() string {
	return strings.Join(append([]string{filepath.Base(c.Path)}, c.Args...), " ")
}

// TimeoutError is a run killed at its deadline.
type TimeoutError struct {
	Cmd   string
	Limit time.Duration
	Hint  string
}

func (e *TimeoutError) Error() string {
	msg := fmt.Sprintf("%s did not finish within %s and was killed", e.Cmd, e.Limit)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// Unwrap lets errors.Is(err, context.DeadlineExceeded) find it.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Output runs c and returns its stdout. A failed run returns an *Error;
// a timeout a *TimeoutError; a canceled context an error wrapping
// context.Canceled.
func (c Cmd) Output(ctx context.Context) ([]byte, error) {
	limit := c.Timeout
	if limit <= 0 {
		limit = DefaultTimeout
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < limit {
		limit = max(time.Until(dl), 0)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Stdin = c.Stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = WaitDelay
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	switch cerr := ctx.Err(); {
	case errors.Is(cerr, context.DeadlineExceeded):
		return nil, &TimeoutError{Cmd: c.String(), Limit: limit.Round(time.Millisecond), Hint: c.Hint}
	case cerr != nil:
		return nil, fmt.Errorf("%s: %w", c, cerr)
	}
	return nil, &Error{Cmd: c.String(), Stderr: strings.TrimSpace(stderr.String()), Err: err}
}

// Error is a run that failed on its own (not at its deadline).
type Error struct {
	Cmd    string
	Stderr string // trimmed
	Err    error  // from exec: usually an *exec.ExitError
}

// Error says the command and what it printed on stderr, or how it
// ended when it printed nothing.
func (e *Error) Error() string {
	if e.Stderr != "" {
		return e.Cmd + ": " + e.Stderr
	}
	return e.Cmd + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }
