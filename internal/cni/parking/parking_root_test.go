package parking_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// Park, mark, collect only when stale or asked, and nothing left.
func TestRootParkAndCollect(t *testing.T) {
	ns := testutil.NewNetNS(t)
	saved := parking.Dir
	parking.Dir = t.TempDir()
	t.Cleanup(func() { parking.Dir = saved })
	err := netns.Do(ns, func() error {
		var idx []int
		for _, name := range []string{"fnpktest0", "fnpktest1"} {
			if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			idx = append(idx, l.Attrs().Index)
		}
		p := parking.New()
		for _, i := range idx {
			if err := p.DeleteLink(i); err != nil {
				return err
			}
		}
		if err := p.DeleteLink(1 << 20); err != nil { // gone already: fine
			t.Errorf("parking a missing link: %v", err)
		}
		if err := p.Flush(); err != nil {
			return err
		}
		for _, i := range idx {
			l, err := netlink.LinkByIndex(i)
			if err != nil {
				return err
			}
			if !netlinkx.IsParked(l) {
				t.Errorf("%s after DeleteLink: group %#x, flags %v; want parked", l.Attrs().Name, l.Attrs().Group, l.Attrs().Flags)
			}
		}
		marker, err := parking.MarkerPath()
		if err != nil {
			return err
		}
		if err := parking.CollectStale(); err != nil {
			return err
		}
		if _, err := netlink.LinkByIndex(idx[0]); err != nil {
			t.Errorf("a fresh marker, yet collected: %v", err)
		}
		old := time.Now().Add(-parking.StaleAfter - time.Second)
		if err := os.Chtimes(marker, old, old); err != nil {
			return err
		}
		if err := parking.CollectStale(); err != nil {
			return err
		}
		for _, i := range idx {
			if _, err := netlink.LinkByIndex(i); err == nil {
				t.Errorf("link %d still there after a stale collection", i)
			}
		}
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("marker after collection: %v", err)
		}
		if found, err := parking.Collect(); found || err != nil {
			t.Errorf("Collect with nothing parked: %v %v", found, err)
		}
		// A parker that parked nothing leaves no marker.
		if err := parking.New().Flush(); err != nil {
			return err
		}
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("marker without parking: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
