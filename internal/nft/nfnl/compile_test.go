package nfnl

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The expected expressions are what `nft --debug=netlink` shows nft 1.0
// generating for the same rule text.

func le32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

var (
	daddr4 = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	saddr4 = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
	saddr6 = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}
	tcp    = []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{6}}}
	dport  = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
)

// nfproto is the "meta nfproto" match nft puts before a network header
// match in an inet table.
func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{p}}}
}

func testSets() map[string]*setInfo {
	return map[string]*setInfo{
		"service-ips":         {key: concat{tIPv4, tProto, tService}, verdict: true},
		"service-nodeports":   {key: concat{tProto, tService}, verdict: true},
		"cluster-ips":         {key: concat{tIPv4}},
		"aff-X":               {key: concat{tIPv4}},
		"aff-6":               {key: concat{tIPv6}},
		"hairpin-connections": {key: concat{tIPv4, tIPv4, tProto, tService}},
		"masq4":               {key: concat{tIPv4}, verdict: true},
		"ports":               {key: concat{tIfname}, verdict: true},
	}
}

func compileRule(t *testing.T, family, rule string) ([]expr.Any, *compiler, error) {
	t.Helper()
	sets := testSets()
	c, err := newCompiler(family, "t", func(name string) (*setInfo, error) {
		if s, ok := sets[name]; ok {
			return s, nil
		}
		return nil, unsupported("no set %s", name)
	})
	if err != nil {
		t.Fatal(err)
	}
	exprs, err := c.ruleExprs(&command{verb: "add", typ: "rule", family: family, table: "t", name: "c", body: rule})
	return exprs, c, err
}

func TestCompileRules(t *testing.T) {
	for _, tc := range []struct {
		family, rule string
		want         []expr.Any
		anonMsgs     int // NEWSET + NEWSETELEM of anonymous sets
	}{
		{"ip", "jump services", []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "services"}}, 0},
		{"ip", "ct state new jump no-endpoints", []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(8), Xor: le32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: "no-endpoints"}}, 0},
		{"ip", "ip daddr . meta l4proto . th dport vmap @service-ips", []expr.Any{
			daddr4,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true}}, 0},
		{"ip", "ip daddr != 127.0.0.0/8 ip daddr { 172.30.0.0/24 , 172.31.0.0/24 } fib daddr type local meta l4proto . th dport vmap @service-nodeports", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{127}},
			daddr4,
			&expr.Lookup{SourceRegister: 1, SetName: "__set%d", SetID: 1},
			&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagDADDR: true},
			&expr.Cmp{Register: 1, Data: le32(2)},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "service-nodeports", IsDestRegSet: true}}, 2},
		{"ip", "ip daddr @cluster-ips goto reject-chain", []expr.Any{daddr4,
			&expr.Lookup{SourceRegister: 1, SetName: "cluster-ips"}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: "reject-chain"}}, 0},
		{"ip", "meta l4proto tcp reject with tcp reset", append(tcp[:2:2], &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}), 0},
		{"ip", "reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}}, 0},
		{"ip6", "reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}}, 0},
		{"ip", "mark set mark or 0x4000", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0xffffbfff), Xor: le32(0x4000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}, 0},
		{"ip", "mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0x4000), Xor: le32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0xffffffff), Xor: le32(0x4000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Masq{FullyRandom: true}}, 0},
		{"ip", "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random", []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0x20), Xor: le32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
			saddr4,
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 10},
			&expr.Payload{DestRegister: 11, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "hairpin-connections"},
			&expr.Masq{FullyRandom: true}}, 0},
		{"ip", "update @aff-X { ip saddr }", []expr.Any{saddr4,
			&expr.Dynset{SrcRegKey: 1, SetName: "aff-X", Operation: unix.NFT_DYNSET_OP_UPDATE}}, 0},
		{"ip6", "ip6 saddr @aff-6 goto ep", []expr.Any{saddr6,
			&expr.Lookup{SourceRegister: 1, SetName: "aff-6"}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: "ep"}}, 0},
		{"ip", "meta l4proto tcp dnat to 10.244.1.5:8080", append(tcp[:2:2],
			&expr.Immediate{Register: 1, Data: []byte{10, 244, 1, 5}},
			&expr.Immediate{Register: 2, Data: []byte{0x1f, 0x90}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true}), 0},
		{"ip6", "meta l4proto tcp dnat to [fd00::5]:8080", append(tcp[:2:2],
			&expr.Immediate{Register: 1, Data: []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}},
			&expr.Immediate{Register: 2, Data: []byte{0x1f, 0x90}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2, Specified: true}), 0},
		{"ip", "numgen random mod 2 vmap { 0 : goto a , 1 : goto b }", []expr.Any{
			&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: "__map%d", SetID: 1, IsDestRegSet: true}}, 2},
		{"ip", "numgen random mod 2 offset 7 vmap { 7 : goto a , 8 : goto b }", []expr.Any{
			&expr.Numgen{Register: 1, Modulus: 2, Offset: 7, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: "__map%d", SetID: 1, IsDestRegSet: true}}, 2},
		{"ip", "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.0.1 . 80 , 1 : 10.0.0.2 . 80 }", append(tcp[:2:2],
			&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: "__map%d", SetID: 1, IsDestRegSet: true, DestRegister: 1},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 9}), 2},
		{"ip6", "meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00::1 . 80 , 1 : fd00::2 . 80 }", append(tcp[:2:2],
			&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
			&expr.Lookup{SourceRegister: 1, SetName: "__map%d", SetID: 1, IsDestRegSet: true, DestRegister: 1},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2}), 2},
		{"ip", "ip saddr 10.244.0.0/16 goto x", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 2},
			&expr.Cmp{Register: 1, Data: []byte{10, 244}}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: "x"}}, 0},
		{"ip", "ip saddr != 10.0.0.0/9 drop", []expr.Any{saddr4,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 128, 0, 0}, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{10, 0, 0, 0}}, &expr.Verdict{Kind: expr.VerdictDrop}}, 0},
		// What nft writes for a /0 (nodePortAddresses ["0.0.0.0/0"]).
		{"ip", "ip daddr 0.0.0.0/0 accept", []expr.Any{daddr4,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: make([]byte, 4), Xor: make([]byte, 4)},
			&expr.Cmp{Register: 1, Data: make([]byte, 4)}, &expr.Verdict{Kind: expr.VerdictAccept}}, 0},
		{"ip", "fib saddr type local jump mark-for-masquerade", []expr.Any{
			&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagSADDR: true}, &expr.Cmp{Register: 1, Data: le32(2)},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: "mark-for-masquerade"}}, 0},
		{"ip", "ip saddr != { 1.2.3.0/24 , 5.6.0.0/16 } drop", []expr.Any{saddr4,
			&expr.Lookup{SourceRegister: 1, SetName: "__set%d", SetID: 1, Invert: true}, &expr.Verdict{Kind: expr.VerdictDrop}}, 2},
		// inet: the network and transport protocol dependencies nft
		// inserts, once per rule.
		{"inet", "ip saddr vmap @masq4", append(nfproto(2), saddr4,
			&expr.Lookup{SourceRegister: 1, SetName: "masq4", IsDestRegSet: true}), 0},
		{"inet", "meta nfproto ipv4 ip saddr 1.2.3.4 ip daddr 5.6.7.8 accept", append(nfproto(2), saddr4,
			&expr.Cmp{Register: 1, Data: []byte{1, 2, 3, 4}}, daddr4, &expr.Cmp{Register: 1, Data: []byte{5, 6, 7, 8}},
			&expr.Verdict{Kind: expr.VerdictAccept}), 0},
		{"inet", "meta l4proto tcp tcp dport 80 accept", append(tcp[:2:2], dport, &expr.Cmp{Register: 1, Data: []byte{0, 80}},
			&expr.Verdict{Kind: expr.VerdictAccept}), 0},
		{"inet", "ip6 saddr fd00::/64 udp dport 53 meta mark set meta mark | 0x2000", append(nfproto(10),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 8},
			&expr.Cmp{Register: 1, Data: []byte{0xfd, 0, 0, 0, 0, 0, 0, 0}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{17}},
			dport, &expr.Cmp{Register: 1, Data: []byte{0, 53}},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0xffffdfff), Xor: le32(0x2000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}), 0},
		{"inet", "meta nfproto ipv4 sctp dport 8080 dnat ip to 10.0.0.5:80", append(nfproto(2),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{132}},
			dport, &expr.Cmp{Register: 1, Data: []byte{0x1f, 0x90}},
			&expr.Immediate{Register: 1, Data: []byte{10, 0, 0, 5}},
			&expr.Immediate{Register: 2, Data: []byte{0, 80}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true}), 0},
		{"inet", "meta mark & 0x2000 == 0x2000 masquerade", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0x2000), Xor: le32(0)},
			&expr.Cmp{Register: 1, Data: le32(0x2000)}, &expr.Masq{}}, 0},
		{"inet", "ip saddr { 10.1.0.0/24, 127.0.0.1 } jump x", append(nfproto(2), saddr4,
			&expr.Lookup{SourceRegister: 1, SetName: "__set%d", SetID: 1}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "x"}), 2},
		{"bridge", "iifname vmap @ports", []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: "ports", IsDestRegSet: true}}, 0},
		{"bridge", "ether saddr 0a:58:0a:01:00:05 return", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Cmp{Register: 1, Data: []byte{0x0a, 0x58, 0x0a, 1, 0, 5}}, &expr.Verdict{Kind: expr.VerdictReturn}}, 0},
	} {
		t.Run(tc.family+" "+tc.rule, func(t *testing.T) {
			got, c, err := compileRule(t, tc.family, tc.rule)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if len(c.msgs) != tc.anonMsgs {
				t.Errorf("%d messages for anonymous sets, want %d", len(c.msgs), tc.anonMsgs)
			}
		})
	}
}

// TestIntervalElements: prefixes become merged ranges, a leading interval
// end at zero, and each range's start and end+1, as nft sends them.
func TestIntervalElements(t *testing.T) {
	_, c, err := compileRule(t, "ip", "ip saddr != { 10.245.0.0/16 , 10.244.0.0/16 , 0.0.0.0/0 } drop")
	if err != nil {
		t.Fatal(err)
	}
	// 0.0.0.0/0 covers everything: one element, no end.
	if n := countElems(t, c.msgs[1].data); n != 1 {
		t.Errorf("%d elements, want 1", n)
	}
	_, c, _ = compileRule(t, "ip", "ip saddr { 10.245.0.0/16 , 10.244.0.0/16 , 10.250.0.0/16 } drop")
	if n := countElems(t, c.msgs[1].data); n != 5 { // 0 end, 10.244 start, 10.246 end, 10.250 start, 10.251 end
		t.Errorf("%d elements, want 5", n)
	}
}

func countElems(t *testing.T, b []byte) int {
	t.Helper()
	n := 0
	for off := 0; off+4 <= len(b); {
		l := int(binary.NativeEndian.Uint16(b[off:]))
		typ := binary.NativeEndian.Uint16(b[off+2:]) &^ unix.NLA_F_NESTED
		if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			inner := b[off+4 : off+l]
			for o := 0; o+4 <= len(inner); o += (int(binary.NativeEndian.Uint16(inner[o:])) + 3) &^ 3 {
				n++
			}
		}
		off += (l + 3) &^ 3
	}
	return n
}

func TestUnsupported(t *testing.T) {
	for _, rule := range []string{
		"tcp flags syn accept",
		"log prefix x",
		"ip saddr { 1.2.3.4 , 5.6.7.8 } accept",
		"ip6 saddr ::1 accept", // another family's match
		"th dport { 80 , 443 } accept",
		"limit rate 10/second accept",
	} {
		if _, _, err := compileRule(t, "ip", rule); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: %v, want ErrUnsupported", rule, err)
		}
	}
	for _, tc := range []struct{ family, rule string }{
		{"inet", "dnat to 10.0.0.1"},                             // inet needs the family
		{"inet", "tcp dport 80 dnat ip to 10.0.0.1:80"},          // nft would insert no nfproto here
		{"inet", "ip saddr 1.2.3.4 dnat ip6 to [fd00::1]:80"},    // the other family
		{"inet", "ip saddr 1.2.3.4 ip6 daddr ::1 accept"},        // two network protocols
		{"inet", "tcp dport 80 udp dport 53 accept"},             // two transport protocols
		{"inet", "reject"},                                       // icmpx
		{"inet", "iifname \"eth0\" accept"},                      // names compared directly
		{"inet", "ip saddr { 1.2.3.4, 5.6.7.8 } accept"},         // a plain set
		{"inet", "ether saddr 0a:58:0a:01:00:05 drop"},           // needs a link type dependency
		{"bridge", "ip saddr 1.2.3.4 drop"},                      // needs an ether type dependency
		{"ip", "meta nfproto ipv4 accept"},                       // only in inet
		{"bridge", "ether saddr 0a:58:0a:01:00:05 . iifname @x"}, // no such set
	} {
		if _, _, err := compileRule(t, tc.family, tc.rule); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s %q: %v, want ErrUnsupported", tc.family, tc.rule, err)
		}
	}
	for _, line := range []string{
		"insert rule ip t c drop",
		"add rule ip t c index 0 drop",
		"add flowtable ip t f { hook ingress priority 0 ; }",
		"add set ip t s { type ipv4_addr ; flags interval ; }",
		"add chain ip t c { type filter hook ingress device \"eth0\" priority 0 ; }",
		// typeof beyond the endpoint maps' forms
		"add set ip t s { typeof ip daddr ; }",
		"add map ip t m { typeof ip daddr : verdict ; }",
		"add map ip t m { typeof numgen inc mod 1 : verdict ; }",
		"add map ip t m { typeof numgen random mod 1 : ip daddr . th dport ; }",
		"add map ip t m { typeof numgen random mod 1 : ip daddr ; }",
		"add map ip t m { typeof numgen random mod 1 : ip6 daddr . tcp dport ; }",
		"add map ip t m { typeof numgen random mod 1 : ip daddr . tcp dport . tcp dport ; }",
		"add map ip t m { typeof numgen random mod 1 : meta mark ; }",
		// dnat through a map of other types
		"add map ip t m { type ipv4_addr : ipv4_addr . inet_service ; }\nadd rule ip t c dnat ip addr . port to numgen random mod 2 map @m",
		"add map ip t m { typeof numgen random mod 1 : verdict ; }\nadd rule ip t c dnat ip addr . port to numgen random mod 2 map @m",
	} {
		if _, err := compileText("ip", "t", line, nil); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: %v, want ErrUnsupported", line, err)
		}
	}
	if _, err := compileText("netdev", "t", "add table netdev t", nil); !errors.Is(err, ErrUnsupported) {
		t.Errorf("netdev family: %v, want ErrUnsupported", err)
	}
}

// TestEndpointMapsAsNFT: the proxy's named endpoint maps (typeof numgen
// maps, dnat and vmap through them with a numgen offset, their elements,
// replacing an element and flushing the map) compile to the very messages
// nft 1.0.6 sends. The expected messages were recorded in a scratch netns
// with
//
//	strace -f -e trace=sendmsg -e write=all nft -f FILE
//
// where FILE is the text below after "add table FAMILY TABLE" and "add
// chain FAMILY TABLE c" (whose messages are left out), and split into
// messages: type, header flags, attributes (hex). nft 1.0.6 refuses a
// "meta l4proto udp" rule mapping through a "tcp dport" map it reads from
// the kernel ("conflicting protocols specified: udp vs. tcp"; in "create"
// it only passes because a tcp rule came first): hence "per protocol".
func TestEndpointMapsAsNFT(t *testing.T) {
	endpoints := &setInfo{key: concat{tInteger}, data: concat{tIPv4, tService}}
	chains := &setInfo{key: concat{tInteger}, verdict: true}
	for _, tc := range []struct {
		name, family, text string
		existing           map[string]*setInfo // sets already in the kernel
		want               []string
	}{{
		name: "create", family: "ip", text: `add map ip t endpoints { typeof numgen random mod 1 : ip daddr . tcp dport ; }
add map ip t endpoint-chains { typeof numgen random mod 1 : verdict ; comment "x" ; }
add rule ip t c meta l4proto tcp dnat ip addr . port to numgen random mod 3 offset 5 map @endpoints
add rule ip t c numgen random mod 2 offset 8 vmap @endpoint-chains
add rule ip t c meta l4proto udp dnat ip addr . port to numgen random mod 2 offset 0 map @endpoints
add element ip t endpoints { 5 : 10.0.0.1 . 80 }
add element ip t endpoint-chains { 8 : goto c }`,
		want: []string{
			"type 9 flags 0x401: 06000100740000000e000200656e64706f696e747300000008000300000000080800040000000004080005000000000408000600000001cd080007000000000808000a000000000168000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000",
			"type 9 flags 0x401: 060001007400000014000200656e64706f696e742d636861696e730008000300000000080800040000000004080005000000000408000600ffffff00080007000000000008000a000000000240000d00000401000000010400000000031a00041700000001120004010000000104010000000204000000000408000401000000010006040000000007027800",
			"type 6 flags 0xc01: 06000100740000000600020063000000f400048024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800b0001006e756d67656e00002400028008000100000000010800020000000003080003000000000108000400000000053c0001800b0001006c6f6f6b757000002c000280080002000000000108000300000000010e000100656e64706f696e7473000000080004000000000130000180080001006e617400240002800800010000000001080002000000000208000300000000010800050000000009",
			"type 6 flags 0xc01: 0600010074000000060002006300000078000480340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000010800040000000008400001800b0001006c6f6f6b75700000300002800800020000000001080003000000000014000100656e64706f696e742d636861696e73000800040000000002",
			"type 6 flags 0xc01: 06000100740000000600020063000000f400048024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010011000000340001800b0001006e756d67656e00002400028008000100000000010800020000000002080003000000000108000400000000003c0001800b0001006c6f6f6b757000002c000280080002000000000108000300000000010e000100656e64706f696e7473000000080004000000000130000180080001006e617400240002800800010000000001080002000000000208000300000000010800050000000009",
			"type 12 flags 0x401: 06000100740000000e000200656e64706f696e7473000000080004000000000124000380200001800c0001800800010005000000100002800c0001000a00000100500000",
			"type 12 flags 0x401: 060001007400000014000200656e64706f696e742d636861696e730008000400000000022c000380280001800c0001800800010008000000180002801400028008000100fffffffc0600020063000000",
		}}, {
		// nft also sends a set ID of its own numbering with the two adds
		// (NFTA_SET_ELEM_LIST_SET_ID 1 and 2, dropped below): the kernel
		// finds an existing set by name and uses the ID only for a set
		// created in the same batch.
		name: "replace and flush", family: "ip", text: `delete element ip t endpoints { 5 }
add element ip t endpoints { 5 : 10.0.0.2 . 8080 }
delete element ip t endpoint-chains { 8 }
add element ip t endpoint-chains { 8 : goto c }
flush map ip t endpoints`,
		existing: map[string]*setInfo{"endpoints": endpoints, "endpoint-chains": chains},
		want: []string{
			"type 14 flags 0x1: 06000100740000000e000200656e64706f696e747300000014000380100001800c0001800800010005000000",
			"type 12 flags 0x401: 06000100740000000e000200656e64706f696e7473000000080004000000000124000380200001800c0001800800010005000000100002800c0001000a0000021f900000",
			"type 14 flags 0x1: 060001007400000014000200656e64706f696e742d636861696e730014000380100001800c0001800800010008000000",
			"type 12 flags 0x401: 060001007400000014000200656e64706f696e742d636861696e730008000400000000022c000380280001800c0001800800010008000000180002801400028008000100fffffffc0600020063000000",
			"type 14 flags 0x1: 0e000200656e64706f696e74730000000600010074000000",
		}}, {
		name: "per protocol", family: "ip", text: perProtocol("ip", "10.0.0.1"),
		want: []string{
			"type 9 flags 0x401: 06000100700000000b00020065702d756470000008000300000000080800040000000004080005000000000408000600000001cd080007000000000808000a000000000168000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000406000000010402000000060400000000",
			"type 9 flags 0x401: 06000100700000000c00020065702d736374700008000300000000080800040000000004080005000000000408000600000001cd080007000000000808000a000000000268000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c00040a000000010402000000060400000000",
			"type 9 flags 0x401: 06000100700000000b00020065702d746370000008000300000000080800040000000004080005000000000408000600000001cd080007000000000808000a000000000368000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c000408000000010402000000060400000000",
			"type 6 flags 0xc01: 06000100700000000600020063000000f000048024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010011000000340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000010800040000000000380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000010b00010065702d7564700000080004000000000130000180080001006e617400240002800800010000000001080002000000000208000300000000010800050000000009",
			"type 12 flags 0x401: 06000100700000000b00020065702d7564700000080004000000000124000380200001800c0001800800010001000000100002800c0001000a00000100350000",
		}}, {
		name: "per protocol ip6", family: "ip6", text: perProtocol("ip6", "fd00::1"),
		want: []string{
			"type 9 flags 0x401: 06000100700000000b00020065702d7564700000080003000000000808000400000000040800050000000004080006000000020d080007000000001408000a000000000168000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c000406000000010402000000060400000000",
			"type 9 flags 0x401: 06000100700000000c00020065702d7363747000080003000000000808000400000000040800050000000004080006000000020d080007000000001408000a000000000268000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c00040a000000010402000000060400000000",
			"type 9 flags 0x401: 06000100700000000b00020065702d7463700000080003000000000808000400000000040800050000000004080006000000020d080007000000001408000a000000000368000d00000401000000010400000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040d0000000104090000000114000407000000010c000408000000010402000000060400000000",
			"type 6 flags 0xc01: 06000100700000000600020063000000f000048024000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010011000000340001800b0001006e756d67656e0000240002800800010000000001080002000000000208000300000000010800040000000000380001800b0001006c6f6f6b7570000028000280080002000000000108000300000000010b00010065702d7564700000080004000000000130000180080001006e617400240002800800010000000001080002000000000a08000300000000010800050000000002",
			"type 12 flags 0x401: 06000100700000000b00020065702d75647000000800040000000001300003802c0001800c00018008000100010000001c00028018000100fd00000000000000000000000000000100350000",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, err := parseLine(tc.text[:strings.IndexByte(tc.text, '\n')])
			if err != nil {
				t.Fatal(err)
			}
			c, err := compileText(tc.family, first.table, tc.text, func(name string) (*setInfo, error) {
				if s, ok := tc.existing[name]; ok {
					return s, nil
				}
				return nil, unsupported("no set %s", name)
			})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range c.msgs {
				got = append(got, fmt.Sprintf("type %d flags %#x: %x", m.typ, uint16(m.flags), m.data))
			}
			want := tc.want
			if tc.existing != nil {
				want = withoutElemSetID(t, want)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("messages differ from nft's (-nft +ours):\n%s", d)
			}
		})
	}
}

// perProtocol declares a map per protocol and dnats UDP through its own.
func perProtocol(fam, addr string) string {
	var b strings.Builder
	for _, p := range []string{"udp", "sctp", "tcp"} {
		fmt.Fprintf(&b, "add map %[1]s p ep-%[2]s { typeof numgen random mod 1 : %[1]s daddr . %[2]s dport ; }\n", fam, p)
	}
	fmt.Fprintf(&b, "add rule %[1]s p c meta l4proto udp dnat %[1]s addr . port to numgen random mod 2 offset 0 map @ep-udp\n", fam)
	fmt.Fprintf(&b, "add element %s p ep-udp { 1 : %s . 53 }", fam, addr)
	return b.String()
}

// withoutElemSetID drops NFTA_SET_ELEM_LIST_SET_ID from NEWSETELEM messages.
func withoutElemSetID(t *testing.T, msgs []string) []string {
	var out []string
	for _, m := range msgs {
		head, hx, _ := strings.Cut(m, ": ")
		if !strings.HasPrefix(head, fmt.Sprintf("type %d ", unix.NFT_MSG_NEWSETELEM)) {
			out = append(out, m)
			continue
		}
		b, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatal(err)
		}
		var kept []byte
		for off := 0; off+4 <= len(b); {
			l := int(binary.NativeEndian.Uint16(b[off:]))
			next := min(off+((l+3)&^3), len(b))
			if binary.NativeEndian.Uint16(b[off+2:]) != unix.NFTA_SET_ELEM_LIST_SET_ID {
				kept = append(kept, b[off:next]...)
			}
			off = next
		}
		out = append(out, fmt.Sprintf("%s: %x", head, kept))
	}
	return out
}

// TestCNITablesAsNFT: the CNI plugins' tables (bridge's macspoofchk,
// ipMasq, portmap: inet and bridge families, their base chains, maps,
// elements and every statement they write; "masks": the bitwise of flags,
// binary operations and prefixes, fib, and a rule deleted by handle)
// compile to the very messages
// nft 1.0.6 sends for the same text. testdata/NAME.nft is the text;
// NAME.msgs was recorded in a scratch netns with
//
//	unshare -n strace -f -e trace=sendmsg -e write=all -o OUT nft -f NAME.nft
//
// and split into messages (type, header flags, attributes in hex) as
// TestEndpointMapsAsNFT's are.
func TestCNITablesAsNFT(t *testing.T) {
	for _, name := range []string{"spoofchk", "ipmasq", "portmap", "masks"} {
		t.Run(name, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("testdata", name+".nft"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join("testdata", name+".msgs"))
			if err != nil {
				t.Fatal(err)
			}
			first, err := parseLine(string(text[:strings.IndexByte(string(text), '\n')]))
			if err != nil {
				t.Fatal(err)
			}
			c, err := compileText(first.family, first.table, string(text), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range c.msgs {
				got = append(got, fmt.Sprintf("type %d flags %#x: %x", m.typ, uint16(m.flags), m.data))
			}
			if d := cmp.Diff(strings.Split(strings.TrimSpace(string(want)), "\n"), got); d != "" {
				t.Errorf("messages differ from nft's (-nft +ours):\n%s", d)
			}
		})
	}
}

// TestDecode: element values read back as nft spells them (what
// ListElements returns), for every type the CNI tables' sets use.
func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		t    concat
		in   string
		want string
	}{
		{concat{tIPv4}, "10.1.0.5", "10.1.0.5"},
		{concat{tIPv6}, "fd00:1::5", "fd00:1::5"},
		{concat{tIfname}, `"veth1234"`, "veth1234"},
		{concat{tEther}, "0a:58:0a:01:00:05", "0a:58:0a:01:00:05"},
		{concat{tIPv4, tProto, tService}, "10.0.0.1 . tcp . 80", "10.0.0.1 . tcp . 80"},
		{concat{tInteger}, "7", "7"},
	} {
		b, err := tc.t.encode(strings.Split(tc.in, " . "))
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		got, err := tc.t.decode(b)
		if err != nil || strings.Join(got, " . ") != tc.want {
			t.Errorf("decode(encode(%s)) = %q, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := (concat{tIfname}).encode([]string{`"eth*"`}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("wildcard ifname: %v, want ErrUnsupported", err)
	}
}
