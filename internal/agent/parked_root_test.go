package agent

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// The agent collects what the plugins' DEL parked, within a few seconds.
func TestRootCollectParked(t *testing.T) {
	ns := testutil.NewNetNS(t)
	saved := parking.Dir
	parking.Dir = t.TempDir()
	t.Cleanup(func() { parking.Dir = saved })
	err := netns.Do(ns, func() error {
		if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "fnpkagent0"}}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("fnpkagent0")
		if err != nil {
			return err
		}
		p := parking.New()
		if err := p.DeleteLink(l.Attrs().Index); err != nil {
			return err
		}
		if err := p.Flush(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), parkedEvery+time.Second)
		defer cancel()
		collectParked(ctx) // on this goroutine's thread: in ns
		if _, err := netlink.LinkByName("fnpkagent0"); err == nil {
			t.Errorf("the parked IFB is still there %s after parking", parkedEvery+time.Second)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
