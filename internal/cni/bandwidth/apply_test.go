package bandwidth

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/tc"
)

// fakeHost is a fake host namespace with one host veth.
func fakeHost(t *testing.T) (*tc.Fake, tc.Link) {
	t.Helper()
	k := tc.NewFake()
	h := veth
	h.Index = k.AddLink(h)
	return k, h
}

func bothPlan(t *testing.T, host tc.Link, owner Owner) *Plan {
	t.Helper()
	p, err := NewPlan(&Config{Ingress: Limit{10_000_000, 100_000}, Egress: Limit{20_000_000, 200_000}}, owner, host, clock)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var owner = Owner{"net", "ctr1", "eth0"}

func TestApplyAndCheck(t *testing.T) {
	k, host := fakeHost(t)
	p := bothPlan(t, host, owner)
	ifb, _, err := apply(k, p, owner)
	if err != nil {
		t.Fatal(err)
	}
	if ifb == nil || ifb.Name != p.IFB {
		t.Fatalf("apply returned IFB %+v", ifb)
	}
	want := fmt.Sprintf("1 veth1234 veth root=tbf(%v) ingress redirect=[2]\n2 %s ifb alias=flatnet-bw:net:ctr1:eth0 root=tbf(%v)\n",
		*p.Ingress, p.IFB, *p.Egress)
	if got := k.Dump(); got != want {
		t.Errorf("after apply:\n%s\nwant:\n%s", got, want)
	}
	if err := check(k, p); err != nil {
		t.Errorf("check after apply: %v", err)
	}
	// A second plan for the same attachment, with other limits, fails CHECK.
	p2, _ := NewPlan(&Config{Ingress: Limit{5_000_000, 100_000}, Egress: Limit{20_000_000, 200_000}}, owner, host, clock)
	if code, _ := cnierr.Code(check(k, p2)); code != cnierr.CheckFailed {
		t.Errorf("check with another ingress rate: code %d, want 106", code)
	}
}

func TestApplyUndo(t *testing.T) {
	k, host := fakeHost(t)
	p := bothPlan(t, host, owner)
	before := k.Dump()
	_, undo, err := apply(k, p, owner)
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if got := k.Dump(); got != before {
		t.Errorf("after undo:\n%s\nwant:\n%s", got, before)
	}
}

// Whatever step fails, nothing is left behind, and a missing kernel
// feature is code 105.
func TestApplyRollsBackEveryStep(t *testing.T) {
	for _, op := range []string{"AddIFB", "SetRootTBF:ifb", "AddIngress", "AddRedirect", "SetRootTBF:veth"} {
		for _, feature := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/feature=%v", op, feature), func(t *testing.T) {
				k, host := fakeHost(t)
				p := bothPlan(t, host, owner)
				before := k.Dump()
				injected := errors.New("injected")
				if feature {
					injected = &tc.FeatureError{Feature: "X", Hint: "load X", Err: errors.New("not supported")}
				}
				k.Fail = func(o, link string) error {
					name, which, _ := strings.Cut(op, ":")
					if o != name {
						return nil
					}
					if which == "ifb" && !strings.HasPrefix(link, "bwp") || which == "veth" && link != host.Name {
						return nil
					}
					return injected
				}
				ifb, undo, err := apply(k, p, owner)
				if err == nil || ifb != nil || undo != nil {
					t.Fatalf("apply = %v, undo set %v, %v; want failure", ifb, undo != nil, err)
				}
				code, _ := cnierr.Code(err)
				if feature && code != cnierr.KernelFeatureMissing {
					t.Errorf("feature missing: code %d, want 105 (%v)", code, err)
				}
				if !feature && code == cnierr.KernelFeatureMissing {
					t.Errorf("plain failure classified as 105: %v", err)
				}
				if got := k.Dump(); got != before {
					t.Errorf("after failed apply:\n%s\nwant:\n%s", got, before)
				}
			})
		}
	}
}

func TestApplyReplacesLeftovers(t *testing.T) {
	for _, alias := range []string{"", "flatnet-bw:net:ctr1:eth0"} {
		k, host := fakeHost(t)
		p := bothPlan(t, host, owner)
		// A leftover IFB of this attachment (a retried ADD; or the
		// reference's, which has no alias) and a stale ingress qdisc.
		if _, err := k.AddIFB(p.IFB, alias, 1500); err != nil {
			t.Fatal(err)
		}
		if err := k.AddIngress(host.Index); err != nil {
			t.Fatal(err)
		}
		if _, _, err := apply(k, p, owner); err != nil {
			t.Fatalf("alias %q: %v", alias, err)
		}
		if err := check(k, p); err != nil {
			t.Errorf("alias %q: check: %v", alias, err)
		}
		ifbs, _ := k.IFBs()
		if len(ifbs) != 1 {
			t.Errorf("alias %q: %d IFBs", alias, len(ifbs))
		}
	}
}

func TestApplyConflict(t *testing.T) {
	k, host := fakeHost(t)
	p := bothPlan(t, host, owner)
	// Same container and network, another interface: same IFB name.
	if _, err := k.AddIFB(p.IFB, "flatnet-bw:net:ctr1:net1", 1500); err != nil {
		t.Fatal(err)
	}
	before := k.Dump()
	_, _, err := apply(k, p, owner)
	if code, _ := cnierr.Code(err); code != cnierr.InterfaceExists || !strings.Contains(err.Error(), "net1") {
		t.Errorf("got %v (code %d), want 104 naming the owner", err, code)
	}
	if got := k.Dump(); got != before {
		t.Errorf("conflict changed state:\n%s\nwant:\n%s", got, before)
	}
}

func TestCheckFindsEachDifference(t *testing.T) {
	for _, tt := range []struct {
		name   string
		break_ func(k *tc.Fake, host, ifb tc.Link)
		msg    string
	}{
		{"host root TBF gone", func(k *tc.Fake, host, _ tc.Link) { k.DeleteRoot(host.Index) }, "no TBF root qdisc"},
		{"host root not TBF", func(k *tc.Fake, host, _ tc.Link) { k.SetOtherRoot(host.Index, "fq_codel") }, "no TBF root qdisc"},
		{"IFB gone", func(k *tc.Fake, _, ifb tc.Link) { k.DeleteLink(ifb.Index) }, "is missing"},
		{"IFB TBF changed", func(k *tc.Fake, _, ifb tc.Link) { k.SetRootTBF(ifb.Index, tc.TBF{Rate: 1, Buffer: 2, Limit: 3}) }, "want rate"},
		{"IFB down", func(k *tc.Fake, _, ifb tc.Link) { k.SetDown(ifb.Index) }, "is down"},
		{"ingress qdisc gone", func(k *tc.Fake, host, _ tc.Link) { k.DeleteIngress(host.Index) }, "no ingress qdisc"},
		{"redirect to another device", func(k *tc.Fake, host, _ tc.Link) {
			k.DeleteIngress(host.Index)
			k.AddIngress(host.Index)
			k.AddRedirect(host.Index, 99)
		}, "no filter redirecting"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k, host := fakeHost(t)
			p := bothPlan(t, host, owner)
			ifb, _, err := apply(k, p, owner)
			if err != nil {
				t.Fatal(err)
			}
			tt.break_(k, host, *ifb)
			err = check(k, p)
			if code, _ := cnierr.Code(err); code != cnierr.CheckFailed || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v (code %d), want 106 mentioning %q", err, code, tt.msg)
			}
		})
	}
}

func TestTeardown(t *testing.T) {
	k, host := fakeHost(t)
	p := bothPlan(t, host, owner)
	if _, _, err := apply(k, p, owner); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // idempotent
		if err := teardown(k, k, owner); err != nil {
			t.Fatalf("teardown #%d: %v", i+1, err)
		}
		if ifbs, _ := k.IFBs(); len(ifbs) != 0 {
			t.Errorf("teardown #%d left %v", i+1, ifbs)
		}
	}
	// A reference-made IFB (no alias) is removed too; another
	// attachment's IFB of the same name, or a non-IFB link, is not.
	for _, tt := range []struct {
		alias, kind string
		removed     bool
	}{{"", "ifb", true}, {"flatnet-bw:net:ctr1:net1", "ifb", false}, {"", "veth", false}} {
		k := tc.NewFake()
		k.AddLink(tc.Link{Name: p.IFB, Alias: tt.alias, Kind: tt.kind})
		if err := teardown(k, k, owner); err != nil {
			t.Fatal(err)
		}
		_, ok, _ := k.LinkByName(p.IFB)
		if ok == tt.removed {
			t.Errorf("alias %q kind %s: removed %v, want %v", tt.alias, tt.kind, !ok, tt.removed)
		}
	}
}

func TestCollect(t *testing.T) {
	k := tc.NewFake()
	mk := func(o Owner) string {
		n := IFBName(o.Network, o.ContainerID)
		k.AddLink(tc.Link{Name: n, Kind: "ifb", Alias: o.Alias()})
		return n
	}
	live := mk(Owner{"net", "live", "eth0"})
	stale := mk(Owner{"net", "stale", "eth0"})
	otherIf := mk(Owner{"net2", "live", "net1"}) // another network: never ours to collect
	otherNet := mk(Owner{"other", "gone", "eth0"})
	// Reference-made IFBs, without alias.
	refLive := IFBName("net", "reflive")
	k.AddLink(tc.Link{Name: refLive, Kind: "ifb"})
	refOrphan := IFBName("net", "refgone")
	k.AddLink(tc.Link{Name: refOrphan, Kind: "ifb"})
	refInUse := IFBName("elsewhere", "x") // still the target of a live veth's redirect
	inUse := k.AddLink(tc.Link{Name: refInUse, Kind: "ifb"})
	v := k.AddLink(tc.Link{Name: "vethx", Kind: "veth"})
	k.AddIngress(v)
	k.AddRedirect(v, inUse)
	k.AddLink(tc.Link{Name: "someifb", Kind: "ifb"}) // not a bandwidth IFB at all

	valid := map[plugin.Attachment]bool{{ContainerID: "live", IfName: "eth0"}: true, {ContainerID: "reflive", IfName: "eth0"}: true}
	removed, err := collect(k, "net", valid)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{stale, refOrphan}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, n := range []string{live, otherIf, otherNet, refLive, refInUse, "someifb"} {
		if _, ok, _ := k.LinkByName(n); !ok {
			t.Errorf("GC removed %s", n)
		}
	}
	// Nothing left to collect: a second GC removes nothing.
	if removed, err := collect(k, "net", valid); err != nil || len(removed) != 0 {
		t.Errorf("second GC removed %v, %v", removed, err)
	}
}

func TestCollectKeepsGoing(t *testing.T) {
	k := tc.NewFake()
	for _, c := range []string{"a", "b", "c"} {
		o := Owner{"net", c, "eth0"}
		k.AddLink(tc.Link{Name: IFBName("net", c), Kind: "ifb", Alias: o.Alias()})
	}
	bad := IFBName("net", "b")
	k.Fail = func(op, link string) error {
		if op == "DeleteLink" && link == bad {
			return errors.New("injected")
		}
		return nil
	}
	removed, err := collect(k, "net", nil)
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("want an error naming %s, got %v", bad, err)
	}
	if len(removed) != 2 {
		t.Errorf("removed %v, want the two others", removed)
	}
}
