package nft

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/knftables"
)

func TestHashAndTarget(t *testing.T) {
	if h := Hash(10, "a", "b"); len(h) != 10 || h != Hash(10, "a", "b") || h == Hash(10, "ab") {
		t.Errorf("Hash: %q", h)
	}
	for v, want := range map[string]string{"goto c1": "c1", "jump c2": "c2", "accept": ""} {
		if got := Target(&knftables.Element{Key: []string{"k"}, Value: []string{v}}); got != want {
			t.Errorf("Target(%q) = %q", v, got)
		}
	}
}

// failOnce makes the first Run fail with errno, as the kernel does.
type failOnce struct {
	*knftables.Fake
	errno syscall.Errno
}

func (f *failOnce) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.errno != 0 {
		errno := f.errno
		f.errno = 0
		return &Error{Msg: "nft -f -: " + errno.Error(), Errno: errno}
	}
	return f.Fake.Run(ctx, tx)
}

func TestInstallAndPurge(t *testing.T) {
	ctx := context.Background()
	f := knftables.NewFake(knftables.InetFamily, "t")
	base := func(tx *knftables.Transaction) {
		tx.Add(&knftables.Table{})
		tx.Add(&knftables.Map{Name: "m", Type: "ipv4_addr : verdict"})
	}
	attach := func(chain, key string) func(*knftables.Transaction) {
		return func(tx *knftables.Transaction) {
			tx.Add(&knftables.Chain{Name: chain})
			tx.Add(&knftables.Rule{Chain: chain, Rule: "masquerade"})
			tx.Add(&knftables.Element{Map: "m", Key: []string{key}, Value: []string{"goto " + chain}})
		}
	}
	noEvict := func() error { t.Error("evict called"); return nil }
	// The table is missing: base, then the attachment.
	if err := Install(ctx, f, attach("a", "10.0.0.1"), base, noEvict); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, f, attach("b", "10.0.0.2"), base, noEvict); err != nil {
		t.Fatal(err)
	}
	// EEXIST: evict, then retry.
	evicted := 0
	err := Install(ctx, &failOnce{Fake: f, errno: syscall.EEXIST}, attach("c", "10.0.0.3"), base, func() error { evicted++; return nil })
	if err != nil || evicted != 1 {
		t.Fatalf("Install after EEXIST: %v, %d evictions", err, evicted)
	}
	// Any other failure is returned.
	if err := Install(ctx, &failOnce{Fake: f, errno: syscall.EBUSY}, attach("d", "10.0.0.4"), base, noEvict); !IsBusy(err) {
		t.Errorf("Install after EBUSY: %v", err)
	}

	elems, err := f.ListElements(ctx, "map", "m")
	if err != nil || len(elems) != 3 {
		t.Fatalf("elements %v, %v", elems, err)
	}
	if err := Purge(ctx, f, map[string]bool{"a": true, "c": true, "gone": true}, elems); err != nil {
		t.Fatal(err)
	}
	d := f.Dump()
	for _, s := range []string{"chain inet t a", "chain inet t c", "10.0.0.1", "10.0.0.3"} {
		if strings.Contains(d, s) {
			t.Errorf("Purge left %q:\n%s", s, d)
		}
	}
	if !strings.Contains(d, "add chain inet t b") || !strings.Contains(d, "10.0.0.2 : goto b") {
		t.Errorf("Purge removed b:\n%s", d)
	}
	if err := Purge(ctx, f, map[string]bool{"gone": true}, nil); err != nil {
		t.Errorf("nothing to purge: %v", err)
	}
}
