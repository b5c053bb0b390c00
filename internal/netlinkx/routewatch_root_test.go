package netlinkx_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootRouteWatch: a RouteSet counts the routes that were there when it
// started and follows 3,000 added in one batch (a burst of notifications
// like an agent's start) and 1,000 deleted, ignoring routes its filter
// does not keep; it stops when done is closed.
func TestRootRouteWatch(t *testing.T) {
	testutil.RequireFreeRange(t, "10.248.0.0/16", "10.247.0.0/16")
	ns := testutil.NewNetNS(t)
	keep := netip.MustParsePrefix("10.248.0.0/16")
	dst := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 248, byte(i / 16), byte(i % 16 * 16)}), 28)
	}
	var lo int
	batch := func(op netlinkx.RouteOp, from, to int, prefix func(int) netip.Prefix) {
		t.Helper()
		err := netns.Do(ns, func() error {
			var b netlinkx.RouteBatch
			for i := from; i < to; i++ {
				b.Route(op, netlinkx.BatchRoute{Dst: prefix(i), LinkIndex: lo})
			}
			errs, err := b.Exec()
			for _, e := range errs {
				if e != nil {
					return e
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := netns.Do(ns, func() error {
		l, err := netlink.LinkByName("lo")
		lo = l.Attrs().Index
		return err
	}); err != nil {
		t.Fatal(err)
	}
	batch(netlinkx.OpReplace, 0, 10, dst)

	done := make(chan struct{})
	defer close(done)
	set, err := netlinkx.RouteWatch(ns, keep.Overlaps, done)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Len(); got != 10 {
		t.Fatalf("at start: %d routes, want the 10 already there", got)
	}
	wait := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for set.Len() != want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := set.Len(); got != want {
			t.Fatalf("%d routes, want %d (resubscribed %d times, err %v)", got, want, set.Resubscribed(), set.Err())
		}
	}
	batch(netlinkx.OpReplace, 10, 3000, dst)
	other := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 247, byte(i), 0}), 24) }
	batch(netlinkx.OpReplace, 0, 5, other)
	wait(3000)
	batch(netlinkx.OpDelete, 1000, 2000, dst)
	wait(2000)
	if err := set.Err(); err != nil {
		t.Fatal(err)
	}
}
