package nft

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// listOutput is `nft -j list table inet t` (nft 1.0.6) for a table shaped
// like ours.
const listOutput = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "inet", "name": "t", "handle": 1}},
{"map": {"family": "inet", "name": "masq4", "table": "t", "type": "ipv4_addr", "handle": 1, "map": "verdict",
  "elem": [["10.0.0.5", {"goto": {"target": "a1"}}], [{"elem": {"val": "10.0.0.6", "comment": "x"}}, {"jump": {"target": "a2"}}]]}},
{"map": {"family": "inet", "name": "masq6", "table": "t", "type": "ipv6_addr", "handle": 2, "map": "verdict"}},
{"set": {"family": "inet", "name": "s", "table": "t", "type": "ipv4_addr", "handle": 7, "flags": ["interval"],
  "elem": [{"prefix": {"addr": "10.0.0.0", "len": 24}}, "10.1.0.1"]}},
{"set": {"family": "inet", "name": "boxes", "table": "t", "type": ["ipv4_addr", "ipv4_addr", "inet_proto", "inet_service"], "handle": 8, "flags": ["interval"],
  "elem": [{"concat": ["10.0.1.5", {"prefix": {"addr": "10.0.0.0", "len": 16}}, {"range": [0, 255]}, {"range": [0, 65535]}]},
    {"concat": ["10.0.1.6", {"range": ["10.1.0.1", "10.1.0.9"]}, "udp", 80]}]}},
{"counter": {"family": "inet", "name": "c1", "table": "t", "handle": 9, "comment": "x/a", "packets": 7, "bytes": 420}},
{"chain": {"family": "inet", "table": "t", "name": "postrouting", "handle": 3, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
{"chain": {"family": "inet", "table": "t", "name": "a1", "handle": 5}},
{"rule": {"family": "inet", "table": "t", "chain": "postrouting", "handle": 4, "expr": [{"vmap": {"key": {"payload": {"protocol": "ip", "field": "saddr"}}, "data": "@masq4"}}]}},
{"rule": {"family": "inet", "table": "t", "chain": "a1", "handle": 6, "comment": "c1", "expr": [{"masquerade": null}]}}]}`

func fakeExec(t *testing.T, out string, err error) *Runner {
	n := &Runner{path: "nft", family: knftables.InetFamily, table: "t", txs: knftables.NewFake(knftables.InetFamily, "t")}
	n.exec = func(_ context.Context, stdin string, args ...string) ([]byte, error) {
		if got := strings.Join(args, " "); got != "-j list table inet t" {
			t.Errorf("ran nft %s", got)
		}
		return []byte(out), err
	}
	return n
}

func TestRunnerLists(t *testing.T) {
	ctx := context.Background()
	n := fakeExec(t, listOutput, nil)
	chains, err := n.List(ctx, "chains")
	must(t, err)
	if d := cmp.Diff([]string{"postrouting", "a1"}, chains); d != "" {
		t.Errorf("List(chains) (-want +got):\n%s", d)
	}
	counters, err := n.ListCounters(ctx)
	must(t, err)
	if d := cmp.Diff([]*knftables.Counter{{Name: "c1", Comment: knftables.PtrTo("x/a"), Handle: knftables.PtrTo(9),
		Packets: knftables.PtrTo[uint64](7), Bytes: knftables.PtrTo[uint64](420)}}, counters); d != "" {
		t.Errorf("ListCounters (-want +got):\n%s", d)
	}
	elems, err := n.ListElements(ctx, "map", "masq4")
	must(t, err)
	want := []*knftables.Element{
		{Map: "masq4", Key: []string{"10.0.0.5"}, Value: []string{"goto a1"}},
		{Map: "masq4", Key: []string{"10.0.0.6"}, Value: []string{"jump a2"}, Comment: knftables.PtrTo("x")},
	}
	if d := cmp.Diff(want, elems); d != "" {
		t.Errorf("ListElements(masq4) (-want +got):\n%s", d)
	}
	if elems, err := n.ListElements(ctx, "map", "masq6"); err != nil || len(elems) != 0 {
		t.Errorf("ListElements(masq6) = %v, %v; want empty", elems, err)
	}
	set, err := n.ListElements(ctx, "set", "s")
	must(t, err)
	if d := cmp.Diff([]*knftables.Element{{Set: "s", Key: []string{"10.0.0.0/24"}}, {Set: "s", Key: []string{"10.1.0.1"}}}, set); d != "" {
		t.Errorf("ListElements(set s) (-want +got):\n%s", d)
	}
	boxes, err := n.ListElements(ctx, "set", "boxes")
	must(t, err)
	if d := cmp.Diff([]*knftables.Element{
		{Set: "boxes", Key: []string{"10.0.1.5", "10.0.0.0/16", "0-255", "0-65535"}},
		{Set: "boxes", Key: []string{"10.0.1.6", "10.1.0.1-10.1.0.9", "udp", "80"}},
	}, boxes); d != "" {
		t.Errorf("ListElements(set boxes) (-want +got):\n%s", d)
	}
	if _, err := n.ListElements(ctx, "map", "nope"); !IsNotFound(err) {
		t.Errorf("ListElements(nope) err = %v, want not found", err)
	}
	rules, err := n.ListRules(ctx, "a1")
	must(t, err)
	if len(rules) != 1 || *rules[0].Handle != 6 || *rules[0].Comment != "c1" || rules[0].Chain != "a1" {
		t.Errorf("ListRules(a1) = %+v", rules)
	}
	if _, err := n.ListRules(ctx, "nope"); !IsNotFound(err) {
		t.Errorf("ListRules(nope) err = %v, want not found", err)
	}
}

func TestRunnerMissingTable(t *testing.T) {
	n := fakeExec(t, "", &Error{Msg: "Error: No such file or directory", Errno: syscall.ENOENT})
	chains, err := n.List(context.Background(), "chain")
	if err != nil || len(chains) != 0 {
		t.Errorf("List on a missing table = %v, %v; want empty, nil", chains, err)
	}
}

func TestRunnerRunsTransactionText(t *testing.T) {
	n := &Runner{path: "nft", family: knftables.InetFamily, table: "t", txs: knftables.NewFake(knftables.InetFamily, "t")}
	var got string
	n.exec = func(_ context.Context, stdin string, args ...string) ([]byte, error) {
		got = strings.Join(args, " ") + "\n" + stdin
		return nil, nil
	}
	tx := n.NewTransaction()
	tx.Add(&knftables.Chain{Name: "c"})
	must(t, n.Run(context.Background(), tx))
	if want := "-f -\nadd chain inet t c\n"; got != want {
		t.Errorf("ran %q, want %q", got, want)
	}
	// An invalid transaction is refused before nft runs.
	got = ""
	tx = n.NewTransaction()
	tx.Add(&knftables.Chain{})
	if err := n.Run(context.Background(), tx); err == nil || got != "" {
		t.Errorf("invalid transaction: err=%v, ran %q", err, got)
	}
}

func TestClassify(t *testing.T) {
	for in, want := range map[string]syscall.Errno{
		"Error: Could not process rule: No such file or directory\nadd element ...": syscall.ENOENT,
		"Error: Could not process rule: File exists":                                syscall.EEXIST,
		"Error: Could not process rule: Device or resource busy":                    syscall.EBUSY,
		"Error: Could not process rule: Operation not supported":                    syscall.EOPNOTSUPP,
		"Error: syntax error\nNo such file or directory":                            0,
	} {
		if got := classify(in); got != want {
			t.Errorf("classify(%q) = %v, want %v", in, got, want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunnerErrors runs a stand-in nft that fails the way nft does: the
// first stderr line gives the errno, and Classify sees every failure.
func TestRunnerErrors(t *testing.T) {
	script := filepath.Join(t.TempDir(), "nft")
	body := "#!/bin/sh\ncat >/dev/null\necho 'Error: Could not process rule: Operation not supported' >&2\necho 'add rule inet t c masquerade' >&2\nexit 1\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runner{path: script, family: knftables.InetFamily, table: "t", txs: knftables.NewFake(knftables.InetFamily, "t")}
	r.exec = r.run
	tx := r.NewTransaction()
	tx.Add(&knftables.Chain{Name: "c"})
	err := r.Run(context.Background(), tx)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, syscall.EOPNOTSUPP) || !strings.HasPrefix(err.Error(), "nft -f -: Error: Could not process rule: Operation not supported") {
		t.Fatalf("Run = %v", err)
	}
	if IsNotFound(err) || IsExists(err) || IsBusy(err) {
		t.Errorf("misclassified: %v", err)
	}
	wrapped := errors.New("classified")
	r.Classify = func(e *Error) error { return fmt.Errorf("%w: %w", wrapped, e) }
	if err := r.Run(context.Background(), tx); !errors.Is(err, wrapped) || !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("Run with Classify = %v", err)
	}
}
