// Package tc programs Linux traffic control over netlink: token-bucket
// (TBF) qdiscs, the ingress qdisc with a redirect filter, and IFB devices.
//
// Design: the parameters of a qdisc are plain data computed by pure
// functions (TBFFor, below), so the arithmetic is unit tested against the
// formulas of containernetworking/plugins' bandwidth plugin without root.
// The kernel is reached through the small Kernel interface; Netlink is the
// real implementation and Fake an in-memory one for tests. Nothing here
// execs tc(8): every operation is one netlink round trip.
//
// Units. The kernel's TBF takes its rate in bytes per second, its queue
// limit in bytes and its bucket size ("buffer") in packet-scheduler ticks,
// whose length /proc/net/psched gives (64 ns on current kernels). The
// kernel keeps the buffer internally as nanoseconds in a u32, so a bucket
// longer than ~4.29 s is silently cut to that; TBFFor applies the same cap
// so that what we ask for is what a later dump reads back.
package tc

import (
	"errors"
	"fmt"
	"math"
)

const (
	usecPerSec = 1_000_000

	// LatencyUsec is the longest a packet may wait in a TBF queue, which
	// sizes the queue (limit). The reference bandwidth plugin fixes it at
	// 25 ms; so do we, so that its qdiscs and ours compare equal.
	LatencyUsec = 25_000
)

// Clock converts time to packet-scheduler ticks.
type Clock struct {
	// TicksPerUsec is what vishvananda/netlink calls TickInUsec: ticks per
	// microsecond, from /proc/net/psched (15.625 for 64 ns ticks).
	TicksPerUsec float64
}

// ErrNoClock means /proc/net/psched could not be read, so tick lengths
// are unknown and no TBF can be computed.
var ErrNoClock = errors.New("packet scheduler clock unknown (/proc/net/psched unreadable): the kernel has no tc support (CONFIG_NET_SCHED)")

// MaxBufferTicks is the largest TBF buffer the kernel keeps: it stores the
// buffer as nanoseconds in a u32.
func (c Clock) MaxBufferTicks() uint32 {
	if c.TicksPerUsec <= 0 {
		return 0
	}
	nsPerTick := 1000 / c.TicksPerUsec
	return uint32(math.Floor(math.MaxUint32 / nsPerTick))
}

// TBF holds a token-bucket qdisc's parameters in the kernel's units.
type TBF struct {
	Rate   uint64 // bytes per second
	Buffer uint32 // bucket size, in scheduler ticks
	Limit  uint32 // queue length, in bytes
}

func (t TBF) String() string {
	return fmt.Sprintf("rate %d B/s buffer %d ticks limit %d B", t.Rate, t.Buffer, t.Limit)
}

// TBFFor computes the TBF for a rate in bits per second and a burst in
// bits, as `tc qdisc add ... tbf rate R burst B latency 25ms` and the
// reference plugin do:
//
//	rate   = rateBits / 8                      (bytes/s)
//	burst  = burstBits / 8                     (bytes)
//	buffer = ticks(burst * 1e6 / rate µs)      (time to send a burst)
//	limit  = rate * 25 ms + burst              (bytes queued at most)
//
// with each value truncated as the reference truncates it, and capped
// where the reference would overflow a u32 (see the package comment).
func (c Clock) TBFFor(rateBits, burstBits uint64) (TBF, error) {
	if c.TicksPerUsec <= 0 {
		return TBF{}, ErrNoClock
	}
	rate, burst := rateBits/8, burstBits/8
	if rate == 0 {
		return TBF{}, fmt.Errorf("rate %d bit/s is below one byte per second", rateBits)
	}
	if burst == 0 {
		return TBF{}, fmt.Errorf("burst %d bits is below one byte", burstBits)
	}
	usec := math.Trunc(float64(burst) * usecPerSec / float64(rate))
	usec = math.Min(usec, math.MaxUint32)
	ticks := math.Trunc(usec * c.TicksPerUsec)
	ticks = math.Min(ticks, float64(c.MaxBufferTicks()))
	limit := math.Trunc(float64(rate)*LatencyUsec/usecPerSec) + float64(burst)
	limit = math.Min(limit, math.MaxUint32)
	return TBF{Rate: rate, Buffer: uint32(ticks), Limit: uint32(limit)}, nil
}

// BurstBytes is the bucket size in bytes that t really allows: the
// kernel's rate times buffer time. Packets larger than this never pass.
func (c Clock) BurstBytes(t TBF) uint64 {
	if c.TicksPerUsec <= 0 {
		return 0
	}
	usec := float64(t.Buffer) / c.TicksPerUsec
	return uint64(math.Round(float64(t.Rate) * usec / usecPerSec))
}
