package tc

import (
	"math"
	"testing"
)

// refTBF is containernetworking/plugins v1.10.0 bandwidth's arithmetic
// (ifb_creator.go: createTBF, buffer, limit, time2Tick, latencyInUsec),
// restated with the clock as a parameter.
func refTBF(tick float64, rateBits, burstBits uint64) TBF {
	rate := rateBits / 8
	burst := burstBits / 8
	time2Tick := func(t uint32) uint32 { return uint32(float64(t) * tick) }
	buffer := time2Tick(uint32(float64(uint32(burst)) * float64(1000000) / float64(rate)))
	latency := float64(1000000) * (25 / 1000.0)
	limit := uint32(float64(rate)*latency/float64(1000000)) + uint32(burst)
	return TBF{Rate: rate, Buffer: buffer, Limit: limit}
}

func TestTBFForMatchesReference(t *testing.T) {
	for _, tick := range []float64{15.625, 1, 1000} {
		c := Clock{TicksPerUsec: tick}
		for _, tt := range []struct{ rate, burst uint64 }{
			{8, 8},
			{1_000_000, 12_000},
			{10_000_000, 100_000},
			{10_000_000, 80_000},
			{100_000_000, 1_000_000},
			{1_000_000_000, 2_000_000},
			{123_456_789, 987_654},
			{40_000_000_000, 100_000_000}, // rate over 2^32 bytes/s needs TCA_TBF_RATE64
			{1_000_003, 12_345},           // truncation everywhere
		} {
			want := refTBF(tick, tt.rate, tt.burst)
			if want.Buffer > c.MaxBufferTicks() {
				continue // the kernel would cap it; tested below
			}
			got, err := c.TBFFor(tt.rate, tt.burst)
			if err != nil {
				t.Fatalf("tick %v TBFFor(%d, %d): %v", tick, tt.rate, tt.burst, err)
			}
			if got != want {
				t.Errorf("tick %v TBFFor(%d, %d) = %v, reference gives %v", tick, tt.rate, tt.burst, got, want)
			}
		}
	}
}

func TestTBFForHandComputed(t *testing.T) {
	c := Clock{TicksPerUsec: 15.625} // 64 ns ticks, as /proc/net/psched says today
	got, err := c.TBFFor(10_000_000, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	// 1.25 MB/s; a 12500-byte bucket drains in 10 ms = 10000 µs = 156250
	// ticks; the queue holds 25 ms of traffic (31250 B) plus the bucket.
	want := TBF{Rate: 1_250_000, Buffer: 156_250, Limit: 31_250 + 12_500}
	if got != want {
		t.Errorf("TBFFor(10 Mbit, 100 kbit) = %v, want %v", got, want)
	}
	if b := c.BurstBytes(got); b != 12_500 {
		t.Errorf("BurstBytes = %d, want 12500", b)
	}
}

// The kernel keeps the bucket as nanoseconds in a u32 (at most ~4.29 s),
// and reads back ticks of that. Bursts beyond it, as the kubelet's
// runtimes send (burst = MaxUint32 bits), are capped, not wrapped as the
// reference's uint32 conversions do.
func TestTBFForCapsBuffer(t *testing.T) {
	c := Clock{TicksPerUsec: 15.625}
	if got, want := c.MaxBufferTicks(), uint32(math.MaxUint32>>6); got != want {
		t.Fatalf("MaxBufferTicks = %d, want %d (u32 ns >> PSCHED_SHIFT 6)", got, want)
	}
	for _, rate := range []uint64{8, 1_000_000, 10_000_000, 1_000_000_000} {
		got, err := c.TBFFor(rate, math.MaxUint32)
		if err != nil {
			t.Fatal(err)
		}
		wantBuf := math.Trunc(math.Min(math.Trunc(float64(uint64(math.MaxUint32)/8)*1e6/float64(rate/8)), math.MaxUint32) * 15.625)
		if wantBuf > float64(c.MaxBufferTicks()) {
			wantBuf = float64(c.MaxBufferTicks())
		}
		if got.Buffer != uint32(wantBuf) {
			t.Errorf("rate %d, burst MaxUint32: buffer %d, want %d", rate, got.Buffer, uint32(wantBuf))
		}
		if got.Buffer > c.MaxBufferTicks() {
			t.Errorf("rate %d: buffer %d exceeds the kernel's cap %d", rate, got.Buffer, c.MaxBufferTicks())
		}
	}
	// The limit saturates instead of wrapping.
	got, err := c.TBFFor(math.MaxUint64, uint64(math.MaxUint32)*8-8)
	if err != nil {
		t.Fatal(err)
	}
	if got.Limit != math.MaxUint32 {
		t.Errorf("huge rate and burst: limit %d, want MaxUint32", got.Limit)
	}
}

func TestTBFForErrors(t *testing.T) {
	c := Clock{TicksPerUsec: 15.625}
	for _, tt := range []struct{ rate, burst uint64 }{{7, 100}, {100, 7}, {0, 100}, {100, 0}} {
		if _, err := c.TBFFor(tt.rate, tt.burst); err == nil {
			t.Errorf("TBFFor(%d, %d): want an error (below one byte)", tt.rate, tt.burst)
		}
	}
	if _, err := (Clock{}).TBFFor(1000, 1000); err != ErrNoClock {
		t.Errorf("zero clock: got %v, want ErrNoClock", err)
	}
}
