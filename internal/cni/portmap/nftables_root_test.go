package portmap

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootNFTSameAsNetlink runs the same backend verbs through the nft
// binary (the text path) in one namespace and over netlink (the default)
// in another: `nft list table inet flatnet-portmap` must be identical
// after each (a repeated ADD replaces jumps by handle; C's condition is
// one the netlink compiler covers, D's one it hands to nft); then each
// path removes what the other wrote.
func TestRootNFTSameAsNetlink(t *testing.T) {
	nsExec, nsNL := testutil.NewNetNS(t), testutil.NewNetNS(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	ctx := context.Background()
	var viaExec, viaNL *nftBackend
	if err := netns.Do(nsExec, func() error {
		r, err := nft.New(knftables.InetFamily, nftTable)
		viaExec = &nftBackend{nft: r}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(nsNL, func() error {
		r, err := ipmasq.NewNFT(knftables.InetFamily, nftTable)
		viaNL = &nftBackend{nft: r}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	a, b, c := planA(), planB(), planC("ip saddr 10.0.0.0/8")
	d := planC(`iifname "eth9"`)
	d.ID = attB.ID() // another attachment with C's mappings and a condition nfnl leaves to nft
	aChanged := planA()
	aChanged.Families = aChanged.Families[:1] // IPv4 only: the jumps and chain change
	steps := []struct {
		name string
		do   func(b *nftBackend) error
	}{
		{"ADD A", func(x *nftBackend) error { return x.add(ctx, a) }},
		{"ADD B", func(x *nftBackend) error { return x.add(ctx, b) }},
		{"ADD A again", func(x *nftBackend) error { return x.add(ctx, a) }},
		{"ADD A changed", func(x *nftBackend) error { return x.add(ctx, aChanged) }},
		{"ADD C", func(x *nftBackend) error { return x.add(ctx, c) }},
		{"CHECK C", func(x *nftBackend) error { return x.check(ctx, c) }},
		{"DEL B", func(x *nftBackend) error { return x.del(ctx, b.ID, false) }},
		{"ADD D (nft fallback)", func(x *nftBackend) error { return x.add(ctx, d) }},
		{"DEL D", func(x *nftBackend) error { return x.del(ctx, d.ID, false) }},
		{"GC net1", func(x *nftBackend) error { return x.gc(ctx, "net1", nil) }},
		{"DEL C pruning", func(x *nftBackend) error { return x.del(ctx, c.ID, true) }},
	}
	list := func(ns string) string {
		return testutil.RunIn(t, ns, "sh", "-c", "nft list table inet "+nftTable+" 2>/dev/null || true")
	}
	for _, st := range steps {
		for _, side := range []struct {
			ns string
			b  *nftBackend
		}{{nsExec, viaExec}, {nsNL, viaNL}} {
			if err := netns.Do(side.ns, func() error { return st.do(side.b) }); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
		}
		x, y := list(nsExec), list(nsNL)
		if x != y {
			t.Fatalf("%s: nft list differs (-nft +netlink):\n%s", st.name, cmp.Diff(strings.Split(x, "\n"), strings.Split(y, "\n")))
		}
		t.Logf("%s: %d lines, identical", st.name, strings.Count(x, "\n"))
	}
	if x := list(nsExec); x != "" {
		t.Fatalf("the last DEL left:\n%s", x)
	}

	// A node switching binaries: what one path wrote, the other removes.
	if err := netns.Do(nsExec, func() error {
		for _, pair := range [][2]*nftBackend{{viaExec, viaNLIn(t)}, {viaNLIn(t), viaExec}} {
			if err := pair[0].add(ctx, a); err != nil {
				return err
			}
			if err := pair[1].check(ctx, a); err != nil {
				return err
			}
			if err := pair[1].del(ctx, a.ID, true); err != nil {
				return err
			}
			if got := list(nsExec); got != "" {
				t.Errorf("A's rules survived a DEL by the other path:\n%s", got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// viaNLIn is the netlink backend in the calling thread's namespace.
func viaNLIn(t *testing.T) *nftBackend {
	r, err := ipmasq.NewNFT(knftables.InetFamily, nftTable)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return &nftBackend{nft: r}
}
