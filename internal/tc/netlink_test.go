package tc

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// Every Kernel operation against the real kernel, inside a namespace of
// the test's own, including what the kernel reads back.
func TestNetlinkRoundTrip(t *testing.T) {
	ns := testutil.NewNetNS(t)
	k := Netlink{}
	err := netns.Do(ns, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fnv0", MTU: 1400}, PeerName: "fnv1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(veth); err != nil {
			return err
		}
		v, ok, err := k.LinkByName("fnv0")
		if err != nil || !ok || v.Kind != "veth" || v.MTU != 1400 || v.Parent == 0 {
			t.Fatalf("LinkByName(fnv0) = %+v, %v, %v", v, ok, err)
		}
		if _, ok, err := k.LinkByName("nonesuch"); ok || err != nil {
			t.Errorf("LinkByName(nonesuch) = %v, %v; want not found, no error", ok, err)
		}
		if _, ok, err := k.LinkByIndex(99999); ok || err != nil {
			t.Errorf("LinkByIndex(99999) = %v, %v; want not found, no error", ok, err)
		}

		ifb, err := k.AddIFB("fnifb0", "flatnet-bw:n:c:eth0", 1400)
		if err != nil {
			t.Fatalf("AddIFB: %v", err)
		}
		got, ok, err := k.LinkByName("fnifb0")
		if err != nil || !ok {
			t.Fatalf("IFB not found: %v", err)
		}
		if got.Kind != "ifb" || !got.Up || got.Alias != "flatnet-bw:n:c:eth0" || got.MTU != 1400 || got.MAC != ifb.MAC || got.Index != ifb.Index {
			t.Errorf("IFB read back as %+v, created as %+v", got, ifb)
		}
		if _, err := k.AddIFB("fnifb0", "", 1400); !errors.Is(err, ErrExist) {
			t.Errorf("second AddIFB: got %v, want ErrExist", err)
		}
		ifbs, err := k.IFBs()
		if err != nil || len(ifbs) != 1 || ifbs[0].Name != "fnifb0" {
			t.Errorf("IFBs() = %+v, %v", ifbs, err)
		}

		c := KernelClock()
		for _, tt := range []struct{ rate, burst uint64 }{
			{10_000_000, 100_000},
			{10_000_000, math.MaxUint32},      // buffer capped
			{40_000_000_000, 100_000_000},     // rate64
			{100_000_000_000, math.MaxUint32}, // both
		} {
			want, err := c.TBFFor(tt.rate, tt.burst)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.SetRootTBF(v.Index, want); err != nil {
				t.Fatalf("SetRootTBF(%v): %v", want, err)
			}
			got, ok, err := k.RootTBF(v.Index)
			if err != nil || !ok || got != want {
				t.Errorf("rate %d burst %d: RootTBF read back %v (ok %v, err %v), set %v", tt.rate, tt.burst, got, ok, err, want)
			}
		}
		if err := k.DeleteRoot(v.Index); err != nil {
			t.Errorf("DeleteRoot: %v", err)
		}
		if _, ok, _ := k.RootTBF(v.Index); ok {
			t.Errorf("root TBF still there after DeleteRoot")
		}
		if err := k.DeleteRoot(v.Index); err != nil {
			t.Errorf("second DeleteRoot: %v", err)
		}

		if err := k.AddIngress(v.Index); err != nil {
			t.Fatalf("AddIngress: %v", err)
		}
		if err := k.AddIngress(v.Index); !errors.Is(err, ErrExist) {
			t.Errorf("second AddIngress: got %v, want ErrExist", err)
		}
		if has, err := k.HasIngress(v.Index); !has || err != nil {
			t.Errorf("HasIngress = %v, %v", has, err)
		}
		if err := k.AddRedirect(v.Index, ifb.Index); err != nil {
			t.Fatalf("AddRedirect: %v", err)
		}
		if to, err := k.Redirects(v.Index); err != nil || !slices.Equal(to, []int{ifb.Index}) {
			t.Errorf("Redirects = %v, %v; want [%d]", to, err, ifb.Index)
		}
		all, err := k.AllRedirects()
		if err != nil || !slices.Equal(all[ifb.Index], []int{v.Index}) {
			t.Errorf("AllRedirects = %v, %v", all, err)
		}
		if to, err := k.Redirects(v.Parent); err != nil || len(to) != 0 {
			t.Errorf("Redirects of a link without ingress qdisc = %v, %v", to, err)
		}
		if err := k.DeleteIngress(v.Index); err != nil {
			t.Errorf("DeleteIngress: %v", err)
		}
		if has, _ := k.HasIngress(v.Index); has {
			t.Errorf("ingress qdisc still there")
		}
		if err := k.DeleteIngress(v.Index); err != nil {
			t.Errorf("second DeleteIngress: %v", err)
		}

		if err := k.DeleteLink(ifb.Index); err != nil {
			t.Errorf("DeleteLink: %v", err)
		}
		if _, ok, _ := k.LinkByName("fnifb0"); ok {
			t.Errorf("IFB still there after DeleteLink")
		}
		if err := k.DeleteLink(ifb.Index); err != nil {
			t.Errorf("second DeleteLink: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
