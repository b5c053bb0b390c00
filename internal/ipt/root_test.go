package ipt

import (
	"context"
	"os/exec"
	"slices"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootFakeFidelity feeds the same iptables-restore inputs to the real
// binaries (in a test namespace) and to the fake, and requires the same
// saved tables: the fake is only useful if it behaves like iptables.
func TestRootFakeFidelity(t *testing.T) {
	testutil.RequireRoot(t)
	for _, p := range []Protocol{IPv4, IPv6} {
		if err := Available(p); err != nil {
			testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
		}
	}
	ns := testutil.NewNetNS(t)
	ctx := context.Background()
	real, fake := New(), NewFake()
	steps := []struct {
		proto Protocol
		in    string
		fails bool
	}{
		{IPv4, "*nat\n:T - [0:0]\n:U - [0:0]\n-A T -s 10.1.0.2/32 -d 10.0.0.1/32 -p tcp -m tcp --dport 8080 -j U\n" +
			"-A T -m comment --comment \"a \\\"quoted\\\" comment\" -j RETURN\n-A T -p udp -m udp --dport 53 -j DNAT --to-destination 10.1.0.2:5353\n" +
			"-A U -j MARK --set-xmark 0x2000/0x2000\n-A PREROUTING -m addrtype --dst-type LOCAL -j T\n-I POSTROUTING 1 -m mark --mark 0x2000/0x2000 -j MASQUERADE\nCOMMIT\n", false},
		{IPv6, "*nat\n:T - [0:0]\n-A T -s fd00::2/128 -p tcp -m tcp --dport 80 -j DNAT --to-destination [fd00::2]:8080\nCOMMIT\n", false},
		// Declaring an existing chain flushes it.
		{IPv4, "*nat\n:U - [0:0]\n-A U -m comment --comment second -j MARK --set-xmark 0x20/0x20\nCOMMIT\n", false},
		// A failing line rolls back the whole input.
		{IPv4, "*nat\n-A T -j RETURN\n-D T -j NOSUCHRULE\nCOMMIT\n", true},
		{IPv4, "*nat\n-X T\nCOMMIT\n", true},
		{IPv4, "*nat\n-D PREROUTING -m addrtype --dst-type LOCAL -j T\n-F T\n-X T\nCOMMIT\n", false},
	}
	for i, s := range steps {
		var rerr error
		if err := netns.Do(ns, func() error { rerr = real.Restore(ctx, s.proto, []byte(s.in)); return nil }); err != nil {
			t.Fatal(err)
		}
		ferr := fake.Restore(ctx, s.proto, []byte(s.in))
		if (rerr != nil) != s.fails || (ferr != nil) != s.fails {
			t.Fatalf("step %d: real error %v, fake error %v, want failure %v", i, rerr, ferr, s.fails)
		}
		for _, p := range []Protocol{IPv4, IPv6} {
			var rt *Table
			if err := netns.Do(ns, func() (err error) { rt, err = real.Save(ctx, p, "nat"); return }); err != nil {
				t.Fatal(err)
			}
			ft, _ := fake.Save(ctx, p, "nat")
			rc, fc := slices.Clone(rt.Chains), slices.Clone(ft.Chains)
			slices.Sort(rc)
			slices.Sort(fc)
			if !slices.Equal(rc, fc) || !slices.EqualFunc(rt.Rules, ft.Rules, func(a, b Rule) bool { return a.Chain == b.Chain && slices.Equal(a.Args, b.Args) }) {
				out, _ := exec.Command("ip", "netns", "exec", testutil.NSName(ns), p.String()+"-save", "-t", "nat").CombinedOutput()
				t.Fatalf("step %d %s: real and fake differ\nreal:\n%s\nfake:\n%s", i, p, out, fake.Dump(p, "nat"))
			}
		}
	}
}
