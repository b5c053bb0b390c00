package vxlan

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestRootNetlink: Netlink creates, reads back, updates and removes the
// device and its entries in a namespace of the test's own, and a second
// Sync changes nothing.
func TestRootNetlink(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, "10.251.88.0/24", "10.253.0.0/16")
	node, other := testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, node, "eth0", []string{"10.251.88.11/24"}, other, "eth0", []string{"10.251.88.12/24"})
	nsn := testutil.NSName(node)
	var idx int
	netns.Do(node, func() error {
		l, err := Netlink{}.Link("eth0")
		if err == nil && l != nil {
			idx = l.Index
		}
		return err
	})
	if idx == 0 {
		t.Fatal("no eth0")
	}
	want := State{
		Device: Device{Name: DeviceName, VNI: 42, Port: 4789, Local: ip("10.251.88.11"), Underlay: "eth0", UnderlayIndex: idx, MAC: macA, MTU: 1450},
		Addrs:  []netip.Prefix{pfx("10.253.1.0/32")},
		Neighs: []Neigh{{IP: ip("10.253.2.0"), MAC: macB}, {IP: ip("10.253.3.0"), MAC: macC}},
		FDB:    []FDB{{MAC: macB, Dst: ip("10.251.88.12")}, {MAC: macC, Dst: ip("10.251.88.13")}},
	}
	sync := func(s State) Result {
		t.Helper()
		var res Result
		err := netns.Do(node, func() error {
			var err error
			res, err = Sync(Netlink{}, s)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	sync(want)

	link := testutil.Run(t, "ip", "-n", nsn, "-d", "link", "show", DeviceName)
	for _, s := range []string{"mtu 1450", "state UNKNOWN", "link/ether 02:00:00:00:00:0a", "vxlan id 42 local 10.251.88.11 dev eth0", "dstport 4789", "nolearning", " udpcsum"} {
		if !strings.Contains(link, s) {
			t.Errorf("ip -d link lacks %q:\n%s", s, link)
		}
	}
	if strings.Contains(link, "l2miss") || strings.Contains(link, "l3miss") {
		t.Errorf("miss notifications on:\n%s", link)
	}
	fdb := testutil.Run(t, "ip", "netns", "exec", nsn, "bridge", "fdb", "show", "dev", DeviceName)
	for _, s := range []string{"02:00:00:00:00:0b dst 10.251.88.12 self permanent", "02:00:00:00:00:0c dst 10.251.88.13 self permanent"} {
		if !strings.Contains(fdb, s) {
			t.Errorf("bridge fdb lacks %q:\n%s", s, fdb)
		}
	}
	neigh := testutil.Run(t, "ip", "-n", nsn, "neigh", "show", "dev", DeviceName)
	for _, s := range []string{"10.253.2.0 lladdr 02:00:00:00:00:0b PERMANENT", "10.253.3.0 lladdr 02:00:00:00:00:0c PERMANENT"} {
		if !strings.Contains(neigh, s) {
			t.Errorf("ip neigh lacks %q:\n%s", s, neigh)
		}
	}
	if a := testutil.Run(t, "ip", "-n", nsn, "-4", "addr", "show", "dev", DeviceName); !strings.Contains(a, "inet 10.253.1.0/32") {
		t.Errorf("address:\n%s", a)
	}
	if k := testutil.Run(t, "ip", "netns", "exec", nsn, "ethtool", "-k", DeviceName); !strings.Contains(k, "tx-checksumming: off") {
		t.Errorf("tx checksum offload still on:\n%s", k)
	}

	// Read back as data: what Netlink lists is what Sync programmed, so a
	// second Sync has nothing to do.
	if res := sync(want); res.Changed() {
		t.Errorf("second sync changed things: %+v", res)
	}

	// n3 moves (FDB replace), n2 leaves, the device's MAC changes in place
	// (the kernel then flushes the device's neighbour entries, permanent
	// ones too: Sync reads them after the device step and puts back n3's).
	moved := want
	moved.Device.MAC = macC
	moved.Neighs = want.Neighs[1:]
	moved.FDB = []FDB{{MAC: macC, Dst: ip("10.251.88.23")}}
	res := sync(moved)
	if res.Device.Delete || res.Device.Update.MAC == nil || len(res.Entries.SetFDB) != 1 || len(res.Entries.DelFDB) != 1 {
		t.Errorf("plan: %+v", res)
	}
	fdb = testutil.Run(t, "ip", "netns", "exec", nsn, "bridge", "fdb", "show", "dev", DeviceName)
	if strings.TrimSpace(fdb) != "02:00:00:00:00:0c dst 10.251.88.23 self permanent" {
		t.Errorf("fdb after the move:\n%s", fdb)
	}
	if n := testutil.Run(t, "ip", "-n", nsn, "neigh", "show", "dev", DeviceName); strings.TrimSpace(n) != "10.253.3.0 lladdr 02:00:00:00:00:0c PERMANENT" {
		t.Errorf("neighbours after the move:\n%s", n)
	}
	if res := sync(moved); res.Changed() {
		t.Errorf("sync after the move changed things: %+v", res)
	}

	// Another VNI cannot be changed in place: re-created, with its entries.
	vni := moved
	vni.Device.VNI = 43
	if res := sync(vni); !res.Device.Delete || !res.Device.Create {
		t.Errorf("VNI change: %+v", res)
	}
	if l := testutil.Run(t, "ip", "-n", nsn, "-d", "link", "show", DeviceName); !strings.Contains(l, "vxlan id 43") {
		t.Errorf("link:\n%s", l)
	}
	if f := testutil.Run(t, "ip", "netns", "exec", nsn, "bridge", "fdb", "show", "dev", DeviceName); !strings.Contains(f, "02:00:00:00:00:0c dst 10.251.88.23") {
		t.Errorf("fdb after re-create:\n%s", f)
	}

	// A device of another type under our name is replaced.
	testutil.Run(t, "ip", "-n", nsn, "link", "del", DeviceName)
	testutil.Run(t, "ip", "-n", nsn, "link", "add", DeviceName, "type", "bridge")
	if res := sync(vni); res.Device.Reason != "not a VXLAN device" {
		t.Errorf("bridge under our name: %+v", res)
	}

	// A hand-made device without outer UDP checksums is re-created.
	testutil.Run(t, "ip", "-n", nsn, "link", "del", DeviceName)
	testutil.Run(t, "ip", "-n", nsn, "link", "add", DeviceName, "address", "02:00:00:00:00:0c", "mtu", "1450", "type", "vxlan",
		"id", "43", "local", "10.251.88.11", "dev", "eth0", "dstport", "4789", "nolearning", "noudpcsum")
	if res := sync(vni); res.Device.Reason != "outer UDP checksums off" {
		t.Errorf("noudpcsum device: %+v", res)
	}

	// Offload back on (the agent's default) in place.
	on := vni
	on.Device.TxChecksumOffload = true
	if res := sync(on); res.Device.Create || res.Device.Update.TxChecksumOffload == nil {
		t.Errorf("offload on: %+v", res)
	}
	if k := testutil.Run(t, "ip", "netns", "exec", nsn, "ethtool", "-k", DeviceName); !strings.Contains(k, "tx-checksumming: on") {
		t.Errorf("tx checksum offload still off:\n%s", k)
	}
	if res := sync(on); res.Changed() {
		t.Errorf("offload on, second sync: %+v", res)
	}

	err := netns.Do(node, func() error {
		ok, err := Remove(Netlink{}, DeviceName)
		if !ok {
			t.Error("Remove found no device")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := testutil.Run(t, "ip", "-n", nsn, "link", "show"); strings.Contains(l, DeviceName) {
		t.Errorf("device stayed:\n%s", l)
	}
}
