// Package dirlock takes exclusive locks on directories (flock on the
// directory itself, so no lock file is left behind): the lab's state root
// for one up or down, the image cache for one build.
package dirlock

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Lock creates dir if needed and locks it until unlock is called (or the
// process exits). When another holder has it, waiting is called once and
// Lock blocks until the lock is free.
func Lock(dir string, waiting func()) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		if waiting != nil {
			waiting()
		}
		err = unix.Flock(fd, unix.LOCK_EX)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}
