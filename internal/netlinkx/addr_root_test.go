package netlinkx_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootAddrProto: addresses added with a protocol are listed with it
// (IPv4 and IPv6, on lo), adding twice and deleting twice are no errors,
// and the dummy driver's absence is reported as ErrNotSupported.
func TestRootAddrProto(t *testing.T) {
	ns := testutil.NewNetNS(t)
	const proto = 0x66
	v4, v6 := netip.MustParsePrefix("10.246.202.10/32"), netip.MustParsePrefix("fd00:246:202::10/128")
	list := func() map[netip.Prefix]uint8 {
		t.Helper()
		var got []netlinkx.ProtoAddr
		if err := netns.Do(ns, func() (err error) { got, err = netlinkx.AddrListProto(); return err }); err != nil {
			t.Fatal(err)
		}
		m := map[netip.Prefix]uint8{}
		for _, a := range got {
			m[a.Prefix] = a.Proto
			if a.Prefix == v4 && a.Label != "lo:test" {
				t.Errorf("%s has label %q, want lo:test", v4, a.Label)
			}
		}
		return m
	}
	err := netns.Do(ns, func() error {
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return err
		}
		for range 2 {
			for _, p := range []netip.Prefix{v4, v6} {
				if err := netlinkx.AddrAddProto(lo.Attrs().Index, p, "lo:test", proto); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := list()
	if got[v4] != proto || got[v6] != proto {
		t.Fatalf("addresses with protocols: %v", got)
	}
	err = netns.Do(ns, func() error {
		lo, _ := netlinkx.LinkByName("lo")
		for range 2 {
			for _, p := range []netip.Prefix{v4, v6} {
				if err := netlinkx.AddrDelPrefix(lo.Attrs().Index, p); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 2 {
		t.Errorf("after deleting, want only lo's own two addresses: %v", got)
	}
	err = netns.Do(ns, func() error {
		_, err := netlinkx.EnsureDummy("fntdummy0")
		if err == nil {
			return netlinkx.DeleteDummy("fntdummy0")
		}
		if errors.Is(err, netlinkx.ErrNotSupported) {
			t.Logf("no dummy driver: %v", err)
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
