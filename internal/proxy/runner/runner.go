// Package runner runs a sync function at a bounded frequency, in the shape
// of kube-proxy's BoundedFrequencyRunner (written anew), and decides which
// syncs are full, as kube-proxy's proxiers do with lastFullSync and
// needFullSync:
//
//   - Run asks for a sync; requests that arrive before the sync starts are
//     coalesced into one, so a burst of API events costs one transaction;
//   - two syncs start at least MinInterval apart (a request arriving sooner
//     waits for the interval to pass, then runs);
//   - with PartialSpacing, a sync after a partial one that took d also
//     starts no sooner than PartialSpacing times d after that one started,
//     so partial syncs take at most 1/PartialSpacing of the time under a
//     steady stream of requests. That bounds the CPU the way a fixed
//     MinInterval does (kube-proxy's 1 s was set for iptables-restore runs
//     of tens or hundreds of milliseconds), while a change waits for a
//     few of the proxy's own syncs' worth of time rather than for up to a
//     second: a partial sync that takes 5 ms holds the next for 50 ms;
//   - a sync is full when it is the first, when the one before failed, or
//     when the last successful full sync started FullInterval ago or more
//     (MaxInterval when FullInterval is 0).
//     That clock is kept apart from the last sync of any kind: on a busy
//     cluster requests keep partial syncs coming more often than
//     MaxInterval, and a full one must still come, or drift (a foreign
//     edit of the table, a bug in a partial sync) is never repaired. With
//     no request the loop wakes for that full sync alone;
//   - a full sync that took long spaces the next one out: the resync period
//     is at least FullSyncSpacing times the last full sync's duration, so
//     resyncs take at most 1/FullSyncSpacing of the time. At 10,000
//     Services the kernel needs minutes to commit a full nftables resync
//     (docs/benchmarks.md); resyncing every 30 s would keep the proxy
//     busy for good and hold every partial sync behind a resync;
//   - FullInterval apart from MaxInterval is kube-proxy's split between
//     syncPeriod and its hard-coded hourly FullSyncPeriod: a full resync
//     lists and rewrites the whole table, which at 10,000 Services costs
//     seconds of CPU and a transient 100 MB, so the proxy does it hourly
//     and repairs drift within the hour, while MaxInterval still caps the
//     retry backoff;
//   - a failed sync is retried without any new request after RetryInterval,
//     doubled on each further failure up to MaxInterval, and reset by a
//     success. Requests do not cut that wait short: the retry is a full
//     sync that takes every change in, and a table the kernel keeps
//     refusing must not cost a full listing every MinInterval.
//
// The loop reads time only through Clock, so tests drive it with a fake
// (runnertest).
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

// Func is one sync; full asks it to rebuild everything rather than only
// what changed.
type Func func(ctx context.Context, full bool) error

// Config sets the intervals. MinInterval may be 0 (run at once on every
// request); MaxInterval caps the retry backoff and is the full-resync
// period unless FullInterval is set (an hour when 0); RetryInterval, the
// first retry's delay, defaults to MinInterval, or one second when that
// is 0.
type Config struct {
	MinInterval   time.Duration
	MaxInterval   time.Duration
	FullInterval  time.Duration
	RetryInterval time.Duration
	// PartialSpacing, when > 0, spaces syncs after a partial one by this
	// many times its duration (at least MinInterval).
	PartialSpacing int
	Clock          Clock // Real when nil
}

// FullSyncSpacing bounds the share of time spent in full resyncs: the
// next one is due no sooner than this many times the last one's duration
// after it started.
const FullSyncSpacing = 10

// PartialSyncSpacing is the Service proxy's PartialSpacing: partial syncs
// take at most a tenth of the time, however busy the cluster.
const PartialSyncSpacing = 10

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
	if cfg.FullInterval <= 0 {
		cfg.FullInterval = cfg.MaxInterval
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

// schedule is what the loop remembers between syncs.
type schedule struct {
	last     time.Time     // start of the last sync; zero before the first
	lastFull time.Time     // start of the last successful full sync
	fullTook time.Duration // how long that sync took
	// partialTook is how long the last sync took when it was a successful
	// partial one, else 0.
	partialTook time.Duration
	failures    int       // consecutive failed syncs
	retryAt     time.Time // when failures > 0: the earliest retry
	pending     bool      // a request arrived since the last sync started
}

// Loop runs syncs until ctx ends. The first sync starts at once and is
// full.
func (r *Runner) Loop(ctx context.Context) {
	s := schedule{pending: true}
	for {
		now := r.cfg.Clock.Now()
		due := r.due(s)
		if !now.Before(due) {
			full := r.full(s, now)
			s.last, s.pending = now, false
			// A request arriving from here on is for the next sync.
			err := r.fn(ctx, full)
			if ctx.Err() != nil {
				return
			}
			s.partialTook = 0
			if err == nil && !full {
				s.partialTook = r.cfg.Clock.Now().Sub(now)
			}
			if err != nil {
				s.failures++
				s.retryAt = r.cfg.Clock.Now().Add(r.backoff(s.failures))
			} else {
				s.failures = 0
				if full {
					s.lastFull, s.fullTook = now, r.cfg.Clock.Now().Sub(now)
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			s.pending = true
		case <-r.cfg.Clock.After(due.Sub(now)):
		}
	}
}

// full reports whether a sync starting at now must be full.
func (r *Runner) full(s schedule, now time.Time) bool {
	return s.lastFull.IsZero() || s.failures > 0 || !now.Before(s.lastFull.Add(r.fullPeriod(s)))
}

// fullPeriod is the time from a full sync's start to the next one's:
// FullInterval, or FullSyncSpacing times the last one's duration if longer.
func (r *Runner) fullPeriod(s schedule) time.Duration {
	return max(r.cfg.FullInterval, FullSyncSpacing*s.fullTook)
}

// due is when the next sync may start: at once for the first; after a
// failure at the retry; on a request MinInterval (or PartialSpacing times
// the last partial sync's duration, if longer) after the last sync;
// without one when the next full resync is due.
func (r *Runner) due(s schedule) time.Time {
	if s.last.IsZero() {
		return s.last
	}
	var next time.Time
	switch {
	case s.failures > 0:
		next = s.retryAt
	case s.pending:
		next = s.last
	default:
		next = s.lastFull.Add(r.fullPeriod(s))
	}
	gap := max(r.cfg.MinInterval, time.Duration(r.cfg.PartialSpacing)*s.partialTook)
	if earliest := s.last.Add(gap); next.Before(earliest) {
		next = earliest
	}
	return next
}

// backoff is the wait after the n-th consecutive failure: RetryInterval,
// doubled for each further one, at most MaxInterval.
func (r *Runner) backoff(n int) time.Duration {
	d := r.cfg.RetryInterval
	for i := 1; i < n && d < r.cfg.MaxInterval; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxInterval)
}
