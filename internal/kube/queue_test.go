package kube

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
)

func TestWaitForCachesCleanStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ok, err := WaitForCaches(ctx, "t", func() bool { return false })
	if ok || err != nil {
		t.Fatalf("cancelled wait: ok=%v err=%v, want false, nil", ok, err)
	}
}

func TestRunWorkersRetriesThenForgets(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, 10*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	var calls, errs atomic.Int32
	done := make(chan struct{})
	q.Add("a")
	go func() {
		RunWorkers(ctx, q, 2, func(_ context.Context, key string) error {
			if calls.Add(1) < 3 {
				return errors.New("not yet")
			}
			cancel()
			return nil
		}, func(context.Context, string, error) { errs.Add(1) })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunWorkers did not return after ctx ended")
	}
	if calls.Load() != 3 || errs.Load() != 2 {
		t.Errorf("calls=%d errors=%d, want 3 and 2", calls.Load(), errs.Load())
	}
	if !q.ShuttingDown() {
		t.Error("queue not shut down")
	}
}
