package netlinkx

// Deleting several links in one request.
//
// Removing a link waits for the kernel: unregistering a device ends in an
// RCU barrier (netdev_run_todo), ~10-15 ms here, and two removals, even
// from two threads, wait one after the other. RTM_DELLINK with no index
// and an IFLA_GROUP removes every link of that group in the namespace as
// one batch (rtnl_group_dellink), with one wait. A LinkBatch gives the
// links it is handed a group of their own, then deletes the group.
//
// The group is 0x40000000 | pid: nonzero (0 is every link's default),
// unique among the processes running at once, and far from the small
// numbers people give groups by hand. A process that dies between marking
// and deleting leaves the links in that group; they are still found by
// name, and the next DEL of their owner removes them.

import (
	"fmt"
	"os"
	"sync"
)

// LinkDeleter deletes a link of the caller's network namespace by index,
// now or later (a LinkBatch); a missing link is no error.
type LinkDeleter interface {
	DeleteLink(index int) error
}

// LinkBatch collects links of the caller's network namespace to delete
// together. Its methods may be called from several goroutines, but all
// in the same network namespace.
type LinkBatch struct {
	group uint32
	mu    sync.Mutex
	n     int
}

// NewLinkBatch returns an empty batch.
func NewLinkBatch() *LinkBatch {
	return &LinkBatch{group: 0x40000000 | uint32(os.Getpid())&0x3fffffff}
}

// DeleteLink marks the link with index for deletion by Flush; a missing
// link is not an error (it is gone already).
func (b *LinkBatch) DeleteLink(index int) error {
	if err := setGroup(index, b.group, false); err != nil {
		return fmt.Errorf("marking link %d for deletion (group %#x): %w", index, b.group, err)
	}
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
	return nil
}

// Flush deletes the marked links in one request.
func (b *LinkBatch) Flush() error {
	b.mu.Lock()
	n := b.n
	b.n = 0
	b.mu.Unlock()
	if n == 0 {
		return nil
	}
	// A group found empty: gone meanwhile (a veth whose peer's namespace
	// was deleted).
	if _, err := DeleteGroup(b.group); err != nil {
		return fmt.Errorf("deleting %d links: %w", n, err)
	}
	return nil
}
