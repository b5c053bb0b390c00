package endpointslice

// A table of shared, read-only values held weakly: a value lives as long
// as some cached object points to it, and its entry goes with it. The pod
// cache shares label sets through one (labels.go), the slice cache node
// names and zones (transform.go).

import (
	"runtime"
	"sync"
	"weak"
)

type internTable[T any] struct {
	mu     sync.Mutex
	values map[string]weak.Pointer[T]
}

func newInternTable[T any]() *internTable[T] {
	return &internTable[T]{values: map[string]weak.Pointer[T]{}}
}

// get returns the shared value for key, made by mk when there is none.
func (t *internTable[T]) get(key string, mk func() *T) *T {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.values[key].Value(); p != nil {
		return p
	}
	p := mk()
	t.values[key] = weak.Make(p)
	runtime.AddCleanup(p, t.forget, key)
	return p
}

// forget drops key's entry once its value is gone (and not made anew
// since).
func (t *internTable[T]) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if wp, ok := t.values[key]; ok && wp.Value() == nil {
		delete(t.values, key)
	}
}

func (t *internTable[T]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.values)
}
