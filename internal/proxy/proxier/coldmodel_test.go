package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/tracker"
)

// BenchmarkColdModel is the part of BenchmarkColdStart that is flatnet's
// own, without an API server (no root): BenchmarkColdStart's 10,000
// Services and slices, as the informers hand them over (through
// tracker.Slim), into the tracker, then the first full sync rendered to
// nft's text. It reports the heap still live after it with the objects
// held (as the informers' caches hold them).
//
//	go test -run '^$' -bench ColdModel -benchmem ./internal/proxy/proxier/
func BenchmarkColdModel(b *testing.B) {
	const n = 10000
	type pair struct {
		svc   *corev1.Service
		slice *discovery.EndpointSlice
	}
	objs := func() []pair {
		out := make([]pair, n)
		nodePort := int32(30000)
		for i := range out {
			svc, slice := coldObjects(i)
			// What the API server fills in.
			ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
			if svc.Spec.Type != corev1.ServiceTypeClusterIP {
				for p := range svc.Spec.Ports {
					svc.Spec.Ports[p].NodePort = nodePort
					nodePort++
				}
			}
			if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
				svc.Status = coldStatus(i)
			}
			out[i] = pair{svc, slice}
		}
		return out
	}
	var live uint64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		in := objs()
		b.StartTimer()
		tr := tracker.New(false)
		for i, o := range in {
			svc, err := tracker.Slim(o.svc)
			if err != nil {
				b.Fatal(err)
			}
			in[i].svc = nil // what the informer caches is the Svc
			tr.OnSvc(svc.(*tracker.Svc))
		}
		for i, o := range in {
			sl, err := tracker.Slim(o.slice)
			if err != nil {
				b.Fatal(err)
			}
			in[i].slice = nil // what the informer caches is the Slice
			tr.OnSlice(sl.(*tracker.Slice))
		}
		null := &nullNFT{txs: knftables.NewFake(knftables.IPv4Family, nftables.DefaultTable)}
		be := nftables.NewBackend(null, nftables.Config{Family: knftables.IPv4Family, NodeName: coldNode,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")}})
		round := tr.Take()
		if _, err := be.Sync(context.Background(), round.Services, round.Changed, true); err != nil {
			b.Fatal(err)
		}
		if len(round.Services) != n {
			b.Fatal(fmt.Sprintf("%d services", len(round.Services)))
		}
		b.StopTimer()
		round = tracker.Round{}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		live = ms.HeapAlloc
		if f := os.Getenv("FLATNET_COLD_HEAPPROFILE"); f != "" {
			writeHeapProfile(b, f)
		}
		runtime.KeepAlive(in)
		runtime.KeepAlive(tr)
		runtime.KeepAlive(be)
		b.StartTimer()
	}
	b.ReportMetric(float64(live)/(1<<20), "live-MiB")
}
