// Package nfnltest checks, in network namespaces a test creates, that a
// table written over netlink (nfnl) is the table nft writes: the same
// operations run on two subjects, one per namespace, and `nft list table`
// must be identical after each.
package nfnltest

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/testutil"
)

// Side is one subject (a backend over nft or over netlink) and the
// namespace it programs.
type Side[T any] struct {
	NS string
	V  T
}

// Sides makes the two namespaces of a comparison and builds the subject
// in each, inside it: over the nft binary (viaNFT, handed a runner for
// family/table) and over netlink (viaNL). t is skipped (failed in CI)
// without the nft binary.
func Sides[T any](t *testing.T, family knftables.Family, table string, viaNFT func(*nft.Runner) T, viaNL func() (T, error)) (Side[T], Side[T]) {
	t.Helper()
	a, b := Side[T]{NS: testutil.NewNetNS(t)}, Side[T]{NS: testutil.NewNetNS(t)}
	if _, err := nft.LookPath(nft.StandardPaths...); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	if err := netns.Do(a.NS, func() error {
		r, err := nft.New(family, table, nft.StandardPaths...)
		if err == nil {
			a.V = viaNFT(r)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(b.NS, func() (err error) { b.V, err = viaNL(); return err }); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// Step is one operation, run on each side in its namespace.
type Step[T any] struct {
	Name string
	Do   func(T) error
}

// List is `nft list table family table` in ns ("" when it is missing).
func List(t testing.TB, ns string, family knftables.Family, table string) string {
	t.Helper()
	return testutil.RunIn(t, ns, "sh", "-c", "nft list table "+string(family)+" "+table+" 2>/dev/null || true")
}

// Same runs steps on viaNFT and viaNL in turn and fails t when the table
// lists differently after a step.
func Same[T any](t *testing.T, family knftables.Family, table string, viaNFT, viaNL Side[T], steps []Step[T]) {
	t.Helper()
	for _, st := range steps {
		for _, side := range []Side[T]{viaNFT, viaNL} {
			if err := netns.Do(side.NS, func() error { return st.Do(side.V) }); err != nil {
				t.Fatalf("%s: %v", st.Name, err)
			}
		}
		a, b := List(t, viaNFT.NS, family, table), List(t, viaNL.NS, family, table)
		if a != b {
			t.Fatalf("%s: nft list differs (-nft +netlink):\n%s", st.Name, cmp.Diff(strings.Split(a, "\n"), strings.Split(b, "\n")))
		}
		t.Logf("%s: %d lines, identical", st.Name, strings.Count(a, "\n"))
	}
}
