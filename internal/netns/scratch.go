package netns

// Scratch namespaces: throwaway namespaces for probing kernel features
// (the bandwidth plugin's STATUS builds its qdiscs in one).

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// DoScratch runs fn in a new, empty network namespace that lives only as
// long as fn: it is never bind-mounted, and the OS thread that entered it
// is never unlocked, so the Go runtime destroys that thread when fn
// returns and the kernel frees the namespace with everything fn created
// in it. Use it to probe kernel features without leaving anything behind.
func DoScratch(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread, on purpose: see above.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("creating a scratch network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
