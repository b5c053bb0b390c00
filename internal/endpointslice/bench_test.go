package endpointslice

// Scale benchmarks: the controller's CPU per pod event at 5,000 Services
// and 50,000 pods in 50 namespaces (100 Services and 1,000 pods per
// namespace, each Service selecting 10 pods), with the informers' stores
// filled directly and the event handlers called as the informers would;
// every event's queued Services are synced before the next event. The
// clientset applies slice writes to the slice store at once (what the
// informer would do a moment later), so each sync sees its own writes.
//
//	nice -n 19 flock /tmp/flatnet-e2e.lock go test ./internal/endpointslice/ \
//	  -run '^$' -bench 'PodEvent' -benchtime 3000x -count 3

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

const (
	benchNamespaces  = 50
	benchSvcsPerNS   = 100
	benchPodsPerSvc  = 10
	benchNodes       = 5000
	benchPodsTotal   = benchNamespaces * benchSvcsPerNS * benchPodsPerSvc
	benchServicesAll = benchNamespaces * benchSvcsPerNS
)

type benchEnv struct {
	c                  *Controller
	podStore, svcStore cache.Indexer
	client             *fake.Clientset
	ctx                context.Context
}

// benchPod is pod i of Service s in namespace n: labels app (the
// Service's selector) plus two that every pod of the namespace shares.
func benchPod(n, s, i int) *corev1.Pod {
	name := fmt.Sprintf("svc-%d-%d", s, i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: fmt.Sprintf("ns-%d", n), UID: types.UID(fmt.Sprintf("ns-%d-%s", n, name)),
			ResourceVersion: "1",
			Labels:          map[string]string{"app": fmt.Sprintf("svc-%d", s), "tier": "backend", "pod-template-hash": fmt.Sprintf("h%d", s)},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%d", (n*benchSvcsPerNS*benchPodsPerSvc+s*benchPodsPerSvc+i)%benchNodes),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      fmt.Sprintf("10.%d.%d.%d", n, s, i+1),
			PodIPs:     []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", n, s, i+1)}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, factory, 100)
	if err != nil {
		b.Fatal(err)
	}
	e := &benchEnv{
		c:        c,
		podStore: factory.Core().V1().Pods().Informer().GetIndexer(),
		svcStore: factory.Core().V1().Services().Informer().GetIndexer(),
		client:   client,
		ctx:      context.Background(),
	}
	sliceStore := factory.Discovery().V1().EndpointSlices().Informer().GetIndexer()
	nodeStore := factory.Core().V1().Nodes().Informer().GetIndexer()
	seq := 0
	// Slice writes land in the slice store at once; the fake's object
	// tracker is bypassed (its cost is the API server's, not ours).
	client.PrependReactor("*", "endpointslices", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		switch a := a.(type) {
		case k8stesting.CreateAction:
			s := a.GetObject().(*discovery.EndpointSlice)
			if s.Name == "" {
				seq++
				s.Name = fmt.Sprintf("%sgen%d", s.GenerateName, seq)
			}
			return true, s, sliceStore.Add(s)
		case k8stesting.UpdateAction:
			s := a.GetObject().(*discovery.EndpointSlice)
			return true, s, sliceStore.Update(s)
		case k8stesting.DeleteAction:
			obj, ok, _ := sliceStore.GetByKey(a.GetNamespace() + "/" + a.GetName())
			if ok {
				return true, nil, sliceStore.Delete(obj)
			}
			return true, nil, nil
		}
		return false, nil, nil
	})
	for i := range benchNodes {
		if err := nodeStore.Add(node(fmt.Sprintf("node-%d", i), fmt.Sprintf("zone-%d", i%3))); err != nil {
			b.Fatal(err)
		}
	}
	for n := range benchNamespaces {
		for s := range benchSvcsPerNS {
			for i := range benchPodsPerSvc {
				p := PodOf(benchPod(n, s, i))
				if err := e.podStore.Add(p); err != nil {
					b.Fatal(err)
				}
				c.onPodAdd(p) // the informer's handler: the pod index
			}
		}
	}
	for n := range benchNamespaces {
		for s := range benchSvcsPerNS {
			svc := &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", s), Namespace: fmt.Sprintf("ns-%d", n), UID: types.UID(fmt.Sprintf("uid-%d-%d", n, s))},
				Spec: corev1.ServiceSpec{
					Selector: map[string]string{"app": fmt.Sprintf("svc-%d", s)}, ClusterIP: "10.96.0.10",
					IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
					Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}},
				},
			}
			if err := e.svcStore.Add(svc); err != nil {
				b.Fatal(err)
			}
			c.onServiceAdd(svc)
		}
	}
	if got := e.drain(b); got != benchServicesAll {
		b.Fatalf("initial syncs: %d, want %d", got, benchServicesAll)
	}
	return e
}

// drain syncs every queued Service; it returns how many.
func (e *benchEnv) drain(b *testing.B) int {
	n := 0
	for e.c.queue.Len() > 0 {
		key, _ := e.c.queue.Get()
		if err := e.c.Sync(e.ctx, key); err != nil {
			b.Fatalf("sync %s: %v", key, err)
		}
		e.c.queue.Forget(key)
		e.c.queue.Done(key)
		n++
	}
	e.client.ClearActions()
	return n
}

func (e *benchEnv) getPod(b *testing.B, i int) *Pod {
	n, s, k := i%benchNamespaces, (i/benchNamespaces)%benchSvcsPerNS, (i/benchServicesAll)%benchPodsPerSvc
	obj, ok, err := e.podStore.GetByKey(fmt.Sprintf("ns-%d/svc-%d-%d", n, s, k))
	if err != nil || !ok {
		b.Fatalf("pod %d: %v %v", i, ok, err)
	}
	return obj.(*Pod)
}

// BenchmarkPodEvent is one pod event and the syncs it causes. Each
// iteration touches a different pod (round robin over namespaces and
// Services), so at most benchPodsTotal iterations for delete.
func BenchmarkPodEvent(b *testing.B) {
	b.Run("add", func(b *testing.B) {
		e := newBenchEnv(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			n, s := i%benchNamespaces, (i/benchNamespaces)%benchSvcsPerNS
			p := PodOf(benchPod(n, s, benchPodsPerSvc+i/benchServicesAll))
			if err := e.podStore.Add(p); err != nil {
				b.Fatal(err)
			}
			e.c.onPodAdd(p)
			e.drain(b)
		}
	})
	// An update of pod i; change makes the new state.
	update := func(b *testing.B, change func(p *Pod, i int)) {
		e := newBenchEnv(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			old := e.getPod(b, i)
			p := old.DeepCopy()
			p.ResourceVersion = fmt.Sprint(i + 2)
			change(p, i)
			if err := e.podStore.Update(p); err != nil {
				b.Fatal(err)
			}
			e.c.onPodUpdate(old, p)
			e.drain(b)
		}
	}
	b.Run("ready", func(b *testing.B) {
		update(b, func(p *Pod, i int) {
			p.Ready = map[corev1.ConditionStatus]corev1.ConditionStatus{corev1.ConditionTrue: corev1.ConditionFalse, corev1.ConditionFalse: corev1.ConditionTrue}[p.Ready]
			p.ReadySince = time.Unix(int64(1e9+i), 0).UnixNano()
		})
	})
	// A status change no endpoint shows (a container restarted): the
	// transform leaves only the new resourceVersion.
	b.Run("status-only", func(b *testing.B) {
		update(b, func(*Pod, int) {})
	})
	b.Run("delete", func(b *testing.B) {
		if b.N > benchPodsTotal {
			b.Skipf("%d deletes of %d pods", b.N, benchPodsTotal)
		}
		e := newBenchEnv(b)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			p := e.getPod(b, i)
			if err := e.podStore.Delete(p); err != nil {
				b.Fatal(err)
			}
			e.c.onPodDelete(p)
			e.drain(b)
		}
	})
}
