package netlinkx_test

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// BenchmarkRootOneRouteExec is the agent's write for one peer Node event
// under host-gw: a batch of one route replace, in a namespace of its own.
//
//	sudo go test ./internal/netlinkx -run XXX -bench BenchmarkRootOneRouteExec -benchmem
func BenchmarkRootOneRouteExec(b *testing.B) {
	ns := testutil.NewNetNS(b)
	err := netns.Do(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		route := netlinkx.BatchRoute{Dst: netip.MustParsePrefix("10.99.0.0/24"), LinkIndex: lo.Attrs().Index}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			var batch netlinkx.RouteBatch
			batch.Route(netlinkx.OpReplace, route)
			errs, err := batch.Exec()
			if err != nil {
				return err
			}
			if errs[0] != nil {
				return errs[0]
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
