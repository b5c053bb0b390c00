package nfnl_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
)

// TestProxyTransactionsCompile: every transaction the proxy's renderer
// writes (full, partial, full after a restart; both families) compiles
// without falling back to nft.
func TestProxyTransactionsCompile(t *testing.T) {
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		v6 := fam == knftables.IPv6Family
		r := nftables.New(renderConfig(fam, "t"))
		fake := knftables.NewFake(fam, "t")
		full := fake.NewTransaction()
		st := r.Full(full, services(200, v6, 0), nil, nil)
		next := services(220, v6, 1)
		changed := map[string]bool{}
		for i, s := range next {
			if i%9 == 0 || i >= 200 {
				changed[s.Key()] = true
			}
		}
		changed["ns3/svc3"] = true
		var kept []*proxy.Service
		for _, s := range next {
			if s.Key() != "ns3/svc3" {
				kept = append(kept, s)
			}
		}
		partial := fake.NewTransaction()
		r.Partial(partial, kept, st, changed)
		// The restart finds the endpoint maps in the table and replaces them.
		if err := fake.Run(context.Background(), full); err != nil {
			t.Fatal(err)
		}
		maps, err := fake.List(context.Background(), "maps")
		if err != nil || len(maps) == 0 {
			t.Fatalf("maps after the full sync: %v %v", maps, err)
		}
		restart := fake.NewTransaction()
		r.Full(restart, services(50, v6, 2), nil, &nftables.Existing{Chains: st.Chains(), Sets: []string{"aff-GONE"}, Maps: maps})
		if !strings.Contains(restart.String(), "delete map") {
			t.Fatalf("the restart did not replace the endpoint maps:\n%s", restart)
		}
		n, err := nfnl.CompileTx(full, partial, restart)
		if err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
		t.Logf("%s: %d messages for %d operations", fam, n, full.NumOperations()+partial.NumOperations()+restart.NumOperations())
	}
}

// TestFallback: a transaction outside the compiled subset goes to the
// fallback, whole, without touching the kernel.
func TestFallback(t *testing.T) {
	var ran []*knftables.Transaction
	r := nfnl.New(knftables.IPv4Family, "t", nfnl.Options{Fallback: func(_ context.Context, tx *knftables.Transaction) error {
		ran = append(ran, tx)
		return nil
	}})
	tx := r.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "c"})
	tx.Add(&knftables.Rule{Chain: "c", Rule: "tcp dport 22 log prefix ssh accept"})
	if err := r.Run(context.Background(), tx); err != nil || len(ran) != 1 || ran[0] != tx {
		t.Fatalf("Run: %v, fallback ran %d", err, len(ran))
	}
	// Without a fallback the error names the command.
	r = nfnl.New(knftables.IPv4Family, "t", nfnl.Options{})
	err := r.Run(context.Background(), tx)
	if !errors.Is(err, nfnl.ErrUnsupported) {
		t.Fatalf("Run without fallback: %v", err)
	}
	t.Log(err)
	// An empty transaction is a no-op.
	if err := r.Run(context.Background(), r.NewTransaction()); err != nil {
		t.Fatal(err)
	}
}
