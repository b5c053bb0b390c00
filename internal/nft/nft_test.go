package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/knftables"
)

// Output of a real `nft -j --terse list table` (nft 1.0.6), shortened.
const realJSON = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "inet", "name": "fpm", "handle": 1}},
{"chain": {"family": "inet", "table": "fpm", "name": "prerouting", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "inet", "table": "fpm", "name": "hostports", "handle": 3}},
{"chain": {"family": "inet", "table": "fpm", "name": "dnat-abc", "handle": 4}},
{"rule": {"family": "inet", "table": "fpm", "chain": "prerouting", "handle": 5, "comment": "entry", "expr": [{"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["daddr"]}}, "right": "local"}}, {"jump": {"target": "hostports"}}]}},
{"rule": {"family": "inet", "table": "fpm", "chain": "hostports", "handle": 6, "comment": "abc x y", "expr": [{"jump": {"target": "dnat-abc"}}]}},
{"rule": {"family": "inet", "table": "fpm", "chain": "dnat-abc", "handle": 9, "expr": [{"masquerade": null}]}}]}`

func TestParseTableJSON(t *testing.T) {
	tb, err := ParseTableJSON([]byte(realJSON))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tb.Chains, []string{"prerouting", "hostports", "dnat-abc"}) {
		t.Errorf("chains %q", tb.Chains)
	}
	var got []string
	for _, r := range tb.Rules {
		c := "<nil>"
		if r.Comment != nil {
			c = *r.Comment
		}
		got = append(got, fmt.Sprintf("%s/%d/%s", r.Chain, *r.Handle, c))
	}
	if want := []string{"prerouting/5/entry", "hostports/6/abc x y", "dnat-abc/9/<nil>"}; !slices.Equal(got, want) {
		t.Errorf("rules %q", got)
	}
	if !tb.HasChain("hostports") || tb.HasChain("nope") || len(tb.RulesIn("hostports")) != 1 {
		t.Error("HasChain/RulesIn")
	}
	if _, err := ParseTableJSON([]byte("not json")); err == nil {
		t.Error("bad JSON accepted")
	}
	var nilTable *Table
	if nilTable.HasChain("x") || nilTable.RulesIn("x") != nil {
		t.Error("nil table")
	}
}

func TestRenderRefusesInvalidTransactions(t *testing.T) {
	f := NewFake(knftables.InetFamily, "t")
	tx := f.NewTransaction()
	tx.Add(&knftables.Chain{Name: "c"})
	tx.Add(&knftables.Rule{Chain: "c"}) // no rule text: invalid
	tx.Add(&knftables.Rule{Chain: "c", Rule: "accept"})
	if s, err := Render(tx); err == nil || !strings.Contains(err.Error(), "no rule specified") {
		t.Fatalf("Render = %q, %v", s, err)
	}
	tx = f.NewTransaction()
	tx.Add(&knftables.Rule{Chain: "c"}) // the only operation, and invalid
	if _, err := Render(tx); err == nil || tx.NumOperations() != 0 {
		t.Fatalf("Render of an invalid-only transaction: %v", err)
	}
	tx = f.NewTransaction()
	tx.Add(&knftables.Chain{Name: "c", Comment: knftables.PtrTo("# ERROR: not really")})
	if _, err := Render(tx); err != nil {
		t.Fatalf("a comment that looks like an error: %v", err)
	}
}

func TestFakeListTable(t *testing.T) {
	ctx := context.Background()
	f := NewFake(knftables.InetFamily, "t")
	if tb, err := f.ListTable(ctx); tb != nil || err != nil {
		t.Fatalf("no table: %v %v", tb, err)
	}
	tx := f.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Chain{Name: "b"})
	tx.Add(&knftables.Chain{Name: "a"})
	tx.Add(&knftables.Rule{Chain: "b", Rule: "accept", Comment: knftables.PtrTo("one")})
	tx.Add(&knftables.Rule{Chain: "b", Rule: "drop"})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tb, err := f.ListTable(ctx)
	if err != nil || !slices.Equal(tb.Chains, []string{"a", "b"}) || len(tb.RulesIn("b")) != 2 || *tb.RulesIn("b")[0].Comment != "one" {
		t.Fatalf("ListTable: %+v %v", tb, err)
	}
	// Deleting by the listed handle works.
	tx = f.NewTransaction()
	tx.Delete(&knftables.Rule{Chain: "b", Handle: tb.RulesIn("b")[0].Handle})
	if err := f.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if tb, _ := f.ListTable(ctx); len(tb.RulesIn("b")) != 1 {
		t.Fatal("delete by handle")
	}
}

func TestComment(t *testing.T) {
	if got := Comment("a \"b\"\\\n\xff"); got != "a _b___"+"_" {
		t.Errorf("Comment = %q", got)
	}
	if got := Comment(strings.Repeat("x", 200)); len(got) != 128 {
		t.Errorf("len %d", len(got))
	}
}

func TestIsNotFound(t *testing.T) {
	if !IsNotFound(fmt.Errorf("x: %w", &Error{Msg: "nft: No such file or directory", Errno: syscall.ENOENT})) || IsNotFound(errors.New("x")) {
		t.Error("IsNotFound")
	}
	f := NewFake(knftables.InetFamily, "t")
	tx := f.NewTransaction()
	tx.Delete(&knftables.Chain{Name: "nope"})
	if err := f.Run(context.Background(), tx); !IsNotFound(err) {
		t.Errorf("fake not-found: %v", err)
	}
}
