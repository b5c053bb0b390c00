package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/lab"
)

func TestExitCode(t *testing.T) {
	// A child that failed on flatnet's way (an ip, an nft, a make) makes
	// flatnet fail with its own code, not the child's.
	err := exec.Command("sh", "-c", "exit 3").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sh -c 'exit 3': %v", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, ExitOK},
		{"failure", errors.New("no lab"), ExitFailure},
		{"a child's failure, wrapped", fmt.Errorf("lab up: running ip: %w", err), ExitFailure},
		{"a child's failure, bare", err, ExitFailure},
		{"lab exec passes its command's code on", &lab.ExitError{Code: 3}, 3},
		{"usage", &usageError{errors.New("unknown flag")}, ExitUsage},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("%s: ExitCode(%v) = %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		want   int
		stderr string
	}{
		{[]string{"version"}, ExitOK, ""},
		{[]string{"lab"}, ExitOK, ""}, // help
		{[]string{"--no-such-flag"}, ExitUsage, "unknown flag"},
		{[]string{"no-such-command"}, ExitUsage, `unknown command "no-such-command" for "flatnet"`},
		{[]string{"lab", "no-such-command"}, ExitUsage, `unknown command "no-such-command" for "flatnet lab"`},
		{[]string{"lab", "down", "extra"}, ExitUsage, "flatnet lab down --help"},
		{[]string{"lab", "exec", "pod"}, ExitUsage, "usage: flatnet lab exec"},
	} {
		var stdout, stderr bytes.Buffer
		if got := Run(tc.args, &stdout, &stderr); got != tc.want {
			t.Errorf("flatnet %s: exit %d, want %d (stderr %q)", strings.Join(tc.args, " "), got, tc.want, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("flatnet %s: stderr %q does not say %q", strings.Join(tc.args, " "), stderr.String(), tc.stderr)
		}
	}
	var stdout bytes.Buffer
	Run([]string{"--help"}, &stdout, &stdout)
	if !strings.Contains(stdout.String(), "Exit codes: 0 success; 1 failure; 2 usage error") {
		t.Errorf("--help does not list the exit codes:\n%s", stdout.String())
	}
}
