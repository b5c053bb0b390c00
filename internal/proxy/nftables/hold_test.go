package nftables

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy"
)

// ruleOps matches what rewrites a chain: a flush or a rule added.
var ruleOps = regexp.MustCompile(`(?m)^(?:flush chain|add rule) `)

// distinct is sortedDump with each dispatch's values deduplicated: a
// table holding a modulus (a value twice) against one that does not. A
// dispatch left with one endpoint is the single DNAT a full sync writes.
func distinct(dump string) string {
	arms := regexp.MustCompile(`numgen random mod \d+ (map|vmap) \{ ([^}]*) \}`)
	single := regexp.MustCompile(`dnat ip addr \. port to numgen map \{([0-9.]+) \. (\d+)\}`)
	dump = arms.ReplaceAllStringFunc(dump, func(s string) string {
		m := arms.FindStringSubmatch(s)
		var vals []string
		for _, arm := range strings.Split(m[2], " , ") {
			_, v, _ := strings.Cut(arm, " : ")
			vals = append(vals, v)
		}
		slices.Sort(vals)
		return "numgen " + m[1] + " {" + strings.Join(slices.Compact(vals), ", ") + "}"
	})
	return single.ReplaceAllString(dump, "dnat to $1:$2")
}

// A partial sync keeps a dispatch rule's modulus while an endpoint is
// replaced: the leaver's key takes a copy of another endpoint and the
// replacement takes it back, with element changes only (no rule written,
// so the kernel does not validate the table); past ModulusHold, or when
// too many endpoints left, the rule gets the exact count again.
func TestPartialHoldsModulus(t *testing.T) {
	const hold = 10 * time.Second
	now := time.Unix(1_800_000_000, 0)
	cfg := testConfig()
	cfg.ModulusHold, cfg.Now = hold, func() time.Time { return now }
	r := New(cfg)
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	var eps []proxy.Endpoint
	for i := range 10 {
		eps = append(eps, ep(fmt.Sprintf("10.244.2.%d", 10+i), 8080, "node-b"))
	}
	s := svc("web", "10.96.0.80", 80, eps...)
	tx := fake.NewTransaction()
	st := r.Full(tx, []*proxy.Service{s}, nil, nil)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	full := func(s *proxy.Service) string {
		want, _, _ := load(t, []*proxy.Service{s})
		return sortedDump(want)
	}
	// step syncs s with endpoints eps (nil: none changed; due: the
	// service is due for its hold), in at most most endpoint-map element
	// operations, and reports whether the transaction rewrote a chain.
	step := func(what string, eps []proxy.Endpoint, due bool, most int) (rewrote bool) {
		t.Helper()
		changed := proxy.Changes{}
		if eps != nil { // nil: s unchanged
			next := *s
			next.Ports = slices.Clone(s.Ports)
			next.Ports[0].Endpoints = eps
			s = &next
			changed[s.Key()] = s
		}
		changed = st.WithHoldsDue([]*proxy.Service{s}, changed, hold, now)
		if _, ok := changed[s.Key()]; ok != (eps != nil || due) {
			t.Fatalf("%s: service changed %v, want %v", what, ok, eps != nil || due)
		}
		tx := fake.NewTransaction()
		st = r.partial(tx, st, changed)
		if n := endpointElementOps(tx); n > most {
			t.Errorf("%s: %d endpoint-map element operations, want at most %d:\n%s", what, n, most, tx)
		}
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return ruleOps.MatchString(tx.String())
	}
	without := func(i int) []proxy.Endpoint { return slices.Delete(slices.Clone(s.Ports[0].Endpoints), i, i+1) }

	// One leaves: mod 10 over nine endpoints, every one of them reached.
	if step("one left", without(3), false, 2) {
		t.Errorf("one left: the dispatch rule was rewritten")
	}
	got := sortedDump(fake)
	if !strings.Contains(got, "numgen random mod 10 ") {
		t.Errorf("one left: the modulus is not held:\n%s", got)
	}
	if diff := cmp.Diff(distinct(full(s)), distinct(got)); diff != "" {
		t.Errorf("one left: endpoints differ from a full sync's (-full +partial):\n%s", diff)
	}
	if d := st.NextHoldDue(hold, now); d != hold {
		t.Errorf("one left: next hold due in %s, want %s", d, hold)
	}

	// Its replacement joins 2 s later: exactly a full sync's table.
	now = now.Add(2 * time.Second)
	if step("replaced", append(slices.Clone(s.Ports[0].Endpoints), ep("10.244.2.99", 8080, "node-c")), false, 2) {
		t.Errorf("replaced: the dispatch rule was rewritten")
	}
	if diff := cmp.Diff(full(s), sortedDump(fake)); diff != "" {
		t.Errorf("replaced: table differs from a full sync (-full +partial):\n%s", diff)
	}
	if d := st.NextHoldDue(hold, now); d != 0 {
		t.Errorf("replaced: a hold is still due in %s", d)
	}

	// One leaves and nothing replaces it: held until the hold is due,
	// then the rule gets mod 9 in a sync of nothing else.
	step("another left", without(0), false, 2)
	now = now.Add(hold - time.Millisecond)
	if step("nothing changed, the hold not due", nil, false, 0) {
		t.Errorf("the hold not due: a rule was written")
	}
	now = now.Add(time.Millisecond)
	if !step("nothing changed, the hold due", nil, true, 3) {
		t.Errorf("the hold due: the dispatch rule was not rewritten")
	}
	if diff := cmp.Diff(full(s), sortedDump(fake)); diff != "" {
		t.Errorf("the hold due: table differs from a full sync (-full +partial):\n%s", diff)
	}
	if d := st.NextHoldDue(hold, now); d != 0 {
		t.Errorf("after the hold: a hold is still due in %s", d)
	}

	// Three of nine leave at once: more than a copy per four endpoints, so
	// the exact count at once.
	if !step("three left", s.Ports[0].Endpoints[3:], false, 9) {
		t.Errorf("three left: the dispatch rule was not rewritten")
	}
	if diff := cmp.Diff(full(s), sortedDump(fake)); diff != "" {
		t.Errorf("three left: table differs from a full sync (-full +partial):\n%s", diff)
	}

	// Down to one endpoint from two: mod 2 over it, not a plain DNAT.
	step("two", s.Ports[0].Endpoints[:2], false, 6)
	if step("one", s.Ports[0].Endpoints[:1], false, 2) {
		t.Errorf("one: the dispatch rule was rewritten")
	}
	if got := sortedDump(fake); !strings.Contains(got, "numgen random mod 2 ") {
		t.Errorf("one: the modulus is not held:\n%s", got)
	}
}

// ModulusHold off: every endpoint change that changes the count rewrites
// the rule, as before it existed.
func TestPartialModulusHoldOff(t *testing.T) {
	fake, r, st := load(t, []*proxy.Service{svc("web", "10.96.0.80", 80,
		ep("10.244.2.10", 8080, "node-b"), ep("10.244.2.11", 8080, "node-b"), ep("10.244.2.12", 8080, "node-b"))})
	s := svc("web", "10.96.0.80", 80, ep("10.244.2.10", 8080, "node-b"), ep("10.244.2.11", 8080, "node-b"))
	tx := fake.NewTransaction()
	st = r.Partial(tx, []*proxy.Service{s}, st, map[string]bool{s.Key(): true})
	if !ruleOps.MatchString(tx.String()) {
		t.Errorf("the rule was not rewritten:\n%s", tx)
	}
	if d := st.NextHoldDue(time.Second, time.Now()); d != 0 {
		t.Errorf("a hold is due in %s with ModulusHold 0", d)
	}
}

// The backend asks for a sync when a hold will be due, and that sync
// (with nothing changed) writes the exact count.
func TestBackendResyncsHeldModulus(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cfg := testConfig()
	cfg.ModulusHold, cfg.Now = 5*time.Second, func() time.Time { return now }
	f := nft.NewFake(knftables.IPv4Family, DefaultTable)
	b := NewBackend(f, cfg)
	eps := []proxy.Endpoint{ep("10.244.2.10", 8080, "node-b"), ep("10.244.2.11", 8080, "node-b"), ep("10.244.2.12", 8080, "node-b")}
	s := svc("web", "10.96.0.80", 80, eps...)
	ctx := context.Background()
	if res, err := b.Sync(ctx, []*proxy.Service{s}, nil, true); err != nil || res.ResyncAfter != 0 {
		t.Fatalf("full sync: %v, resync after %s", err, res.ResyncAfter)
	}
	less := svc("web", "10.96.0.80", 80, eps[:2]...)
	res, err := b.Sync(ctx, []*proxy.Service{less}, proxy.Changes{less.Key(): less}, false)
	if err != nil || res.ResyncAfter != 5*time.Second {
		t.Fatalf("partial sync: %v, resync after %s, want 5s", err, res.ResyncAfter)
	}
	now = now.Add(5 * time.Second)
	if res, err = b.Sync(ctx, []*proxy.Service{less}, nil, false); err != nil || res.ResyncAfter != 0 {
		t.Fatalf("resync: %v, resync after %s, want 0", err, res.ResyncAfter)
	}
	if tbl := f.Dump(); strings.Contains(tbl, "10.244.2.12") || !strings.Contains(tbl, "numgen random mod 2 ") {
		t.Errorf("after the resync the table still holds:\n%s", tbl)
	}
}
