package netlinkx

// Conntrack messages (ctnetlink, linux/netfilter/nfnetlink_conntrack.h),
// encoded and decoded with no kernel access, so that tests pin the bytes.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// What vishvananda/netlink's nl package and x/sys/unix lack.
const (
	ctaFilter = 25 // CTA_FILTER (Linux 5.8)

	ctaFilterOrigFlags = 1 // CTA_FILTER_ORIG_FLAGS, inside CTA_FILTER

	// CTA_FILTER_FLAG(...) bits (net/netfilter/nf_internals.h): which
	// fields of the CTA_TUPLE_ORIG sent along must equal the entry's.
	ctaFilterFProtoNum = 1 << 3 // CTA_FILTER_F_CTA_PROTO_NUM
	ctaFilterFDstPort  = 1 << 5 // CTA_FILTER_F_CTA_PROTO_DST_PORT

	nlaTypeMask = 0x3fff // ^(NLA_F_NESTED | NLA_F_NET_BYTEORDER)

	ctMsgGet    = unix.NFNL_SUBSYS_CTNETLINK<<8 | nl.IPCTNL_MSG_CT_GET
	ctMsgNew    = unix.NFNL_SUBSYS_CTNETLINK<<8 | nl.IPCTNL_MSG_CT_NEW
	ctMsgDelete = unix.NFNL_SUBSYS_CTNETLINK<<8 | nl.IPCTNL_MSG_CT_DELETE
)

// ctRequest starts a ctnetlink message of type typ for family (AF_UNSPEC:
// every family).
func ctRequest(typ, flags int, family uint8) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	return req
}

// dumpRequest is the IPCTNL_MSG_CT_GET dump of d. With d.filter the
// kernel sends only the entries of protocol proto (and, when d.port is
// not 0, original-direction destination port d.port): CTA_FILTER's orig
// flags name the fields of the CTA_TUPLE_ORIG sent along that must match
// (ctnetlink_filter_match_tuple). The kernel still walks its whole hash;
// it no longer serializes every entry for us to parse.
func dumpRequest(d ctDump, proto uint8) *nl.NetlinkRequest {
	req := ctRequest(ctMsgGet, unix.NLM_F_DUMP, d.family)
	if !d.filter {
		return req
	}
	flags := uint32(ctaFilterFProtoNum)
	tp := nl.NewRtAttr(nl.CTA_TUPLE_PROTO|unix.NLA_F_NESTED, nil)
	tp.AddRtAttr(nl.CTA_PROTO_NUM, []byte{proto})
	if d.port != 0 {
		tp.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(d.port))
		flags |= ctaFilterFDstPort
	}
	tuple := nl.NewRtAttr(nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, nil)
	tuple.AddChild(tp)
	filter := nl.NewRtAttr(ctaFilter|unix.NLA_F_NESTED, nil)
	filter.AddRtAttr(ctaFilterOrigFlags, nl.Uint32Attr(flags|d.extraFlags))
	req.AddData(tuple)
	req.AddData(filter)
	return req
}

// ctEntry is a dumped conntrack entry: the fields we select on, and the
// attributes that delete exactly it.
type ctEntry struct {
	family   uint8
	proto    uint8
	src, dst netip.Addr
	sport    uint16
	dport    uint16 // original direction
	tuple    []byte // CTA_TUPLE_ORIG's payload, as dumped (with CTA_TUPLE_ZONE if any)
	zone     []byte // CTA_ZONE's payload, nil when absent (zone 0)
	id       []byte // CTA_ID's payload, nil when absent
}

func (e ctEntry) String() string {
	return fmt.Sprintf("proto %d %s -> %s", e.proto, netip.AddrPortFrom(e.src, e.sport), netip.AddrPortFrom(e.dst, e.dport))
}

var errMalformed = errors.New("malformed conntrack message")

// forAttrs calls fn with the type (flags cleared) and payload of each
// netlink attribute in b.
func forAttrs(b []byte, fn func(typ uint16, v []byte)) error {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofRtAttr || l > len(b) {
			return errMalformed
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nlaTypeMask, b[unix.SizeofRtAttr:l])
		b = b[min(nlaAlign(l), len(b)):]
	}
	return nil
}

func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// parseEntry decodes one message of a conntrack dump (what follows the
// nlmsghdr: nfgenmsg, then attributes).
func parseEntry(msg []byte) (ctEntry, error) {
	var e ctEntry
	if len(msg) < nl.SizeofNfgenmsg {
		return e, errMalformed
	}
	e.family = msg[0]
	var errs []error
	err := forAttrs(msg[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			e.tuple = v
			errs = append(errs, parseTuple(&e, v))
		case nl.CTA_ZONE:
			e.zone = v
		case nl.CTA_ID:
			e.id = v
		}
	})
	if err := errors.Join(append(errs, err)...); err != nil {
		return e, err
	}
	if e.tuple == nil || !e.src.IsValid() || !e.dst.IsValid() || e.proto == 0 {
		return e, fmt.Errorf("%w: no complete original tuple", errMalformed)
	}
	return e, nil
}

func parseTuple(e *ctEntry, b []byte) error {
	var errs []error
	errs = append(errs, forAttrs(b, func(typ uint16, v []byte) {
		switch typ {
		case nl.CTA_TUPLE_IP:
			errs = append(errs, forAttrs(v, func(typ uint16, v []byte) {
				a, ok := netip.AddrFromSlice(v)
				if !ok {
					return
				}
				switch typ {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					e.src = a
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					e.dst = a
				}
			}))
		case nl.CTA_TUPLE_PROTO:
			errs = append(errs, forAttrs(v, func(typ uint16, v []byte) {
				switch {
				case typ == nl.CTA_PROTO_NUM && len(v) == 1:
					e.proto = v[0]
				case typ == nl.CTA_PROTO_SRC_PORT && len(v) == 2:
					e.sport = binary.BigEndian.Uint16(v)
				case typ == nl.CTA_PROTO_DST_PORT && len(v) == 2:
					e.dport = binary.BigEndian.Uint16(v)
				}
			}))
		}
	}))
	return errors.Join(errs...)
}

// deleteRequest is the IPCTNL_MSG_CT_DELETE of exactly e: its original
// tuple, zone and id as dumped (the kernel looks the tuple up in the
// zone, and answers ENOENT when the entry found has another id, i.e. it
// was replaced since the dump). A delete with no tuple would flush the
// whole table, hence the error.
func deleteRequest(e ctEntry) (*nl.NetlinkRequest, error) {
	if len(e.tuple) == 0 {
		return nil, fmt.Errorf("refusing to delete conntrack entry %v with no original tuple (that would flush the table)", e)
	}
	req := ctRequest(ctMsgDelete, 0, e.family)
	req.AddData(nl.NewRtAttr(nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, e.tuple))
	if e.zone != nil {
		req.AddData(nl.NewRtAttr(nl.CTA_ZONE, e.zone))
	}
	if e.id != nil {
		req.AddData(nl.NewRtAttr(nl.CTA_ID, e.id))
	}
	return req, nil
}

// ConntrackEntry is a conntrack entry to create: its original-direction
// tuple (the reply tuple is its reverse, as for an un-NATed flow) and
// zone. Proto is one with ports (TCP, UDP, SCTP...): ICMP's id, type and
// code are not encoded.
type ConntrackEntry struct {
	Proto            uint8
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Zone             uint16
}

func tupleAttr(typ int, proto uint8, src, dst netip.Addr, sport, dport uint16) *nl.RtAttr {
	t := nl.NewRtAttr(typ|unix.NLA_F_NESTED, nil)
	ip := t.AddRtAttr(nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, nil)
	if src.Is4() {
		ip.AddRtAttr(nl.CTA_IP_V4_SRC, src.AsSlice())
		ip.AddRtAttr(nl.CTA_IP_V4_DST, dst.AsSlice())
	} else {
		ip.AddRtAttr(nl.CTA_IP_V6_SRC, src.AsSlice())
		ip.AddRtAttr(nl.CTA_IP_V6_DST, dst.AsSlice())
	}
	p := t.AddRtAttr(nl.CTA_TUPLE_PROTO|unix.NLA_F_NESTED, nil)
	p.AddRtAttr(nl.CTA_PROTO_NUM, []byte{proto})
	p.AddRtAttr(nl.CTA_PROTO_SRC_PORT, nl.BEUint16Attr(sport))
	p.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(dport))
	return t
}

// createRequest is the IPCTNL_MSG_CT_NEW that creates e (and fails with
// EEXIST when it exists), expiring after timeout seconds.
func createRequest(e ConntrackEntry, timeout uint32) (*nl.NetlinkRequest, error) {
	src, dst := e.Src.Unmap(), e.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("conntrack entry %s -> %s: addresses must be valid and of one family", e.Src, e.Dst)
	}
	fam := uint8(unix.AF_INET6)
	if src.Is4() {
		fam = unix.AF_INET
	}
	req := ctRequest(ctMsgNew, unix.NLM_F_CREATE|unix.NLM_F_EXCL, fam)
	req.AddData(tupleAttr(nl.CTA_TUPLE_ORIG, e.Proto, src, dst, e.SrcPort, e.DstPort))
	req.AddData(tupleAttr(nl.CTA_TUPLE_REPLY, e.Proto, dst, src, e.DstPort, e.SrcPort))
	req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, nl.BEUint32Attr(timeout)))
	if e.Zone != 0 {
		req.AddData(nl.NewRtAttr(nl.CTA_ZONE, nl.BEUint16Attr(e.Zone)))
	}
	return req, nil
}
