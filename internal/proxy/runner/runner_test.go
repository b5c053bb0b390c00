package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/proxy/runner/runnertest"
)

type harness struct {
	t     *testing.T
	clock *runnertest.Clock
	r     *Runner
	// results ends each sync when result is nil.
	results chan error
	result  func(*harness, runnertest.Event) error
}

const (
	minI   = 1 * time.Second
	maxI   = 60 * time.Second
	retryI = 5 * time.Second
)

// start runs a loop on a fake clock; result, when set, ends each sync
// (else the test does, on h.results).
func start(t *testing.T, cfg Config, result func(*harness, runnertest.Event) error) *harness {
	h := &harness{t: t, clock: runnertest.New(), results: make(chan error), result: result}
	cfg.Clock = h.clock
	h.r = New(func(ctx context.Context, full bool) error {
		h.clock.Synced(full)
		if h.result != nil {
			return h.result(h, runnertest.Event{At: h.clock.Now(), Full: full})
		}
		select {
		case err := <-h.results:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Loop(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Loop did not return after cancel")
		}
	})
	return h
}

func startDefault(t *testing.T) *harness {
	return start(t, Config{MinInterval: minI, MaxInterval: maxI, RetryInterval: retryI}, nil)
}

// sync waits for the next sync to start (skipping timers armed on the
// way), checks it, and ends it with err.
func (h *harness) sync(wantAt time.Time, wantFull bool, err error) {
	h.t.Helper()
	for {
		e := h.clock.Next(h.t)
		if e.Timer {
			continue
		}
		if !e.At.Equal(wantAt) || e.Full != wantFull {
			h.t.Fatalf("sync at %v full=%v, want at %v full=%v", e.At, e.Full, wantAt, wantFull)
		}
		h.results <- err
		return
	}
}

// nextArmed checks that the loop's next step is to wait until want.
func (h *harness) nextArmed(want time.Time) {
	h.t.Helper()
	if e := h.clock.Next(h.t); !e.Timer || !e.At.Equal(want) {
		h.t.Fatalf("loop did %+v, want a wait until %v", e, want)
	}
}

func TestFirstSyncIsImmediateAndFull(t *testing.T) {
	h := startDefault(t)
	t0 := h.clock.Now()
	h.sync(t0, true, nil)
	h.nextArmed(t0.Add(maxI))
	h.clock.Advance(maxI)
	h.sync(t0.Add(maxI), true, nil)
	h.nextArmed(t0.Add(2 * maxI))
}

func TestBurstIsCoalescedAndWaitsMinInterval(t *testing.T) {
	h := startDefault(t)
	t0 := h.clock.Now()
	// Hold the first sync while a burst of requests arrives.
	if e := h.clock.Next(t); e.Timer {
		t.Fatalf("first event %+v, want the first sync", e)
	}
	for range 10 {
		h.r.Run()
	}
	h.results <- nil
	if h.clock.Idle(t); !h.clock.Deadline().Equal(t0.Add(minI)) {
		t.Fatalf("loop waits until %v, want %v", h.clock.Deadline(), t0.Add(minI))
	}
	if h.clock.Advance(minI - time.Millisecond) {
		t.Fatal("the loop woke before MinInterval")
	}
	h.clock.Advance(time.Millisecond)
	h.sync(t0.Add(minI), false, nil)
	// One sync served the whole burst: the loop waits for the next full
	// resync, a period after the last one.
	h.nextArmed(t0.Add(maxI))

	// A request long after the last sync runs at once.
	h.clock.Advance(10 * time.Second)
	h.r.Run()
	h.sync(t0.Add(minI+10*time.Second), false, nil)
}

func TestFailedSyncIsRetriedFully(t *testing.T) {
	h := startDefault(t)
	t0 := h.clock.Now()
	h.sync(t0, true, nil)
	h.nextArmed(t0.Add(maxI))
	h.clock.Advance(10 * time.Second)
	h.r.Run()
	h.sync(t0.Add(10*time.Second), false, errors.New("nft: boom"))
	h.nextArmed(t0.Add(10*time.Second + retryI))
	h.clock.Advance(retryI)
	h.sync(t0.Add(10*time.Second+retryI), true, nil)
	h.nextArmed(t0.Add(10*time.Second + retryI + maxI))
}

// A sync requested every half period still leaves a full one at least
// every period: churn must not postpone the repair of drift for ever.
func TestFullResyncUnderChurn(t *testing.T) {
	h := start(t, Config{MinInterval: minI, MaxInterval: maxI, RetryInterval: retryI}, func(*harness, runnertest.Event) error { return nil })
	t0 := h.clock.Now()
	syncs := h.clock.Idle(t)
	const step = 5 * time.Second
	for now := step; now <= 6*maxI; now += step {
		syncs = append(syncs, h.clock.Step(t, step)...)
		if (now-10*time.Second)%(maxI/2) == 0 {
			h.r.Run()
			syncs = append(syncs, h.clock.Idle(t)...)
		}
	}
	var log strings.Builder
	lastFull, partial := t0, 0
	for _, s := range syncs {
		fmt.Fprintf(&log, " %v/full=%v", s.At.Sub(t0), s.Full)
		if s.Full {
			if gap := s.At.Sub(lastFull); gap > maxI {
				t.Errorf("full syncs %v apart (at %v and %v), want at most the period %v", gap, lastFull.Sub(t0), s.At.Sub(t0), maxI)
			}
			lastFull = s.At
		} else {
			partial++
		}
	}
	if end := h.clock.Now(); end.Sub(lastFull) > maxI {
		t.Errorf("no full sync from %v to the end %v (period %v)", lastFull.Sub(t0), end.Sub(t0), maxI)
	}
	if partial < 10 {
		t.Errorf("%d partial syncs, want one per request (12)", partial)
	}
	t.Logf("syncs:%s", log.String())
}

// Failed syncs are retried after 1, 2, 4, ... retry intervals, capped at
// the period; requests arriving meanwhile do not cut the wait short; a
// success resets the backoff.
func TestFailedSyncsBackOff(t *testing.T) {
	failing := true
	h := start(t, Config{MinInterval: minI, MaxInterval: maxI, RetryInterval: time.Second}, func(*harness, runnertest.Event) error {
		if failing {
			return errors.New("nft: boom")
		}
		return nil
	})
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	t0 := h.clock.Now()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || !syncs[0].Full {
		t.Fatalf("first syncs %+v, want one full", syncs)
	}
	last := t0
	for i, w := range want {
		w *= time.Second
		if got := h.clock.Deadline().Sub(last); got != w {
			t.Fatalf("retry %d after %v, want %v", i+1, got, w)
		}
		// A request in the middle of the wait changes nothing.
		if !h.clock.Advance(w / 2) {
			h.r.Run()
			if syncs := h.clock.Idle(t); len(syncs) != 0 || !h.clock.Deadline().Equal(last.Add(w)) {
				t.Fatalf("a request during backoff: syncs %+v, then a wait until %v; want no sync and a wait until %v",
					syncs, h.clock.Deadline().Sub(t0), last.Add(w).Sub(t0))
			}
		}
		syncs := h.clock.Step(t, w-w/2)
		if len(syncs) != 1 {
			t.Fatalf("retry %d: syncs %+v, want one", i+1, syncs)
		}
		if !syncs[0].Full {
			t.Errorf("retry %d was partial, want full", i+1)
		}
		last = h.clock.Now()
	}
	// Success, then a new failure: the backoff starts again from 1s.
	failing = false
	h.clock.Step(t, h.clock.Deadline().Sub(h.clock.Now()))
	failing = true
	h.clock.Advance(5 * time.Second)
	h.r.Run()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || syncs[0].Full {
		t.Fatalf("request after a success: syncs %+v, want one partial", syncs)
	}
	if got := h.clock.Deadline().Sub(h.clock.Now()); got != time.Second {
		t.Errorf("first retry after a success and a new failure in %v, want 1s", got)
	}
}

func TestRetryNoSoonerThanMinInterval(t *testing.T) {
	h := start(t, Config{MinInterval: 10 * time.Second, MaxInterval: time.Minute, RetryInterval: time.Second}, func(*harness, runnertest.Event) error {
		return errors.New("nft: boom")
	})
	t0 := h.clock.Now()
	h.clock.Idle(t)
	if got, want := h.clock.Deadline(), t0.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("retry due at %v, want %v", got.Sub(t0), want.Sub(t0))
	}
}

func TestDefaults(t *testing.T) {
	r := New(nil, Config{})
	if r.cfg.RetryInterval != time.Second || r.cfg.MaxInterval != time.Hour || r.cfg.Clock != Real {
		t.Errorf("defaults: %+v", r.cfg)
	}
}

// A full sync that takes long spaces the next full resync out to
// FullSyncSpacing times its duration; partial syncs still run meanwhile,
// and a quick full sync brings the period back.
func TestSlowFullResyncIsSpacedOut(t *testing.T) {
	h := startDefault(t)
	t0 := h.clock.Now()
	if e := h.clock.Next(t); e.Timer || !e.Full {
		t.Fatalf("first event %+v, want the first (full) sync", e)
	}
	h.clock.Advance(20 * time.Second) // the first sync takes 20 s
	h.results <- nil
	h.nextArmed(t0.Add(FullSyncSpacing * 20 * time.Second)) // 200 s, not maxI (60 s)
	h.r.Run()
	h.sync(t0.Add(20*time.Second), false, nil)
	h.nextArmed(t0.Add(FullSyncSpacing * 20 * time.Second))
	h.clock.Advance(FullSyncSpacing*20*time.Second - 20*time.Second)
	h.sync(t0.Add(FullSyncSpacing*20*time.Second), true, nil) // quick
	h.nextArmed(t0.Add(FullSyncSpacing*20*time.Second + maxI))
}

// With FullInterval set, full resyncs come that far apart however many
// partial syncs run, while failures still back off up to MaxInterval only.
func TestFullIntervalApartFromMaxInterval(t *testing.T) {
	const fullI = 10 * maxI
	failing := false
	h := start(t, Config{MinInterval: minI, MaxInterval: maxI, FullInterval: fullI, RetryInterval: time.Second}, func(*harness, runnertest.Event) error {
		if failing {
			return errors.New("nft: boom")
		}
		return nil
	})
	t0 := h.clock.Now()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || !syncs[0].Full {
		t.Fatalf("first syncs %+v, want one full", syncs)
	}
	// Idle: no wake-up before the full resync is due.
	if got := h.clock.Deadline(); !got.Equal(t0.Add(fullI)) {
		t.Fatalf("idle loop waits until %v, want the full resync at %v", got.Sub(t0), fullI)
	}
	// Requests every 30 s: partial syncs only, until the full one is due.
	var full []time.Duration
	for now := 30 * time.Second; now <= 2*fullI; now += 30 * time.Second {
		for _, s := range h.clock.Step(t, 30*time.Second) {
			if s.Full {
				full = append(full, s.At.Sub(t0))
			}
		}
		h.r.Run()
		for _, s := range h.clock.Idle(t) {
			if s.Full {
				full = append(full, s.At.Sub(t0))
			}
		}
	}
	if want := []time.Duration{fullI, 2 * fullI}; fmt.Sprint(full) != fmt.Sprint(want) {
		t.Errorf("full syncs at %v, want %v", full, want)
	}
	// A failure is retried (fully) with a backoff capped at MaxInterval,
	// not FullInterval.
	failing = true
	h.clock.Advance(5 * time.Second)
	h.r.Run()
	h.clock.Idle(t)
	last := h.clock.Now()
	for range 8 {
		h.clock.Step(t, h.clock.Deadline().Sub(h.clock.Now()))
		if gap := h.clock.Now().Sub(last); gap > maxI {
			t.Fatalf("retry %v after the one before, want at most MaxInterval %v", gap, maxI)
		}
		last = h.clock.Now()
	}
}

// With PartialSpacing and no MinInterval, a request runs at once after a
// full sync, and after a partial sync that took d no sooner than
// PartialSpacing times d after its start.
func TestPartialSyncsSpacedByTheirDuration(t *testing.T) {
	var took time.Duration // how long each sync takes
	// The callback gets the harness as an argument: the loop may run the
	// first sync before start returns it.
	h := start(t, Config{MaxInterval: maxI, RetryInterval: retryI, PartialSpacing: 10}, func(h *harness, _ runnertest.Event) error {
		h.clock.Advance(took)
		return nil
	})
	t0 := h.clock.Now()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || !syncs[0].Full {
		t.Fatalf("first syncs %+v, want one full", syncs)
	}
	took = 30 * time.Millisecond
	h.r.Run()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || syncs[0].Full || !syncs[0].At.Equal(t0) {
		t.Fatalf("after a full sync: %+v, want one partial at once", syncs)
	}
	h.r.Run()
	if h.clock.Idle(t); !h.clock.Deadline().Equal(t0.Add(300 * time.Millisecond)) {
		t.Fatalf("after a 30 ms partial sync the loop waits until +%v, want +300ms", h.clock.Deadline().Sub(t0))
	}
	took = 0
	if syncs := h.clock.Step(t, 270*time.Millisecond); len(syncs) != 1 || !syncs[0].At.Equal(t0.Add(300*time.Millisecond)) {
		t.Fatalf("syncs %+v, want one at +300ms", syncs)
	}
	// That one took no time: the next request runs at once.
	h.r.Run()
	if syncs := h.clock.Idle(t); len(syncs) != 1 || !syncs[0].At.Equal(t0.Add(300*time.Millisecond)) {
		t.Fatalf("syncs %+v, want one at once", syncs)
	}
}

// MinInterval stays the floor under PartialSpacing.
func TestPartialSpacingKeepsMinInterval(t *testing.T) {
	h := start(t, Config{MinInterval: minI, MaxInterval: maxI, RetryInterval: retryI, PartialSpacing: 10}, func(*harness, runnertest.Event) error { return nil })
	t0 := h.clock.Now()
	h.clock.Idle(t)
	h.r.Run()
	h.clock.Idle(t)
	if !h.clock.Deadline().Equal(t0.Add(minI)) {
		t.Fatalf("loop waits until +%v, want MinInterval after the last sync", h.clock.Deadline().Sub(t0))
	}
}
