package agent

import (
	"context"
	"testing"
	"time"
)

// policyAfterProxy returns once every proxier synced, at the limit when
// one never does, and when the context ends.
func TestPolicyAfterProxy(t *testing.T) {
	returns := func(ctx context.Context, synced []<-chan struct{}, limit time.Duration) time.Duration {
		t.Helper()
		done := make(chan time.Duration, 1)
		start := time.Now()
		go func() {
			policyAfterProxy(ctx, synced, limit)
			done <- time.Since(start)
		}()
		select {
		case d := <-done:
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("policyAfterProxy did not return within 30s")
			return 0
		}
	}
	ctx := context.Background()
	a, b := make(chan struct{}), make(chan struct{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(a)
		close(b)
	}()
	returns(ctx, []<-chan struct{}{a, b}, time.Hour) // both synced: returns (no limit reached)
	returns(ctx, nil, time.Hour)                     // no proxy: at once

	never := make(chan struct{})
	if d := returns(ctx, []<-chan struct{}{a, never}, 50*time.Millisecond); d < 50*time.Millisecond {
		t.Errorf("returned after %v, before the 50ms limit, with a proxier not synced", d)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	returns(cctx, []<-chan struct{}{never}, time.Hour) // the context ends it
}
