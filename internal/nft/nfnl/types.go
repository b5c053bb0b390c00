package nfnl

// Data types: how nft names, sizes and encodes the values the compiler
// handles, with nft's type ids (src/datatype.h) so that `nft list` reads
// back what we wrote exactly as if nft had.

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dtype is one nft data type.
type dtype struct {
	name string
	id   uint32
	len  int // bytes
	// host: stored in host byte order (marks, ct state...); else network.
	host bool
}

var (
	tInteger  = dtype{"integer", 4, 4, true}
	tIPv4     = dtype{"ipv4_addr", 7, 4, false}
	tIPv6     = dtype{"ipv6_addr", 8, 16, false}
	tProto    = dtype{"inet_proto", 12, 1, false}
	tService  = dtype{"inet_service", 13, 2, false}
	tMark     = dtype{"mark", 19, 4, true}
	tCtState  = dtype{"ct_state", 26, 4, true}
	tCtStatus = dtype{"ct_status", 28, 4, true}
	tFibType  = dtype{"fib_addrtype", 40, 4, true} // nft's id for "type" of fib: unused in sets
	tNfproto  = dtype{"nf_proto", 2, 1, true}
	tEther    = dtype{"ether_addr", 9, 6, false}
	// tIfname is an interface name, NUL-padded to IFNAMSIZ.
	tIfname = dtype{"ifname", 41, 16, true}
)

// verdictType is NFT_DATA_VERDICT, the data type of a verdict map.
const verdictType = 0xffffff00

var typesByName = map[string]dtype{}

func init() {
	for _, t := range []dtype{tInteger, tIPv4, tIPv6, tProto, tService, tMark, tIfname, tEther} {
		typesByName[t.name] = t
	}
}

// concat is a (possibly one-field) key or data type.
type concat []dtype

// parseConcat reads "ipv4_addr . inet_proto . inet_service".
func parseConcat(s string) (concat, error) {
	var out concat
	for _, f := range strings.Split(s, " . ") {
		t, ok := typesByName[strings.TrimSpace(f)]
		if !ok {
			return nil, unsupported("type %q", s)
		}
		out = append(out, t)
	}
	return out, nil
}

// id is nft's type id of the concatenation: 6 bits per field.
func (c concat) id() uint32 {
	if len(c) == 1 {
		return c[0].id
	}
	var id uint32
	for _, t := range c {
		id = id<<6 | t.id
	}
	return id
}

// size is the key length: fields of a concatenation take whole 32-bit
// registers.
func (c concat) size() int {
	if len(c) == 1 {
		return c[0].len
	}
	n := 0
	for _, t := range c {
		n += pad4(t.len)
	}
	return n
}

func pad4(n int) int { return (n + 3) &^ 3 }

// concatFromID decodes a kernel set's key type id (as GETSET returns it).
func concatFromID(id uint32, keyLen int) (concat, error) {
	byID := map[uint32]dtype{}
	for _, t := range typesByName {
		byID[t.id] = t
	}
	if t, ok := byID[id]; ok && t.len == keyLen {
		return concat{t}, nil
	}
	var out concat
	for id != 0 {
		t, ok := byID[id&0x3f]
		if !ok {
			return nil, unsupported("set key type id %#x", id)
		}
		out = append(concat{t}, out...)
		id >>= 6
	}
	if out.size() != keyLen {
		return nil, unsupported("set key type id %#x of length %d", id, keyLen)
	}
	return out, nil
}

// encode returns the bytes of v, a value of type t.
func (t dtype) encode(v string) ([]byte, error) {
	switch t {
	case tIPv4, tIPv6:
		a, err := netip.ParseAddr(v)
		if err != nil || a.Is4() != (t == tIPv4) {
			return nil, unsupported("%s value %q", t.name, v)
		}
		return a.AsSlice(), nil
	case tProto:
		if n, ok := protoNums[v]; ok {
			return []byte{n}, nil
		}
		n, err := strconv.ParseUint(v, 10, 8)
		if err != nil {
			return nil, unsupported("inet_proto value %q", v)
		}
		return []byte{byte(n)}, nil
	case tService:
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, unsupported("inet_service value %q", v)
		}
		return binary.BigEndian.AppendUint16(nil, uint16(n)), nil
	case tIfname:
		name := v
		if strings.HasPrefix(v, `"`) {
			var err error
			if name, err = strconv.Unquote(v); err != nil {
				return nil, unsupported("ifname value %q", v)
			}
		}
		// A trailing * is a wildcard; nft matches only its prefix.
		if name == "" || len(name) >= t.len || strings.ContainsAny(name, "*\x00") {
			return nil, unsupported("ifname value %q", v)
		}
		return append([]byte(name), make([]byte, t.len-len(name))...), nil
	case tEther:
		hw, err := net.ParseMAC(v)
		if err != nil || len(hw) != 6 {
			return nil, unsupported("ether_addr value %q", v)
		}
		return hw, nil
	case tNfproto:
		n, ok := map[string]byte{"ipv4": unix.NFPROTO_IPV4, "ipv6": unix.NFPROTO_IPV6}[v]
		if !ok {
			return nil, unsupported("nf_proto value %q", v)
		}
		return []byte{n}, nil
	case tInteger, tMark:
		n, err := strconv.ParseUint(v, 0, 32)
		if err != nil {
			return nil, unsupported("%s value %q", t.name, v)
		}
		return binary.NativeEndian.AppendUint32(nil, uint32(n)), nil
	case tCtState, tCtStatus, tFibType:
		bits, ok := map[dtype]map[string]uint32{tCtState: ctStates, tCtStatus: ctStatuses, tFibType: fibTypes}[t], true
		var n uint32
		for _, w := range strings.Split(v, ",") {
			b, found := bits[w]
			if !found || !ok {
				return nil, unsupported("%s value %q", t.name, v)
			}
			n |= b
		}
		return binary.NativeEndian.AppendUint32(nil, n), nil
	}
	return nil, unsupported("value %q of type %s", v, t.name)
}

// encodeConcat encodes "a . b . c" (fields padded to 32 bits when more than one).
func (c concat) encode(fields []string) ([]byte, error) {
	if len(fields) != len(c) {
		return nil, fmt.Errorf("%w: %d fields %q for a key of %d", ErrUnsupported, len(fields), fields, len(c))
	}
	var out []byte
	for i, t := range c {
		b, err := t.encode(strings.TrimSpace(fields[i]))
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		if len(c) > 1 {
			out = append(out, make([]byte, pad4(len(b))-len(b))...)
		}
	}
	return out, nil
}

var (
	protoNums  = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "icmpv6": 58, "dccp": 33, "udplite": 136}
	ctStates   = map[string]uint32{"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}
	ctStatuses = map[string]uint32{"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 16, "dnat": 32, "dying": 512}
	fibTypes   = map[string]uint32{"unspec": 0, "unicast": 1, "local": 2, "broadcast": 3, "anycast": 4, "multicast": 5, "blackhole": 6, "unreachable": 7, "prohibit": 8}
)

// decode is encode's inverse: b as nft (and knftables) spell a value of
// type t in a set element. Interface names come back unquoted, as nft's
// JSON gives them.
func (t dtype) decode(b []byte) (string, error) {
	if len(b) != t.len {
		return "", fmt.Errorf("%d bytes for a %s", len(b), t.name)
	}
	switch t {
	case tIPv4, tIPv6:
		a, _ := netip.AddrFromSlice(b)
		return a.String(), nil
	case tService:
		return strconv.Itoa(int(binary.BigEndian.Uint16(b))), nil
	case tProto:
		for name, n := range protoNums {
			if n == b[0] {
				return name, nil
			}
		}
		return strconv.Itoa(int(b[0])), nil
	case tInteger:
		return strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b)), 10), nil
	case tMark:
		return fmt.Sprintf("%#08x", binary.NativeEndian.Uint32(b)), nil
	case tIfname:
		name, _, _ := strings.Cut(string(b), "\x00")
		return name, nil
	case tEther:
		return net.HardwareAddr(b).String(), nil
	}
	return "", unsupported("decoding a value of type %s", t.name)
}

// decode splits an element's bytes into its fields' strings.
func (c concat) decode(b []byte) ([]string, error) {
	if len(c) == 1 {
		s, err := c[0].decode(b)
		if err != nil {
			return nil, err
		}
		return []string{s}, nil
	}
	var out []string
	for _, t := range c {
		if len(b) < pad4(t.len) {
			return nil, fmt.Errorf("short element for %d fields", len(c))
		}
		s, err := t.decode(b[:t.len])
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		b = b[pad4(t.len):]
	}
	return out, nil
}
