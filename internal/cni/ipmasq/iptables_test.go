package ipmasq

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/ipt"
)

// natDump renders the fake's nat table of proto as "-A chain args" lines,
// with chain names made readable.
func natDump(t *testing.T, f *ipt.Fake, proto ipt.Protocol) string {
	t.Helper()
	tb, err := f.Save(context.Background(), proto, "nat")
	must(t, err)
	var lines []string
	for _, c := range tb.Chains {
		if strings.HasPrefix(c, "FNMQ-") {
			lines = append(lines, ":"+c)
		}
	}
	for _, r := range tb.Rules {
		lines = append(lines, "-A "+r.Chain+" "+strings.Join(r.Args, " "))
	}
	d := strings.Join(lines, "\n")
	for _, a := range []Attachment{attA, attB, attC} {
		d = strings.ReplaceAll(d, IPTChainName(a), "<"+a.ContainerID+"/"+a.IfName+"@"+a.Network+">")
	}
	return d
}

func TestIPTablesSetupTeardown(t *testing.T) {
	ctx := context.Background()
	f := ipt.NewFake()
	x := NewIPTables(f)
	addrs := pfx("10.1.0.5/24", "fd00:1::5/64")
	must(t, x.Setup(ctx, attA, addrs))
	must(t, x.Setup(ctx, attA, addrs)) // idempotent
	want4 := `:<ctr-a/eth0@mynet>
-A POSTROUTING -s 10.1.0.5/32 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j <ctr-a/eth0@mynet>
-A <ctr-a/eth0@mynet> -s 10.1.0.5/32 -d 10.1.0.0/24 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j RETURN
-A <ctr-a/eth0@mynet> -d 224.0.0.0/4 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j RETURN
-A <ctr-a/eth0@mynet> -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j MASQUERADE`
	if d := cmp.Diff(want4, natDump(t, f, ipt.IPv4)); d != "" {
		t.Errorf("IPv4 nat after Setup (-want +got):\n%s", d)
	}
	want6 := `:<ctr-a/eth0@mynet>
-A POSTROUTING -s fd00:1::5/128 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j <ctr-a/eth0@mynet>
-A <ctr-a/eth0@mynet> -s fd00:1::5/128 -d fd00:1::/64 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j RETURN
-A <ctr-a/eth0@mynet> -d ff00::/8 -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j RETURN
-A <ctr-a/eth0@mynet> -m comment --comment flatnet ipMasq net: mynet, if: eth0, id: ctr-a -j MASQUERADE`
	if d := cmp.Diff(want6, natDump(t, f, ipt.IPv6)); d != "" {
		t.Errorf("IPv6 nat after Setup (-want +got):\n%s", d)
	}
	must(t, x.Check(ctx, attA, addrs))

	// B reuses A's IPv4 address: two jumps; A's teardown keeps B's.
	must(t, x.Setup(ctx, attB, pfx("10.1.0.5/24")))
	must(t, x.Teardown(ctx, attA, nil))
	got := natDump(t, f, ipt.IPv4)
	if strings.Contains(got, "ctr-a") || !strings.Contains(got, "-j <ctr-b/eth0@mynet>") {
		t.Errorf("after Teardown(A):\n%s", got)
	}
	if got := natDump(t, f, ipt.IPv6); got != "" {
		t.Errorf("IPv6 left after Teardown(A):\n%s", got)
	}
	n := len(f.Restores)
	must(t, x.Teardown(ctx, attA, nil))
	if len(f.Restores) != n {
		t.Errorf("a second Teardown restored %q", f.Restores[n:])
	}
	must(t, x.Check(ctx, attB, pfx("10.1.0.5/24")))
}

func TestIPTablesCheck(t *testing.T) {
	ctx := context.Background()
	f := ipt.NewFake()
	x := NewIPTables(f)
	addrs := pfx("10.1.0.5/24")
	err := x.Check(ctx, attA, addrs)
	wantCode(t, err, cnierr.CheckFailed, "is missing")
	must(t, x.Setup(ctx, attA, addrs))
	b := ipt.NewBuilder("nat")
	b.Delete("POSTROUTING", iptJump(attA, addrs[0])...)
	must(t, f.Restore(ctx, ipt.IPv4, b.Bytes()))
	wantCode(t, x.Check(ctx, attA, addrs), cnierr.CheckFailed, "does not send 10.1.0.5")
	wantCode(t, x.Check(ctx, attA, pfx("10.1.0.5/16")), cnierr.CheckFailed, "holds")
}

func TestIPTablesGC(t *testing.T) {
	ctx := context.Background()
	f := ipt.NewFake()
	x := NewIPTables(f)
	must(t, x.Setup(ctx, attA, pfx("10.1.0.5/24", "fd00:1::5/64")))
	must(t, x.Setup(ctx, attB, pfx("10.1.0.6/24")))
	must(t, x.Setup(ctx, attC, pfx("10.9.0.5/24")))
	must(t, x.GC(ctx, "mynet", []Attachment{{ContainerID: "ctr-b", IfName: "eth0"}}))
	got := natDump(t, f, ipt.IPv4)
	if strings.Contains(got, "ctr-a/eth0") || !strings.Contains(got, "ctr-b") || !strings.Contains(got, "othernet") {
		t.Errorf("IPv4 after GC:\n%s", got)
	}
	if got := natDump(t, f, ipt.IPv6); got != "" {
		t.Errorf("IPv6 after GC:\n%s", got)
	}
	if len(IPTChainName(attA)) > 28 {
		t.Errorf("chain name %q too long for iptables", IPTChainName(attA))
	}
}
