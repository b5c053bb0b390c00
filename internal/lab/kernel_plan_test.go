package lab

import (
	"net/netip"
	"strings"
	"testing"
)

func fixLines(fixes []fix) string {
	var b strings.Builder
	for _, f := range fixes {
		b.WriteString(f.String() + "\n")
	}
	return b.String()
}

// fakeLab returns a Spec and a fake kernel with nothing of it.
func fakeLab(t *testing.T, o Options, underlays ...string) (*Spec, *fakeKernel, kernel) {
	t.Helper()
	var ps []netip.Prefix
	for _, u := range underlays {
		ps = append(ps, netip.MustParsePrefix(u))
	}
	s, err := NewSpec(o, ps...)
	if err != nil {
		t.Fatal(err)
	}
	fk := newFakeKernel()
	return s, fk, kernel{io: fk}
}

// TestKernelPlanNewLab: on an empty machine, every object of every part
// is one fix, in an order the fake (which refuses a link on a missing
// bridge or namespace) accepts; once applied, nothing is left to fix.
func TestKernelPlanNewLab(t *testing.T) {
	o := opts("k", 1)
	o.External, o.LBPool = true, DefaultLBPool
	s, _, k := fakeLab(t, o, "10.250.0.0/24")
	fixes := mustPlan(t, k, s)
	want := `underlay: create bridge fl-k in the host
underlay: add 10.250.0.1/24 to fl-k in the host
underlay: set fl-k up in the host
node k-node1: create netns fl-k-n1
node k-node1: create veth fl-k-n1 on fl-k in the host <-> eth0 (0a:58:0a:fa:00:0b) in netns fl-k-n1
node k-node1: set lo up in netns fl-k-n1
node k-node1: add 10.250.0.11/24 to eth0 in netns fl-k-n1
node k-node1: set eth0 up in netns fl-k-n1
node k-node1: route 10.96.0.0/16 dev eth0 in netns fl-k-n1
node k-node1: sysctl net.ipv4.ip_forward=1 in netns fl-k-n1
external host: create netns fl-k-ext
external host: create veth fx-k on fl-k in the host <-> eth0 (0a:58:0a:fa:00:fa) in netns fl-k-ext
external host: set lo up in netns fl-k-ext
external host: add 10.250.0.250/24 to eth0 in netns fl-k-ext
external host: set eth0 up in netns fl-k-ext
external host: route 10.251.0.0/24 via 10.250.0.11 dev eth0 in netns fl-k-ext
`
	if got := fixLines(fixes); got != want {
		t.Errorf("fixes:\n%s\nwant:\n%s", got, want)
	}
	for _, id := range []partID{partUnderlay, nodePart("k-node1"), partExternal} {
		if ready(fixes, id) {
			t.Errorf("%s ready on an empty machine", id)
		}
	}
	if err := k.apply(fixes); err != nil {
		t.Fatal(err)
	}
	if fixes := mustPlan(t, k, s); len(fixes) != 0 {
		t.Fatalf("fixes after applying the plan:\n%s", fixLines(fixes))
	}
}

// TestKernelPlanDrift: a ready two-subnet lab with an external host, one
// invariant broken at a time in the fake kernel: the plan lists exactly
// the fixes for it (one per drifted invariant; a lost link takes what was
// on it), and once they are applied the lab is ready again.
func TestKernelPlanDrift(t *testing.T) {
	o := twoSubnetOpts("k", 3)
	o.LBPool = DefaultLBPool
	n1, n2, rt, ext := NetnsPath("fl-k-n1"), NetnsPath("fl-k-n2"), NetnsPath("fl-k-rt"), NetnsPath("fl-k-ext")
	setLink := func(fk *fakeKernel, ns, name string, fn func(*linkView)) {
		l := fk.v[ns].links[name]
		fn(&l)
		fk.v[ns].links[name] = l
	}
	// rewired1 is node 1 with a new veth pair: everything on eth0 again.
	rewired1 := `node k-node1: create veth fl-k-n1 on fl-k in the host <-> eth0 (0a:58:0a:fa:00:0b) in netns fl-k-n1
node k-node1: add 10.250.0.11/24 to eth0 in netns fl-k-n1
node k-node1: set eth0 up in netns fl-k-n1
node k-node1: route 10.250.1.0/24 via 10.250.0.254 dev eth0 in netns fl-k-n1
node k-node1: route 10.96.0.0/16 dev eth0 in netns fl-k-n1
`
	for _, c := range []struct {
		name  string
		drift func(fk *fakeKernel)
		want  string
	}{
		{"a node's service route gone", func(fk *fakeKernel) { fk.dropRoute(n1, netip.MustParsePrefix("10.96.0.0/16")) },
			"node k-node1: route 10.96.0.0/16 dev eth0 in netns fl-k-n1\n"},
		{"a node's route to the other subnet points elsewhere", func(fk *fakeKernel) {
			fk.dropRoute(n2, netip.MustParsePrefix("10.250.0.0/24"))
			fk.v[n2].routes = append(fk.v[n2].routes, onEth0(netip.MustParsePrefix("10.250.0.0/24"), netip.MustParseAddr("10.250.1.99")))
		}, "node k-node2: route 10.250.0.0/24 via 10.250.1.1 dev eth0 in netns fl-k-n2\n"},
		{"forwarding off in the router", func(fk *fakeKernel) { fk.v[rt].sysctls[ipForward] = "0" },
			"router: sysctl net.ipv4.ip_forward=1 in netns fl-k-rt\n"},
		{"the host address gone", func(fk *fakeKernel) { setLink(fk, "", "fl-k", func(l *linkView) { l.addrs = nil }) },
			"underlay: add 10.250.0.1/24 to fl-k in the host\n"},
		{"the host route to the second underlay gone", func(fk *fakeKernel) { fk.dropRoute("", netip.MustParsePrefix("10.250.1.0/24")) },
			"underlay: route 10.250.1.0/24 via 10.250.0.254 dev fl-k in the host\n"},
		{"the second underlay's bridge down", func(fk *fakeKernel) { setLink(fk, rt, "underlay2", func(l *linkView) { l.up = false }) },
			"router: set underlay2 up in netns fl-k-rt\n"},
		{"a host veth detached and down", func(fk *fakeKernel) {
			setLink(fk, "", "fl-k-n3", func(l *linkView) { l.master, l.up = "", false })
		}, "node k-node3: attach fl-k-n3 to fl-k in the host\nnode k-node3: set fl-k-n3 up in the host\n"},
		{"lo down in the external host", func(fk *fakeKernel) { setLink(fk, ext, "lo", func(l *linkView) { l.up = false }) },
			"external host: set lo up in netns fl-k-ext\n"},
		{"an ECMP nexthop missing", func(fk *fakeKernel) {
			fk.dropRoute(ext, netip.MustParsePrefix(DefaultLBPool))
			fk.v[ext].routes = append(fk.v[ext].routes, onEth0(netip.MustParsePrefix(DefaultLBPool), netip.MustParseAddr("10.250.0.11")))
		}, "external host: route 10.251.0.0/24 via 10.250.0.11 10.250.0.13 dev eth0 in netns fl-k-ext\n"},
		{"the multipath hash policy reset", func(fk *fakeKernel) { fk.v[ext].sysctls["net.ipv4.fib_multipath_hash_policy"] = "0" },
			"external host: sysctl net.ipv4.fib_multipath_hash_policy=1 in netns fl-k-ext\n"},
		{"a node's eth0 deleted (its host veth goes with it)", func(fk *fakeKernel) { fk.deleteLink(n1, "eth0") }, rewired1},
		{"a host veth without its eth0", func(fk *fakeKernel) {
			delete(fk.peers, nsLink{n1, "eth0"})
			delete(fk.peers, nsLink{"", "fl-k-n1"})
			fk.deleteLink(n1, "eth0")
		}, "node k-node1: delete fl-k-n1 (its eth0 in netns fl-k-n1 is gone) in the host\n" + rewired1},
		{"the router rebuilt from nothing", func(fk *fakeKernel) {
			if err := fk.apply(fix{op: fixDeleteNetns, ns: rt}); err != nil {
				panic(err)
			}
		}, `router: create netns fl-k-rt
router: create veth fr-k on fl-k in the host <-> eth0 (0a:58:0a:fa:00:fe) in netns fl-k-rt
router: set lo up in netns fl-k-rt
router: add 10.250.0.254/24 to eth0 in netns fl-k-rt
router: set eth0 up in netns fl-k-rt
router: sysctl net.ipv4.ip_forward=1 in netns fl-k-rt
router: create bridge underlay2 in netns fl-k-rt
router: add 10.250.1.1/24 to underlay2 in netns fl-k-rt
router: set underlay2 up in netns fl-k-rt
node k-node2: create veth fl-k-n2 on underlay2 in netns fl-k-rt <-> eth0 (0a:58:0a:fa:01:0c) in netns fl-k-n2
node k-node2: add 10.250.1.12/24 to eth0 in netns fl-k-n2
node k-node2: set eth0 up in netns fl-k-n2
node k-node2: route 10.250.0.0/24 via 10.250.1.1 dev eth0 in netns fl-k-n2
node k-node2: route 10.96.0.0/16 dev eth0 in netns fl-k-n2
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, fk, k := fakeLab(t, o, "10.250.0.0/24", "10.250.1.0/24")
			applyPlan(t, k, s)
			c.drift(fk)
			fixes := mustPlan(t, k, s)
			if got := fixLines(fixes); got != c.want {
				t.Errorf("fixes:\n%s\nwant:\n%s", got, c.want)
			}
			// Only a re-made namespace or veth restarts what runs inside.
			for _, id := range []partID{partRouter, nodePart("k-node1"), nodePart("k-node2"), nodePart("k-node3"), partExternal} {
				if want := strings.Contains(c.want, string(id)+": create"); rewired(fixes, id) != want {
					t.Errorf("%s rewired = %v, want %v", id, !want, want)
				}
			}
			if err := k.apply(fixes); err != nil {
				t.Fatal(err)
			}
			if fixes := mustPlan(t, k, s); len(fixes) != 0 {
				t.Errorf("fixes after repair:\n%s", fixLines(fixes))
			}
		})
	}
}

// TestKernelPlanRefuses: an interface of another kind under a lab's name
// is not replaced: the part is not ready, and applying says what to do.
func TestKernelPlanRefuses(t *testing.T) {
	s, fk, k := fakeLab(t, opts("k", 1), "10.250.0.0/24")
	fk.v[""].links["fl-k"] = linkView{kind: "dummy", up: true}
	fk.v[""].links["fl-k-n1"] = linkView{kind: "dummy"}
	fixes := mustPlan(t, k, s)
	want := `underlay: cannot fix: interface fl-k exists and is a dummy, not the lab's bridge; remove it or pick another --name in the host
node k-node1: create netns fl-k-n1
node k-node1: cannot fix: interface fl-k-n1 exists and is a dummy, not the lab's veth to fl-k-n1; remove it in the host
`
	if got := fixLines(fixes); got != want {
		t.Errorf("fixes:\n%s\nwant:\n%s", got, want)
	}
	err := k.apply(fixesOf(fixes, partUnderlay))
	if err == nil || !strings.Contains(err.Error(), "interface fl-k exists and is a dummy, not the lab's bridge; remove it") {
		t.Errorf("apply: %v", err)
	}
}
