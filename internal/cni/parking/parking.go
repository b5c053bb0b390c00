// Package parking takes a pod's links off DEL's path: DEL parks them
// (down, in netlinkx.ParkedGroup) instead of deleting them, and a
// collector deletes every parked link of the namespace in one request.
//
// Why: deleting a link waits for an RCU barrier in the kernel (~15 ms
// here), the largest part of a DEL once the plugin is one process. A
// parked link waits for nothing (~0.3 ms to park), carries no traffic (it
// is down: the pod's address answers nowhere), and its name is free (the
// container's end is renamed), so the address and the interface name may
// be reused at once. The veth pair goes away by itself when the runtime
// deletes the pod's netns, as it does right after DEL (the kernel tears
// the namespace down in the background, in batches); the IFB and a veth
// whose netns is kept must be collected.
//
// Who collects, so that nothing is left if the node agent is not running:
//   - the node agent, every few seconds (Collect);
//   - GC (CNI 1.1), at once;
//   - the next ADD of bridge or bandwidth, when links were parked more
//     than StaleAfter ago (CollectStale): the agent would have taken them
//     by then, so it is not running. ADD runs the collection beside its
//     own work.
//
// A marker file per network namespace (/run/flatnet/parked/net-<inode>)
// says when the oldest uncollected link was parked, so that ADD's check
// is one stat, not a link dump.
package parking

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// StaleAfter is how long parked links may wait for a collector before
// ADD collects them itself.
const StaleAfter = 10 * time.Second

// Dir holds the markers; tests point it elsewhere.
var Dir = "/run/flatnet/parked"

// MarkerPath is the marker of the caller's network namespace.
func MarkerPath() (string, error) {
	return markerOf("/proc/thread-self/ns/net")
}

// markerOf is the marker of the network namespace at nsPath (a
// /proc/.../ns/net file or a bind mount of one).
func markerOf(nsPath string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		return "", fmt.Errorf("parking: reading the network namespace %s: %w", nsPath, err)
	}
	return filepath.Join(Dir, "net-"+strconv.FormatUint(st.Ino, 10)), nil
}

// Forget removes the marker of the network namespace at nsPath, which is
// about to be deleted (its parked links go with it): whoever deletes a
// namespace that plugins ran in calls it, or the marker outlives it.
func Forget(nsPath string) error {
	path, err := markerOf(nsPath)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("parking: %w", err)
	}
	return nil
}

// Parker is a netlinkx.LinkDeleter that parks instead of deleting. Its
// methods may be called from several goroutines, all in one network
// namespace (the host's).
type Parker struct {
	mu     sync.Mutex
	parked int
}

// New returns a Parker.
func New() *Parker { return &Parker{} }

// ParksLinks tells veth.DeleteInNS to park the container's end too
// (renamed, so that its name is free) instead of deleting the pair.
func (p *Parker) ParksLinks() {}

// DeleteLink parks the link with index; a missing link is not an error.
func (p *Parker) DeleteLink(index int) error {
	if err := netlinkx.ParkLink(index); err != nil {
		return err
	}
	p.mu.Lock()
	p.parked++
	p.mu.Unlock()
	return nil
}

// Flush records that links were parked (the marker), if any were.
func (p *Parker) Flush() error {
	p.mu.Lock()
	n := p.parked
	p.parked = 0
	p.mu.Unlock()
	if n == 0 {
		return nil
	}
	path, err := MarkerPath()
	if err != nil {
		return err
	}
	// O_EXCL: an existing marker keeps the time of the oldest parking.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(Dir, 0o755); err == nil {
			f, err = os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		}
	}
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("parking: recording %d parked link(s) in %s: %w", n, path, err)
	}
	return f.Close()
}

// Collect deletes every parked link of the caller's network namespace in
// one request; found is false when there was none.
func Collect() (found bool, err error) {
	// The marker goes first: a link parked meanwhile makes a new one.
	if path, err := MarkerPath(); err == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("parking: %w", err)
		}
	}
	return netlinkx.DeleteGroup(netlinkx.ParkedGroup)
}

// ParkedSince is when the oldest link not yet collected was parked in the
// caller's network namespace (its marker's time); ok is false when the
// marker says none is.
func ParkedSince() (since time.Time, ok bool) {
	path, err := MarkerPath()
	if err != nil {
		return time.Time{}, false
	}
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}, false
	}
	return st.ModTime(), true
}

// CollectStale collects when links were parked more than StaleAfter ago
// in the caller's network namespace (no collector is running); otherwise
// it only looks at the marker.
func CollectStale() error {
	if since, ok := ParkedSince(); !ok || time.Since(since) < StaleAfter {
		return nil
	}
	_, err := Collect()
	return err
}

// staleOnce: a process looks once (the flatnet type runs bridge's and
// bandwidth's ADD in one process, and both ask).
var staleOnce sync.Once

// CollectStaleBeside runs CollectStale beside the caller's work (ADD's),
// the first time a process asks, and returns a func that waits for it. A
// failure is not ADD's: the links stay parked (down) for the next
// collector, and GC reports it. It runs on a goroutine of its own, so in
// the process's network namespace: a plugin's, the host's.
func CollectStaleBeside() (wait func()) {
	done := make(chan struct{})
	ran := false
	staleOnce.Do(func() {
		ran = true
		go func() { defer close(done); _ = CollectStale() }()
	})
	if !ran {
		close(done)
	}
	return func() { <-done }
}
