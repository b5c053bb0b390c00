package iptables

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/netpoltest"
	"github.com/flatnet/flatnet/internal/testutil"
)

// trafficModel: pods a and b on either side of a router whose FORWARD
// holds the rules; every check of both directions, Admin tier and
// NetworkPolicy tier, decides one of the probes.
func trafficModel() []netpol.Pod {
	a := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: "a"}, IPs: []netip.Addr{addr("10.213.1.2"), addr("fd13:213:1::2")}}
	a.Egress.Admin = []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{entry("10.213.2.2/32", netpol.ProtoTCP, 81, 81)}, Rule: cnp("a-out", netpol.Egress, 0)}}
	a.Ingress = netpol.Rules{
		Admin:     []netpol.TierRule{{Action: netpol.Accept, Entries: []netpol.Entry{entry("fd13:213:2::2/128", netpol.ProtoTCP, 81, 81)}, Rule: cnp("a-in", netpol.Ingress, 0)}},
		Isolated:  true,
		Isolators: []netpol.RuleRef{np("x", "a", netpol.Ingress, -1)},
		Allowed:   []netpol.Allow{{Entry: entry("fd13:213:2::/64", netpol.ProtoTCP, 80, 80)}},
	}
	b := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: "b"}, IPs: []netip.Addr{addr("10.213.2.2"), addr("fd13:213:2::2")}}
	b.Egress.Admin = []netpol.TierRule{{Action: netpol.Deny, Entries: []netpol.Entry{entry("10.213.1.0/24", netpol.ProtoTCP, 80, 80)}, Rule: cnp("b-out", netpol.Egress, 0)}}
	b.Ingress = netpol.Rules{
		Isolated:  true,
		Isolators: []netpol.RuleRef{np("x", "b", netpol.Ingress, -1)},
		Allowed: []netpol.Allow{
			{Entry: entry("10.213.1.2/32", netpol.ProtoTCP, 80, 81)},
			{Entry: entry("fd13:213:1::/64", netpol.ProtoTCP, 80, 81)},
		},
	}
	return []netpol.Pod{a, b}
}

// useIPTables puts impl's ("nft" or "legacy") iptables-save/-restore
// first in PATH, under the names ipt.Runner runs.
func useIPTables(t *testing.T, impl string) {
	dir := t.TempDir()
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, verb := range []string{"save", "restore"} {
			path, err := exec.LookPath(fam + "-" + impl + "-" + verb)
			if err != nil {
				testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
			}
			if err := os.Symlink(path, filepath.Join(dir, fam+"-"+verb)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// TestRootTraffic applies a ruleset with the real iptables-restore, both
// iptables-nft and iptables-legacy, on a router (or bridge) namespace
// between two namespaces, and requires real TCP connections over IPv4 and IPv6 to be
// allowed or to time out as the model says; the kernel's save must read
// back what was written; Cleanup must leave nothing.
func TestRootTraffic(t *testing.T) { forEachIPTables(t, rootTraffic) }

// forEachIPTables runs test once with iptables-nft and once with
// iptables-legacy (when the kernel has ip_tables).
func forEachIPTables(t *testing.T, test func(*testing.T)) {
	testutil.RequireRoot(t)
	for _, impl := range []string{"nft", "legacy"} {
		t.Run(impl, func(t *testing.T) {
			useIPTables(t, impl)
			if impl == "legacy" {
				if _, err := os.Stat("/proc/net/ip_tables_names"); err != nil {
					testutil.Skip(t, "the kernel has no ip_tables (legacy iptables): %v; build it with CONFIG_IP_NF_IPTABLES", err)
				}
			}
			test(t)
		})
	}
}

// topology returns namespaces a (10.213.1.2, fd13:213:1::2) and b
// (10.213.2.2, fd13:213:2::2) joined through r: routed (r forwards), or
// bridged (one subnet on r's bridge, whose frames br_netfilter hands to
// the IP hooks, as between two pods of one node).
func topology(t *testing.T, bridged bool) (a, r, b string) {
	testutil.RequireFreeRange(t, "10.213.0.0/16", "fd13:213::/32")
	a, r, b = testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	if bridged {
		if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
			testutil.Skip(t, "br_netfilter is not loaded (modprobe br_netfilter): %v", err)
		}
		testutil.Wire(t, a, "a0", []string{"10.213.1.2/16", "fd13:213:1::2/32"}, r, "r1", nil)
		testutil.Wire(t, r, "r2", nil, b, "b0", []string{"10.213.2.2/16", "fd13:213:2::2/32"})
		rn := testutil.NSName(r)
		testutil.Run(t, "ip", "-n", rn, "link", "add", "br0", "type", "bridge")
		for _, dev := range []string{"r1", "r2"} {
			testutil.Run(t, "ip", "-n", rn, "link", "set", dev, "master", "br0")
		}
		testutil.Run(t, "ip", "-n", rn, "link", "set", "br0", "up")
		testutil.RunIn(t, r, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
		return a, r, b
	}
	testutil.Wire(t, a, "a0", []string{"10.213.1.2/24", "fd13:213:1::2/64"}, r, "r1", []string{"10.213.1.1/24", "fd13:213:1::1/64"})
	testutil.Wire(t, r, "r2", []string{"10.213.2.1/24", "fd13:213:2::1/64"}, b, "b0", []string{"10.213.2.2/24", "fd13:213:2::2/64"})
	for _, end := range []struct{ ns, v4, v6 string }{{a, "10.213.1.1", "fd13:213:1::1"}, {b, "10.213.2.1", "fd13:213:2::1"}} {
		testutil.Run(t, "ip", "-n", testutil.NSName(end.ns), "route", "add", "default", "via", end.v4)
		testutil.Run(t, "ip", "-n", testutil.NSName(end.ns), "-6", "route", "add", "default", "via", end.v6)
	}
	testutil.RunIn(t, r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return a, r, b
}

func rootTraffic(t *testing.T) {
	for _, bridged := range []bool{false, true} {
		t.Run(map[bool]string{false: "routed", true: "bridged"}[bridged], func(t *testing.T) { traffic(t, bridged) })
	}
}

func traffic(t *testing.T, bridged bool) {
	ctx := context.Background()
	a, r, b := topology(t, bridged)

	type probe struct {
		from, to string // namespace paths
		src, dst netip.Addr
		port     uint16
	}
	var probes []probe
	for _, ips := range [][2]string{{"10.213.1.2", "10.213.2.2"}, {"fd13:213:1::2", "fd13:213:2::2"}} {
		for _, port := range []uint16{80, 81} {
			probes = append(probes, probe{a, b, addr(ips[0]), addr(ips[1]), port}, probe{b, a, addr(ips[1]), addr(ips[0]), port})
		}
	}
	for _, p := range probes {
		testutil.EchoServer(t, p.to, net.JoinHostPort(p.dst.String(), fmt.Sprint(p.port)), "hi")
	}
	// check probes all in parallel (a denied one times out after 3 s).
	check := func(step string, model []netpol.Pod) {
		t.Helper()
		got := make([]error, len(probes))
		var wg sync.WaitGroup
		for i, p := range probes {
			wg.Go(func() {
				_, got[i] = testutil.Ask(p.from, net.JoinHostPort(p.dst.String(), fmt.Sprint(p.port)))
			})
		}
		wg.Wait()
		allowed := 0
		for i, p := range probes {
			w := netpoltest.Allowed(model, p.src, p.dst, netpol.ProtoTCP, p.port)
			var ne net.Error
			switch {
			case (got[i] == nil) != w:
				t.Errorf("%s: %s -> %s:%d: error %v, want allowed=%v", step, p.src, p.dst, p.port, got[i], w)
			case got[i] != nil && !(errors.As(got[i], &ne) && ne.Timeout()):
				t.Errorf("%s: %s -> %s:%d: %v, want a timeout (a deny drops, never rejects)", step, p.src, p.dst, p.port, got[i])
			}
			if got[i] == nil {
				allowed++
			}
		}
		t.Logf("%s: %d of %d probes allowed, as the model says", step, allowed, len(probes))
	}
	check("no rules", nil)

	runner := ipt.New()
	s := NewSyncer(runner)
	inR := func(f func() error) {
		t.Helper()
		if err := netns.Do(r, f); err != nil {
			t.Fatal(err)
		}
	}
	model := trafficModel()
	rs := Render(model)
	inR(func() error { _, err := s.Sync(ctx, rs, false); return err })
	// The kernel's save reads back our rules as written (canonical form).
	for _, fam := range Families {
		inR(func() error {
			tb, err := runner.Save(ctx, fam, Table)
			if err != nil {
				return err
			}
			if fwd := tb.RulesIn(Forward); len(fwd) != 1 || !slices.Equal(fwd[0].Args, JumpRule) {
				t.Errorf("%s FORWARD: %v, want only %q", fam, fwd, JumpRule)
			}
			for chain, rules := range rs.Families[fam] {
				got := tb.RulesIn(chain)
				if !slices.EqualFunc(got, rules, func(g ipt.Rule, w Rule) bool { return slices.Equal(g.Args, w) }) {
					t.Errorf("%s chain %s: the kernel has\n%v\nwant\n%v", fam, chain, got, rules)
				}
			}
			return nil
		})
	}
	check("model", model)

	// An incremental change: a's egress deny goes.
	model[0].Egress.Admin = nil
	inR(func() error {
		res, err := s.Sync(ctx, Render(model), false)
		if err == nil && (res.Full || res.Restores != 1) {
			t.Errorf("incremental sync: %+v, want one restore", res)
		}
		return err
	})
	check("a's egress deny removed", model)

	inR(func() error {
		removed, err := Cleanup(ctx, runner)
		if err != nil || !removed {
			return fmt.Errorf("cleanup: removed %v, %w", removed, err)
		}
		for _, fam := range Families {
			tb, err := runner.Save(ctx, fam, Table)
			if err != nil {
				return err
			}
			if len(tb.RulesIn(Forward)) != 0 || slices.ContainsFunc(tb.Chains, Ours) {
				t.Errorf("%s after Cleanup: chains %v, FORWARD %v", fam, tb.Chains, tb.RulesIn(Forward))
			}
		}
		return nil
	})
	check("after cleanup", nil)
}

// scaleModel is netpoltest.Scale plus the topology's b, sorted last,
// whose last allow is a's port 80.
func scaleModel() []netpol.Pod {
	pods := netpoltest.Scale()
	b := netpol.Pod{Pod: types.NamespacedName{Namespace: "zz", Name: "b"}, IPs: []netip.Addr{addr("10.213.2.2")}}
	b.Ingress.Isolated = true
	b.Ingress.Allowed = append(slices.Clone(pods[0].Ingress.Allowed), netpol.Allow{Entry: entry("10.213.1.2/32", netpol.ProtoTCP, 80, 80)})
	return append(pods, b)
}

// TestRootScale logs what the fallback costs at scale with the real
// iptables-nft and iptables-legacy: a full sync, an incremental one after
// one pod's change, and the rate of new TCP connections from a to b when
// b's rules come last (every pod's jump, then 100 allows, walked per new
// flow), against no rules. Figures only: nothing is asserted on them.
func TestRootScale(t *testing.T) { forEachIPTables(t, rootScale) }

func rootScale(t *testing.T) {
	ctx := context.Background()
	a, r, b := topology(t, false)
	server := testutil.EchoServer(t, b, "10.213.2.2:80", "hi")
	rate := func() float64 {
		start, n := time.Now(), 0
		for time.Since(start) < 2*time.Second {
			if _, err := testutil.Ask(a, server); err != nil {
				t.Fatalf("a -> b:80: %v", err)
			}
			n++
		}
		return float64(n) / time.Since(start).Seconds()
	}
	before := rate()
	model := scaleModel()
	s := NewSyncer(ipt.New(), ipt.IPv4)
	var full, incr time.Duration
	rs := Render(model)
	err := netns.Do(r, func() error {
		start := time.Now()
		if _, err := s.Sync(ctx, rs, false); err != nil {
			return err
		}
		full = time.Since(start)
		model[0].Ingress.Allowed = model[0].Ingress.Allowed[1:]
		start = time.Now()
		if _, err := s.Sync(ctx, Render(model), false); err != nil {
			return err
		}
		incr = time.Since(start)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rules are in force: b's port 81 is not allowed (no server: a
	// refusal without the rules, a timeout with them).
	var ne net.Error
	if _, err := testutil.Ask(a, "10.213.2.2:81"); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a -> b:81 through the rules: %v, want a timeout", err)
	}
	with := rate()
	if err := netns.Do(r, func() error { _, err := Cleanup(ctx, ipt.New()); return err }); err != nil {
		t.Fatal(err)
	}
	without := (before + rate()) / 2
	t.Logf("%d pods, %d rules: full sync %s, one pod changed %s; new connections a -> b %.0f/s without rules (mean of before and after), %.0f/s through them (%.0f %%)",
		rs.Pods, rs.NumRules(), full.Round(time.Millisecond), incr.Round(time.Millisecond), without, with, 100*with/without)
}
