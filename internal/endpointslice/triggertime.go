package endpointslice

// Trigger times. The endpoints.kubernetes.io/last-change-trigger-time
// annotation on a slice says when the change that led to the slice's last
// write happened, so that a proxy can measure network programming latency
// from that moment to its rules being in place (ours:
// flatnet_network_programming_duration_seconds in internal/proxy).
//
// As kube-controller-manager does (k8s.io/endpointslice/util's
// TriggerTimeTracker), the controller remembers per Service the trigger
// time of the Service (its creationTimestamp) and of each selected pod
// (its Ready condition's lastTransitionTime) as seen by the last sync. A
// sync's trigger time is the earliest of those that moved forward since
// then, zero when none did; the first sync of a Service gives its
// creationTimestamp.
//
// Deletions, unlike upstream (v1.37.2 stamps nothing for them, so a pod
// going away never feeds the latency metric): a terminating pod's trigger
// time is also the moment its deletion was accepted, deletionTimestamp
// minus deletionGracePeriodSeconds (the API server sets deletionTimestamp
// that far in the future), when that is later than its Ready transition;
// and a pod that had an address and is removed from the API counts, for
// each Service that selected it, from when the controller saw the
// removal (PodDeleted; the object carries no deletion time, so the
// watch's delay is left out of the latency). Reconcile stamps the result on the slices it creates
// or updates and removes the annotation from them when it is zero.
//
// The state is updated by every sync that gets as far as planning, even
// one that writes nothing or whose writes fail (as upstream: a retried
// write then carries no trigger time), and forgotten with the Service.
// Approximations, upstream's too: an object that changes twice between
// two syncs counts only with its last change, and a change of labels has
// no trigger time.
//
// The pods' times are kept per Service as a slice sorted by name, of the
// cached pods' own name strings and Unix nanoseconds, not upstream's map
// of names to time.Time: at 100,000 pods the maps were 13 MB of the
// controller's live heap (BenchmarkTriggerTrackerHeap, 10,000 Services
// of 10 pods: 9.6 MiB with maps, 3.6 with slices).

import (
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// triggerState is what a Service's last sync saw.
type triggerState struct {
	service time.Time            // the Service's trigger time
	pods    []podTrigger         // pods that have a trigger time, sorted by name
	removed map[string]time.Time // pod name -> when it was seen removed, since then (input only)
}

// podTrigger is a pod's trigger time as a sync saw it: name shares the
// cached pod's string, at is Unix nanoseconds.
type podTrigger struct {
	name string
	at   int64
}

func comparePodTrigger(a, b podTrigger) int { return strings.Compare(a.name, b.name) }

// podTriggerOf looks name up in ts (sorted by name).
func podTriggerOf(ts []podTrigger, name string) (int64, bool) {
	i, ok := slices.BinarySearchFunc(ts, podTrigger{name: name}, comparePodTrigger)
	if !ok {
		return 0, false
	}
	return ts[i].at, true
}

// lastChangeTriggerTime is the pure step: the trigger time of a sync of
// svc and pods given the state of the previous one (prev nil: none), and
// the state to keep for the next.
func lastChangeTriggerTime(prev *triggerState, svc *corev1.Service, pods []*Pod) (time.Time, triggerState) {
	next := triggerState{service: svc.CreationTimestamp.Time}
	var last triggerState
	if prev != nil {
		last = *prev
	}
	var earliest time.Time
	changed := func(t time.Time) {
		if earliest.IsZero() || t.Before(earliest) {
			earliest = t
		}
	}
	if len(last.removed) > 0 {
		for _, pod := range pods {
			delete(last.removed, pod.Name) // back under the same name: its own time counts
		}
		for _, t := range last.removed {
			changed(t)
		}
	}
	next.pods = make([]podTrigger, 0, len(pods))
	for _, pod := range pods {
		t := pod.triggerTime()
		if t.IsZero() {
			continue
		}
		ns := t.UnixNano()
		next.pods = append(next.pods, podTrigger{name: pod.Name, at: ns})
		if prevNs, ok := podTriggerOf(last.pods, pod.Name); !ok || ns > prevNs {
			changed(t)
		}
	}
	if !slices.IsSortedFunc(next.pods, comparePodTrigger) {
		slices.SortFunc(next.pods, comparePodTrigger)
	}
	if len(next.pods) < cap(next.pods) {
		next.pods = slices.Clone(next.pods) // kept until the next sync: no spare room
	}
	if next.service.After(last.service) {
		changed(next.service)
	}
	if prev == nil {
		return svc.CreationTimestamp.Time, next
	}
	return earliest, next
}

// TriggerTimeTracker keeps the per-Service state that trigger times are
// computed from. It is safe for concurrent use, but one Service must not
// be computed concurrently (the work queue never syncs a key twice at
// once).
type TriggerTimeTracker struct {
	mu      sync.Mutex
	states  map[string]triggerState         // by Service key "namespace/name"
	removed map[string]map[string]time.Time // Service key -> pod name -> seen removed at
}

// NewTriggerTimeTracker returns a tracker that has seen nothing.
func NewTriggerTimeTracker() *TriggerTimeTracker {
	return &TriggerTimeTracker{states: map[string]triggerState{}, removed: map[string]map[string]time.Time{}}
}

// ComputeEndpointLastChangeTriggerTime returns the trigger time to stamp
// on the slices of svc (in namespace) written by this sync, zero for none,
// and remembers svc and pods for the next one.
func (t *TriggerTimeTracker) ComputeEndpointLastChangeTriggerTime(namespace string, svc *corev1.Service, pods []*Pod) time.Time {
	key := namespace + "/" + svc.Name
	t.mu.Lock()
	prev, known := t.states[key]
	prev.removed = t.removed[key]
	delete(t.removed, key)
	t.mu.Unlock()
	var p *triggerState
	if known {
		p = &prev
	}
	at, next := lastChangeTriggerTime(p, svc, pods)
	t.mu.Lock()
	t.states[key] = next
	t.mu.Unlock()
	return at
}

// DeleteService forgets the Service namespace/name: if one of that name
// comes back, its first sync is a first sight again.
func (t *TriggerTimeTracker) DeleteService(namespace, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.states, namespace+"/"+name)
	delete(t.removed, namespace+"/"+name)
}

// PodDeleted records that pod (by name) of the Service serviceKey
// ("namespace/name") was seen removed at at: the Service's next sync
// counts it as a change then. Nothing for a Service not synced yet (its
// first sync gives its creation time anyway); the first removal counts if
// a name is removed twice before a sync.
func (t *TriggerTimeTracker) PodDeleted(serviceKey, pod string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.states[serviceKey]; !ok {
		return
	}
	if t.removed[serviceKey] == nil {
		t.removed[serviceKey] = map[string]time.Time{}
	}
	if _, ok := t.removed[serviceKey][pod]; !ok {
		t.removed[serviceKey][pod] = at
	}
}
