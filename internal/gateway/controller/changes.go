package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/compile"
)

// maxIncremental is the number of changed routes from which sync compiles
// everything again rather than route by route (a full compile costs about
// as much as a few hundred single-route steps, and the informers' first
// listing adds every route).
const maxIncremental = 500

// changes is what changed since the last sync, as the event handlers saw
// it: the keys of changed routes, or full when anything else changed (or
// a route whose key cannot be read). A key only says "look again": sync
// reads the route from the cache, where a deleted one is missing.
type changes struct {
	mu     sync.Mutex
	full   bool
	routes map[compile.RouteKey]struct{}
	// skipped: Services (or their EndpointSlices) whose events were let
	// pass as changing nothing, and whether Node events were, since the
	// last recheck (see recheck).
	skipped      map[types.NamespacedName]bool
	skippedNodes bool
}

// skip records an event let pass: a change to Service k (or its slices),
// or with node, to a Node.
func (ch *changes) skip(k types.NamespacedName, node bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if node {
		ch.skippedNodes = true
		return
	}
	if ch.skipped == nil {
		ch.skipped = map[types.NamespacedName]bool{}
	}
	ch.skipped[k] = true
}

// recheck closes the window in which a compile made an object relevant
// after its event was let pass: called once a compile's result is
// published (what it uses, whether frontends exist), it asks for a full
// compile if any event skipped since the previous recheck now matters,
// and reports whether it did. Events after it are judged against the
// published result.
func (ch *changes) recheck(uses func(namespace, name string) bool, nodesMatter bool) bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	again := ch.skippedNodes && nodesMatter
	for k := range ch.skipped {
		if again {
			break
		}
		again = uses(k.Namespace, k.Name)
	}
	ch.skipped, ch.skippedNodes = nil, false
	if again {
		ch.full, ch.routes = true, nil
	}
	return again
}

// all asks for a full compile.
func (ch *changes) all() {
	ch.mu.Lock()
	ch.full, ch.routes = true, nil
	ch.mu.Unlock()
}

// route records a change to a route (an object or a deletion tombstone).
func (ch *changes) route(kind gwv1.Kind, obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	ns, name, err2 := cache.SplitMetaNamespaceKey(key)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.full {
		return
	}
	if err != nil || err2 != nil || len(ch.routes) >= maxIncremental {
		ch.full, ch.routes = true, nil
		return
	}
	if ch.routes == nil {
		ch.routes = map[compile.RouteKey]struct{}{}
	}
	ch.routes[compile.RouteKey{Kind: kind, Namespace: ns, Name: name}] = struct{}{}
}

// take returns what changed and starts over.
func (ch *changes) take() (full bool, routes []compile.RouteKey) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	full = ch.full
	for k := range ch.routes {
		routes = append(routes, k)
	}
	ch.full, ch.routes = false, nil
	return full, routes
}
