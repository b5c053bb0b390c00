package controller

import (
	"sync"

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
