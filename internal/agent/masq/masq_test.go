package masq

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
)

const want4 = `add table inet flatnet-agent { comment "flatnet agent: masquerade pod traffic leaving the cluster CIDR" ; }
add chain inet flatnet-agent postrouting { type nat hook postrouting priority 100 ; }
add rule inet flatnet-agent postrouting ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "10.244.0.0/16 to 10.244.0.0/16: pod to pod, no NAT"
add rule inet flatnet-agent postrouting ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "10.244.0.0/16 to multicast: no NAT"
add rule inet flatnet-agent postrouting ip saddr 10.244.0.0/16 masquerade fully-random comment "10.244.0.0/16 leaving the cluster: masquerade"
`

func TestSyncIdempotentAndReplaces(t *testing.T) {
	ctx := context.Background()
	f := nft.NewFake(knftables.InetFamily, Table)
	m := New(f)
	cidr := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	if changed, err := m.Sync(ctx, cidr); err != nil || !changed {
		t.Fatalf("first sync: %v %v", changed, err)
	}
	if d := cmp.Diff(want4, f.Dump()); d != "" {
		t.Errorf("ruleset (-want +got):\n%s", d)
	}
	// Twice: same ruleset, no transaction.
	if changed, err := m.Sync(ctx, cidr); err != nil || changed || f.Runs() != 1 {
		t.Fatalf("second sync: changed %v, %v, %d transactions", changed, err, f.Runs())
	}
	if d := cmp.Diff(want4, f.Dump()); d != "" {
		t.Errorf("ruleset after the second sync (-want +got):\n%s", d)
	}

	// Another cluster CIDR, dual-stack: the table is replaced whole.
	dual := []netip.Prefix{netip.MustParsePrefix("10.32.0.0/12"), netip.MustParsePrefix("fd00:10:244::/56")}
	if changed, err := m.Sync(ctx, dual); err != nil || !changed {
		t.Fatalf("changed CIDR: %v %v", changed, err)
	}
	want := `add table inet flatnet-agent { comment "flatnet agent: masquerade pod traffic leaving the cluster CIDR" ; }
add chain inet flatnet-agent postrouting { type nat hook postrouting priority 100 ; }
add rule inet flatnet-agent postrouting ip saddr 10.32.0.0/12 ip daddr 10.32.0.0/12 return comment "10.32.0.0/12 to 10.32.0.0/12: pod to pod, no NAT"
add rule inet flatnet-agent postrouting ip saddr 10.32.0.0/12 ip daddr 224.0.0.0/4 return comment "10.32.0.0/12 to multicast: no NAT"
add rule inet flatnet-agent postrouting ip saddr 10.32.0.0/12 masquerade fully-random comment "10.32.0.0/12 leaving the cluster: masquerade"
add rule inet flatnet-agent postrouting ip6 saddr fd00:10:244::/56 ip6 daddr fd00:10:244::/56 return comment "fd00:10:244::/56 to fd00:10:244::/56: pod to pod, no NAT"
add rule inet flatnet-agent postrouting ip6 saddr fd00:10:244::/56 ip6 daddr ff00::/8 return comment "fd00:10:244::/56 to multicast: no NAT"
add rule inet flatnet-agent postrouting ip6 saddr fd00:10:244::/56 masquerade fully-random comment "fd00:10:244::/56 leaving the cluster: masquerade"
`
	if d := cmp.Diff(want, f.Dump()); d != "" {
		t.Errorf("ruleset (-want +got):\n%s", d)
	}

	// A hand-added chain makes the table stale: it is rewritten.
	tx := f.NewTransaction()
	tx.Add(&knftables.Chain{Name: "extra"})
	if err := f.Fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if changed, err := m.Sync(ctx, dual); err != nil || !changed {
		t.Fatalf("after a hand edit: %v %v", changed, err)
	}
	if d := cmp.Diff(want, f.Dump()); d != "" {
		t.Errorf("ruleset after a hand edit (-want +got):\n%s", d)
	}

	if err := m.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if d := f.Dump(); d != "" {
		t.Errorf("after Remove:\n%s", d)
	}
	if err := m.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestSyncRejectsBadCIDR(t *testing.T) {
	m := New(nft.NewFake(knftables.InetFamily, Table))
	for _, c := range []netip.Prefix{{}, netip.MustParsePrefix("::ffff:10.0.0.0/104")} {
		if _, err := m.Sync(context.Background(), []netip.Prefix{c}); err == nil {
			t.Errorf("Sync(%v): no error", c)
		}
	}
}
