package endpointslice

// Indexes, so that the controller costs per event and not per cluster.
//
// A pod event must find the Services that select the pod. Scanning every
// Service of the namespace and parsing its selector (what this controller
// and upstream's did) is O(Services in the namespace) per event. Instead
// serviceIndex keeps each Service's selector, copied once when it is
// added or its selector changes, under exactly one of its key=value pairs:
// the pair with the fewest Services under it when the Service was
// indexed, so that a pair every Service shares (tier=backend) does not
// become one big bucket. A Service can only select a pod that carries
// that pair, so looking up the pod's own pairs and checking the full
// selector of the few candidates finds every match, each once. An empty
// (non-nil) selector selects every pod of the namespace; those Services
// are kept apart and always candidates. A nil selector selects nothing
// and ExternalName Services have no endpoints: neither is indexed.
//
// A Service sync must find the pods its selector matches. podIndex
// (podindex.go) holds the pods by namespace/key=value; a sync takes the
// smallest bucket among its selector's pairs and filters it. Its pods by
// node name let a Node event reach the Services of the pods on that node
// instead of every Service.
//
// A sync also reads its Service's slices from an index of our slices by
// Service (slicesByService), not by listing the namespace's slices with a
// label selector: that matched the labels of every slice in the namespace
// and was half of a sync's CPU at 100 Services per namespace.

import (
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

const (
	slicesByService = "flatnet.io/slice-service" // "namespace/service" of our slices
)

// sliceServiceIndex is the slicesByService index function: slices
// managed by this controller, by their Service's key.
func sliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok || s.Labels[discovery.LabelManagedBy] != ManagedBy {
		return nil, nil
	}
	name := s.Labels[discovery.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + name}, nil
}

// selects reports whether selector (non-nil) matches labels, as
// labels.SelectorFromValidatedSet(selector).Matches would.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

type indexedService struct {
	key      string
	selector map[string]string // a private copy
	k, v     string            // the pair it is indexed under; none for an empty selector
}

type nsServices struct {
	pairs map[string]map[string]map[string]*indexedService // key -> value -> Service key -> entry
	all   map[string]*indexedService                       // empty selectors
}

// serviceIndex finds the Services that select a pod. Safe for concurrent
// use.
type serviceIndex struct {
	mu   sync.RWMutex
	svcs map[string]*indexedService // by Service key
	ns   map[string]*nsServices
}

func newServiceIndex() *serviceIndex {
	return &serviceIndex{svcs: map[string]*indexedService{}, ns: map[string]*nsServices{}}
}

// set indexes svc (or drops it when it selects nothing). It reports
// whether the selector the index holds for svc changed.
func (x *serviceIndex) set(svc *corev1.Service) bool {
	key := svc.Namespace + "/" + svc.Name
	sel := svc.Spec.Selector
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		sel = nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.svcs[key]
	if old != nil && sel != nil && maps.Equal(old.selector, sel) {
		return false // the cached selector stands
	}
	if old == nil && sel == nil {
		return false
	}
	if old != nil {
		x.removeLocked(svc.Namespace, old)
	}
	if sel == nil {
		return true
	}
	e := &indexedService{key: key, selector: maps.Clone(sel)}
	if e.selector == nil {
		e.selector = map[string]string{}
	}
	n := x.ns[svc.Namespace]
	if n == nil {
		n = &nsServices{pairs: map[string]map[string]map[string]*indexedService{}, all: map[string]*indexedService{}}
		x.ns[svc.Namespace] = n
	}
	x.svcs[key] = e
	if len(sel) == 0 {
		n.all[key] = e
		return true
	}
	best := -1
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		if size := len(n.pairs[k][sel[k]]); best < 0 || size < best {
			best, e.k, e.v = size, k, sel[k]
		}
	}
	if n.pairs[e.k] == nil {
		n.pairs[e.k] = map[string]map[string]*indexedService{}
	}
	if n.pairs[e.k][e.v] == nil {
		n.pairs[e.k][e.v] = map[string]*indexedService{}
	}
	n.pairs[e.k][e.v][key] = e
	return true
}

// delete forgets the Service namespace/name.
func (x *serviceIndex) delete(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.svcs[namespace+"/"+name]; e != nil {
		x.removeLocked(namespace, e)
	}
}

func (x *serviceIndex) removeLocked(namespace string, e *indexedService) {
	delete(x.svcs, e.key)
	n := x.ns[namespace]
	if n == nil {
		return
	}
	if len(e.selector) == 0 {
		delete(n.all, e.key)
	} else {
		bucket := n.pairs[e.k][e.v]
		delete(bucket, e.key)
		if len(bucket) == 0 {
			delete(n.pairs[e.k], e.v)
			if len(n.pairs[e.k]) == 0 {
				delete(n.pairs, e.k)
			}
		}
	}
	if len(n.pairs) == 0 && len(n.all) == 0 {
		delete(x.ns, namespace)
	}
}

// matching calls fn with the key of every indexed Service of namespace
// whose selector matches labels, each once.
func (x *serviceIndex) matching(namespace string, labels map[string]string, fn func(key string)) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.ns[namespace]
	if n == nil {
		return
	}
	for key := range n.all {
		fn(key)
	}
	for k, v := range labels {
		for key, e := range n.pairs[k][v] {
			if selects(e.selector, labels) {
				fn(key)
			}
		}
	}
}
