package agent

import (
	"context"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab/controlplane/cptest"
)

// BenchmarkRootNodeCacheSync: how long the agent's Node cache (trimNode
// on) takes to fill from a real kube-apiserver holding 5,000 kubelet-like
// Nodes, and this process's CPU for it, when its informer starts from a
// WatchList stream (client-go's default) and from one LIST
// (kube.ListFirst, what the agent uses). Every peer route waits for it.
//
//	go test -run '^$' -bench RootNodeCacheSync -benchtime 5x ./internal/agent/
func BenchmarkRootNodeCacheSync(b *testing.B) {
	const nodes = 5000
	kubeconfig, _ := cptest.Start(b, 2*time.Minute)
	client, err := kube.Client(kubeconfig, "flatnet-bench")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range nodes {
		g.Go(func() error {
			n := kubeletNode(i)
			n.ResourceVersion, n.UID, n.ManagedFields = "", "", nil
			created, err := client.CoreV1().Nodes().Create(gctx, n, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			if err != nil {
				return err
			}
			n.ObjectMeta = created.ObjectMeta // a Node's create drops its status
			_, err = client.CoreV1().Nodes().UpdateStatus(gctx, n, metav1.UpdateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
	}{{"watchlist", client}, {"list", kube.ListFirst(client)}} {
		b.Run(tc.name, func(b *testing.B) {
			var wall, cpu time.Duration
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithCancel(ctx)
				c0, t0 := processCPU(), time.Now()
				f := informers.NewSharedInformerFactoryWithOptions(tc.client, 0, informers.WithTransform(trimNode))
				inf := f.Core().V1().Nodes().Informer()
				synced := make(chan struct{})
				if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{}); err != nil {
					b.Fatal(err)
				}
				f.Start(ctx.Done())
				go func() {
					// Poll finer than WaitForCacheSync's 100 ms.
					for !inf.HasSynced() {
						time.Sleep(time.Millisecond)
					}
					close(synced)
				}()
				<-synced
				wall += time.Since(t0)
				cpu += processCPU() - c0
				if got := len(inf.GetStore().ListKeys()); got != nodes {
					b.Fatalf("%d Nodes cached, want %d", got, nodes)
				}
				cancel()
				f.Shutdown()
			}
			b.ReportMetric(float64(wall.Milliseconds())/float64(b.N), "ms/sync")
			b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/sync")
		})
	}
}

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
