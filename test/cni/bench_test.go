package cni

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/testutil"
)

// The benchmarks time the whole conflist through libcni, in a host
// namespace of their own, for both styles (the classic three plugins and
// the flatnet type), with this tree's flatnet-cni ("after") and, when
// FLATNET_CNI_BEFORE names a directory holding another install of it
// (`make install-cni DESTDIR=DIR` from an older tree), with that one
// ("before"): the anchor, measured in the same run. See docs/cni.md.
//
//	FLATNET_CNI_BEFORE=DIR go test -run X -bench Root -benchtime 200x ./test/cni

// benchSets runs fn once per style and install.
func benchSets(b *testing.B, fn func(b *testing.B, l *vethtest.Lab)) {
	const subnet = "10.77.9.0/24"
	testutil.RequireFreeRange(b, subnet)
	sets := []struct{ name, dir string }{{"after", ""}}
	if dir := os.Getenv("FLATNET_CNI_BEFORE"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "flatnet-cni")); err != nil {
			b.Fatalf("FLATNET_CNI_BEFORE: %v", err)
		}
		sets = append([]struct{ name, dir string }{{"before", dir}}, sets...)
	}
	for _, style := range []string{"classic", "flatnet"} {
		for _, set := range sets {
			b.Run(style+"/"+set.name, func(b *testing.B) {
				l := vethtest.New(b, chain(style, subnet))
				if set.dir != "" {
					l.CNI = libcni.NewCNIConfigWithCacheDir([]string{set.dir}, l.CacheDir, nil)
				}
				fn(b, l)
			})
		}
	}
}

// BenchmarkRootStatus: STATUS of the conflist, which containerd asks for
// on every runtime status request (about every 5 s per node). The first
// ADD is made and undone beforehand, so the nftables tables exist.
func BenchmarkRootStatus(b *testing.B) {
	benchSets(b, func(b *testing.B, l *vethtest.Lab) {
		pod := testutil.NewNetNS(b)
		rt := benchRT(pod)
		if _, err := l.AddRT(rt); err != nil {
			b.Fatal(err)
		}
		if err := l.DelRT(rt); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := l.Status(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRootAddDel: one pod's ADD and DEL with a port mapping and
// bandwidth limits (every nftables table of the chain: ipMasq, portmap).
func BenchmarkRootAddDel(b *testing.B) {
	benchSets(b, func(b *testing.B, l *vethtest.Lab) {
		pod := testutil.NewNetNS(b)
		rt := benchRT(pod)
		b.ResetTimer()
		for range b.N {
			if _, err := l.AddRT(rt); err != nil {
				b.Fatal(err)
			}
			if err := l.DelRT(rt); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchRT(pod string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: "bench", NetNS: pod, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "bench"}},
		CapabilityArgs: map[string]any{
			"portMappings": []map[string]any{{"hostPort": 18300, "containerPort": 8080, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"ingressRate": 100_000_000, "ingressBurst": 1_000_000, "egressRate": 100_000_000, "egressBurst": 1_000_000},
		},
	}
}
