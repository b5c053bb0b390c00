package netlinkx

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The expected messages are built here from the kernel's numbers
// (nfnetlink_conntrack.h, nf_internals.h), written out, not from the
// package's constants or vishvananda's encoder.

// attr is one netlink attribute: header, payload, padding to 4 bytes.
func attr(typ uint16, payload ...[]byte) []byte {
	var p []byte
	for _, b := range payload {
		p = append(p, b...)
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(p)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, p...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

const nested = 0x8000

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// msg is a whole ctnetlink message: nlmsghdr (seq 1, portid 0), nfgenmsg
// (version 0, res_id 0), attributes.
func msg(typ, flags uint16, family byte, attrs ...[]byte) []byte {
	body := []byte{family, 0, 0, 0}
	for _, a := range attrs {
		body = append(body, a...)
	}
	b := binary.NativeEndian.AppendUint32(nil, uint32(16+len(body)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, 1)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, body...)
}

func serialize(r *nl.NetlinkRequest) []byte {
	r.Seq = 1
	return r.Serialize()
}

// tuple is CTA_TUPLE_ORIG/REPLY's payload for a UDP or TCP flow.
func tuple(src, dst netip.Addr, proto byte, sport, dport uint16) []byte {
	ipSrc, ipDst := uint16(1), uint16(2) // CTA_IP_V4_SRC, CTA_IP_V4_DST
	if src.Is6() {
		ipSrc, ipDst = 3, 4
	}
	return append(
		attr(1|nested, attr(ipSrc, src.AsSlice()), attr(ipDst, dst.AsSlice())),                // CTA_TUPLE_IP
		attr(2|nested, attr(1, []byte{proto}), attr(2, be16(sport)), attr(3, be16(dport)))...) // CTA_TUPLE_PROTO: NUM, SRC_PORT, DST_PORT
}

func TestDumpRequest(t *testing.T) {
	const (
		get      = 1<<8 | 1 // NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET
		reqDump  = 0x1 | 0x300
		origTupl = 1 | nested  // CTA_TUPLE_ORIG
		proto    = 2 | nested  // CTA_TUPLE_PROTO
		filter   = 25 | nested // CTA_FILTER
	)
	cases := []struct {
		name string
		d    ctDump
		want []byte
	}{
		{"whole table", ctDump{family: unix.AF_UNSPEC}, msg(get, reqDump, 0)},
		{"whole IPv6 table", ctDump{family: unix.AF_INET6}, msg(get, reqDump, 10)},
		{"UDP to 5353, IPv4", ctDump{family: unix.AF_INET, filter: true, port: 5353}, msg(get, reqDump, 2,
			attr(origTupl, attr(proto, attr(1, []byte{17}), attr(3, be16(5353)))),
			attr(filter, attr(1, ne32(1<<3|1<<5))))}, // CTA_FILTER_ORIG_FLAGS: PROTO_NUM, PROTO_DST_PORT
		{"UDP, IPv6", ctDump{family: unix.AF_INET6, filter: true}, msg(get, reqDump, 10,
			attr(origTupl, attr(proto, attr(1, []byte{17}))),
			attr(filter, attr(1, ne32(1<<3))))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := serialize(dumpRequest(c.d, unix.IPPROTO_UDP))
			if diff := cmp.Diff(hex.Dump(c.want), hex.Dump(got)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// Pinned bytes on a little-endian machine, the common case.
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		got := hex.EncodeToString(serialize(dumpRequest(ctDump{family: unix.AF_INET, filter: true, port: 53}, unix.IPPROTO_UDP)))
		want := "38000000" + "0101" + "0103" + "01000000" + "00000000" + // nlmsghdr: len 56, type, flags, seq, portid
			"02000000" + // nfgenmsg: AF_INET
			"1800" + "0180" + // CTA_TUPLE_ORIG, nested, 24 bytes
			"1400" + "0280" + // CTA_TUPLE_PROTO, nested, 20 bytes
			"0500" + "0100" + "11000000" + // CTA_PROTO_NUM 17, padded
			"0600" + "0300" + "00350000" + // CTA_PROTO_DST_PORT 53, big-endian, padded
			"0c00" + "1980" + // CTA_FILTER, nested, 12 bytes
			"0800" + "0100" + "28000000" // CTA_FILTER_ORIG_FLAGS: 1<<3 | 1<<5
		if got != want {
			t.Errorf("bytes:\n got %s\nwant %s", got, want)
		}
	}
}

func TestCreateRequest(t *testing.T) {
	const newMsg, flags = 1<<8 | 0, 0x1 | 0x200 | 0x400 // IPCTNL_MSG_CT_NEW; REQUEST, EXCL, CREATE
	a4, b4 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	cases := []struct {
		name string
		e    ConntrackEntry
		want []byte
	}{
		{"UDP IPv4", ConntrackEntry{Proto: 17, Src: a4, Dst: b4, SrcPort: 40000, DstPort: 53}, msg(newMsg, flags, 2,
			attr(1|nested, tuple(a4, b4, 17, 40000, 53)), // CTA_TUPLE_ORIG
			attr(2|nested, tuple(b4, a4, 17, 53, 40000)), // CTA_TUPLE_REPLY
			attr(7, be32(600)))},                         // CTA_TIMEOUT
		{"TCP IPv6 in zone 7", ConntrackEntry{Proto: 6, Src: a6, Dst: b6, SrcPort: 1, DstPort: 2, Zone: 7}, msg(newMsg, flags, 10,
			attr(1|nested, tuple(a6, b6, 6, 1, 2)),
			attr(2|nested, tuple(b6, a6, 6, 2, 1)),
			attr(7, be32(600)),
			attr(18, be16(7)))}, // CTA_ZONE
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := createRequest(c.e, 600)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(hex.Dump(c.want), hex.Dump(serialize(r))); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	for _, e := range []ConntrackEntry{{Proto: 17, Src: a4, Dst: b6}, {Proto: 17, Src: a4}} {
		if _, err := createRequest(e, 600); err == nil {
			t.Errorf("createRequest(%v) succeeded", e)
		}
	}
}

// dumped is a message as a dump sends it: both tuples, status, zone,
// id, and an attribute we do not read.
func dumped(family byte, orig, reply []byte, zone []byte) []byte {
	m := msg(1<<8|0, 0x2, family,
		attr(1|nested, orig),
		attr(2|nested, reply),
		attr(3, be32(0x18a)), // CTA_STATUS
		attr(7, be32(120)),   // CTA_TIMEOUT
		attr(4|nested, attr(1|nested, attr(1, []byte{3}))), // CTA_PROTOINFO
	)
	if zone != nil {
		m = append(m, attr(18, zone)...)
	}
	m = append(m, attr(12, be32(0xdeadbeef))...) // CTA_ID
	binary.NativeEndian.PutUint32(m, uint32(len(m)))
	return m[16:] // what ExecuteIter hands over
}

func TestParseEntryAndDelete(t *testing.T) {
	const del = 1<<8 | 2 // IPCTNL_MSG_CT_DELETE
	a, b := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	orig, reply := tuple(a, b, 17, 40000, 5353), tuple(b, a, 17, 5353, 40000)
	for _, zone := range [][]byte{nil, be16(3)} {
		e, err := parseEntry(dumped(10, orig, reply, zone))
		if err != nil {
			t.Fatal(err)
		}
		want := ctEntry{family: 10, proto: 17, src: a, dst: b, sport: 40000, dport: 5353, tuple: orig, zone: zone, id: be32(0xdeadbeef)}
		if diff := cmp.Diff(want, e, cmp.AllowUnexported(ctEntry{}), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
			t.Errorf("parseEntry (-want +got):\n%s", diff)
		}
		r, err := deleteRequest(e)
		if err != nil {
			t.Fatal(err)
		}
		wantMsg := msg(del, 0x1, 10, attr(1|nested, orig))
		if zone != nil {
			wantMsg = append(wantMsg, attr(18, zone)...)
		}
		wantMsg = append(wantMsg, attr(12, be32(0xdeadbeef))...)
		binary.NativeEndian.PutUint32(wantMsg, uint32(len(wantMsg)))
		if diff := cmp.Diff(hex.Dump(wantMsg), hex.Dump(serialize(r))); diff != "" {
			t.Errorf("deleteRequest (-want +got):\n%s", diff)
		}
	}
	if _, err := deleteRequest(ctEntry{family: 2, proto: 17}); err == nil {
		t.Error("deleteRequest with no tuple succeeded: it would flush the table")
	}
}

func TestParseEntryMalformed(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	good := dumped(2, tuple(a, b, 17, 1, 2), tuple(b, a, 17, 2, 1), nil)
	noIP := append([]byte{2, 0, 0, 0}, attr(1|nested, attr(2|nested, attr(1, []byte{17})))...)
	cases := map[string][]byte{
		"empty":          nil,
		"no attributes":  {2, 0, 0, 0},
		"truncated":      good[:len(good)-9],
		"bad attr len":   append([]byte{2, 0, 0, 0}, 0xff, 0, 1, 0),
		"no tuple":       append([]byte{2, 0, 0, 0}, attr(12, be32(1))...),
		"tuple, no addr": noIP,
	}
	for name, b := range cases {
		if _, err := parseEntry(b); !errors.Is(err, errMalformed) {
			t.Errorf("%s: err %v, want errMalformed", name, err)
		}
	}
}

func FuzzParseEntry(f *testing.F) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	f.Add(dumped(2, tuple(a, b, 17, 1, 2), tuple(b, a, 17, 2, 1), be16(3)))
	f.Add([]byte{2, 0, 0, 0, 5, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := parseEntry(b)
		if err != nil {
			return
		}
		if _, err := deleteRequest(e); err != nil {
			t.Fatalf("parsed entry %v cannot be deleted: %v", e, err)
		}
	})
}

func TestPlanDumps(t *testing.T) {
	udp := func(p4, p6 []uint16) ConntrackPorts {
		return ConntrackPorts{Proto: unix.IPPROTO_UDP, Ports4: p4, Ports6: p6}
	}
	cases := []struct {
		name  string
		sel   ConntrackPorts
		count int
		want  []ctDump
	}{
		{"IPv4, one port", udp([]uint16{53}, nil), 5, []ctDump{{family: unix.AF_INET, filter: true, port: 53}}},
		{"IPv6, two ports", udp(nil, []uint16{53, 54}), 100000, []ctDump{{family: unix.AF_INET6, filter: true}}},
		{"both, small table", udp([]uint16{53}, []uint16{53}), smallTable, []ctDump{{family: unix.AF_UNSPEC}}},
		{"both, large table", udp([]uint16{53}, []uint16{53, 54}), smallTable + 1, []ctDump{
			{family: unix.AF_INET, filter: true, port: 53}, {family: unix.AF_INET6, filter: true}}},
		{"both, unknown count", udp([]uint16{53}, []uint16{53}), -1, []ctDump{
			{family: unix.AF_INET, filter: true, port: 53}, {family: unix.AF_INET6, filter: true, port: 53}}},
		{"none", udp(nil, nil), 5, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, planDumps(c.sel, c.count), cmp.AllowUnexported(ctDump{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestConntrackPortsMatch(t *testing.T) {
	sel := ConntrackPorts{Proto: unix.IPPROTO_UDP, Ports4: []uint16{53}, Ports6: []uint16{54}}
	for _, c := range []struct {
		e    ctEntry
		want bool
	}{
		{ctEntry{family: unix.AF_INET, proto: 17, dport: 53}, true},
		{ctEntry{family: unix.AF_INET, proto: 17, dport: 54}, false},
		{ctEntry{family: unix.AF_INET, proto: 6, dport: 53}, false},
		{ctEntry{family: unix.AF_INET, proto: 17, sport: 53, dport: 1}, false},
		{ctEntry{family: unix.AF_INET6, proto: 17, dport: 54}, true},
		{ctEntry{family: unix.AF_INET6, proto: 17, dport: 53}, false},
	} {
		if got := sel.match(c.e); got != c.want {
			t.Errorf("match(%+v) = %v, want %v", c.e, got, c.want)
		}
	}
}
