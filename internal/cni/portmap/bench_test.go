package portmap

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// BenchmarkRootAddDel times one portmap ADD+DEL (two mappings, dual-stack
// container) through libcni in a test host namespace, for each flatnet
// backend and, when REF_CNI_DIR (or the bench-cni cache) holds them, the
// reference plugin's. Run: go test -run X -bench RootAddDel ./internal/cni/portmap
func BenchmarkRootAddDel(b *testing.B) {
	refDir := os.Getenv("REF_CNI_DIR")
	if refDir == "" {
		refDir = "/root/.cache/flatnet/ref-cni-v1.10.0"
	}
	cases := []struct{ name, dir, backend string }{
		{"flatnet-nftables", "", "nftables"},
		{"flatnet-iptables", "", "iptables"},
		{"reference-nftables", refDir, "nftables"},
		{"reference-iptables", refDir, "iptables"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if c.dir != "" {
				if _, err := os.Stat(filepath.Join(c.dir, "portmap")); err != nil {
					b.Skipf("no reference portmap in %s (make bench-cni builds it)", c.dir)
				}
			}
			l := newRootLab(b, c.backend)
			dir := l.cniPath
			if c.dir != "" {
				dir = c.dir
			}
			cni := libcni.NewCNIConfigWithCacheDir([]string{dir}, b.TempDir(), nil)
			list := l.list(nil)
			r := rt("bench", l.ctr, pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}, pm{HostPort: 5353, ContainerPort: 5353, Protocol: "udp"})
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				if err := l.InHost(func() error {
					if _, err := cni.AddNetworkList(ctx, list, r); err != nil {
						return err
					}
					return cni.DelNetworkList(ctx, list, r)
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
