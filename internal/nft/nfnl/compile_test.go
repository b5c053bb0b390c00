package nfnl

import (
	"encoding/binary"
	"errors"
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
)

func testSets() map[string]*setInfo {
	return map[string]*setInfo{
		"service-ips":         {key: concat{tIPv4, tProto, tService}, verdict: true},
		"service-nodeports":   {key: concat{tProto, tService}, verdict: true},
		"cluster-ips":         {key: concat{tIPv4}},
		"aff-X":               {key: concat{tIPv4}},
		"aff-6":               {key: concat{tIPv6}},
		"hairpin-connections": {key: concat{tIPv4, tIPv4, tProto, tService}},
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
		"tcp dport 80 accept",
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
	for _, line := range []string{
		"insert rule ip t c drop",
		"add rule ip t c index 0 drop",
		"add flowtable ip t f { hook ingress priority 0 ; }",
		"add set ip t s { type ipv4_addr ; flags interval ; }",
		"add chain ip t c { type filter hook ingress device \"eth0\" priority 0 ; }",
	} {
		if _, err := compileText("ip", "t", line, nil); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%q: %v, want ErrUnsupported", line, err)
		}
	}
	if _, err := compileText("inet", "t", "add table inet t", nil); !errors.Is(err, ErrUnsupported) {
		t.Errorf("inet family: %v, want ErrUnsupported", err)
	}
}
