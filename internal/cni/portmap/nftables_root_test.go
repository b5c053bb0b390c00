package portmap

import (
	"context"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl/nfnltest"
)

// TestRootNFTSameAsNetlink runs the same backend verbs through the nft
// binary (the text path) in one namespace and over netlink (the default)
// in another: `nft list table inet flatnet-portmap` must be identical
// after each (a repeated ADD replaces jumps by handle; C's condition is
// one the netlink compiler covers, D's one it hands to nft); then each
// path removes what the other wrote.
func TestRootNFTSameAsNetlink(t *testing.T) {
	viaExec, viaNL := nfnltest.Sides(t, knftables.InetFamily, nftTable, func(r *nft.Runner) *nftBackend {
		return &nftBackend{nft: r}
	}, func() (*nftBackend, error) {
		r, err := ipmasq.NewNFT(knftables.InetFamily, nftTable)
		return &nftBackend{nft: r}, err
	})
	ctx := context.Background()
	a, b, c := planA(), planB(), planC("ip saddr 10.0.0.0/8")
	d := planC(`iifname "eth9"`)
	d.ID = attB.ID() // another attachment with C's mappings and a condition nfnl leaves to nft
	aChanged := planA()
	aChanged.Families = aChanged.Families[:1] // IPv4 only: the jumps and chain change
	nfnltest.Same(t, knftables.InetFamily, nftTable, viaExec, viaNL, []nfnltest.Step[*nftBackend]{
		{Name: "ADD A", Do: func(x *nftBackend) error { return x.add(ctx, a) }},
		{Name: "ADD B", Do: func(x *nftBackend) error { return x.add(ctx, b) }},
		{Name: "ADD A again", Do: func(x *nftBackend) error { return x.add(ctx, a) }},
		{Name: "ADD A changed", Do: func(x *nftBackend) error { return x.add(ctx, aChanged) }},
		{Name: "ADD C", Do: func(x *nftBackend) error { return x.add(ctx, c) }},
		{Name: "CHECK C", Do: func(x *nftBackend) error { return x.check(ctx, c) }},
		{Name: "DEL B", Do: func(x *nftBackend) error { return x.del(ctx, b.ID, false) }},
		{Name: "ADD D (nft fallback)", Do: func(x *nftBackend) error { return x.add(ctx, d) }},
		{Name: "DEL D", Do: func(x *nftBackend) error { return x.del(ctx, d.ID, false) }},
		{Name: "GC net1", Do: func(x *nftBackend) error { return x.gc(ctx, "net1", nil) }},
		{Name: "DEL C pruning", Do: func(x *nftBackend) error { return x.del(ctx, c.ID, true) }},
	})
	list := func(ns string) string { return nfnltest.List(t, ns, knftables.InetFamily, nftTable) }

	if x := list(viaExec.NS); x != "" {
		t.Fatalf("the last DEL left:\n%s", x)
	}

	// A node switching binaries: what one path wrote, the other removes.
	if err := netns.Do(viaExec.NS, func() error {
		for _, pair := range [][2]*nftBackend{{viaExec.V, viaNLIn(t)}, {viaNLIn(t), viaExec.V}} {
			if err := pair[0].add(ctx, a); err != nil {
				return err
			}
			if err := pair[1].check(ctx, a); err != nil {
				return err
			}
			if err := pair[1].del(ctx, a.ID, true); err != nil {
				return err
			}
			if got := list(viaExec.NS); got != "" {
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
