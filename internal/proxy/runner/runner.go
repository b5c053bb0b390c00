// Package runner runs a sync function at a bounded frequency, in the shape
// of kube-proxy's BoundedFrequencyRunner (written anew):
//
//   - Run asks for a sync; requests that arrive before the sync starts are
//     coalesced into one, so a burst of API events costs one transaction;
//   - two syncs start at least MinInterval apart (a request arriving sooner
//     waits for the interval to pass, then runs);
//   - a sync starts at least every MaxInterval even with no request, and is
//     then marked periodic (the proxier does a full resync on those);
//   - a failed sync is retried after RetryInterval (still no sooner than
//     MinInterval after the failed one), without any new request.
//
// The loop reads time only through Clock, so tests drive it with a fake.
package runner

import (
	"context"
	"time"
)

// Clock is the time source. Real uses the system clock.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Real is the system clock.
var Real Clock = realClock{}

// Func is one sync. periodic is true when the sync runs because MaxInterval
// passed (or it is the first one) rather than because of Run.
type Func func(ctx context.Context, periodic bool) error

// Config sets the intervals. MinInterval may be 0 (run at once on every
// request); MaxInterval must be > 0; RetryInterval defaults to MinInterval,
// or one second when that is 0.
type Config struct {
	MinInterval   time.Duration
	MaxInterval   time.Duration
	RetryInterval time.Duration
	Clock         Clock // Real when nil
}

// Runner coalesces sync requests. Create it with New and start Loop.
type Runner struct {
	cfg  Config
	fn   Func
	kick chan struct{}
}

// New returns a runner for fn.
func New(fn Func, cfg Config) *Runner {
	if cfg.Clock == nil {
		cfg.Clock = Real
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = cfg.MinInterval
		if cfg.RetryInterval <= 0 {
			cfg.RetryInterval = time.Second
		}
	}
	if cfg.MaxInterval <= 0 {
		cfg.MaxInterval = time.Hour
	}
	return &Runner{cfg: cfg, fn: fn, kick: make(chan struct{}, 1)}
}

// Run asks for a sync; it never blocks.
func (r *Runner) Run() {
	select {
	case r.kick <- struct{}{}:
	default: // one is already queued: coalesced
	}
}

// Loop runs syncs until ctx ends. The first sync starts at once and is
// periodic.
func (r *Runner) Loop(ctx context.Context) {
	var (
		last    time.Time // start of the last sync; zero before the first
		pending = true
		retryAt time.Time // zero when no retry is due
	)
	for {
		now := r.cfg.Clock.Now()
		due := r.due(last, pending, retryAt)
		if !now.Before(due) {
			periodic := last.IsZero() || !now.Before(last.Add(r.cfg.MaxInterval))
			pending, retryAt, last = false, time.Time{}, now
			// A request arriving from here on is for the next sync.
			if err := r.fn(ctx, periodic); err != nil {
				retryAt = now.Add(r.cfg.RetryInterval)
			}
			if ctx.Err() != nil {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			pending = true
		case <-r.cfg.Clock.After(due.Sub(now)):
		}
	}
}

// due is when the next sync may start.
func (r *Runner) due(last time.Time, pending bool, retryAt time.Time) time.Time {
	if last.IsZero() {
		return last
	}
	next := last.Add(r.cfg.MaxInterval)
	if !retryAt.IsZero() && retryAt.Before(next) {
		next = retryAt
	}
	if pending {
		next = last.Add(r.cfg.MinInterval)
	}
	if earliest := last.Add(r.cfg.MinInterval); next.Before(earliest) {
		next = earliest
	}
	return next
}
