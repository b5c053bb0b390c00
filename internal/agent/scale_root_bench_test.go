package agent

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

const (
	scaleUnderlay = "10.249.0.0/16"
	scalePods     = "10.160.0.0/11"
)

// BenchmarkRootColdStart: a node with 4,999 peers and an empty kernel
// (a fresh agent on a rebooted node), from the first Reconcile to every
// route (host-gw) or route, neighbour and FDB entry (vxlan) programmed,
// in a namespace of its own whose underlay is one end of a veth pair.
func BenchmarkRootColdStart(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireFreeRange(b, scaleUnderlay, scalePods)
	nodes := scalePeers(5000, netip.MustParsePrefix(scaleUnderlay), netip.MustParsePrefix(scalePods))
	ctx := klog.NewContext(context.Background(), logr.Discard())
	for _, be := range []string{backend.HostGW, backend.VXLAN} {
		b.Run(be, func(b *testing.B) {
			ns := testutil.NewNetNS(b)
			nsn := testutil.NSName(ns)
			testutil.Run(b, "ip", "-n", nsn, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
			testutil.Run(b, "ip", "-n", nsn, "link", "set", "eth0p", "up")
			testutil.Run(b, "ip", "-n", nsn, "addr", "add", "10.249.0.1/16", "dev", "eth0")
			testutil.Run(b, "ip", "-n", nsn, "link", "set", "eth0", "up")
			bk, err := backend.New(be, backend.Config{VNI: 1, Port: 4789, TxChecksumOffload: true})
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				// Nexthops first: deleting one deletes the routes through it,
				// and ip's route flush fails on such routes.
				testutil.Run(b, "ip", "-n", nsn, "nexthop", "flush", "proto", "0x66")
				testutil.Run(b, "ip", "-n", nsn, "route", "flush", "proto", "0x66")
				if strings.Contains(testutil.Run(b, "ip", "-n", nsn, "link"), vxlan.DeviceName) {
					testutil.Run(b, "ip", "-n", nsn, "link", "del", vxlan.DeviceName)
				}
				r := &Reconciler{
					NodeName:     "n0",
					ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(scalePods)},
					CNIConfDir:   filepath.Join(dir, "net.d"),
					Backend:      bk,
					Kernel:       backend.Kernel{Routes: &routes.Netlink{}, VXLAN: vxlan.Netlink{}},
				}
				b.StartTimer()
				if err := netns.Do(ns, func() error { return r.Reconcile(ctx, nodes) }); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			want := map[string]int{"route": len(nodes) - 1}
			if be == backend.VXLAN {
				want["neigh"], want["fdb"] = len(nodes)-1, len(nodes)-1
			}
			got := map[string]int{"route": countLines(testutil.Run(b, "ip", "-n", nsn, "route", "show", "proto", "0x66"))}
			if be == backend.VXLAN {
				got["neigh"] = countLines(testutil.Run(b, "ip", "-n", nsn, "neigh", "show", "dev", vxlan.DeviceName, "nud", "permanent"))
				got["fdb"] = countLines(testutil.Run(b, "bridge", "-n", nsn, "fdb", "show", "dev", vxlan.DeviceName, "permanent", "self"))
			}
			for k, n := range want {
				if got[k] != n {
					b.Errorf("%s entries: %d, want %d", k, got[k], n)
				}
			}
		})
	}
}

func countLines(s string) int { return strings.Count(s, "\n") }
