package cli

// Exit codes. flatnet exits with codes of its own, never with the status
// of a process it ran on the way (an nft, an ip, a make that failed is a
// flatnet failure: 1). The two commands whose job is to run a command for
// the user, `lab exec` and `lab kubectl`, pass that command's code on, as
// `kubectl exec` does; their own failures (no such pod, no lab) are 1.

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/flatnet/flatnet/internal/lab"
)

// Exit codes of the flatnet command, listed in `flatnet --help`.
const (
	ExitOK      = 0
	ExitFailure = 1 // flatnet's own failure
	ExitUsage   = 2 // unknown command or flag, wrong arguments
)

const exitCodesHelp = "Exit codes: 0 success; 1 failure; 2 usage error (unknown command or flag,\n" +
	"wrong arguments). `lab exec` and `lab kubectl` exit with their command's code\n" +
	"(128+N when signal N ended it), as kubectl exec does; `netexec` with the code\n" +
	"/exit asks for."

// usageError is a command line flatnet cannot run as written.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usage(cmd *cobra.Command, err error) error {
	return &usageError{fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())}
}

// ExitCode maps an error from Execute to the process exit code. Only a
// *lab.ExitError (from `lab exec` and `lab kubectl`) passes a child's code
// on; an *exec.ExitError anywhere in the chain is a failure like any other.
func ExitCode(err error) int {
	var le *lab.ExitError
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &le):
		return le.Code
	case errors.As(err, &ue):
		return ExitUsage
	}
	return ExitFailure
}

// Run executes the flatnet command line args and returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return ExitCode(root.Execute())
}

// markUsageErrors makes every command's flag and argument errors usage
// errors, and gives each command that only groups others (flatnet, lab)
// a run that refuses an unknown subcommand with one: left to cobra, the
// root answers "unknown command" with no way to tell it from a failure,
// and `flatnet lab bogus` prints help and exits 0.
func markUsageErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usage(cmd, err) })
	if !c.Runnable() && c.HasSubCommands() && c.Args == nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		}
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usage(cmd, err)
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}
