package veth

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func TestRandom(t *testing.T) {
	for range 100 {
		m := RandomMAC()
		if len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
			t.Fatalf("RandomMAC() = %s: want unicast, locally administered", m)
		}
	}
	if n := RandomName(); len(n) != 12 || !strings.HasPrefix(n, "veth") {
		t.Errorf("RandomName() = %q", n)
	}
}

func TestCreateDelete(t *testing.T) {
	host := testutil.NewNetNS(t)
	cont := testutil.NewNetNS(t)
	peerMAC, _ := net.ParseMAC("02:00:00:aa:bb:cc")
	err := netns.Do(host, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		p, err := Create(Spec{NetNS: cont, PeerName: "eth0", MTU: 1400, PeerMAC: peerMAC, MasterIndex: br.Index})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		l, err := netlinkx.LinkByName(p.HostName)
		if err != nil {
			t.Fatalf("host end %s: %v", p.HostName, err)
		}
		if l.Attrs().Index != p.HostIndex || l.Attrs().MTU != 1400 || l.Attrs().MasterIndex != br.Index ||
			l.Attrs().HardwareAddr.String() != p.HostMAC.String() || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("host end = %+v, pair = %+v", l.Attrs(), p)
		}
		// The same name again in the same netns: 104.
		_, err = Create(Spec{NetNS: cont, PeerName: "eth0"})
		if code, _ := cnierr.Code(err); code != cnierr.InterfaceExists {
			t.Errorf("second Create: %v (code %d), want 104", err, code)
		}
		// A missing netns: 3.
		_, err = Create(Spec{NetNS: "/run/netns/fnt-does-not-exist", PeerName: "eth0"})
		if code, _ := cnierr.Code(err); code != cnierr.UnknownContainer {
			t.Errorf("Create in missing netns: %v (code %d), want 3", err, code)
		}
		// A taken host name is reported, not retried.
		if _, err := Create(Spec{NetNS: cont, PeerName: "eth1", HostName: p.HostName}); err == nil {
			t.Error("Create with a taken host name succeeded")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = netns.Do(cont, func() error {
		l, err := netlinkx.LinkByName("eth0")
		if err != nil {
			t.Fatalf("container end: %v", err)
		}
		if l.Attrs().MTU != 1400 || l.Attrs().HardwareAddr.String() != peerMAC.String() || l.Type() != "veth" {
			t.Errorf("container end = %+v", l.Attrs())
		}
		if _, err := netlinkx.LinkByName("eth1"); err == nil {
			t.Error("eth1 left behind by a failed Create")
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("10.99.0.2"), Mask: net.CIDRMask(24, 32)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	addrs, found, err := DeleteInNS(cont, "eth0", nil)
	if err != nil || !found {
		t.Fatalf("DeleteInNS: found %v, %v", found, err)
	}
	hasAddr := false
	for _, a := range addrs {
		hasAddr = hasAddr || a.IP.String() == "10.99.0.2"
	}
	if !hasAddr {
		t.Errorf("DeleteInNS returned %v, want 10.99.0.2 among them", addrs)
	}
	// The host end went with it.
	_ = netns.Do(host, func() error {
		links, _ := netlinkx.LinkList()
		for _, l := range links {
			if l.Type() == "veth" {
				t.Errorf("veth %s left in host ns", l.Attrs().Name)
			}
		}
		return nil
	})
	// Again, and with the netns gone: fine.
	if _, found, err := DeleteInNS(cont, "eth0", nil); err != nil || found {
		t.Errorf("second DeleteInNS: found %v, %v", found, err)
	}
	if _, found, err := DeleteInNS("/run/netns/fnt-does-not-exist", "eth0", nil); err != nil || found {
		t.Errorf("DeleteInNS in a missing netns: found %v, %v", found, err)
	}
}

func TestDeleteHostEnd(t *testing.T) {
	host := testutil.NewNetNS(t)
	_ = netns.Do(host, func() error {
		p, err := Create(Spec{PeerName: "peer0"})
		if err != nil {
			t.Fatal(err)
		}
		// A recycled name (another MAC) is not ours.
		if err := DeleteHostEnd(p.HostName, "02:00:00:00:00:99"); err != nil {
			t.Fatal(err)
		}
		if _, err := netlinkx.LinkByName(p.HostName); err != nil {
			t.Errorf("DeleteHostEnd removed a veth with another MAC: %v", err)
		}
		if err := DeleteHostEnd(p.HostName, p.HostMAC.String()); err != nil {
			t.Fatal(err)
		}
		if _, err := netlinkx.LinkByName(p.HostName); err == nil {
			t.Error("DeleteHostEnd left the veth")
		}
		if err := DeleteHostEnd(p.HostName, p.HostMAC.String()); err != nil {
			t.Errorf("DeleteHostEnd of a missing link: %v", err)
		}
		return nil
	})
}
