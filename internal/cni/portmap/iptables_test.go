package portmap

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/ipt"
)

const iptEmpty = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
COMMIT
`

const iptAv4 = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FLATNET-DN-UJAJVL-CBFTLI2XAT - [0:0]
:FLATNET-HOSTPORT-DNAT - [0:0]
:FLATNET-HOSTPORT-MASQ - [0:0]
:FLATNET-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "flatnet-portmap: masquerade marked hostport connections" -j FLATNET-HOSTPORT-MASQ
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 10.1.0.0/24 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 10.1.0.0/24 -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 127.0.0.1/32 -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j DNAT --to-destination 10.1.0.2:53
-A FLATNET-HOSTPORT-DNAT -m comment --comment "ujajvl-cbftli2xat net=net1 id=ctr1 if=eth0" -j FLATNET-DN-UJAJVL-CBFTLI2XAT
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x2000/0x2000
COMMIT
`

const iptAv6 = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FLATNET-DN-UJAJVL-CBFTLI2XAT - [0:0]
:FLATNET-HOSTPORT-DNAT - [0:0]
:FLATNET-HOSTPORT-MASQ - [0:0]
:FLATNET-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "flatnet-portmap: masquerade marked hostport connections" -j FLATNET-HOSTPORT-MASQ
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s fd00::/64 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80
-A FLATNET-HOSTPORT-DNAT -m comment --comment "ujajvl-cbftli2xat net=net1 id=ctr1 if=eth0" -j FLATNET-DN-UJAJVL-CBFTLI2XAT
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x2000/0x2000
COMMIT
`

// iptACv4 is the IPv4 table after ADD A, B, C and DEL B.
const iptACv4 = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FLATNET-DN-UJAJVL-CBFTLI2XAT - [0:0]
:FLATNET-DN-WQNKQJ-EFYOKCJJCQ - [0:0]
:FLATNET-HOSTPORT-DNAT - [0:0]
:FLATNET-HOSTPORT-MASQ - [0:0]
:FLATNET-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "flatnet-portmap: masquerade marked hostport connections" -j FLATNET-HOSTPORT-MASQ
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 10.1.0.0/24 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 10.1.0.0/24 -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -s 127.0.0.1/32 -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-UJAJVL-CBFTLI2XAT -d 10.0.0.1/32 -p udp -m udp --dport 5353 -j DNAT --to-destination 10.1.0.2:53
-A FLATNET-DN-WQNKQJ-EFYOKCJJCQ -p tcp -m tcp --dport 443 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-WQNKQJ-EFYOKCJJCQ -p tcp -m tcp --dport 443 -j DNAT --to-destination 10.2.0.2:8443
-A FLATNET-HOSTPORT-DNAT -m comment --comment "ujajvl-cbftli2xat net=net1 id=ctr1 if=eth0" -j FLATNET-DN-UJAJVL-CBFTLI2XAT
-A FLATNET-HOSTPORT-DNAT -s 10.0.0.0/8 -m comment --comment "wqnkqj-efyokcjjcq net=net2 id=ctr3 if=net1" -j FLATNET-DN-WQNKQJ-EFYOKCJJCQ
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x20/0x20 -j MASQUERADE
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x2000/0x2000
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x20/0x20
COMMIT
`

// iptCv6 is the IPv6 table after GC of net1 with nothing valid.
const iptCv6 = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FLATNET-DN-WQNKQJ-EFYOKCJJCQ - [0:0]
:FLATNET-HOSTPORT-DNAT - [0:0]
:FLATNET-HOSTPORT-MASQ - [0:0]
:FLATNET-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "flatnet-portmap: masquerade marked hostport connections" -j FLATNET-HOSTPORT-MASQ
-A FLATNET-DN-WQNKQJ-EFYOKCJJCQ -p tcp -m tcp --dport 443 -j FLATNET-HOSTPORT-SETMARK
-A FLATNET-DN-WQNKQJ-EFYOKCJJCQ -p tcp -m tcp --dport 443 -j DNAT --to-destination [fd00:2::2]:8443
-A FLATNET-HOSTPORT-DNAT -m comment --comment "wqnkqj-efyokcjjcq net=net2 id=ctr3 if=net1" -j FLATNET-DN-WQNKQJ-EFYOKCJJCQ
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x20/0x20 -j MASQUERADE
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x2000/0x2000
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x20/0x20
COMMIT
`

// iptSkeleton is what DEL of the last attachment leaves.
const iptSkeleton = `
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FLATNET-HOSTPORT-DNAT - [0:0]
:FLATNET-HOSTPORT-MASQ - [0:0]
:FLATNET-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "flatnet-portmap: connections to a local address" -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "flatnet-portmap: masquerade marked hostport connections" -j FLATNET-HOSTPORT-MASQ
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A FLATNET-HOSTPORT-MASQ -m mark --mark 0x20/0x20 -j MASQUERADE
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x2000/0x2000
-A FLATNET-HOSTPORT-SETMARK -m comment --comment "flatnet-portmap: mark for masquerade" -j MARK --set-xmark 0x20/0x20
COMMIT
`

func newIPTFake() (*ipt.Fake, *iptBackend) {
	f := ipt.NewFake()
	return f, &iptBackend{ipt: f, protos: []ipt.Protocol{ipt.IPv4, ipt.IPv6}}
}

func TestIPTLifecycle(t *testing.T) {
	ctx := context.Background()
	f, b := newIPTFake()
	a, bb, c := planA(), planB(), planC("-s", "10.0.0.0/8")
	must := func(step string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	v4 := func() string { return f.Dump(ipt.IPv4, "nat") }
	v6 := func() string { return f.Dump(ipt.IPv6, "nat") }

	must("ADD A", b.add(ctx, a))
	wantDump(t, "ADD A v4", v4(), iptAv4)
	wantDump(t, "ADD A v6", v6(), iptAv6)
	must("CHECK A", b.check(ctx, a))

	// One iptables-restore per family, and ADD twice gives the same
	// ruleset (the attachment's chain is rewritten, its jump kept).
	if n := len(f.Restores); n != 2 {
		t.Fatalf("ADD ran %d restores, want 2", n)
	}
	must("ADD A again", b.add(ctx, a))
	wantDump(t, "ADD A twice v4", v4(), iptAv4)
	wantDump(t, "ADD A twice v6", v6(), iptAv6)
	if in := f.Restores[len(f.Restores)-1]; strings.Contains(in, iptTopDNAT+" -") || strings.Contains(in, "-D ") {
		t.Errorf("second ADD touched shared rules:\n%s", in)
	}

	must("ADD B", b.add(ctx, bb))
	must("ADD C", b.add(ctx, c))
	for _, p := range []*Plan{a, bb, c} {
		must("CHECK "+p.ID.String(), b.check(ctx, p))
	}
	must("DEL B", b.del(ctx, bb.ID, false))
	wantDump(t, "DEL B v4", v4(), iptACv4)
	must("DEL B again", b.del(ctx, bb.ID, false))
	wantDump(t, "DEL B twice v4", v4(), iptACv4)

	must("GC net1 {A}", b.gc(ctx, "net1", map[ID]bool{a.ID: true}))
	wantDump(t, "GC net1 {A} v4", v4(), iptACv4)
	must("GC net1 {}", b.gc(ctx, "net1", nil))
	wantDump(t, "GC net1 {} v6", v6(), iptCv6)
	must("CHECK C", b.check(ctx, c))

	// DEL of the last attachment keeps the shared chains; GC with nothing
	// left removes them.
	must("DEL C", b.del(ctx, c.ID, false))
	wantDump(t, "DEL C v4", v4(), iptSkeleton)
	must("GC of nothing", b.gc(ctx, "net2", nil))
	wantDump(t, "GC v4", v4(), iptEmpty)
	wantDump(t, "GC v6", v6(), iptEmpty)
}

func TestIPTGCRemovesLast(t *testing.T) {
	ctx := context.Background()
	f, b := newIPTFake()
	for _, p := range []*Plan{planA(), planB()} {
		if err := b.add(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.gc(ctx, "net1", nil); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "GC v4", f.Dump(ipt.IPv4, "nat"), iptEmpty)
	wantDump(t, "GC v6", f.Dump(ipt.IPv6, "nat"), iptEmpty)
}

func TestIPTLeavesOthersAlone(t *testing.T) {
	ctx := context.Background()
	f, b := newIPTFake()
	// Someone else's chains and rules, including the reference plugin's.
	other := "*nat\n:CNI-HOSTPORT-DNAT - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n" +
		"-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n" +
		"-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n"
	if err := f.Restore(ctx, ipt.IPv4, []byte(other)); err != nil {
		t.Fatal(err)
	}
	before := f.Dump(ipt.IPv4, "nat")
	p := planB()
	p.SNAT, p.SetMarkChain = true, "KUBE-MARK-MASQ"
	if err := b.add(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := f.Dump(ipt.IPv4, "nat")
	for _, want := range []string{
		"-A FLATNET-DN-UJAJVL-FTY67EY7OH -s 10.1.0.0/24 -p udp -m udp --dport 53 -j KUBE-MARK-MASQ",
		"-A FLATNET-DN-UJAJVL-FTY67EY7OH -s 127.0.0.1/32 -p udp -m udp --dport 53 -j KUBE-MARK-MASQ",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, iptSetMark) || strings.Contains(got, iptMasq) {
		t.Errorf("externalSetMarkChain: our masquerade chains were created:\n%s", got)
	}
	if err := b.check(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := b.del(ctx, p.ID, true); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "after DEL with prune", f.Dump(ipt.IPv4, "nat"), before)
}

func TestIPTCheckFindsMissingRules(t *testing.T) {
	ctx := context.Background()
	f, b := newIPTFake()
	a := planA()
	if err := b.check(ctx, a); err == nil {
		t.Fatal("CHECK before ADD passed")
	}
	if err := b.add(ctx, a); err != nil {
		t.Fatal(err)
	}
	chain := iptChain(a.ID)
	del := "*nat\n-D " + chain + " -p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::2]:80\nCOMMIT\n"
	if err := f.Restore(ctx, ipt.IPv6, []byte(del)); err != nil {
		t.Fatal(err)
	}
	err := b.check(ctx, a)
	if err == nil || !strings.Contains(err.Error(), "ip6tables nat chain "+chain) {
		t.Fatalf("CHECK with a missing rule: %v", err)
	}
	if err := b.add(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := b.check(ctx, a); err != nil {
		t.Fatalf("CHECK after repair: %v", err)
	}
	flush := "*nat\n-F OUTPUT\nCOMMIT\n"
	if err := f.Restore(ctx, ipt.IPv4, []byte(flush)); err != nil {
		t.Fatal(err)
	}
	if err := b.check(ctx, a); err == nil || !strings.Contains(err.Error(), "OUTPUT") {
		t.Fatalf("CHECK without the OUTPUT jump: %v", err)
	}
}

func TestIPTFailedFamilyIsAtomic(t *testing.T) {
	ctx := context.Background()
	f, b := newIPTFake()
	if err := b.add(ctx, planB()); err != nil {
		t.Fatal(err)
	}
	before := f.Dump(ipt.IPv4, "nat")
	f.FailRestore = errors.New("injected")
	if err := b.add(ctx, planA()); err == nil {
		t.Fatal("ADD with a failing restore passed")
	}
	wantDump(t, "after failed restore", f.Dump(ipt.IPv4, "nat"), before)
}

func TestIPTNeedsIP6Tables(t *testing.T) {
	f := ipt.NewFake()
	b := &iptBackend{ipt: f, protos: []ipt.Protocol{ipt.IPv4}}
	err := b.add(context.Background(), planA())
	if !errors.Is(err, ipt.ErrNoIPTables) {
		t.Fatalf("ADD of an IPv6 mapping without ip6tables: %v", err)
	}
}
