package endpointslice

// Interned label sets. The pods of one workload carry the same labels
// (a ReplicaSet's replicas differ in none), and a map of a few labels is
// ~300 bytes: at 100,000 pods that is 30 MB of identical maps in the pod
// cache. Transform gives every pod with the same labels one shared,
// read-only map. The table (intern.go) holds each set weakly: a set lives
// as long as some cached Pod points to it (Pod.labelSet).

import (
	"maps"
	"slices"
	"strings"
)

// labelSet is one interned set of labels; m is never written once made.
type labelSet struct{ m map[string]string }

var labelTable = newInternTable[labelSet]()

// internLabels returns the shared set equal to l (nil for no labels).
func internLabels(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	return labelTable.get(labelKey(l), func() *labelSet { return &labelSet{m: maps.Clone(l)} })
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
