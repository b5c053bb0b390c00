package vxlan

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var ipOpts = cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})

var (
	macA = MustMAC("02:00:00:00:00:0a")
	macB = MustMAC("02:00:00:00:00:0b")
	macC = MustMAC("02:00:00:00:00:0c")
)

func MustMAC(s string) MAC {
	m, err := ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }
func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func device(local string) Device {
	return Device{Name: DeviceName, VNI: 1, Port: 4789, Local: ip(local), Underlay: "eth0", UnderlayIndex: 2, MAC: macA, MTU: 1450}
}

func TestMAC(t *testing.T) {
	m := MACFor("node-1")
	if m != MACFor("node-1") {
		t.Error("MACFor is not stable")
	}
	if m == MACFor("node-2") {
		t.Error("two nodes, one MAC")
	}
	if m[0]&0x01 != 0 || m[0]&0x02 == 0 {
		t.Errorf("%s is not a locally administered unicast address", m)
	}
	if p, err := ParseMAC(m.String()); err != nil || p != m {
		t.Errorf("round trip %s: %s %v", m, p, err)
	}
	for _, bad := range []string{"", "x", "02:00:00:00:00:00:00:01"} {
		if _, err := ParseMAC(bad); err == nil {
			t.Errorf("ParseMAC(%q): no error", bad)
		}
	}
	if Overhead(ip("10.0.0.1")) != 50 || Overhead(ip("fd00::1")) != 70 {
		t.Error("overhead")
	}
}

func TestPlanDevice(t *testing.T) {
	want := device("10.250.0.11")
	good := &Link{Name: DeviceName, IsVXLAN: true, VNI: 1, Port: 4789, Local: ip("10.250.0.11"), UnderlayIndex: 2, UDPCSum: true, MAC: macA, MTU: 1450, Up: true}
	off := false
	on := true
	mtu, mac := 1450, macA
	for _, tc := range []struct {
		name string
		have func(l *Link) *Link
		want DevicePlan
	}{
		{"absent", func(*Link) *Link { return nil }, DevicePlan{Create: true, Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"as wanted", func(l *Link) *Link { return l }, DevicePlan{}},
		{"not vxlan", func(l *Link) *Link { l.IsVXLAN = false; return l }, DevicePlan{Delete: true, Create: true, Reason: "not a VXLAN device", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"vni", func(l *Link) *Link { l.VNI = 7; return l }, DevicePlan{Delete: true, Create: true, Reason: "VNI 7, want 1", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"port", func(l *Link) *Link { l.Port = 8472; return l }, DevicePlan{Delete: true, Create: true, Reason: "UDP port 8472, want 4789", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"local", func(l *Link) *Link { l.Local = ip("10.250.0.99"); return l }, DevicePlan{Delete: true, Create: true, Reason: "local address 10.250.0.99, want 10.250.0.11", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"underlay", func(l *Link) *Link { l.UnderlayIndex = 9; return l }, DevicePlan{Delete: true, Create: true, Reason: "underlay device index 9, want 2 (eth0)", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"udpcsum", func(l *Link) *Link { l.UDPCSum = false; return l }, DevicePlan{Delete: true, Create: true, Reason: "outer UDP checksums off", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"learning", func(l *Link) *Link { l.Learning = true; return l }, DevicePlan{Delete: true, Create: true, Reason: "learning, miss notifications or flow-based mode on", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"l3miss", func(l *Link) *Link { l.L3Miss = true; return l }, DevicePlan{Delete: true, Create: true, Reason: "learning, miss notifications or flow-based mode on", Update: LinkUpdate{Up: true, TxChecksumOffload: &off}}},
		{"in place", func(l *Link) *Link { l.MTU, l.MAC, l.Up, l.TxChecksumOffload = 1500, macB, false, true; return l }, DevicePlan{Update: LinkUpdate{MTU: &mtu, MAC: &mac, Up: true, TxChecksumOffload: &off}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := *good
			got := PlanDevice(want, tc.have(&l))
			if d := cmp.Diff(tc.want, got, ipOpts); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
	// Offload kept on when asked.
	w := want
	w.TxChecksumOffload = true
	l := *good
	if p := PlanDevice(w, &l); p.Update.TxChecksumOffload == nil || *p.Update.TxChecksumOffload != on {
		t.Errorf("offload on: %+v", p)
	}
}

func TestPlanEntries(t *testing.T) {
	want := State{
		Addrs:  []netip.Prefix{pfx("10.244.1.0/32")},
		Neighs: []Neigh{{IP: ip("10.244.2.0"), MAC: macB, Node: "n2"}, {IP: ip("10.244.3.0"), MAC: macC, Node: "n3"}},
		FDB:    []FDB{{MAC: macB, Dst: ip("10.250.0.12"), Node: "n2"}, {MAC: macC, Dst: ip("10.250.0.13"), Node: "n3"}},
	}
	t.Run("empty device", func(t *testing.T) {
		p := PlanEntries(want, nil, nil, nil)
		if d := cmp.Diff(EntryPlan{AddAddrs: want.Addrs, SetNeighs: want.Neighs, SetFDB: want.FDB}, p, ipOpts); d != "" {
			t.Error(d)
		}
	})
	t.Run("in step", func(t *testing.T) {
		if p := PlanEntries(want, want.Addrs, want.Neighs, want.FDB); !p.Empty() {
			t.Errorf("%+v", p)
		}
	})
	t.Run("stale and moved", func(t *testing.T) {
		p := PlanEntries(want,
			[]netip.Prefix{pfx("10.244.9.0/32"), pfx("10.244.1.0/32")},
			[]Neigh{{IP: ip("10.244.2.0"), MAC: macA}, {IP: ip("10.244.3.0"), MAC: macC}, {IP: ip("10.244.9.0"), MAC: macA}},
			[]FDB{{MAC: macB, Dst: ip("10.250.0.99")}, {MAC: macC, Dst: ip("10.250.0.7")}, {MAC: macC, Dst: ip("10.250.0.13")}, {MAC: macA, Dst: ip("10.250.0.19")}},
		)
		wantPlan := EntryPlan{
			DelAddrs:  []netip.Prefix{pfx("10.244.9.0/32")},
			DelNeighs: []Neigh{{IP: ip("10.244.9.0"), MAC: macA}},
			SetNeighs: []Neigh{{IP: ip("10.244.2.0"), MAC: macB, Node: "n2"}}, // MAC changed: one replace
			DelFDB:    []FDB{{MAC: macC, Dst: ip("10.250.0.7")}, {MAC: macA, Dst: ip("10.250.0.19")}},
			SetFDB:    []FDB{{MAC: macB, Dst: ip("10.250.0.12"), Node: "n2"}}, // underlay IP changed: one replace
		}
		if d := cmp.Diff(wantPlan, p, ipOpts); d != "" {
			t.Errorf("plan (-want +got):\n%s", d)
		}
	})
}

func TestSync(t *testing.T) {
	k := NewFake()
	want := State{
		Device: device("10.250.0.11"),
		Addrs:  []netip.Prefix{pfx("10.244.1.0/32")},
		Neighs: []Neigh{{IP: ip("10.244.2.0"), MAC: macB, Node: "n2"}},
		FDB:    []FDB{{MAC: macB, Dst: ip("10.250.0.12"), Node: "n2"}},
	}
	sync := func(s State, wantOps ...string) {
		t.Helper()
		k.Ops = nil
		if _, err := Sync(k, s); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(wantOps, k.Ops); d != "" {
			t.Errorf("ops (-want +got):\n%s", d)
		}
	}
	sync(want,
		"create flatnet.1 vni 1 port 4789 local 10.250.0.11 dev eth0 mac 02:00:00:00:00:0a mtu 1450",
		"set flatnet.1 up", "set flatnet.1 tx-checksum false",
		"add addr 10.244.1.0/32", "set neigh 10.244.2.0 lladdr 02:00:00:00:00:0b", "set fdb 02:00:00:00:00:0b dst 10.250.0.12")
	wantDump := `link flatnet.1 vxlan=true vni 1 port 4789 local 10.250.0.11 dev#2 mac 02:00:00:00:00:0a mtu 1450 up=true txcsum=false
addr 10.244.1.0/32
neigh 10.244.2.0 lladdr 02:00:00:00:00:0b
fdb 02:00:00:00:00:0b dst 10.250.0.12
`
	if d := cmp.Diff(wantDump, k.Dump(DeviceName)); d != "" {
		t.Errorf("dump (-want +got):\n%s", d)
	}
	sync(want) // idempotent

	// The node's own underlay address changes: the device is re-created
	// and its entries programmed again.
	moved := want
	moved.Device = device("10.250.0.21")
	sync(moved,
		"delete flatnet.1",
		"create flatnet.1 vni 1 port 4789 local 10.250.0.21 dev eth0 mac 02:00:00:00:00:0a mtu 1450",
		"set flatnet.1 up", "set flatnet.1 tx-checksum false",
		"add addr 10.244.1.0/32", "set neigh 10.244.2.0 lladdr 02:00:00:00:00:0b", "set fdb 02:00:00:00:00:0b dst 10.250.0.12")

	// MTU changes in place.
	mtu := moved
	mtu.Device.MTU = 1400
	sync(mtu, "set flatnet.1 mtu 1400")

	if ok, err := Remove(k, DeviceName); !ok || err != nil {
		t.Fatalf("remove: %v %v", ok, err)
	}
	if ok, err := Remove(k, DeviceName); ok || err != nil {
		t.Fatalf("second remove: %v %v", ok, err)
	}
}

type brokenKernel struct{ *Fake }

func (b brokenKernel) WriteEntries(name string, cs []EntryChange) []error {
	errs := make([]error, len(cs))
	for i, c := range cs {
		errs[i] = errNope
		if c.Neigh == nil || c.Del {
			errs[i] = b.Fake.WriteEntries(name, cs[i:i+1])[0]
		}
	}
	return errs
}
func (b brokenKernel) CreateLink(d Device) error {
	if d.VNI == 666 {
		return errNope
	}
	return b.Fake.CreateLink(d)
}

type nope struct{}

func (nope) Error() string { return "nope" }

var errNope error = nope{}

func TestSyncFailures(t *testing.T) {
	k := brokenKernel{NewFake()}
	want := State{
		Device: device("10.250.0.11"),
		Neighs: []Neigh{{IP: ip("10.244.2.0"), MAC: macB, Node: "n2"}},
		FDB:    []FDB{{MAC: macB, Dst: ip("10.250.0.12"), Node: "n2"}},
	}
	// A failing entry does not keep the others from being programmed.
	_, err := Sync(k, want)
	if err == nil || !strings.Contains(err.Error(), "neighbour 10.244.2.0 lladdr 02:00:00:00:00:0b on flatnet.1 for node n2: nope") {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(k.Dump(DeviceName), "fdb 02:00:00:00:00:0b dst 10.250.0.12") {
		t.Errorf("fdb entry missing:\n%s", k.Dump(DeviceName))
	}
	// A device that cannot be created stops Sync with a message naming it.
	bad := want
	bad.Device.VNI = 666
	_, err = Sync(k, bad)
	if err == nil || !strings.Contains(err.Error(), "creating VXLAN device flatnet.1 (VNI 666, port 4789, local 10.250.0.11, dev eth0): nope") {
		t.Fatalf("err = %v", err)
	}
}
