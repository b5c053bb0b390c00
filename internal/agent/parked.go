package agent

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/cni/parking"
)

// parkedEvery is how often the agent looks for the links the CNI plugins'
// DEL parked (internal/cni/parking), and parkedSweepEvery how often it
// deletes the parked group without a marker (one a plugin in another
// mount namespace wrote where the agent cannot see it, or a link parked
// while a collection removed the marker).
const (
	parkedEvery      = 2 * time.Second
	parkedSweepEvery = 30 * time.Second
)

// collectParked deletes the node's parked links in batches until ctx
// ends: one kernel wait per batch, off every DEL's path.
func collectParked(ctx context.Context) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(parkedEvery)
	defer tick.Stop()
	lastSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			// What the last DELs parked, and the marker, before the
			// agent goes (the node may go with it).
			if _, err := parking.Collect(); err != nil {
				logger.Error(err, "Collecting parked pod links at exit")
			}
			return
		case <-tick.C:
		}
		if _, marked := parking.ParkedSince(); !marked && time.Since(lastSweep) < parkedSweepEvery {
			continue
		}
		lastSweep = time.Now()
		start := time.Now()
		found, err := parking.Collect()
		if err != nil {
			logger.Error(err, "Collecting parked pod links")
			continue
		}
		if found {
			logger.V(2).Info("Collected parked pod links", "took", time.Since(start))
		}
	}
}
