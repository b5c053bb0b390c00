// Package containerinit is the hidden `flatnet container-init`: the first
// program of every lab container. The runtime starts it inside the pod's
// network namespace and in fresh mount and UTS namespaces (clone flags set
// by the runtime); it then
//
//  1. makes every mount private, so nothing done here reaches the host's
//     mount namespace (a copied namespace keeps "shared" propagation);
//  2. bind-mounts the pod's resolv.conf and hosts files over /etc/resolv.conf
//     and /etc/hosts;
//  3. mounts a fresh sysfs on /sys, so /sys/class/net shows the pod's
//     interfaces (as `ip netns exec` does); best effort;
//  4. sets the hostname, changes to the working directory, marks every fd
//     but 0, 1 and 2 close-on-exec and execs the container's command, which
//     keeps this PID. Fd 3, when given, is the runtime's exec handshake:
//     the exec closes it with the rest, and the runtime's read of the
//     other end returns, so the container counts as started only with
//     its files mounted.
//
// The environment is the container's, prepared by the runtime; the command
// is looked up in its PATH.
package containerinit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/proc"
)

// Options are container-init's flags.
type Options struct {
	Hostname string
	Resolv   string
	Hosts    string
	Workdir  string
}

// NewCommand returns the hidden `flatnet container-init` command.
func NewCommand() *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:    "container-init --hostname H --resolv FILE --hosts FILE [--workdir DIR] -- CMD [ARGS...]",
		Short:  "Set up a lab container's mounts and hostname, then exec its command (used by the lab runtime)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			err := Exec(o, args)
			// Exec returns only on failure. 128 is what runtimes report
			// for a container that could not start.
			fmt.Fprintf(cmd.ErrOrStderr(), "container-init: %v\n", err)
			os.Exit(128)
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	f.StringVar(&o.Hostname, "hostname", "", "hostname to set (needs a new UTS namespace)")
	f.StringVar(&o.Resolv, "resolv", "", "file to bind-mount over /etc/resolv.conf")
	f.StringVar(&o.Hosts, "hosts", "", "file to bind-mount over /etc/hosts")
	f.StringVar(&o.Workdir, "workdir", "", "working directory")
	return cmd
}

// Exec prepares the namespaces and replaces the process with argv. It
// returns only on failure.
func Exec(o Options, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("no command given")
	}
	if o.Resolv != "" || o.Hosts != "" {
		// Without this, a bind mount would propagate to the host.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("making mounts private (is this a new mount namespace?): %w", err)
		}
		for _, b := range []struct{ src, dst string }{{o.Resolv, "/etc/resolv.conf"}, {o.Hosts, "/etc/hosts"}} {
			if b.src == "" {
				continue
			}
			if err := bindFile(b.src, b.dst); err != nil {
				return err
			}
		}
		remountSys()
	}
	if o.Hostname != "" {
		if err := unix.Sethostname([]byte(o.Hostname)); err != nil {
			return fmt.Errorf("setting hostname %q: %w", o.Hostname, err)
		}
	}
	if o.Workdir != "" {
		if err := os.Chdir(o.Workdir); err != nil {
			return fmt.Errorf("working directory: %w", err)
		}
	}
	path, err := LookPath(argv[0], os.Getenv("PATH"))
	if err != nil {
		return err
	}
	// The container gets 0, 1 and 2 only: nothing the agent (or whoever
	// started it) inherited, as runc closes everything else.
	if err := proc.CloseOnExecFrom(3); err != nil {
		return err
	}
	env := os.Environ()
	if err := unix.Exec(path, argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", path, err)
	}
	return nil
}

// bindFile bind-mounts src over dst, following a symlink at dst (a
// systemd-resolved stub link, say) to the file it names.
func bindFile(src, dst string) error {
	target, err := filepath.EvalSymlinks(dst)
	if err != nil {
		return fmt.Errorf("%s: %w (the host needs this file for the pod's copy to be mounted over it)", dst, err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s over %s: %w", src, target, err)
	}
	return nil
}

// remountSys replaces /sys with a sysfs of this network namespace. A
// failure only makes /sys/class/net show the node's interfaces.
func remountSys() {
	if err := unix.Unmount("/sys", unix.MNT_DETACH); err != nil {
		return
	}
	_ = unix.Mount("sysfs", "/sys", "sysfs", 0, "")
}

// LookPath finds name as execvp would in the search path pathEnv ("" uses
// the default). A name with a slash is used as is.
func LookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("%q: %w", name, err)
		}
		return name, nil
	}
	if pathEnv == "" {
		pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w (PATH=%s)", name, exec.ErrNotFound, pathEnv)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return fmt.Errorf("is a directory")
	}
	if st.Mode()&0o111 == 0 {
		return fmt.Errorf("not executable")
	}
	return nil
}
