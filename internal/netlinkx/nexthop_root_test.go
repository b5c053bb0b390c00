package netlinkx_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// peerLink makes, in ns, a veth end with an address in 10.246.0.0/16 (the
// gateways' network) and returns its index.
func peerLink(tb testing.TB, ns string) int {
	tb.Helper()
	testutil.RequireFreeRange(tb, "10.246.0.0/16", "10.245.0.0/16", "10.160.0.0/11")
	var idx int
	err := netns.Do(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nhv0"}, PeerName: "nhv1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("nhv0")
		if err != nil {
			return err
		}
		peer, err := netlink.LinkByName("nhv1")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.246.255.254/16")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			return err
		}
		idx = l.Attrs().Index
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		tb.Fatal(err)
	}
	return idx
}

func exec(tb testing.TB, b *netlinkx.RouteBatch) {
	tb.Helper()
	errs, err := b.Exec()
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range errs {
		if e != nil {
			tb.Fatal(e)
		}
	}
}

// TestRootRouteBatchNexthop: a route through a nexthop object reads back
// with the nexthop's gateway; replacing the nexthop moves the route with
// it; deleting the nexthop removes the route, and deleting it again is no
// error.
func TestRootRouteBatchNexthop(t *testing.T) {
	ns := testutil.NewNetNS(t)
	link := peerLink(t, ns)
	dst := netip.MustParsePrefix("10.245.1.0/24")
	gw := func() (string, bool) {
		var got string
		var found bool
		if err := netns.Do(ns, func() error {
			rs, err := netlinkx.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
			for _, r := range rs {
				if r.Dst != nil && r.Dst.String() == dst.String() {
					got, found = r.Gw.String(), true
				}
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return got, found
	}
	in := func(fn func(b *netlinkx.RouteBatch)) {
		t.Helper()
		var b netlinkx.RouteBatch
		fn(&b)
		if err := netns.Do(ns, func() error { exec(t, &b); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	in(func(b *netlinkx.RouteBatch) {
		b.Nexthop(netlinkx.OpReplace, netlinkx.BatchNexthop{ID: 100, Gw: netip.MustParseAddr("10.246.0.1"), LinkIndex: link, Protocol: 0x66})
		b.Route(netlinkx.OpReplace, netlinkx.BatchRoute{Dst: dst, Nexthop: 100, Protocol: 0x66})
	})
	if got, ok := gw(); !ok || got != "10.246.0.1" {
		t.Fatalf("route %s: gateway %q (there: %v), want 10.246.0.1", dst, got, ok)
	}
	in(func(b *netlinkx.RouteBatch) {
		b.Nexthop(netlinkx.OpReplace, netlinkx.BatchNexthop{ID: 100, Gw: netip.MustParseAddr("10.246.0.2"), LinkIndex: link, Protocol: 0x66})
	})
	if got, ok := gw(); !ok || got != "10.246.0.2" {
		t.Fatalf("after replacing the nexthop: gateway %q (there: %v), want 10.246.0.2", got, ok)
	}
	for range 2 {
		in(func(b *netlinkx.RouteBatch) { b.Nexthop(netlinkx.OpDelete, netlinkx.BatchNexthop{ID: 100}) })
	}
	if got, ok := gw(); ok {
		t.Fatalf("after deleting the nexthop the route is still there, via %s", got)
	}
}

// BenchmarkRootPeerRoutes is an agent's start among N peers under host-gw:
// N routes, each through its own gateway on one device, written in one
// batch into an empty table, as plain routes (`via`) and through nexthop
// objects (one each, written first). The kernel's cost per plain route
// grows with the routes already there (see BatchNexthop).
//
//	sudo go test ./internal/netlinkx -run XXX -bench BenchmarkRootPeerRoutes
func BenchmarkRootPeerRoutes(b *testing.B) {
	ns := testutil.NewNetNS(b)
	link := peerLink(b, ns)
	for _, n := range []int{1000, 5000} {
		dst := func(i int) netip.Prefix {
			return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 160 + byte(i/256), byte(i), 0}), 24)
		}
		gw := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 246, byte(i / 250), byte(i%250 + 1)}) }
		for _, nexthops := range []bool{false, true} {
			name := fmt.Sprintf("%d/via", n)
			if nexthops {
				name = fmt.Sprintf("%d/nexthop", n)
			}
			b.Run(name, func(b *testing.B) {
				err := netns.Do(ns, func() error {
					for b.Loop() {
						var add netlinkx.RouteBatch
						for i := range n {
							r := netlinkx.BatchRoute{Dst: dst(i), Protocol: 0x66}
							if nexthops {
								add.Nexthop(netlinkx.OpReplace, netlinkx.BatchNexthop{ID: uint32(i + 1), Gw: gw(i), LinkIndex: link, Protocol: 0x66})
								r.Nexthop = uint32(i + 1)
							} else {
								r.Gw, r.LinkIndex = gw(i), link
							}
							add.Route(netlinkx.OpReplace, r)
						}
						exec(b, &add)
						b.StopTimer()
						var del netlinkx.RouteBatch
						for i := range n {
							if nexthops {
								del.Nexthop(netlinkx.OpDelete, netlinkx.BatchNexthop{ID: uint32(i + 1)})
							} else {
								del.Route(netlinkx.OpDelete, netlinkx.BatchRoute{Dst: dst(i), Protocol: 0x66})
							}
						}
						exec(b, &del)
						b.StartTimer()
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// TestRootNexthopList lists a nexthop as it was written, and no others in a
// new namespace.
func TestRootNexthopList(t *testing.T) {
	ns := testutil.NewNetNS(t)
	link := peerLink(t, ns)
	err := netns.Do(ns, func() error {
		if got, err := netlinkx.NexthopList(); err != nil || len(got) != 0 {
			t.Errorf("a new namespace: %v, %v; want no nexthops", got, err)
		}
		var b netlinkx.RouteBatch
		want := netlinkx.BatchNexthop{ID: 7, Gw: netip.MustParseAddr("10.246.0.9"), LinkIndex: link, OnLink: true, Protocol: 0x66}
		b.Nexthop(netlinkx.OpReplace, want)
		exec(t, &b)
		got, err := netlinkx.NexthopList()
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != (netlinkx.Nexthop{ID: 7, Gw: want.Gw, LinkIndex: link, OnLink: true, Protocol: 0x66}) {
			t.Errorf("listed %+v, want the one written: %+v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
