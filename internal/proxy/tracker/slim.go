package tracker

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// Slim is the informers' transform (cache.TransformFunc): it turns Services
// into Svcs and EndpointSlices into Slices, which hold only what the
// tracker reads, before the object is cached. Everything else (metadata
// but the name, namespace, UID and resourceVersion, selectors, topology,
// target references, an endpoint's other addresses, the pointers and maps
// of the API types) is most of what a cached object holds, kept for as
// long as it lives; at 10,000 Services that is tens of megabytes the proxy
// never reads. It is idempotent; other objects pass unchanged.
func Slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		return CompactService(o), nil
	case *discovery.EndpointSlice:
		return CompactSlice(o), nil
	case cache.DeletedFinalStateUnknown:
		inner, err := Slim(o.Obj)
		if err != nil {
			return nil, err
		}
		o.Obj = inner
		return o, nil
	}
	return obj, nil
}
