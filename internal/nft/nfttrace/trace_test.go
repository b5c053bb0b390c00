package nfttrace

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// build makes a fake inet table from chain -> rules; base chains are given
// as "name hook type priority". extra objects (maps, elements) are added
// after the chains, before the rules.
func build(t testing.TB, base []string, chains map[string][]string, sets map[string][]string, extra ...knftables.Object) *knftables.Fake {
	t.Helper()
	fake := knftables.NewFake(knftables.InetFamily, "trace-test")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	for _, b := range base {
		f := strings.SplitN(b, " ", 4)
		typ, hook, prio := knftables.BaseChainType(f[2]), knftables.BaseChainHook(f[1]), knftables.BaseChainPriority(f[3])
		tx.Add(&knftables.Chain{Name: f[0], Type: &typ, Hook: &hook, Priority: &prio})
	}
	for name := range chains {
		tx.Add(&knftables.Chain{Name: name})
	}
	for name, elems := range sets {
		tx.Add(&knftables.Set{Name: name, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.DynamicFlag}})
		for _, e := range elems {
			tx.Add(&knftables.Element{Set: name, Key: []string{e}})
		}
	}
	for _, o := range extra {
		tx.Add(o)
	}
	for name, rules := range chains {
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("%v\n%s", err, tx)
	}
	return fake
}

var (
	src  = netip.MustParseAddr("10.1.0.1")
	node = netip.MustParseAddr("10.9.0.1")
)

func TestTrace(t *testing.T) {
	tests := []struct {
		name    string
		base    []string
		chains  map[string][]string
		sets    map[string][]string
		pkt     Packet
		verdict Verdict
		dst     string
		masq    bool
	}{
		{
			name:    "empty ruleset accepts",
			base:    []string{"pre prerouting nat dstnat"},
			chains:  map[string][]string{"pre": nil},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80},
			verdict: Accept, dst: "10.2.0.1:80",
		},
		{
			name: "priority order: the earlier chain drops first",
			base: []string{"late forward filter filter + 10", "early forward filter filter - 10"},
			chains: map[string][]string{
				"late":  {"accept"},
				"early": {"ip daddr 10.2.0.0/16 drop"},
			},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80},
			verdict: Drop, dst: "10.2.0.1:80",
		},
		{
			name: "accept in one base chain does not skip the next",
			base: []string{"a forward filter -5", "b forward filter 5"},
			chains: map[string][]string{
				"a": {"accept"},
				"b": {"meta l4proto udp reject"},
			},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "udp", DPort: 53},
			verdict: Reject, dst: "10.2.0.1:53",
		},
		{
			name: "jump returns, goto does not; vmap dnat; masquerade by mark",
			base: []string{"pre prerouting nat dstnat", "post postrouting nat srcnat"},
			chains: map[string][]string{
				"pre":  {"jump mark", "ip daddr . meta l4proto . th dport vmap { 10.3.0.1 . tcp . 80 : goto svc }", "drop"},
				"mark": {"ip saddr != 10.1.0.0/16 return", "mark set mark or 0x10"},
				"svc":  {"numgen random mod 2 vmap { 0 : goto ep0 , 1 : goto ep1 }"},
				"ep0":  {"meta l4proto tcp dnat to 10.4.0.1:8080"},
				"ep1":  {"meta l4proto tcp dnat to 10.4.0.2:8080"},
				"post": {"mark and 0x10 == 0 return", "masquerade"},
			},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.3.0.1"), Proto: "tcp", DPort: 80},
			verdict: Accept, dst: "10.4.0.2:8080", masq: true,
		},
		{
			name: "fib daddr type local sends to input",
			base: []string{"in input filter 0", "fwd forward filter 0"},
			chains: map[string][]string{
				"in":  {"fib daddr type local tcp dport 22 reject with tcp reset"},
				"fwd": {"drop"},
			},
			pkt:     Packet{Src: src, Dst: node, Proto: "tcp", DPort: 22},
			verdict: Reject, dst: "10.9.0.1:22",
		},
		{
			name:    "set membership and ip6 selectors do not match IPv4",
			base:    []string{"fwd forward filter 0"},
			sets:    map[string][]string{"allowed": {"10.1.0.1"}},
			chains:  map[string][]string{"fwd": {"ip6 saddr ::/0 drop", "ip saddr @allowed accept", "drop"}},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80},
			verdict: Accept, dst: "10.2.0.1:80",
		},
		{
			name: "a first TCP packet is a SYN: not a pickup",
			base: []string{"fwd forward filter 0"},
			chains: map[string][]string{"fwd": {"ct state new tcp flags & (fin|syn|rst|ack) != syn drop",
				"tcp flags syn meta l4proto udp drop", "tcp flags & (syn|ack) == syn jump syn", "drop"}, "syn": {"accept"}},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80},
			verdict: Accept, dst: "10.2.0.1:80",
		},
		{
			name:    "tcp flags never match UDP",
			base:    []string{"fwd forward filter 0"},
			chains:  map[string][]string{"fwd": {"tcp flags & (fin|syn|rst|ack) != syn drop", "tcp flags syn drop"}},
			pkt:     Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "udp", DPort: 53},
			verdict: Accept, dst: "10.2.0.1:53",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := build(t, tc.base, tc.chains, tc.sets)
			tr := New(fake, node)
			tr.Rand = func(n int) int { return n - 1 }
			res, err := tr.Trace(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != tc.verdict || res.Endpoint() != tc.dst || res.Masqueraded != tc.masq {
				t.Errorf("got %s (%s %s masq=%v), want %s %s masq=%v\ntrace:\n%s", res, res.Verdict, res.Endpoint(), res.Masqueraded,
					tc.verdict, tc.dst, tc.masq, strings.Join(res.Trace, "\n"))
			}
		})
	}
}

func TestUnknownRuleIsAnError(t *testing.T) {
	fake := build(t, []string{"fwd forward filter 0"}, map[string][]string{"fwd": {"ether saddr 00:11:22:33:44:55 drop"}}, nil)
	if _, err := New(fake, node).Trace(Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80}); err == nil {
		t.Fatal("a rule the tracer cannot read must fail the trace")
	}
}

func TestDynamicSetUpdate(t *testing.T) {
	fake := build(t, []string{"fwd forward filter 0"}, map[string][]string{
		"fwd": {"ip saddr @seen drop", "update @seen { ip saddr }"},
	}, map[string][]string{"seen": nil})
	tr := New(fake, node)
	p := Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80}
	for i, want := range []Verdict{Accept, Drop} {
		res, err := tr.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != want {
			t.Errorf("trace %d: %s, want %s", i, res.Verdict, want)
		}
	}
	tr.ResetDynamic()
	if res, _ := tr.Trace(p); res.Verdict != Accept {
		t.Errorf("after reset: %s, want accept", res.Verdict)
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]int{"dstnat": -100, "filter - 10": -10, "srcnat + 5": 105, "-110": -110, "raw": -300} {
		got, err := ParsePriority(in)
		if err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "bogus", "filter * 2", "filter - x"} {
		if _, err := ParsePriority(bad); err == nil {
			t.Errorf("ParsePriority(%q) accepted", bad)
		}
	}
}

// FuzzRule: no rule text may panic or loop the tracer.
func FuzzRule(f *testing.F) {
	for _, s := range []string{
		"ip daddr . meta l4proto . th dport vmap @m", "numgen random mod 2 vmap { 0 : accept , 1 : drop }",
		"mark and 0x4000 == 0 return", "ct state new,established jump x", "update @s { ip saddr }",
		"dnat to 1.2.3.4:5", "fib daddr type local", "mark set mark xor 0x1", "ip saddr != { 1.2.3.4 , 10.0.0.0/8 } drop",
		"tcp flags & (fin|syn|rst|ack) != syn drop", "tcp flags & (", "tcp flags",
		"ct", "mark", "meta mark", "numgen random mod 0 vmap {", "{ } , . :",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rule string) {
		fake := knftables.NewFake(knftables.InetFamily, "fz")
		typ, hook, prio := knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority
		fake.Table = &knftables.FakeTable{
			Table:  knftables.Table{Family: knftables.InetFamily, Name: "fz"},
			Chains: map[string]*knftables.FakeChain{"c": {Chain: knftables.Chain{Name: "c", Type: &typ, Hook: &hook, Priority: &prio}, Rules: []*knftables.Rule{{Chain: "c", Rule: rule}}}},
			Sets:   map[string]*knftables.FakeSet{"s": {}},
			Maps:   map[string]*knftables.FakeMap{"m": {}},
		}
		fake.Tables = map[knftables.Family]map[string]*knftables.FakeTable{knftables.InetFamily: {"fz": fake.Table}}
		_, _ = New(fake, node).Trace(Packet{Src: src, Dst: netip.MustParseAddr("10.2.0.1"), Proto: "tcp", DPort: 80})
	})
}

// TestConcatenatedIntervalSet: a lookup in a set of boxes (address,
// prefix or range; protocol number or range; port or range), as the
// network policy renderer writes them.
func TestConcatenatedIntervalSet(t *testing.T) {
	fake := build(t, []string{"fwd forward filter 0"}, map[string][]string{"fwd": nil}, nil)
	tx := fake.NewTransaction()
	tx.Add(&knftables.Set{Name: "allow", Type: "ipv4_addr . ipv4_addr . inet_proto . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	for _, e := range [][]string{
		{"10.2.0.1", "10.1.0.0/16", "6", "80-81"},
		{"10.2.0.1", "10.3.0.1-10.3.0.9", "0-255", "0-65535"},
		{"10.2.0.2", "10.1.0.1", "17", "53"},
	} {
		tx.Add(&knftables.Element{Set: "allow", Key: e})
	}
	tx.Add(&knftables.Rule{Chain: "fwd", Rule: "ip daddr . ip saddr . meta l4proto . th dport @allow return"})
	tx.Add(&knftables.Rule{Chain: "fwd", Rule: "drop"})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	tr := New(fake, node)
	for _, tc := range []struct {
		src, dst, proto string
		port            uint16
		want            Verdict
	}{
		{"10.1.0.1", "10.2.0.1", "tcp", 80, Accept},
		{"10.1.200.1", "10.2.0.1", "tcp", 81, Accept},
		{"10.1.0.1", "10.2.0.1", "tcp", 82, Drop},
		{"10.1.0.1", "10.2.0.1", "udp", 80, Drop},
		{"10.4.0.1", "10.2.0.1", "tcp", 80, Drop},
		{"10.3.0.5", "10.2.0.1", "sctp", 9, Accept},
		{"10.3.0.5", "10.2.0.1", "icmp", 0, Accept},
		{"10.3.0.10", "10.2.0.1", "tcp", 80, Drop},
		{"10.1.0.1", "10.2.0.2", "udp", 53, Accept},
		{"10.1.0.1", "10.2.0.2", "tcp", 53, Drop},
	} {
		p := Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst), Proto: tc.proto, DPort: tc.port}
		res, err := tr.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != tc.want {
			t.Errorf("%+v: %s, want %s", tc, res.Verdict, tc.want)
		}
	}
}

// TestNumgenOffsetNamedMaps: one named map serves every service, each
// service's numgen picking in its own range [offset, offset+N).
func TestNumgenOffsetNamedMaps(t *testing.T) {
	fake := build(t, []string{"pre prerouting nat dstnat"}, map[string][]string{
		"pre": {"ip daddr 10.3.0.1 jump a", "ip daddr 10.3.0.2 jump b", "ip daddr 10.3.0.3 jump c"},
		"a":   {"meta l4proto tcp dnat ip addr . port to numgen random mod 2 offset 4 map @endpoints"},
		"b":   {"numgen random mod 2 offset 6 vmap @endpoint-chains"},
		"c":   {"meta l4proto tcp dnat ip addr . port to numgen random mod 3 offset 8 map @endpoints"},
		"ep0": {"meta l4proto tcp dnat to 10.4.1.1:81"},
		"ep1": {"meta l4proto tcp dnat to 10.4.1.2:82"},
	},
		nil,
		&knftables.Map{Name: "endpoints", TypeOf: "numgen random mod 1 : ip daddr . tcp dport"},
		&knftables.Map{Name: "endpoint-chains", TypeOf: "numgen random mod 1 : verdict"},
		&knftables.Element{Map: "endpoints", Key: []string{"4"}, Value: []string{"10.4.0.1 . 8080"}},
		&knftables.Element{Map: "endpoints", Key: []string{"5"}, Value: []string{"10.4.0.2 . 8080"}},
		&knftables.Element{Map: "endpoints", Key: []string{"8"}, Value: []string{"10.4.2.1 . 90"}},
		&knftables.Element{Map: "endpoints", Key: []string{"9"}, Value: []string{"10.4.2.2 . 90"}},
		&knftables.Element{Map: "endpoint-chains", Key: []string{"6"}, Value: []string{"goto ep0"}},
		&knftables.Element{Map: "endpoint-chains", Key: []string{"7"}, Value: []string{"goto ep1"}},
	)
	tr := New(fake, node)
	for _, tc := range []struct {
		dst  string
		pick int
		want string
	}{
		{"10.3.0.1", 0, "10.4.0.1:8080"}, {"10.3.0.1", 1, "10.4.0.2:8080"},
		{"10.3.0.2", 0, "10.4.1.1:81"}, {"10.3.0.2", 1, "10.4.1.2:82"},
		{"10.3.0.3", 1, "10.4.2.2:90"},
	} {
		tr.Rand = func(int) int { return tc.pick }
		res, err := tr.Trace(Packet{Src: src, Dst: netip.MustParseAddr(tc.dst), Proto: "tcp", DPort: 80})
		if err != nil {
			t.Fatalf("%s pick %d: %v", tc.dst, tc.pick, err)
		}
		if got := res.Dst.String(); !res.DNAT || got != tc.want {
			t.Errorf("%s pick %d: DNAT %v to %s, want %s", tc.dst, tc.pick, res.DNAT, got, tc.want)
		}
	}
	// Key 10 (offset 8 + 2) has no element: an error, never a silent miss.
	tr.Rand = func(int) int { return 2 }
	if _, err := tr.Trace(Packet{Src: src, Dst: netip.MustParseAddr("10.3.0.3"), Proto: "tcp", DPort: 80}); err == nil || !strings.Contains(err.Error(), "no map element") {
		t.Errorf("missing element: err %v, want one naming the missing element", err)
	}
}
