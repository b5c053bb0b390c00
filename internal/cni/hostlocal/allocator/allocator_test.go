package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/hostlocal/store"
)

// mustSet builds a range set from subnets (defaults filled in as Load does).
func mustSet(t *testing.T, subnets ...string) RangeSet {
	t.Helper()
	var set RangeSet
	for i, s := range subnets {
		r, err := parseRange(rawRange{Subnet: s}, fmt.Sprintf("test[%d]", i))
		if err != nil {
			t.Fatal(err)
		}
		set = append(set, r)
	}
	return set
}

func mustRange(t *testing.T, rr rawRange) Range {
	t.Helper()
	r, err := parseRange(rr, "test")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func wantCode(t *testing.T, err error, code uint) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want code %d", code)
	}
	if c, ok := cnierr.Code(err); !ok || c != code {
		t.Fatalf("error %q has code %d (%v), want %d", err, c, ok, code)
	}
}

// walk lists every candidate the iterator yields.
func walk(a *Allocator) []string {
	var out []string
	it := a.iter()
	for i := 0; i < 1000; i++ {
		_, ip, ok := it.next()
		if !ok {
			return out
		}
		out = append(out, ip.String())
	}
	return append(out, "...")
}

func TestIteratorOrder(t *testing.T) {
	set29 := mustSet(t, "192.168.1.0/29")
	tests := []struct {
		name string
		set  RangeSet
		last string
		want []string
	}{
		{"from the beginning", set29, "", []string{"192.168.1.2", "192.168.1.3", "192.168.1.4", "192.168.1.5", "192.168.1.6"}},
		{"from the end", set29, "192.168.1.6", []string{"192.168.1.2", "192.168.1.3", "192.168.1.4", "192.168.1.5", "192.168.1.6"}},
		{"from the middle", set29, "192.168.1.3", []string{"192.168.1.4", "192.168.1.5", "192.168.1.6", "192.168.1.2", "192.168.1.3"}},
		{"last outside the set", set29, "10.9.9.9", []string{"192.168.1.2", "192.168.1.3", "192.168.1.4", "192.168.1.5", "192.168.1.6"}},
		{"last of other family", set29, "fd00::3", []string{"192.168.1.2", "192.168.1.3", "192.168.1.4", "192.168.1.5", "192.168.1.6"}},
		{"across ranges", mustSet(t, "10.0.0.0/30", "10.0.1.0/30", "10.0.2.0/30"), "10.0.1.2",
			[]string{"10.0.2.2", "10.0.0.2", "10.0.1.2"}},
		{"ipv6", mustSet(t, "fd00:1::/125"), "", []string{"fd00:1::2", "fd00:1::3", "fd00:1::4", "fd00:1::5", "fd00:1::6", "fd00:1::7"}},
		{"ipv6 wraps", mustSet(t, "fd00:1::/125"), "fd00:1::7", []string{"fd00:1::2", "fd00:1::3", "fd00:1::4", "fd00:1::5", "fd00:1::6", "fd00:1::7"}},
		{"gateway in the middle", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/24", RangeStart: "10.0.0.10", RangeEnd: "10.0.0.13", Gateway: "10.0.0.11"})}, "",
			[]string{"10.0.0.10", "10.0.0.12", "10.0.0.13"}},
		{"gateway is rangeStart", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/24", RangeStart: "10.0.0.10", RangeEnd: "10.0.0.12", Gateway: "10.0.0.10"})}, "",
			[]string{"10.0.0.11", "10.0.0.12"}},
		{"network and broadcast skipped", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/30", RangeStart: "10.0.0.0", RangeEnd: "10.0.0.3", Gateway: "10.0.0.2"})}, "",
			[]string{"10.0.0.1"}},
		{"only the gateway", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/24", RangeStart: "10.0.0.1", RangeEnd: "10.0.0.1"})}, "", nil},
		{"rangeStart/rangeEnd", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/16", RangeStart: "10.0.3.254", RangeEnd: "10.0.4.1"})}, "",
			[]string{"10.0.3.254", "10.0.3.255", "10.0.4.0", "10.0.4.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := store.NewFake()
			if tc.last != "" {
				st.SetLast("0", ip(tc.last))
			}
			if diff := cmp.Diff(tc.want, walk(New(tc.set, st, 0))); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetRoundRobin(t *testing.T) {
	tests := []struct {
		name     string
		subnets  []string
		reserved []string
		last     string
		want     string
	}{
		{"fresh", []string{"10.0.0.0/29"}, nil, "", "10.0.0.2"},
		{"fresh ipv6", []string{"2001:db8:1::/64"}, nil, "", "2001:db8:1::2"},
		{"fresh /30", []string{"10.0.0.0/30"}, nil, "", "10.0.0.2"},
		{"first taken", []string{"10.0.0.0/29"}, []string{"10.0.0.2"}, "", "10.0.0.3"},
		{"after last", []string{"10.0.0.0/29"}, nil, "10.0.0.5", "10.0.0.6"},
		{"after last, skip taken", []string{"10.0.0.0/29"}, []string{"10.0.0.4", "10.0.0.5"}, "10.0.0.3", "10.0.0.6"},
		{"wrap to start", []string{"10.0.0.0/29"}, []string{"10.0.0.6"}, "10.0.0.5", "10.0.0.2"},
		{"last out of range", []string{"10.0.0.0/29"}, []string{"10.0.0.2"}, "10.0.0.128", "10.0.0.3"},
		{"only last free", []string{"10.0.0.0/29"}, []string{"10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, "10.0.0.3", "10.0.0.3"},
		{"first of several", []string{"10.0.0.0/30", "10.0.1.0/30"}, nil, "", "10.0.0.2"},
		{"advance to next range", []string{"10.0.0.0/30", "10.0.1.0/30"}, nil, "10.0.0.2", "10.0.1.2"},
		{"roll to first range", []string{"10.0.0.0/30", "10.0.1.0/30", "10.0.2.0/30"}, nil, "10.0.2.2", "10.0.0.2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := store.NewFake()
			for _, r := range tc.reserved {
				st.Set(ip(r), store.Key("other", "eth0"))
			}
			if tc.last != "" {
				st.SetLast("0", ip(tc.last))
			}
			got, err := New(mustSet(t, tc.subnets...), st, 0).Get("ID", "eth0", netip.Addr{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Address.IP.String() != tc.want {
				t.Errorf("got %s, want %s", got.Address.IP, tc.want)
			}
			if last, _ := st.LastReservedIP("0"); last.String() != tc.want {
				t.Errorf("last_reserved_ip = %s, want %s", last, tc.want)
			}
			if c, _ := st.Content(ip(tc.want)); c != "ID\r\neth0" {
				t.Errorf("reservation content %q", c)
			}
		})
	}
}

func TestSequentialAndReleaseRoundRobin(t *testing.T) {
	st := store.NewFake()
	a := New(mustSet(t, "192.168.1.0/29"), st, 0)
	for i := 2; i < 7; i++ {
		res, err := a.Get(fmt.Sprintf("ID%d", i), "eth0", netip.Addr{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("192.168.1.%d/29", i); res.Address.String() != want {
			t.Fatalf("got %s, want %s", res.Address.String(), want)
		}
		if res.Gateway.String() != "192.168.1.1" {
			t.Fatalf("gateway %s", res.Gateway)
		}
	}
	_, err := a.Get("ID7", "eth0", netip.Addr{}, nil)
	wantCode(t, err, cnierr.RangeExhausted)

	// Release .3: the next ADD gets it (the only free one) even though the
	// search starts after .6.
	if err := st.ReleaseByID("ID3", "eth0"); err != nil {
		t.Fatal(err)
	}
	res, err := a.Get("ID8", "eth0", netip.Addr{}, nil)
	if err != nil || res.Address.IP.String() != "192.168.1.3" {
		t.Fatalf("got %v, %v; want 192.168.1.3", res, err)
	}

	// Round robin: a released address is not reused right away.
	st2 := store.NewFake()
	b := New(mustSet(t, "192.168.1.0/29"), st2, 0)
	first, _ := b.Get("A", "eth0", netip.Addr{}, nil)
	_ = st2.ReleaseByID("A", "eth0")
	second, _ := b.Get("A", "eth0", netip.Addr{}, nil)
	if first.Address.IP.String() != "192.168.1.2" || second.Address.IP.String() != "192.168.1.3" {
		t.Fatalf("round robin: got %s then %s", first.Address.IP, second.Address.IP)
	}
}

func TestExhaustion(t *testing.T) {
	tests := []struct {
		subnets  []string
		reserved []string
	}{
		{[]string{"10.0.0.0/30"}, []string{"10.0.0.2"}},
		{[]string{"10.0.0.0/29"}, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{[]string{"10.0.0.0/30", "10.0.1.0/30"}, []string{"10.0.0.2", "10.0.1.2"}},
		{[]string{"fd00::/126"}, []string{"fd00::2", "fd00::3"}},
	}
	for _, tc := range tests {
		st := store.NewFake()
		for _, r := range tc.reserved {
			st.Set(ip(r), store.Key("other", "eth0"))
		}
		set := mustSet(t, tc.subnets...)
		_, err := New(set, st, 0).Get("ID", "eth0", netip.Addr{}, nil)
		wantCode(t, err, cnierr.RangeExhausted)
		if want := set.String(); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name range set %s", err, want)
		}
		if len(st.Reserved()) != len(tc.reserved) {
			t.Errorf("exhausted Get changed the store: %v", st.Reserved())
		}
		if Free(set, st.Reserved()).Sign() != 0 {
			t.Errorf("Free(%v) = %v, want 0", tc.subnets, Free(set, st.Reserved()))
		}
	}
}

func TestStaticRequests(t *testing.T) {
	set := RangeSet{mustRange(t, rawRange{Subnet: "192.168.1.0/24", RangeStart: "192.168.1.10", RangeEnd: "192.168.1.20", Gateway: "192.168.1.15"})}
	st := store.NewFake()
	a := New(set, st, 0)
	res, err := a.Get("ID", "eth0", ip("192.168.1.12"), nil)
	if err != nil || res.Address.String() != "192.168.1.12/24" {
		t.Fatalf("static: %v %v", res, err)
	}
	if last, _ := st.LastReservedIP("0"); last != ip("192.168.1.12") {
		t.Errorf("static request must update last_reserved_ip like the reference, got %s", last)
	}
	_, err = a.Get("ID2", "eth0", ip("192.168.1.12"), nil)
	wantCode(t, err, cnierr.AddressInUse)
	if !strings.Contains(err.Error(), `"ID"`) {
		t.Errorf("error %q does not name the holder", err)
	}
	_, err = a.Get("ID2", "eth0", ip("192.168.1.15"), nil)
	wantCode(t, err, cnierr.AddressInUse) // the gateway
	_, err = a.Get("ID2", "eth0", ip("192.168.1.21"), nil)
	wantCode(t, err, cnierr.AddressNotInRange) // after rangeEnd
	_, err = a.Get("ID2", "eth0", ip("192.168.1.9"), nil)
	wantCode(t, err, cnierr.AddressNotInRange) // before rangeStart
	_, err = a.Get("ID2", "eth0", ip("fd00::12"), nil)
	wantCode(t, err, cnierr.AddressNotInRange)

	wide := RangeSet{mustRange(t, rawRange{Subnet: "10.1.0.0/30", RangeStart: "10.1.0.0", RangeEnd: "10.1.0.3"})}
	_, err = New(wide, st, 1).Get("ID3", "eth0", ip("10.1.0.3"), nil)
	wantCode(t, err, cnierr.AddressNotInRange) // broadcast
	_, err = New(wide, st, 1).Get("ID3", "eth0", ip("10.1.0.0"), nil)
	wantCode(t, err, cnierr.AddressNotInRange) // network

	v6 := mustSet(t, "fd00:5::/64")
	res, err = New(v6, st, 2).Get("ID4", "eth0", ip("fd00:5::abcd"), nil)
	if err != nil || res.Address.String() != "fd00:5::abcd/64" || res.Gateway.String() != "fd00:5::1" {
		t.Fatalf("v6 static: %v %v", res, err)
	}
}

func TestDuplicateAttachment(t *testing.T) {
	st := store.NewFake()
	set := mustSet(t, "10.0.0.0/29")
	a := New(set, st, 0)
	if _, err := a.Get("ID", "eth0", netip.Addr{}, nil); err != nil {
		t.Fatal(err)
	}
	held, _ := st.GetByID("ID", "eth0")
	_, err := a.Get("ID", "eth0", netip.Addr{}, held)
	wantCode(t, err, cnierr.AddressInUse)
	if got := st.Reserved(); len(got) != 1 {
		t.Fatalf("duplicate ADD reserved more: %v", got)
	}
	// Another ifname of the same container is a different attachment.
	held, _ = st.GetByID("ID", "net1")
	if _, err := a.Get("ID", "net1", netip.Addr{}, held); err != nil {
		t.Fatal(err)
	}
	// A legacy (ID-only) reservation counts as held, like the reference.
	st.Set(ip("10.0.0.6"), "LEG")
	held, _ = st.GetByID("LEG", "eth0")
	_, err = a.Get("LEG", "eth0", netip.Addr{}, held)
	wantCode(t, err, cnierr.AddressInUse)
}

func TestStoreErrorIsIOFailure(t *testing.T) {
	st := store.NewFake()
	st.FailReserve = errors.New("disk on fire")
	_, err := New(mustSet(t, "10.0.0.0/29"), st, 0).Get("ID", "eth0", netip.Addr{}, nil)
	wantCode(t, err, cnierr.IOFailure)
	_, err = New(mustSet(t, "10.0.0.0/29"), st, 0).Get("ID", "eth0", ip("10.0.0.3"), nil)
	wantCode(t, err, cnierr.IOFailure)
}

func load(t *testing.T, conf string, args string) *Config {
	t.Helper()
	c, err := Load([]byte(conf), args)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const dualConf = `{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local",
	"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"fd00::/125"}]],
	"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0","gw":"fd00::1"}]}}`

func addrs(t *testing.T, st *store.Fake) []string {
	var out []string
	for _, a := range st.Reserved() {
		c, _ := st.Content(a)
		out = append(out, a.String()+"="+c)
	}
	return out
}

func TestAllocateMultipleRangeSets(t *testing.T) {
	c := load(t, dualConf, "")
	st := store.NewFake()
	res, err := Allocate(c, st, "c1", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ipc := range res.IPs {
		got = append(got, ipc.Address.String()+" via "+ipc.Gateway.String())
	}
	if diff := cmp.Diff([]string{"10.0.0.2/29 via 10.0.0.1", "fd00::2/125 via fd00::1"}, got); diff != "" {
		t.Errorf("IPs (-want +got):\n%s", diff)
	}
	if len(res.Routes) != 2 || res.Routes[1].GW.String() != "fd00::1" {
		t.Errorf("routes %v", res.Routes)
	}
	// Each set has its own last_reserved_ip.N.
	if l0, _ := st.LastReservedIP("0"); l0 != ip("10.0.0.2") {
		t.Errorf("last 0 = %s", l0)
	}
	if l1, _ := st.LastReservedIP("1"); l1 != ip("fd00::2") {
		t.Errorf("last 1 = %s", l1)
	}
	if _, err := Allocate(c, st, "c2", "eth0"); err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.2=c1\r\neth0", "10.0.0.3=c2\r\neth0", "fd00::2=c1\r\neth0", "fd00::3=c2\r\neth0"}
	if diff := cmp.Diff(want, addrs(t, st)); diff != "" {
		t.Errorf("store (-want +got):\n%s", diff)
	}
}

func TestAllocateRollsBackOnlyItsOwn(t *testing.T) {
	c := load(t, dualConf, "")
	st := store.NewFake()
	// v6 set full, so the second set fails after the first succeeded.
	for _, a := range []string{"fd00::2", "fd00::3", "fd00::4", "fd00::5", "fd00::6", "fd00::7"} {
		st.Set(ip(a), store.Key("other", "eth0"))
	}
	before := addrs(t, st)
	_, err := Allocate(c, st, "c1", "eth0")
	wantCode(t, err, cnierr.RangeExhausted)
	if !strings.Contains(err.Error(), "ipam.ranges[1]") || !strings.Contains(err.Error(), `"n"`) {
		t.Errorf("error %q should name the network and range set", err)
	}
	if diff := cmp.Diff(before, addrs(t, st)); diff != "" {
		t.Errorf("failed ADD left state behind (-before +after):\n%s", diff)
	}

	// An attachment that already holds a v6 address (from an earlier ADD)
	// and retries: the v4 reserved by the failing retry goes, the earlier
	// v6 stays (the reference would free both).
	st = store.NewFake()
	st.Set(ip("fd00::7"), store.Key("c1", "eth0"))
	_, err = Allocate(c, st, "c1", "eth0")
	wantCode(t, err, cnierr.AddressInUse)
	if diff := cmp.Diff([]string{"fd00::7=c1\r\neth0"}, addrs(t, st)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestAllocateStaticRequests(t *testing.T) {
	c := load(t, `{"cniVersion":"1.0.0","name":"n",
		"runtimeConfig":{"ips":["fd00::5/125"]},
		"args":{"cni":{"ips":["10.0.0.4"]}},
		"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"fd00::/125"}]]}}`, "")
	st := store.NewFake()
	res, err := Allocate(c, st, "c1", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if res.IPs[0].Address.String() != "10.0.0.4/29" || res.IPs[1].Address.String() != "fd00::5/125" {
		t.Fatalf("got %v", res.IPs)
	}
	// CNI_ARGS IP= for one set; the other set allocates dynamically.
	c = load(t, dualConf, "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.0.0.6")
	res, err = Allocate(c, st, "c2", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if res.IPs[0].Address.String() != "10.0.0.6/29" || res.IPs[1].Address.String() != "fd00::6/125" {
		t.Fatalf("got %v", res.IPs)
	}
	// Taken (102), outside every set (103), two in one set (7): nothing
	// is reserved by any of them.
	before := addrs(t, st)
	_, err = Allocate(load(t, dualConf, "IP=10.0.0.4"), st, "c3", "eth0")
	wantCode(t, err, cnierr.AddressInUse)
	_, err = Allocate(load(t, dualConf, "IP=10.9.0.4"), st, "c3", "eth0")
	wantCode(t, err, cnierr.AddressNotInRange)
	c = load(t, `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["10.0.0.2","10.0.0.3"]},
		"ipam":{"type":"host-local","ranges":[[{"subnet":"10.0.0.0/29"}]]}}`, "")
	_, err = Allocate(c, st, "c3", "eth0")
	wantCode(t, err, cnierr.InvalidConfig)
	if diff := cmp.Diff(before, addrs(t, st)); diff != "" {
		t.Errorf("failed static ADDs changed the store (-before +after):\n%s", diff)
	}
}

func TestStale(t *testing.T) {
	all := []store.Reservation{
		{IP: ip("10.0.0.2"), ContainerID: "a", IfName: "eth0"},
		{IP: ip("10.0.0.3"), ContainerID: "a", IfName: "net1"},
		{IP: ip("10.0.0.4"), ContainerID: "b", IfName: "eth0"},
		{IP: ip("10.0.0.5"), ContainerID: "a", Legacy: true},
		{IP: ip("10.0.0.6"), ContainerID: "z", Legacy: true},
		{IP: ip("fd00::2"), ContainerID: "b", IfName: "eth0"},
	}
	tests := []struct {
		name  string
		valid []Attachment
		want  []string
	}{
		{"none valid frees all", nil, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "fd00::2"}},
		{"keep a/eth0 (and a's legacy)", []Attachment{{"a", "eth0"}}, []string{"10.0.0.3", "10.0.0.4", "10.0.0.6", "fd00::2"}},
		{"ifname matters", []Attachment{{"b", "net1"}}, []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "fd00::2"}},
		{"all valid", []Attachment{{"a", "eth0"}, {"a", "net1"}, {"b", "eth0"}, {"z", "eth9"}}, nil},
		{"unknown attachments change nothing", []Attachment{{"a", "eth0"}, {"a", "net1"}, {"b", "eth0"}, {"z", "x"}, {"q", "eth0"}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, a := range Stale(all, tc.valid) {
				got = append(got, a.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFree(t *testing.T) {
	tests := []struct {
		name     string
		set      RangeSet
		reserved []string
		want     string
	}{
		{"/29 empty", mustSet(t, "10.0.0.0/29"), nil, "5"},
		{"/29 two taken, one foreign", mustSet(t, "10.0.0.0/29"), []string{"10.0.0.2", "10.0.0.6", "10.1.0.3", "fd00::2"}, "3"},
		{"/30", mustSet(t, "10.0.0.0/30"), []string{"10.0.0.2"}, "0"},
		{"two ranges", mustSet(t, "10.0.0.0/30", "10.0.1.0/30"), []string{"10.0.1.2"}, "1"},
		{"ipv6 /64", mustSet(t, "fd00::/64"), []string{"fd00::2"}, "18446744073709551613"},
		{"explicit network/broadcast not counted", RangeSet{mustRange(t, rawRange{Subnet: "10.0.0.0/29", RangeStart: "10.0.0.0", RangeEnd: "10.0.0.7"})}, nil, "5"},
		{"stale reservation of gateway not double-counted", mustSet(t, "10.0.0.0/30"), []string{"10.0.0.1"}, "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r []netip.Addr
			for _, s := range tc.reserved {
				r = append(r, ip(s))
			}
			if got := Free(tc.set, r).String(); got != tc.want {
				t.Errorf("Free = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestFreeMatchesIterator: Free agrees with what the iterator would hand out.
func TestFreeMatchesIterator(t *testing.T) {
	set := RangeSet{
		mustRange(t, rawRange{Subnet: "10.0.0.0/28", RangeStart: "10.0.0.0", RangeEnd: "10.0.0.9", Gateway: "10.0.0.5"}),
		mustRange(t, rawRange{Subnet: "10.0.1.0/29"}),
	}
	st := store.NewFake()
	a := New(set, st, 0)
	candidates := len(walk(a)) // every usable address, reserved or not
	if candidates != 8+5 {
		t.Fatalf("iterator yields %d candidates, want 13", candidates)
	}
	n := 0
	for {
		if got := Free(set, st.Reserved()).Int64(); got != int64(candidates-n) {
			t.Fatalf("after %d allocations Free = %d, want %d", n, got, candidates-n)
		}
		_, err := a.Get(fmt.Sprint("c", n), "eth0", netip.Addr{}, nil)
		if err != nil {
			wantCode(t, err, cnierr.RangeExhausted)
			break
		}
		n++
	}
	if n != candidates {
		t.Errorf("allocated %d, iterator has %d candidates", n, candidates)
	}
	if f := Free(set, st.Reserved()); f.Sign() != 0 {
		t.Errorf("Free after exhaustion = %v", f)
	}
}

func newFuzzStore() *store.Fake { return store.NewFake() }
