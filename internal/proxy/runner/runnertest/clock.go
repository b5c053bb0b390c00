// Package runnertest drives a runner's Loop in lock step with a fake clock,
// so tests cover minutes of syncs in milliseconds and never race the loop.
//
// The loop arms a timer (Clock.After) each time it is about to block, and
// calls its sync function from the same goroutine; a test's sync function
// calls Synced. Both land on one ordered event stream, so "the loop is
// idle" is a positive signal: the last event is a timer, and nothing the
// test did since could have woken it (a request, or time reaching that
// timer).
package runnertest

import (
	"sync"
	"testing"
	"time"
)

// Event is one thing the loop did: armed a timer for At, or started a sync
// at At (Full as the runner asked).
type Event struct {
	Timer bool
	At    time.Time
	Full  bool
}

// Clock is a fake runner.Clock: time moves only on Advance.
type Clock struct {
	events chan Event

	mu       sync.Mutex // protects the fields below
	now      time.Time
	timers   []timer
	deadline time.Time // of the last timer armed: the one the loop waits for
}

type timer struct {
	at time.Time
	ch chan time.Time
}

// New returns a clock at a fixed date.
func New() *Clock {
	return &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), events: make(chan Event, 1000)}
}

// Now implements runner.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After implements runner.Clock; it reports the timer as an Event.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := timer{at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.deadline = t.at
	c.events <- Event{Timer: true, At: t.at}
	return t.ch
}

// Synced reports a sync starting now; call it from the sync function.
func (c *Clock) Synced(full bool) {
	c.events <- Event{At: c.Now(), Full: full}
}

// Advance moves time on by d and fires the timers that are due. It reports
// whether that woke the loop (its current timer was due).
func (c *Clock) Advance(d time.Duration) bool {
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
	return !c.deadline.IsZero() && !c.deadline.After(c.now)
}

// Next returns the loop's next event, failing the test when none comes.
func (c *Clock) Next(tb testing.TB) Event {
	tb.Helper()
	select {
	case e := <-c.events:
		return e
	case <-time.After(10 * time.Second):
		tb.Fatalf("the loop did nothing for 10s (at %v)", c.Now())
		return Event{}
	}
}

// Idle waits until the loop waits for a timer again and returns the syncs
// it started on the way. Call it after something that wakes the loop: its
// start, a request, an Advance that returned true.
func (c *Clock) Idle(tb testing.TB) []Event {
	tb.Helper()
	var syncs []Event
	for {
		e := c.Next(tb)
		if e.Timer {
			return syncs
		}
		syncs = append(syncs, e)
	}
}

// Step advances by d and, when that wakes the loop, waits until it is idle
// again; it returns the syncs started on the way.
func (c *Clock) Step(tb testing.TB, d time.Duration) []Event {
	tb.Helper()
	if !c.Advance(d) {
		return nil
	}
	return c.Idle(tb)
}

// Deadline is the time of the timer the loop waits for.
func (c *Clock) Deadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline
}
