package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fakeClock reports every timer the loop arms on armed and fires timers
// only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
	armed  chan time.Time
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), armed: make(chan time.Time, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := fakeTimer{at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.armed <- t.at
	return t.ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
			continue
		}
		kept = append(kept, t)
	}
	c.timers = kept
}

type call struct {
	at       time.Time
	periodic bool
}

type harness struct {
	t       *testing.T
	clock   *fakeClock
	r       *Runner
	calls   chan call
	results chan error
}

const (
	minI   = 1 * time.Second
	maxI   = 60 * time.Second
	retryI = 5 * time.Second
)

func start(t *testing.T) *harness {
	h := &harness{t: t, clock: newFakeClock(), calls: make(chan call), results: make(chan error)}
	h.r = New(func(ctx context.Context, periodic bool) error {
		h.calls <- call{at: h.clock.Now(), periodic: periodic}
		return <-h.results
	}, Config{MinInterval: minI, MaxInterval: maxI, RetryInterval: retryI, Clock: h.clock})
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

// sync waits for the next sync to start, checks it, and ends it with err.
func (h *harness) sync(wantAt time.Time, wantPeriodic bool, err error) {
	h.t.Helper()
	select {
	case c := <-h.calls:
		if !c.at.Equal(wantAt) || c.periodic != wantPeriodic {
			h.t.Fatalf("sync at %v periodic=%v, want at %v periodic=%v", c.at, c.periodic, wantAt, wantPeriodic)
		}
		h.results <- err
	case <-time.After(5 * time.Second):
		h.t.Fatalf("no sync started (want one at %v)", wantAt)
	}
}

// noSync checks that no sync starts for a moment of real time.
func (h *harness) noSync() {
	h.t.Helper()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected sync at %v periodic=%v", c.at, c.periodic)
	case <-time.After(50 * time.Millisecond):
	}
}

// armed waits until the loop arms a timer for want; deadlines of timers it
// abandoned on the way (a request arrived) are skipped.
func (h *harness) armed(want time.Time) {
	h.t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case at := <-h.clock.armed:
			if at.Equal(want) {
				return
			}
		case <-timeout:
			h.t.Fatalf("loop never waited for %v", want)
		}
	}
}

// nextArmed checks the very next timer the loop arms.
func (h *harness) nextArmed(want time.Time) {
	h.t.Helper()
	select {
	case at := <-h.clock.armed:
		if !at.Equal(want) {
			h.t.Fatalf("loop waits until %v, want %v", at, want)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatalf("loop armed no timer (want %v)", want)
	}
}

func TestFirstSyncIsImmediateAndPeriodic(t *testing.T) {
	h := start(t)
	t0 := h.clock.Now()
	h.sync(t0, true, nil)
	h.nextArmed(t0.Add(maxI))
	h.clock.Advance(maxI)
	h.sync(t0.Add(maxI), true, nil)
	h.nextArmed(t0.Add(2 * maxI))
}

func TestBurstIsCoalescedAndWaitsMinInterval(t *testing.T) {
	h := start(t)
	t0 := h.clock.Now()
	// Hold the first sync while a burst of requests arrives.
	select {
	case <-h.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no first sync")
	}
	for range 10 {
		h.r.Run()
	}
	h.results <- nil
	h.armed(t0.Add(minI))
	h.clock.Advance(minI - time.Millisecond)
	h.noSync()
	h.clock.Advance(time.Millisecond)
	h.sync(t0.Add(minI), false, nil)
	// One sync served the whole burst: the loop is back to the periodic wait.
	h.nextArmed(t0.Add(minI + maxI))

	// A request long after the last sync runs at once.
	h.clock.Advance(10 * time.Second)
	h.r.Run()
	h.sync(t0.Add(minI+10*time.Second), false, nil)
}

func TestFailedSyncIsRetried(t *testing.T) {
	h := start(t)
	t0 := h.clock.Now()
	h.sync(t0, true, errors.New("nft: boom"))
	h.nextArmed(t0.Add(retryI))
	h.clock.Advance(retryI)
	h.sync(t0.Add(retryI), false, nil)
	h.nextArmed(t0.Add(retryI + maxI))
}

func TestRetryNoSoonerThanMinInterval(t *testing.T) {
	r := New(nil, Config{MinInterval: 10 * time.Second, MaxInterval: time.Minute, RetryInterval: time.Second})
	last := time.Unix(1000, 0)
	if got, want := r.due(last, false, last.Add(time.Second)), last.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("retry due at %v, want %v", got, want)
	}
	if got, want := r.due(last, false, time.Time{}), last.Add(time.Minute); !got.Equal(want) {
		t.Errorf("idle due at %v, want %v", got, want)
	}
	if got := r.due(time.Time{}, false, time.Time{}); !got.IsZero() {
		t.Errorf("first sync due at %v, want at once", got)
	}
}

func TestDefaults(t *testing.T) {
	r := New(nil, Config{})
	if r.cfg.RetryInterval != time.Second || r.cfg.MaxInterval != time.Hour || r.cfg.Clock != Real {
		t.Errorf("defaults: %+v", r.cfg)
	}
}
