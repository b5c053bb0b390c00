package dirlock

import (
	"testing"
	"time"
)

// TestLockWaits: a second Lock on the same directory waits (and says so)
// until the first is released.
func TestLockWaits(t *testing.T) {
	dir := t.TempDir() + "/made"
	unlock, err := Lock(dir, func() { t.Error("the first Lock waited") })
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	got := make(chan error)
	go func() {
		u, err := Lock(dir, func() { close(waited) })
		if err == nil {
			u()
		}
		got <- err
	}()
	<-waited
	select {
	case err := <-got:
		t.Fatalf("the second Lock returned (%v) while the first held it", err)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
