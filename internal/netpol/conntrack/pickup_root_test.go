package conntrack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/iptables"
	"github.com/flatnet/flatnet/internal/netpol/nftables"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/testutil"
)

// committer returns a function that commits pods' rules in the
// namespace at nsPath with the renderer of mode (nftables, iptables).
func committer(t *testing.T, mode, nsPath string) func([]netpol.Pod) {
	ctx := context.Background()
	switch mode {
	case "nftables":
		var r *nft.Runner
		if err := netns.Do(nsPath, func() (err error) { r, err = nft.New(knftables.InetFamily, testutil.Name("fnpol-")); return err }); err != nil {
			t.Fatal(err)
		}
		s := nftables.NewSyncer(r)
		return func(pods []netpol.Pod) {
			t.Helper()
			rs, err := nftables.Render(pods)
			if err == nil {
				err = netns.Do(nsPath, func() error { _, err := s.Sync(ctx, rs, false); return err })
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	default:
		s := iptables.NewSyncer(ipt.New(), ipt.IPv4)
		return func(pods []netpol.Pod) {
			t.Helper()
			if err := netns.Do(nsPath, func() error { _, err := s.Sync(ctx, iptables.Render(pods), false); return err }); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRootCutHoldsWhenTheServerSpeaksFirst: a connection from a client to
// a server through a node that enforces the policy table (the real
// renderer's rules), cut once a policy denies it. If the server's packet is
// the first after the cut, conntrack picks the connection up mid-stream as
// a new flow from the server to the client, which the server's (or the
// client's) rules allow; the client's packets would then be its replies
// and pass. The cut must hold: the client's echo never reaches the server.
// Both ways round: the server's ingress denies (the server is the node's
// pod), and the client's egress denies (the client is); with the nftables
// and the iptables renderer.
func TestRootCutHoldsWhenTheServerSpeaksFirst(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := nft.LookPath(); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs nftables)", err)
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		testutil.Skip(t, "%v (hack/deps.sh installs iptables)", err)
	}
	const clientNet, serverNet = "10.251.71.0/24", "10.251.72.0/24"
	testutil.RequireFreeRange(t, clientNet, serverNet)
	client, server := netip.MustParseAddr("10.251.71.2"), netip.MustParseAddr("10.251.72.2")
	for _, tc := range []struct{ mode, local string }{{"nftables", "server"}, {"nftables", "client"}, {"iptables", "server"}, {"iptables", "client"}} {
		local := tc.local
		t.Run(tc.mode+" local "+local, func(t *testing.T) {
			cns, node, sns := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
			testutil.Wire(t, cns, "eth0", []string{"10.251.71.2/24"}, node, "c0", []string{"10.251.71.1/24"})
			testutil.Wire(t, sns, "eth0", []string{"10.251.72.2/24"}, node, "s0", []string{"10.251.72.1/24"})
			testutil.RunIn(t, cns, "ip", "route", "add", "default", "via", "10.251.71.1")
			testutil.RunIn(t, sns, "ip", "route", "add", "default", "via", "10.251.72.1")
			testutil.RunIn(t, node, "sysctl", "-qw", "net.ipv4.ip_forward=1")

			// The node's pod: the server (ingress) or the client (egress),
			// first allowing the other, then denying it.
			pod := netpol.Pod{Pod: types.NamespacedName{Namespace: "x", Name: local}}
			rules, ip, peer := &pod.Ingress, server, client
			if local == "client" {
				rules, ip, peer = &pod.Egress, client, server
			}
			pod.IPs = []netip.Addr{ip}
			rules.Isolated = true
			rules.Allowed = []netpol.Allow{{Entry: netpol.Entry{Peer: netip.PrefixFrom(peer, 32)}}}
			commit := committer(t, tc.mode, node)
			commit([]netpol.Pod{pod})

			var ln net.Listener
			if err := netns.Do(sns, func() (err error) { ln, err = net.Listen("tcp", ":9100"); return err }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var cc net.Conn
			if err := netns.Do(cns, func() (err error) {
				cc, err = net.DialTimeout("tcp", net.JoinHostPort(server.String(), "9100"), 3*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			go func() { _, _ = io.Copy(cc, cc) }() // the client echoes
			sc, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			echoes := bufio.NewReader(sc)
			ping := func(i int) error {
				if _, err := fmt.Fprintf(sc, "ping %d\n", i); err != nil {
					return err
				}
				_ = sc.SetReadDeadline(time.Now().Add(time.Second))
				_, err := echoes.ReadString('\n')
				return err
			}
			if err := ping(0); err != nil {
				t.Fatalf("echo while the policy allows the flow: %v", err)
			}

			rules.Allowed = nil
			commit([]netpol.Pod{pod})
			var n int
			if err := netns.Do(node, func() (err error) { n, err = Cut(Netlink{}, Pods{ip: &pod}); return err }); err != nil || n != 1 {
				t.Fatalf("Cut = %d, %v; want the connection's 1 entry deleted", n, err)
			}
			// The server speaks first; nothing of the client's may come back.
			for i := 1; i <= 2; i++ {
				if err := ping(i); err == nil {
					t.Fatalf("ping %d after the cut: the client's echo reached the server; the flow was picked up again the other way round", i)
				}
			}
		})
	}
}
