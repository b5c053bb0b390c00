package records

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Watch feeds ix from the API until ctx ends: Services and EndpointSlices,
// and Pods when pods is set (verified pod records, autopath). It returns
// one HasSynced per resource, in that order (the pods' last); wait on the
// Services' and slices' before answering, or existing names would be
// NXDOMAIN for a moment.
//
// There are no informers here: a reflector per resource lists and watches
// into a store (feed) that hands every object straight to the index, which
// keeps only the stripped fields it answers from, and remembers nothing but
// the objects' keys (to see what a relist no longer has). An informer would
// keep a second, full copy of every object in its cache: at 10,000 Services
// that copy was about as large as the index itself.
func (ix *Index) Watch(ctx context.Context, cs kubernetes.Interface, pods bool) []cache.InformerSynced {
	feeds := []*feed{
		{what: "services", example: &corev1.Service{}, lw: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return cs.CoreV1().Services("").List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return cs.CoreV1().Services("").Watch(ctx, o)
			}},
			upsert: func(o any) {
				if s, ok := o.(*corev1.Service); ok {
					ix.UpsertService(s)
				}
			}, del: ix.DeleteService},
		{what: "endpointslices", example: &discoveryv1.EndpointSlice{}, lw: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return cs.DiscoveryV1().EndpointSlices("").List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return cs.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
			}},
			upsert: func(o any) {
				if s, ok := o.(*discoveryv1.EndpointSlice); ok {
					ix.UpsertEndpointSlice(s)
				}
			}, del: ix.DeleteEndpointSlice},
	}
	if pods {
		feeds = append(feeds, &feed{what: "pods", example: &corev1.Pod{}, lw: &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return cs.CoreV1().Pods("").List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return cs.CoreV1().Pods("").Watch(ctx, o)
			}},
			upsert: func(o any) {
				if p, ok := o.(*corev1.Pod); ok {
					ix.UpsertPod(p)
				}
			}, del: ix.DeletePod})
	}
	logger := klog.FromContext(ctx)
	var synced []cache.InformerSynced
	for _, f := range feeds {
		f.keys = map[string]struct{}{}
		// As client-go's informers: a client that cannot stream the
		// initial list (the fake clientset) gets a plain list.
		lw := cache.ToListWatcherWithWatchListSemantics(f.lw, cs)
		r := cache.NewReflectorWithOptions(lw, f.example, f, cache.ReflectorOptions{Name: "dns-" + f.what, Logger: &logger})
		go r.RunWithContext(ctx)
		synced = append(synced, f.synced.Load)
	}
	return synced
}

// WatchPods feeds the pod records from inf, an informer of every pod of
// the cluster that someone else runs (the agent's network policy caches
// them all already): watching them a second time would double what each
// pod event costs the node. The index reads a pod's namespace, name and
// status IPs. The returned func reports when inf's initial list has been
// fed.
func (ix *Index) WatchPods(inf cache.SharedIndexInformer) (cache.InformerSynced, error) {
	upsert := func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			ix.UpsertPod(p)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, o any) { upsert(o) },
		DeleteFunc: func(o any) {
			if ns, name, ok := objectKey(o); ok {
				ix.DeletePod(ns, name)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching pods for DNS: %w", err)
	}
	return reg.HasSynced, nil
}

// feed is a reflector's store that writes through to the index.
type feed struct {
	what    string
	example runtime.Object
	lw      *cache.ListWatch
	upsert  func(any)
	del     func(ns, name string)

	mu     sync.Mutex
	keys   map[string]struct{} // namespace/name of every object fed
	synced atomic.Bool         // the first list was fed
}

func objectKey(o any) (ns, name string, ok bool) {
	if d, isD := o.(cache.DeletedFinalStateUnknown); isD {
		o = d.Obj
	}
	m, ok := o.(metav1.Object)
	if !ok {
		return "", "", false
	}
	return m.GetNamespace(), m.GetName(), true
}

// Add implements cache.ReflectorStore.
func (f *feed) Add(o any) error {
	ns, name, ok := objectKey(o)
	if !ok {
		return nil
	}
	f.mu.Lock()
	f.keys[ns+"/"+name] = struct{}{}
	f.mu.Unlock()
	f.upsert(o)
	return nil
}

// Update implements cache.ReflectorStore.
func (f *feed) Update(o any) error { return f.Add(o) }

// Delete implements cache.ReflectorStore.
func (f *feed) Delete(o any) error {
	ns, name, ok := objectKey(o)
	if !ok {
		return nil
	}
	f.mu.Lock()
	delete(f.keys, ns+"/"+name)
	f.mu.Unlock()
	f.del(ns, name)
	return nil
}

// Replace implements cache.ReflectorStore: a (re)list. What the list no
// longer has was deleted while the watch was down.
func (f *feed) Replace(list []any, _ string) error {
	seen := make(map[string]struct{}, len(list))
	for _, o := range list {
		if ns, name, ok := objectKey(o); ok {
			seen[ns+"/"+name] = struct{}{}
			f.upsert(o)
		}
	}
	f.mu.Lock()
	old := f.keys
	f.keys = seen
	f.mu.Unlock()
	for k := range old {
		if _, ok := seen[k]; !ok {
			ns, name, _ := strings.Cut(k, "/")
			f.del(ns, name)
		}
	}
	f.synced.Store(true)
	return nil
}

// Resync implements cache.ReflectorStore (nothing to resync: no cache).
func (f *feed) Resync() error { return nil }
