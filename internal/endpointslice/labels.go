package endpointslice

// Interned label sets. The pods of one workload carry the same labels
// (a ReplicaSet's replicas differ in none), and a map of a few labels is
// ~300 bytes: at 100,000 pods that is 30 MB of identical maps in the pod
// cache. Transform gives every pod with the same labels one shared,
// read-only map. The table holds each set weakly: a set lives as long as
// some cached Pod points to it (Pod.labelSet), and its entry goes with it.

import (
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"weak"
)

// labelSet is one interned set of labels; m is never written once made.
type labelSet struct{ m map[string]string }

var labelTable = struct {
	sync.Mutex
	sets map[string]weak.Pointer[labelSet]
}{sets: map[string]weak.Pointer[labelSet]{}}

// internLabels returns the shared set equal to l (nil for no labels).
func internLabels(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	key := labelKey(l)
	labelTable.Lock()
	defer labelTable.Unlock()
	if p := labelTable.sets[key].Value(); p != nil {
		return p
	}
	p := &labelSet{m: maps.Clone(l)}
	labelTable.sets[key] = weak.Make(p)
	runtime.AddCleanup(p, forgetLabels, key)
	return p
}

// forgetLabels drops key's entry once its set is gone (and not made anew
// since).
func forgetLabels(key string) {
	labelTable.Lock()
	defer labelTable.Unlock()
	if wp, ok := labelTable.sets[key]; ok && wp.Value() == nil {
		delete(labelTable.sets, key)
	}
}

// labelKey is l in one string: sorted key=value pairs, NUL-separated (NUL
// is in no label key or value).
func labelKey(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}
