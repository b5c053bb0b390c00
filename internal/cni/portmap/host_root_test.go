package portmap

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

// flushUDPConntrackWalk is flushUDPConntrack as it was before kernel-side
// filtering: one dump of the whole table, matched here, then a deleting
// pass (another whole dump) per family with a stale entry. The tests hold
// the new one to its results, and the benchmark to its time.
func flushUDPConntrackWalk(ports4, ports6 []uint16) error {
	if len(ports4)+len(ports6) == 0 {
		return nil
	}
	n, err := sysctl.Get("net.netfilter.nf_conntrack_count")
	if errors.Is(err, fs.ErrNotExist) || n == "0" {
		return nil
	}
	filters := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for fam, ports := range map[netlink.InetFamily][]uint16{unix.AF_INET: ports4, unix.AF_INET6: ports6} {
		for _, p := range ports {
			f := &netlink.ConntrackFilter{}
			if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
				return err
			}
			if err := f.AddPort(netlink.ConntrackOrigDstPort, p); err != nil {
				return err
			}
			filters[fam] = append(filters[fam], f)
		}
	}
	flows, err := netlinkx.ConntrackTableList(netlink.ConntrackTable, unix.AF_UNSPEC)
	if err != nil {
		return fmt.Errorf("listing conntrack entries: %w", err)
	}
	stale := map[netlink.InetFamily]bool{}
	for _, flow := range flows {
		fam := netlink.InetFamily(flow.FamilyType)
		for _, f := range filters[fam] {
			if f.MatchConntrackFlow(flow) {
				stale[fam] = true
			}
		}
	}
	var errs []error
	for fam := range stale {
		if _, err := netlinkx.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters[fam]...); err != nil {
			errs = append(errs, fmt.Errorf("deleting UDP conntrack entries for ports %v %v: %w", ports4, ports6, err))
		}
	}
	return errors.Join(errs...)
}

// ctTable is n entries that no flush in these tests selects, of every
// kind a node holds (TCP and UDP, IPv4 and IPv6, DNS among them),
// followed by the stale ones: UDP to the host ports 5353 and 6000 over
// both families, TCP to them, and UDP from them.
func ctTable(n int) []netlinkx.ConntrackEntry {
	es := make([]netlinkx.ConntrackEntry, 0, n+16)
	dports := []uint16{80, 443, 53, 6443, 8080}
	for i := range n {
		e := netlinkx.ConntrackEntry{Proto: unix.IPPROTO_TCP, SrcPort: uint16(1024 + i%60000), DstPort: dports[i%len(dports)]}
		if i%5 == 2 {
			e.Proto = unix.IPPROTO_UDP
		}
		hi, lo := byte(i>>16), [2]byte{byte(i >> 8), byte(i)}
		if i%5 == 4 {
			e.Src = netip.AddrFrom16([16]byte{0xfd, 0, 0x2, 0x47, 14: lo[0], 15: lo[1], 13: hi})
			e.Dst = netip.MustParseAddr("fd00:248::1")
		} else {
			e.Src = netip.AddrFrom4([4]byte{10, 247 - hi, lo[0], lo[1]})
			e.Dst = netip.MustParseAddr("10.248.0.1")
		}
		es = append(es, e)
	}
	return append(es, staleEntries()...)
}

func staleEntries() []netlinkx.ConntrackEntry {
	var es []netlinkx.ConntrackEntry
	for _, p := range [][2]string{{"10.246.40.1", "10.246.40.2"}, {"fd00:246:40::1", "fd00:246:40::2"}} {
		a, b := netip.MustParseAddr(p[0]), netip.MustParseAddr(p[1])
		for _, port := range []uint16{5353, 6000} {
			es = append(es,
				netlinkx.ConntrackEntry{Proto: unix.IPPROTO_UDP, Src: a, Dst: b, SrcPort: 40000, DstPort: port},
				netlinkx.ConntrackEntry{Proto: unix.IPPROTO_UDP, Src: a, Dst: b, SrcPort: 40000, DstPort: port, Zone: 3},
				netlinkx.ConntrackEntry{Proto: unix.IPPROTO_TCP, Src: a, Dst: b, SrcPort: 40000, DstPort: port},
				netlinkx.ConntrackEntry{Proto: unix.IPPROTO_UDP, Src: b, Dst: a, SrcPort: port, DstPort: 40001})
		}
	}
	return es
}

// ctList lists the entries of the namespace at ns, one line each.
func ctList(t testing.TB, ns string) []string {
	t.Helper()
	var flows []*netlink.ConntrackFlow
	if err := netns.Do(ns, func() (err error) {
		flows, err = netlinkx.ConntrackTableList(netlink.ConntrackTable, unix.AF_UNSPEC)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(flows))
	for _, f := range flows {
		out = append(out, fmt.Sprintf("%d %d %s:%d -> %s:%d zone %d", f.FamilyType, f.Forward.Protocol, f.Forward.SrcIP, f.Forward.SrcPort, f.Forward.DstIP, f.Forward.DstPort, f.Zone))
	}
	sort.Strings(out)
	return out
}

// TestRootFlushUDPConntrack: flushUDPConntrack leaves exactly what the
// full walk it replaces left, for what ADD asks (one family, or each its
// ports) and DEL asks (the same ports for both), in a namespace with few
// entries (one unfiltered dump) and with more (kernel-filtered dumps);
// another namespace keeps all of its entries.
func TestRootFlushUDPConntrack(t *testing.T) {
	for _, size := range []int{0, 3000} {
		for _, c := range []struct {
			name           string
			ports4, ports6 []uint16
		}{
			{"ADD IPv4", []uint16{5353}, nil},
			{"ADD IPv6", nil, []uint16{6000}},
			{"ADD dual-stack", []uint16{5353}, []uint16{5353, 6000}},
			{"DEL", []uint16{6000, 5353}, []uint16{6000, 5353}},
			{"none", nil, nil},
		} {
			t.Run(fmt.Sprintf("%s with %d entries", c.name, size), func(t *testing.T) {
				old, node, other := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
				testutil.RequireConntrack(t, node)
				es := ctTable(size)
				for _, ns := range []string{old, node, other} {
					if err := netns.Do(ns, func() error { return netlinkx.ConntrackCreate(es, 600) }); err != nil {
						t.Fatal(err)
					}
				}
				all := ctList(t, other)
				if len(all) != len(es) {
					t.Fatalf("%d entries created, want %d", len(all), len(es))
				}
				if err := netns.Do(old, func() error { return flushUDPConntrackWalk(c.ports4, c.ports6) }); err != nil {
					t.Fatal(err)
				}
				if err := netns.Do(node, func() error { return flushUDPConntrack(c.ports4, c.ports6) }); err != nil {
					t.Fatal(err)
				}
				want := ctList(t, old)
				if len(c.ports4)+len(c.ports6) > 0 && len(want) == len(all) {
					t.Fatalf("the full walk deleted nothing: the test selects no entry")
				}
				if diff := cmp.Diff(want, ctList(t, node)); diff != "" {
					t.Errorf("entries left (-full walk +filtered):\n%s", diff)
				}
				if diff := cmp.Diff(all, ctList(t, other)); diff != "" {
					t.Errorf("entries of another namespace (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// raiseConntrackMax makes room for n more entries in a namespace
// (nf_conntrack_max is global, and only the first namespace may write
// it), restoring the old value when tb ends.
func raiseConntrackMax(tb testing.TB, n int) {
	tb.Helper()
	const path = "/proc/sys/net/netfilter/nf_conntrack_max"
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		tb.Fatal(err)
	}
	if cur >= n+n/4 {
		return
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(n+n/4)), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			tb.Errorf("restoring %s: %v", path, err)
		}
	})
}

// BenchmarkRootFlushUDPConntrack times the flush of a pod's DEL (UDP host
// port 5353, both families) and of an IPv4 pod's ADD (the same port), in
// a node namespace of 100, 1,000 or 100,000 entries besides the 16 of
// staleEntries: recreated before each flush (untimed), so that DEL
// deletes 4 and ADD 2 each time, or not (ADD-clean: nothing to delete,
// the common case). The full walk it replaces against the
// kernel-filtered flush, in the same run. Run:
// go test -run X -bench RootFlushUDPConntrack -benchtime 2s ./internal/cni/portmap
func BenchmarkRootFlushUDPConntrack(b *testing.B) {
	for _, size := range []int{100, 1000, 100000} {
		b.Run(fmt.Sprintf("entries=%d", size), func(b *testing.B) {
			node := testutil.NewNetNS(b)
			testutil.RequireConntrack(b, node)
			raiseConntrackMax(b, size+100)
			if err := netns.Do(node, func() error { return netlinkx.ConntrackCreate(ctTable(size), 600) }); err != nil {
				b.Fatal(err)
			}
			for _, op := range []struct {
				name           string
				ports4, ports6 []uint16
				stale          bool
			}{
				{"DEL", []uint16{5353}, []uint16{5353}, true},
				{"ADD-IPv4", []uint16{5353}, nil, true},
				{"ADD-IPv4-clean", []uint16{5353}, nil, false},
			} {
				for _, impl := range []struct {
					name  string
					flush func(ports4, ports6 []uint16) error
				}{{"walk", flushUDPConntrackWalk}, {"filtered", flushUDPConntrack}} {
					b.Run(op.name+"/"+impl.name, func(b *testing.B) {
						err := netns.Do(node, func() error {
							stale := staleEntries()
							for range b.N {
								if op.stale {
									b.StopTimer()
									_ = netlinkx.ConntrackCreate(stale, 600) // EEXIST for those the last flush kept
									b.StartTimer()
								}
								if err := impl.flush(op.ports4, op.ports6); err != nil {
									return err
								}
							}
							return nil
						})
						if err != nil {
							b.Fatal(err)
						}
					})
				}
			}
		})
	}
}
