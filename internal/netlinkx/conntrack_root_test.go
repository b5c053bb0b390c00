package netlinkx_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// ctKey names an entry for comparisons.
func ctKey(proto uint8, src, dst netip.Addr, sport, dport, zone uint16) string {
	return fmt.Sprintf("proto %d %s -> %s zone %d", proto, netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport), zone)
}

func entryKey(e netlinkx.ConntrackEntry) string {
	return ctKey(e.Proto, e.Src, e.Dst, e.SrcPort, e.DstPort, e.Zone)
}

// listKeys lists the entries of the namespace at ns.
func listKeys(t testing.TB, ns string) []string {
	t.Helper()
	var flows []*netlink.ConntrackFlow
	if err := netns.Do(ns, func() (err error) {
		flows, err = netlinkx.ConntrackTableList(netlink.ConntrackTable, unix.AF_UNSPEC)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range flows {
		src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
		out = append(out, ctKey(f.Forward.Protocol, src.Unmap(), dst.Unmap(), f.Forward.SrcPort, f.Forward.DstPort, f.Zone))
	}
	sort.Strings(out)
	return out
}

// testEntries are entries that a selection of UDP to port 5353 (IPv4)
// and 5353 and 7000 (IPv6) must delete and must leave, in zones 0 and 7.
func testEntries() []netlinkx.ConntrackEntry {
	a4, b4 := netip.MustParseAddr("10.246.31.1"), netip.MustParseAddr("10.246.31.2")
	a6, b6 := netip.MustParseAddr("fd00:246:31::1"), netip.MustParseAddr("fd00:246:31::2")
	var es []netlinkx.ConntrackEntry
	for _, zone := range []uint16{0, 7} {
		for _, p := range []struct {
			a, b netip.Addr
		}{{a4, b4}, {a6, b6}} {
			for _, proto := range []uint8{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				for _, dport := range []uint16{5353, 5354, 7000} {
					es = append(es, netlinkx.ConntrackEntry{Proto: proto, Src: p.a, Dst: p.b, SrcPort: 40000, DstPort: dport, Zone: zone})
				}
				// From the port, not to it.
				es = append(es, netlinkx.ConntrackEntry{Proto: proto, Src: p.b, Dst: p.a, SrcPort: 5353, DstPort: 40001, Zone: zone})
			}
		}
	}
	return es
}

// TestRootConntrackDeletePorts: every way of finding the entries (the
// planned one, one unfiltered dump, per-family kernel-filtered dumps by
// port or by protocol, a filter the kernel rejects) deletes exactly the
// selected entries of the namespace it runs in, whatever their zone, and
// none of another namespace.
func TestRootConntrackDeletePorts(t *testing.T) {
	udp := func(p4, p6 []uint16) netlinkx.ConntrackPorts {
		return netlinkx.ConntrackPorts{Proto: unix.IPPROTO_UDP, Ports4: p4, Ports6: p6}
	}
	cases := []struct {
		name  string
		sel   netlinkx.ConntrackPorts
		dumps []netlinkx.Dump // nil: as ConntrackDeletePorts plans them
	}{
		{name: "planned", sel: udp([]uint16{5353}, []uint16{5353, 7000})},
		{name: "planned IPv4 only", sel: udp([]uint16{5353, 5353}, nil)},
		{name: "one unfiltered dump", sel: udp([]uint16{5353}, []uint16{5353, 7000}), dumps: []netlinkx.Dump{{Family: unix.AF_UNSPEC}}},
		{name: "filtered by port", sel: udp([]uint16{5353}, []uint16{7000}), dumps: []netlinkx.Dump{
			{Family: unix.AF_INET, Filter: true, Port: 5353}, {Family: unix.AF_INET6, Filter: true, Port: 7000}}},
		{name: "filtered by protocol", sel: udp([]uint16{5353, 5354}, []uint16{5353, 7000}), dumps: []netlinkx.Dump{
			{Family: unix.AF_INET, Filter: true}, {Family: unix.AF_INET6, Filter: true}}},
		{name: "TCP filtered by port", sel: netlinkx.ConntrackPorts{Proto: unix.IPPROTO_TCP, Ports4: []uint16{7000}}, dumps: []netlinkx.Dump{
			{Family: unix.AF_INET, Filter: true, Port: 7000}}},
		// CTA_FILTER_F_MAX: a flag no kernel knows, rejected.
		{name: "filter rejected", sel: udp([]uint16{5353}, []uint16{5353, 7000}), dumps: []netlinkx.Dump{
			{Family: unix.AF_INET, Filter: true, Port: 5353, ExtraFlags: 1 << 12}, {Family: unix.AF_INET6, Filter: true, ExtraFlags: 1 << 12}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node, other := testutil.NewNetNS(t), testutil.NewNetNS(t)
			testutil.RequireConntrack(t, node)
			es := testEntries()
			var all, keep []string
			for _, e := range es {
				all = append(all, entryKey(e))
				if !(e.Proto == c.sel.Proto && slices.Contains(map[bool][]uint16{true: c.sel.Ports4, false: c.sel.Ports6}[e.Src.Is4()], e.DstPort)) {
					keep = append(keep, entryKey(e))
				}
			}
			sort.Strings(all)
			sort.Strings(keep)
			for _, ns := range []string{node, other} {
				if err := netns.Do(ns, func() error { return netlinkx.ConntrackCreate(es, 600) }); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(all, listKeys(t, ns)); diff != "" {
					t.Fatalf("entries created (-want +got):\n%s", diff)
				}
			}
			var n uint
			err := netns.Do(node, func() (err error) {
				if c.dumps == nil {
					n, err = netlinkx.ConntrackDeletePorts(context.Background(), c.sel)
				} else {
					n, err = netlinkx.DeletePortsWith(context.Background(), c.sel, c.dumps)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(keep, listKeys(t, node)); diff != "" {
				t.Errorf("entries left in the namespace (-want +got):\n%s", diff)
			}
			if want := uint(len(all) - len(keep)); n != want {
				t.Errorf("deleted %d entries, want %d", n, want)
			}
			if diff := cmp.Diff(all, listKeys(t, other)); diff != "" {
				t.Errorf("entries of another namespace (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRootConntrackDeletePortsEmpty: a namespace with no entry is not
// dumped (nothing to see but success), and entries of other ports stay.
func TestRootConntrackDeletePortsEmpty(t *testing.T) {
	ns := testutil.NewNetNS(t)
	testutil.RequireConntrack(t, ns)
	sel := netlinkx.ConntrackPorts{Proto: unix.IPPROTO_UDP, Ports4: []uint16{9}, Ports6: []uint16{9}}
	del := func() {
		t.Helper()
		var n uint
		if err := netns.Do(ns, func() (err error) { n, err = netlinkx.ConntrackDeletePorts(context.Background(), sel); return err }); err != nil || n != 0 {
			t.Fatalf("ConntrackDeletePorts = %d, %v; want 0, nil", n, err)
		}
	}
	del()
	if err := netns.Do(ns, func() error { return netlinkx.ConntrackCreate(testEntries(), 600) }); err != nil {
		t.Fatal(err)
	}
	del()
	if got, want := len(listKeys(t, ns)), len(testEntries()); got != want {
		t.Errorf("%d entries left, want %d", got, want)
	}
}

// TestRootConntrackFilteredDump: this kernel filters dumps as the plan
// expects (only the protocol's entries, to the port), and rejects an
// unknown filter flag, which is the fallback's cue: EOPNOTSUPP from
// ctnetlink_parse_filter, EINVAL from the attribute policy of newer
// kernels.
func TestRootConntrackFilteredDump(t *testing.T) {
	ns := testutil.NewNetNS(t)
	testutil.RequireConntrack(t, ns)
	es := testEntries()
	if err := netns.Do(ns, func() error { return netlinkx.ConntrackCreate(es, 600) }); err != nil {
		t.Fatal(err)
	}
	want := func(fam uint8, port uint16) (out []string) {
		for _, e := range es {
			if e.Proto == unix.IPPROTO_UDP && e.Src.Is4() == (fam == unix.AF_INET) && (port == 0 || e.DstPort == port) {
				out = append(out, fmt.Sprintf("proto %d %s -> %s", e.Proto, netip.AddrPortFrom(e.Src, e.SrcPort), netip.AddrPortFrom(e.Dst, e.DstPort)))
			}
		}
		sort.Strings(out)
		return out
	}
	for _, d := range []netlinkx.Dump{
		{Family: unix.AF_INET, Filter: true, Port: 5353},
		{Family: unix.AF_INET6, Filter: true, Port: 7000},
		{Family: unix.AF_INET6, Filter: true},
	} {
		var got []string
		if err := netns.Do(ns, func() (err error) { got, err = netlinkx.DumpOnly(d, unix.IPPROTO_UDP); return err }); err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		sort.Strings(got)
		if diff := cmp.Diff(want(d.Family, d.Port), got); diff != "" {
			t.Errorf("dump %+v (-want +got):\n%s", d, diff)
		}
	}
	err := netns.Do(ns, func() error {
		_, err := netlinkx.DumpOnly(netlinkx.Dump{Family: unix.AF_INET, Filter: true, ExtraFlags: 1 << 12}, unix.IPPROTO_UDP)
		return err
	})
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
		t.Errorf("dump with an unknown filter flag: %v, want EOPNOTSUPP or EINVAL", err)
	}
}
