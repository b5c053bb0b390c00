package portmap

// Hairpin through a bridge: pod A reaches pod B's hostPort on the node's
// own address, and B sits on the same bridge as A. After DNAT, B's answer
// is addressed to A, an address on B's own link, so it crosses the bridge
// straight to A; only with br_netfilter (bridge-nf-call-iptables=1) does
// that bridged reply pass conntrack and get its source turned back into
// the node's address. Masquerading the hairpin connection makes B answer
// the bridge's address, so the reply goes through the node's IP stack and
// works either way. The namespaces are the test's own:
//
//	out (client)  10.232.200.2 / fd00:232:200::2
//	   | eth0 <-> fnpo*
//	node          10.232.200.1 / fd00:232:200::1 (the node address)
//	              bridge fnb* 10.232.0.1/24, fd00:232::1/64 (bridge plugin)
//	   |                    |
//	pod A 10.232.0.x        pod B 10.232.0.y: TCP echo on :80, hostPort 8080
//
// bridge-nf-call-iptables is per network namespace since Linux 5.3
// (checked on 6.18): the test sets it in its node namespace only, and
// checks that the test's own namespace kept its value.

import (
	"errors"
	"net"
	"os"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

const (
	hpNode   = "10.232.200.1"
	hpOut    = "10.232.200.2"
	hpNode6  = "fd00:232:200::1"
	hpOut6   = "fd00:232:200::2"
	hpGW     = "10.232.0.1"
	hpGW6    = "fd00:232::1"
	hpRange  = "10.232.0.0/16"
	hpRange6 = "fd00:232::/32"
)

func TestRootHairpin(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		for _, brnf := range []string{"0", "1"} {
			t.Run(backend+"/bridge-nf-call="+brnf, func(t *testing.T) { testRootHairpin(t, backend, brnf) })
		}
	}
}

// setBridgeNF sets bridge-nf-call-iptables and -ip6tables to v in the
// namespace ns. The test's own namespace must keep its values: on a kernel
// where they are global they are put back at once and the test fails.
func setBridgeNF(t *testing.T, ns, v string) {
	t.Helper()
	names := []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"}
	own := map[string]string{}
	for _, name := range names {
		if got, err := sysctl.Get(name); err == nil {
			own[name] = got
		}
	}
	err := netns.Do(ns, func() error {
		for _, name := range names {
			if err := sysctl.Set(name, v); err != nil {
				return err
			}
			if got, err := sysctl.Get(name); err != nil || got != v {
				return errors.Join(err, errors.New(name+" did not take "+v))
			}
		}
		return nil
	})
	for name, before := range own {
		if after, _ := sysctl.Get(name); after != before {
			if rerr := sysctl.Set(name, before); rerr != nil {
				t.Errorf("restoring %s to %s in the test's own namespace: %v", name, before, rerr)
			}
			t.Fatalf("%s is global on this kernel: setting it in a test namespace changed it here from %s to %s (restored)", name, before, after)
		}
	}
	switch {
	case errors.Is(err, os.ErrNotExist) && len(own) > 0:
		// Only the initial namespace has the knobs (before Linux 5.3):
		// the node would run with the machine's setting.
		testutil.Skip(t, "bridge-nf-call-iptables is not per network namespace on this kernel (Linux 5.3 or later needed)")
	case errors.Is(err, os.ErrNotExist) && v == "0":
		// No br_netfilter at all: bridged traffic skips netfilter, as wanted.
	case errors.Is(err, os.ErrNotExist):
		testutil.Skip(t, "br_netfilter is not loaded (no /proc/sys/net/bridge); run `modprobe br_netfilter`")
	case err != nil:
		t.Fatalf("setting bridge-nf-call-* to %s in the node namespace: %v", v, err)
	}
}

func testRootHairpin(t *testing.T, backend, brnf string) {
	requireTools(t)
	testutil.RequireFreeRange(t, hpRange, hpRange6)
	l := vethtest.New(t, "")
	setBridgeNF(t, l.Host, brnf)
	if err := l.InHost(func() error { return sysctl.Set("net.ipv6.conf.all.forwarding", "1") }); err != nil {
		t.Fatal(err)
	}
	podA, podB, out := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, l.Host, testutil.Name("fnpo"), []string{hpNode + "/24", hpNode6 + "/64"}, out, "eth0", []string{hpOut + "/24", hpOut6 + "/64"})

	network := testutil.Name("fnhp-")
	ipam := map[string]any{"type": "host-local", "dataDir": l.DataDir,
		"ranges": [][]map[string]any{{{"subnet": "10.232.0.0/24"}}, {{"subnet": "fd00:232::/64"}}},
		"routes": []map[string]any{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}}}
	pl := l.WithList(vethtest.ConfList(t, network,
		map[string]any{"type": "bridge", "bridge": testutil.Name("fnb"), "isGateway": true, "ipMasq": true, "ipam": ipam},
		map[string]any{"type": "portmap", "backend": backend, "capabilities": map[string]any{"portMappings": true}}))
	rtB := rt("b", podB, pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	rtA := vethtest.RT("a", podA)
	if _, err := pl.AddRT(rtB); err != nil {
		t.Fatalf("ADD pod B: %v", err)
	}
	if _, err := pl.AddRT(rtA); err != nil {
		t.Fatalf("ADD pod A: %v", err)
	}
	testutil.EchoServer(t, podB, ":80", "b")
	rs := &rootLab{Lab: l, t: t}

	// From outside the node the client address is kept.
	rs.wantAnswer(out, net.JoinHostPort(hpNode, "8080"), "b "+hpOut)
	rs.wantAnswer(out, net.JoinHostPort(hpNode6, "8080"), "b "+hpOut6)
	// Pod to pod through the node address: masqueraded to the bridge's
	// address, so that B's answer goes back through the node.
	rs.wantAnswer(podA, net.JoinHostPort(hpNode, "8080"), "b "+hpGW)
	rs.wantAnswer(podA, net.JoinHostPort(hpNode6, "8080"), "b "+hpGW6)

	// DEL and GC still remove every rule portmap added.
	if err := pl.DelRT(rtA); err != nil {
		t.Fatalf("DEL pod A: %v", err)
	}
	if err := pl.DelRT(rtB); err != nil {
		t.Fatalf("DEL pod B: %v", err)
	}
	if got := rs.ruleset(); attachmentRules(got) != "" {
		t.Fatalf("attachment rules left after DEL:\n%s", got)
	}
	if err := pl.GCArgs(&libcni.GCArgs{ValidAttachments: []types.GCAttachment{}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if got := rs.ruleset(); got != "" {
		t.Fatalf("rules left after GC of everything:\n%s", got)
	}
}
