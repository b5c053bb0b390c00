package kube

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// WaitForCaches waits for synced. It reports false, with no error, when
// ctx ends first: a stop before the caches sync is a clean stop.
func WaitForCaches(ctx context.Context, name string, synced ...cache.InformerSynced) (bool, error) {
	if cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, nil
	}
	return false, errors.New(name + ": caches did not sync")
}

// RunWorkers runs syncKey on keys from queue with workers goroutines until
// ctx ends, then shuts the queue down and waits for them. A failed key is
// retried with the queue's rate limit; onError (may be nil) logs it.
func RunWorkers(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], workers int,
	syncKey func(ctx context.Context, key string) error, onError func(ctx context.Context, key string, err error)) {
	defer queue.ShutDown()
	process := func(ctx context.Context) bool {
		key, quit := queue.Get()
		if quit {
			return false
		}
		defer queue.Done(key)
		if err := syncKey(ctx, key); err != nil {
			if onError != nil {
				onError(ctx, key, err)
			} else {
				klog.FromContext(ctx).Error(err, "Sync failed; will retry", "key", key)
			}
			queue.AddRateLimited(key)
			return true
		}
		queue.Forget(key)
		return true
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for process(ctx) {
				}
			}, time.Second)
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
}
