// Package pause is the pod sandbox's process (registry.k8s.io/pause's role):
// PID 1 of the pod's namespaces, it holds them open, reaps the orphans that
// get reparented to it, and exits 0 on SIGINT or SIGTERM. The lab's image
// builder (internal/lab/images) packs it as registry.k8s.io/pause.
package pause

import (
	"os"
	"os/signal"
	"syscall"
)

// Run blocks until SIGINT or SIGTERM and returns the exit code (0).
func Run() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return 0
		}
		reap()
	}
	return 0
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
