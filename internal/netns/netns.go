// Package netns is the only place in flatnet that switches network
// namespaces. Everything else calls Do with a function to run inside.
//
// Design (after containernetworking/plugins pkg/ns/README.md): setns(2)
// affects only the calling OS thread, and the Go scheduler moves goroutines
// between threads. So Do runs the function on a fresh goroutine that is
// locked to its thread for its whole life. If switching back to the
// original namespace fails, the goroutine exits still locked, and the Go
// runtime then destroys the thread instead of reusing it in the wrong
// namespace. Goroutines started inside fn do NOT inherit the namespace.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNotExist is returned (wrapped) when a namespace path does not exist
// or is not a network namespace.
var ErrNotExist = errors.New("network namespace does not exist")

// RunDir is where named namespaces are bind-mounted, as iproute2 does.
const RunDir = "/run/netns"

// Check reports whether path is a network namespace.
func Check(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: %s", ErrNotExist, path)
		}
		return fmt.Errorf("inspecting netns %s: %w", path, err)
	}
	// nsfs (bind mounts and /proc/PID/ns/net) or procfs (older kernels).
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("%w: %s is not a namespace file (fs type %#x)", ErrNotExist, path, st.Type)
	}
	return nil
}

// Do runs fn inside the network namespace at path and returns its error.
func Do(path string, fn func() error) error {
	if err := Check(path); err != nil {
		return err
	}
	target, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", path, err)
	}
	defer target.Close()
	return DoHandle(target, fn)
}

// DoHandle is Do for an already opened namespace handle.
func DoHandle(target vnetns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- fmt.Errorf("opening current netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		if err := vnetns.Set(target); err != nil {
			errc <- fmt.Errorf("entering netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("returning to original netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Create makes a new named network namespace, bind-mounted at
// RunDir/name like `ip netns add`, and returns its path. The calling
// goroutine's namespace is not changed.
func Create(name string) (string, error) {
	if name == "" || filepath.Base(name) != name {
		return "", fmt.Errorf("invalid netns name %q", name)
	}
	if err := prepareRunDir(RunDir); err != nil {
		return "", err
	}
	path := filepath.Join(RunDir, name)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- fmt.Errorf("opening current netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		h, err := vnetns.NewNamed(name) // unshares this thread into the new ns
		if err != nil {
			if serr := vnetns.Set(orig); serr != nil {
				errc <- errors.Join(err, serr)
				return
			}
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("creating netns %s: %w", name, err)
			return
		}
		h.Close()
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("returning to original netns: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return "", err
	}
	return path, nil
}

// Delete removes a namespace made by Create (or `ip netns add`). A missing
// namespace is not an error.
func Delete(name string) error {
	path := filepath.Join(RunDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing netns %s: %w", path, err)
	}
	return nil
}

// runDirMu serialises prepareRunDir within this process; runDirLock (a
// file lock) does it between flatnet processes.
var runDirMu sync.Mutex

const runDirLock = "/run/flatnet-netns.lock"

// prepareRunDir makes dir a mount point with shared propagation, as
// `ip netns add` does, before any namespace is mounted in it. Without this,
// namespaces mounted onto plain files of /run/netns are hidden, never to be
// unmounted, when iproute2 later bind-mounts /run/netns onto itself (seen:
// 25 test namespaces that neither `ip netns delete` nor umount could
// reach). Done under a lock so that two creators cannot both bind it.
func prepareRunDir(dir string) error {
	runDirMu.Lock()
	defer runDirMu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	lock, err := os.OpenFile(runDirLock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s: %w", runDirLock, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", runDirLock, err)
	}
	for bound := false; ; bound = true {
		err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: dir is not a mount point yet. Bind it onto itself
		// (recursively, so that namespaces already mounted in it stay
		// reachable) and try again, once.
		if !errors.Is(err, unix.EINVAL) || bound {
			return fmt.Errorf("making %s a shared mount (as `ip netns add` does): %w", dir, err)
		}
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself (as `ip netns add` does): %w", dir, err)
		}
	}
}
