package lab

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// lockRoot takes an exclusive lock on the state root for one up or down:
// two new labs must not pick the same underlay, and an up must not race a
// down of the same lab. The lock is on the directory itself (flock), so no
// lock file is left behind.
func lockRoot(root string, out io.Writer) (unlock func(), err error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", root, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		fmt.Fprintf(out, "waiting for another `flatnet lab up` or `down` on %s to finish\n", root)
		err = unix.Flock(fd, unix.LOCK_EX)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("locking %s: %w", root, err)
	}
	return func() { unix.Close(fd) }, nil
}
