package routes

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func peer(name, cidr, ip string) Peer {
	p := Peer{Name: name}
	if cidr != "" {
		p.PodCIDRs = []string{cidr}
	}
	if ip != "" {
		p.InternalIPs = []string{ip}
	}
	return p
}

func lines(rs []Route) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.String() + " (" + r.Node + ")\n")
	}
	return b.String()
}

func TestDesired(t *testing.T) {
	peers := []Peer{
		peer("n3", "10.244.3.0/24", "10.250.0.13"),
		peer("n1", "10.244.1.0/24", "10.250.0.11"), // self
		peer("n2", "10.244.2.0/24", "10.250.0.12"),
		peer("new", "", "10.250.0.14"),             // no podCIDR yet: skipped quietly
		peer("noip", "10.244.5.0/24", ""),          // cannot be routed
		peer("dup", "10.244.3.0/24", "10.250.0.9"), // n3's subnet (dup sorts first: it wins, n3 is reported)
		peer("thief", "10.244.1.0/24", "10.250.0.8"),
		{Name: "ds", PodCIDRs: []string{"10.244.6.0/24", "fd00:6::/64"}, InternalIPs: []string{"fd00:250::16", "10.250.0.16"}},
		{Name: "bad", PodCIDRs: []string{"x"}, InternalIPs: []string{"y"}},
	}
	got, problems := Desired("n1", peers)
	want := `10.244.2.0/24 via 10.250.0.12 (n2)
10.244.3.0/24 via 10.250.0.9 (dup)
10.244.6.0/24 via 10.250.0.16 (ds)
fd00:6::/64 via fd00:250::16 (ds)
`
	if d := cmp.Diff(want, lines(got)); d != "" {
		t.Errorf("routes (-want +got):\n%s", d)
	}
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Error())
	}
	joined := strings.Join(msgs, "\n")
	for _, s := range []string{
		`node bad: InternalIP "y"`, `node bad: podCIDR "x"`,
		"node n3: podCIDR 10.244.3.0/24 is also node dup's",
		"node noip: no InternalIP",
		"node thief: podCIDR 10.244.1.0/24 is also node n1's",
	} {
		if !strings.Contains(joined, s) {
			t.Errorf("problems lack %q:\n%s", s, joined)
		}
	}
	if len(problems) != 5 {
		t.Errorf("%d problems:\n%s", len(problems), joined)
	}
}

func TestSyncAddChangeRemove(t *testing.T) {
	k := NewFake()
	k.Foreign = []netip.Prefix{netip.MustParsePrefix("10.250.0.0/24")}
	// A route we owned for a node that is gone by the time we start.
	k.Owned[netip.MustParsePrefix("10.244.9.0/24")] = Route{Dst: netip.MustParsePrefix("10.244.9.0/24"), Gw: netip.MustParseAddr("10.250.0.19")}

	step := func(peers []Peer, wantDump string, wantOps int) Plan {
		t.Helper()
		desired, problems := Desired("n1", peers)
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		k.Ops = 0
		p, err := Sync(k, desired)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(wantDump, k.Dump()); d != "" {
			t.Errorf("routes (-want +got):\n%s", d)
		}
		if k.Ops != wantOps {
			t.Errorf("%d kernel ops, want %d (plan %+v)", k.Ops, wantOps, p)
		}
		return p
	}
	three := []Peer{peer("n1", "10.244.1.0/24", "10.250.0.11"), peer("n2", "10.244.2.0/24", "10.250.0.12"), peer("n3", "10.244.3.0/24", "10.250.0.13")}
	step(three, "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.0.13\n", 3) // 2 adds, 1 stale delete
	// Idempotent: the same input changes nothing.
	if p := step(three, "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.0.13\n", 0); !p.Empty() {
		t.Errorf("second sync planned %+v", p)
	}
	// n3 changes its InternalIP: one replace.
	moved := []Peer{three[0], three[1], peer("n3", "10.244.3.0/24", "10.250.0.23")}
	step(moved, "10.244.2.0/24 via 10.250.0.12\n10.244.3.0/24 via 10.250.0.23\n", 1)
	// n2 leaves: its route goes.
	step([]Peer{three[0], moved[2]}, "10.244.3.0/24 via 10.250.0.23\n", 1)
	// Everyone leaves.
	step(nil, "", 1)
}

func TestSyncConflictsAndFailures(t *testing.T) {
	k := NewFake()
	k.Foreign = []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")} // e.g. a leftover static route
	k.Reachable = netip.MustParsePrefix("10.250.0.0/24")
	desired, _ := Desired("n1", []Peer{
		peer("n2", "10.244.2.0/24", "10.250.0.12"),
		peer("far", "10.244.3.0/24", "192.168.7.7"),
		peer("ok", "10.244.4.0/24", "10.250.0.14"),
	})
	p, err := Sync(k, desired)
	if err == nil {
		t.Fatal("no error")
	}
	if len(p.Conflicts) != 1 || !strings.Contains(err.Error(), "already has a route to 10.244.2.0/24 that flatnet does not own") ||
		!strings.Contains(err.Error(), "route 10.244.3.0/24 via 192.168.7.7 to node far") {
		t.Errorf("error: %v", err)
	}
	// One bad peer does not block the others.
	if k.Dump() != "10.244.4.0/24 via 10.250.0.14\n" {
		t.Errorf("routes:\n%s", k.Dump())
	}
}

func TestMakePlanDuplicateOwned(t *testing.T) {
	d := netip.MustParsePrefix("10.244.2.0/24")
	gw := netip.MustParseAddr("10.250.0.12")
	p := MakePlan([]Route{{Dst: d, Gw: gw}}, []Route{{Dst: d, Gw: gw}, {Dst: d, Gw: gw}}, nil)
	if len(p.Delete) != 1 || len(p.Replace) != 0 {
		t.Errorf("plan %+v", p)
	}
}

type failingKernel struct{ Fake }

func (failingKernel) List() ([]Route, []netip.Prefix, error) { return nil, nil, errors.New("boom") }

func TestSyncListFails(t *testing.T) {
	if _, err := Sync(&failingKernel{}, nil); err == nil || !strings.Contains(err.Error(), "reading routes: boom") {
		t.Errorf("err %v", err)
	}
}

// FuzzDesired: Node fields come from the API server and may hold anything;
// nothing may panic, and every route must be routable (gateway of the
// destination's family).
func FuzzDesired(f *testing.F) {
	f.Add("n1", "10.244.1.0/24", "10.250.0.11", "n2", "10.244.2.0/24", "10.250.0.12")
	f.Add("a", "fd00::/64", "::ffff:1.2.3.4", "b", "::ffff:10.0.0.0/104", "fd00::1")
	f.Fuzz(func(t *testing.T, n1, c1, ip1, n2, c2, ip2 string) {
		rs, _ := Desired(n1, []Peer{peer(n1, c1, ip1), peer(n2, c2, ip2)})
		seen := map[netip.Prefix]bool{}
		for _, r := range rs {
			if r.Dst.Addr().Is4() != r.Gw.Is4() || seen[r.Dst] || r.Node == n1 {
				t.Fatalf("bad route %v (node %s, self %s)", r, r.Node, n1)
			}
			seen[r.Dst] = true
		}
	})
}
