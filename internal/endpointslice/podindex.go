package endpointslice

// podIndex finds cached pods by label pair, node and namespace. It
// replaces the pod informer's own indexes (client-go's Indexer keeps, per
// index value, a set of the pods' key strings): at 100,000 pods those
// were four set entries a pod at about 100 bytes each, a quarter of the
// controller's live heap (BenchmarkPodCacheHeap). Here an entry is a
// pointer in a slice, 8 bytes and its share of the slice's spare room.
//
// The pod event handlers keep it (update, before they queue anything), so
// it trails the informer's store by the handler's delay: a sync that
// reads it in that window sees the pod as it was, and the event's handler
// then queues the Services that care, as the store's own indexes would
// have had them queued. A bucket is scanned to remove a pod (buckets are
// the pods of one label pair, node or namespace: tens to thousands).

import (
	"sync"
)

type labelPair struct{ namespace, key, value string }

type podIndex struct {
	mu          sync.RWMutex
	byLabel     map[labelPair][]*Pod
	byNode      map[string][]*Pod
	byNamespace map[string][]*Pod
}

func newPodIndex() *podIndex {
	return &podIndex{byLabel: map[labelPair][]*Pod{}, byNode: map[string][]*Pod{}, byNamespace: map[string][]*Pod{}}
}

// update replaces old (nil for an added pod) with cur (nil for a deleted
// one) in every bucket.
func (x *podIndex) update(old, cur *Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old != nil {
		for k, v := range old.Labels {
			removeFrom(x.byLabel, labelPair{old.Namespace, k, v}, old)
		}
		if old.NodeName != "" {
			removeFrom(x.byNode, old.NodeName, old)
		}
		removeFrom(x.byNamespace, old.Namespace, old)
	}
	if cur != nil {
		for k, v := range cur.Labels {
			p := labelPair{cur.Namespace, k, v}
			x.byLabel[p] = append(x.byLabel[p], cur)
		}
		if cur.NodeName != "" {
			x.byNode[cur.NodeName] = append(x.byNode[cur.NodeName], cur)
		}
		x.byNamespace[cur.Namespace] = append(x.byNamespace[cur.Namespace], cur)
	}
}

// removeFrom takes p out of bucket k: the same pointer, or failing that
// the pod of the same namespace and name (a copy the handler was given).
// The bucket's last pod takes its place; an emptied bucket is deleted and
// a mostly empty one shrunk, so that churn leaves no dead capacity.
func removeFrom[K comparable](m map[K][]*Pod, k K, p *Pod) {
	b := m[k]
	i := -1
	for j, q := range b {
		if q == p {
			i = j
			break
		}
	}
	if i < 0 {
		for j, q := range b {
			if q.Name == p.Name && q.Namespace == p.Namespace {
				i = j
				break
			}
		}
	}
	if i < 0 {
		return
	}
	last := len(b) - 1
	b[i] = b[last]
	b[last] = nil
	b = b[:last]
	switch {
	case len(b) == 0:
		delete(m, k)
		return
	case cap(b) >= 16 && len(b) < cap(b)/4:
		b = append(make([]*Pod, 0, 2*len(b)), b...)
	}
	m[k] = b
}

// selected returns the pods of namespace that selector (non-nil) matches:
// those of its smallest bucket among the selector's pairs that match the
// rest, or every pod of the namespace for an empty selector.
func (x *podIndex) selected(namespace string, selector map[string]string) []*Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var smallest []*Pod
	if len(selector) == 0 {
		smallest = x.byNamespace[namespace]
	}
	first := true
	for k, v := range selector {
		b := x.byLabel[labelPair{namespace, k, v}]
		if first || len(b) < len(smallest) {
			smallest, first = b, false
		}
		if len(smallest) == 0 {
			return nil
		}
	}
	out := make([]*Pod, 0, len(smallest))
	for _, p := range smallest {
		if selects(selector, p.Labels) {
			out = append(out, p)
		}
	}
	return out
}

// onNode returns the pods on node.
func (x *podIndex) onNode(node string) []*Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return append([]*Pod(nil), x.byNode[node]...)
}
