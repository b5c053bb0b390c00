package netlinkx_test

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootLinkBatch: the links handed to a batch (a veth pair's end and an
// IFB) are there until Flush and gone after it, with both ends of the
// veth; a link not handed over stays; a missing link and an empty batch
// are no errors.
func TestRootLinkBatch(t *testing.T) {
	ns := testutil.NewNetNS(t)
	err := netns.Do(ns, func() error {
		for _, l := range []netlink.Link{
			&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lbv0"}, PeerName: "lbv1"},
			&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "lbifb0"}},
			&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "lbkeep0"}},
		} {
			if err := netlink.LinkAdd(l); err != nil {
				return err
			}
		}
		b := netlinkx.NewLinkBatch()
		if err := b.Flush(); err != nil {
			t.Errorf("empty batch: %v", err)
		}
		for _, name := range []string{"lbv0", "lbifb0"} {
			l, err := netlinkx.LinkByName(name)
			if err != nil {
				return err
			}
			if err := b.DeleteLink(l.Attrs().Index); err != nil {
				return err
			}
		}
		if err := b.DeleteLink(1 << 30); err != nil {
			t.Errorf("a missing link: %v", err)
		}
		for _, name := range []string{"lbv0", "lbv1", "lbifb0"} {
			if _, err := netlinkx.LinkByName(name); err != nil {
				t.Errorf("%s gone before Flush: %v", name, err)
			}
		}
		if err := b.Flush(); err != nil {
			return err
		}
		for _, name := range []string{"lbv0", "lbv1", "lbifb0"} {
			if _, err := netlinkx.LinkByName(name); !netlinkx.IsNotFound(err) {
				t.Errorf("%s after Flush: %v, want it gone", name, err)
			}
		}
		if _, err := netlinkx.LinkByName("lbkeep0"); err != nil {
			t.Errorf("the link not in the batch: %v", err)
		}
		return b.Flush()
	})
	if err != nil {
		t.Fatal(err)
	}
}
