package proc

import (
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// inheritedFD opens a file without close-on-exec, as a shell's
// redirection or `flock FILE cmd` leaves one, and returns its fd and path.
func inheritedFD(t *testing.T) (int, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, path
}

// A daemon gets stdin, stdout and stderr, and none of the fds its starter
// inherited without close-on-exec.
func TestStartPassesNoInheritedFD(t *testing.T) {
	fd, path := inheritedFD(t)
	dir := t.TempDir()
	pid, err := Start("sleeper", []string{"sleep", "300"}, nil, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, dir, "sleeper")
	fds, err := FDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Only the inherited file is checked by name: a daemon just started
	// may hold files of its own for a moment (sleep reading its locale).
	got := slices.Sorted(maps.Keys(fds))
	if len(got) < 3 || !slices.Equal(got[:3], []int{0, 1, 2}) {
		t.Errorf("the daemon has fds %v (%v), want 0 1 2 first", got, fds)
	}
	for n, target := range fds {
		if target == path {
			t.Errorf("the daemon has the starter's inherited file %s as fd %d (the test's fd was %d)", path, n, fd)
		}
	}
	// The starter still has its fd.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		t.Errorf("fd %d closed in the caller: %v", fd, err)
	}
}

func TestCloseOnExecFrom(t *testing.T) {
	fd, _ := inheritedFD(t)
	if err := CloseOnExecFrom(3); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("fd %d flags %#x (%v), want FD_CLOEXEC", fd, flags, err)
	}
}
