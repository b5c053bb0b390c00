package backend

import (
	"net/netip"
	"testing"

	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// FuzzDesired: Node fields and annotations come from the API server and
// may hold anything; no backend may panic, and what it programs must be
// consistent: one route per destination, every overlay route backed by a
// neighbour entry whose MAC has an FDB entry to an underlay address of
// this node's family.
func FuzzDesired(f *testing.F) {
	f.Add("n2", "10.244.2.0/24", "10.250.0.12", "02:00:00:00:00:02", "", "n3", "10.244.3.0/24", "10.250.1.13", "02:00:00:00:00:03", "10.250.1.99")
	f.Add("n1", "10.244.1.0/24", "::ffff:10.250.0.1", "zz", "fd00::1", "n2", "fd00::/64", "10.250.0.12", "02:00:00:00:00:02", "x")
	f.Fuzz(func(t *testing.T, n2, c2, ip2, mac2, pub2, n3, c3, ip3, mac3, pub3 string) {
		mk := func(name, cidr, ip, mac, pub string) Node {
			return Node{Name: name, PodCIDRs: []string{cidr}, InternalIPs: []string{ip},
				Annotations: map[string]string{AnnotationVTEPMAC: mac, AnnotationPublicIP: pub}}
		}
		in := Input{Self: "n1", Underlay: underlay, Nodes: []Node{
			{Name: "n1", PodCIDRs: []string{"10.244.1.0/24"}, InternalIPs: []string{"10.250.0.11"}},
			mk(n2, c2, ip2, mac2, pub2), mk(n3, c3, ip3, mac3, pub3),
		}}
		for _, name := range Names {
			b, _ := New(name, cfg)
			st, _, err := b.Desired(in)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			dsts := map[netip.Prefix]bool{}
			for _, r := range st.Routes {
				if dsts[r.Dst] || r.Node == "n1" || r.Dst.Addr().Is4() != r.Gw.Is4() {
					t.Fatalf("%s: bad route %v (%s)", name, r, r.Node)
				}
				dsts[r.Dst] = true
				if r.Dev == "" {
					continue
				}
				if st.VXLAN == nil {
					t.Fatalf("%s: route %v without a device", name, r)
				}
				var mac vxlan.MAC
				for _, n := range st.VXLAN.Neighs {
					if n.IP == r.Gw {
						mac = n.MAC
					}
				}
				ok := false
				for _, e := range st.VXLAN.FDB {
					if e.MAC == mac && !mac.IsZero() && e.Dst.Is4() == underlay.IP.Is4() && e.Dst != underlay.IP {
						ok = true
					}
				}
				if !ok {
					t.Fatalf("%s: route %v has no neighbour and FDB entry:\n%s", name, r, st)
				}
			}
		}
	})
}
