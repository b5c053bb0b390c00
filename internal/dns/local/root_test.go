package local

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/dns/records"
	"github.com/flatnet/flatnet/internal/dns/server"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
	"github.com/vishvananda/netlink"
)

// TestRootPodReachesServerPastDNAT: a "pod" namespace asks the kube-dns
// ClusterIP in a "node" namespace whose nat table DNATs that address away
// (as a Service proxy does) and whose filter table rejects new connections
// to it (as a proxy does for a Service without endpoints). With the
// address taken and the notrack table in place the agent's server answers,
// and conntrack holds no entry for the queries.
func TestRootPodReachesServerPastDNAT(t *testing.T) {
	testutil.RequireRoot(t)
	const subnet = "10.254.77.0/24"
	testutil.RequireFreeRange(t, subnet)
	node, pod := testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, node, testutil.Name("fnd"), []string{"10.254.77.1/24"}, pod, "eth0", []string{"10.254.77.2/24"})
	testutil.RunIn(t, pod, "ip", "route", "add", "default", "via", "10.254.77.1")
	// The proxy stand-in: DNAT to nowhere and reject, for tracked packets.
	testutil.RunIn(t, node, "nft", `table ip fndproxy {
		chain pre { type nat hook prerouting priority dstnat; ip daddr 10.96.0.10 udp dport 53 dnat to 10.254.77.99:53; }
		chain in { type filter hook input priority filter; ct state new ip daddr 10.96.0.10 reject; }
	}`)

	clusterIP, nodeLocal := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("169.254.20.10")
	ix, _ := records.New(records.Config{})
	ix.UpsertService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"}}})
	srv, err := server.New(server.Config{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	var l *Local
	var pcs []net.PacketConn
	var lns []net.Listener
	err = netns.Do(node, func() error {
		if l, err = NewDefault(); err != nil {
			return err
		}
		if err := l.Sync(context.Background(), []netip.Addr{clusterIP, nodeLocal}, 53); err != nil {
			return err
		}
		for _, a := range []netip.Addr{clusterIP, nodeLocal} {
			ap := netip.AddrPortFrom(a, 53).String()
			pc, err := net.ListenPacket("udp", ap)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", ap)
			if err != nil {
				return err
			}
			pcs, lns = append(pcs, pc), append(lns, ln)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, pcs, lns); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	ask := func(network, server string) (*dns.Msg, error) {
		var r *dns.Msg
		err := netns.Do(pod, func() error {
			m := new(dns.Msg)
			m.SetQuestion("web.ns1.svc.cluster.local.", dns.TypeA)
			var err error
			r, _, err = (&dns.Client{Net: network, Timeout: 2 * time.Second}).Exchange(m, server+":53")
			return err
		})
		return r, err
	}
	for _, s := range []string{"10.96.0.10", "169.254.20.10"} {
		for _, network := range []string{"udp", "tcp"} {
			r, err := ask(network, s)
			if err != nil || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), "10.96.0.20") {
				t.Fatalf("pod asking %s over %s: %v %v", s, network, err, r)
			}
		}
	}
	var flows []*netlink.ConntrackFlow
	if err := netns.Do(node, func() error {
		var err error
		flows, err = netlinkx.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Forward.DstPort == 53 {
			t.Errorf("conntrack has a DNS flow: %s", f)
		}
	}

	// Released: the table and both addresses go, and the DNAT is back in
	// the way (the test's proof that notrack was what let queries by).
	if err := netns.Do(node, func() error { return l.Remove(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	out := testutil.RunIn(t, node, "nft", "list", "tables")
	if strings.Contains(out, Table) {
		t.Errorf("table %s left after Remove: %s", Table, out)
	}
	if out := testutil.RunIn(t, node, "ip", "-o", "addr", "show", "dev", "lo"); strings.Contains(out, "10.96.0.10") || strings.Contains(out, "169.254.20.10") {
		t.Errorf("addresses left on lo after Remove:\n%s", out)
	}
}
