package endpointslice

// The informer transform. At 50,000 pods most of the controller's memory
// is cached fields it never reads: managedFields, and of a pod nearly
// everything (images, env, volumes, resources, container statuses). The
// transform keeps exactly what Reconcile, the trigger time tracker, the
// indexes and the event handlers read:
//
//   - Pod: a *Pod (pod.go): name, namespace, uid, resourceVersion,
//     labels, deletion timestamp and grace period; spec.nodeName,
//     hostname, subdomain, the ports of the containers and of the
//     restartable init containers; status.phase, podIP(s) and the Ready
//     condition.
//   - Node: name, uid, resourceVersion and labels (endpoints show the
//     zone label; a pod on an unknown node is left out).
//   - Service: all but managedFields and kubectl's last-applied copy.
//   - EndpointSlice: all but managedFields (slices are updated whole; an
//     update without managedFields leaves the server's as they are) and
//     the last-change-trigger-time annotation (every write of ours sets
//     it anew or removes it: stampTriggerTime), with what many slices and
//     endpoints hold alike shared (compactSliceMeta, shareEndpointFields)
//     and, in the controller's informer, each endpoint's pod name and uid
//     the cached pod's own strings (Controller.sharePodStrings).
//
// The oracle test runs Reconcile on transformed pods and nodes against
// upstream's reconciler on the full objects.

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Transform is the cache.TransformFunc for the informers of the factory
// given to New (informers.WithTransform). It may change obj in place and
// gives the same result applied twice.
func Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case cache.DeletedFinalStateUnknown:
		inner, err := Transform(o.Obj)
		o.Obj = inner
		return o, err
	case *corev1.Pod:
		return PodOf(o), nil
	case *corev1.Node:
		return &corev1.Node{TypeMeta: o.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion, Labels: o.Labels,
		}}, nil
	case *corev1.Service:
		o.ManagedFields = nil
		if _, ok := o.Annotations[corev1.LastAppliedConfigAnnotation]; ok {
			o.Annotations = maps.Clone(o.Annotations)
			delete(o.Annotations, corev1.LastAppliedConfigAnnotation)
		}
	case *discovery.EndpointSlice:
		o.ManagedFields = nil
		compactSliceMeta(o)
		shareEndpointFields(o)
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// Shared endpoint fields. An endpoint of a cached slice is ~440 bytes,
// and at 100,000 ready pods the slices are the largest part of the
// controller's heap. Of each endpoint's allocations, the three condition
// booleans, the node name and zone (pointers to strings that thousands of
// endpoints hold alike) and its targetRef's kind and namespace (the
// slice's own) need not be its own: shareEndpointFields points them at
// one shared, read-only copy. Nothing writes a cached slice (updates
// start from a DeepCopy, which copies what the pointers point to).
var (
	sharedTrue, sharedFalse = true, false
	nodeNames               = newInternTable[string]()
	zones                   = newInternTable[string]()
)

func shareEndpointFields(s *discovery.EndpointSlice) {
	// A decoder appends endpoints one at a time: the array it leaves has
	// room for up to twice as many (96 bytes each), kept as long as the
	// slice is cached. A copy of the right size lets that go.
	if cap(s.Endpoints) > len(s.Endpoints) {
		s.Endpoints = append(make([]discovery.Endpoint, 0, len(s.Endpoints)), s.Endpoints...)
	}
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		ep.Conditions.Ready = sharedBool(ep.Conditions.Ready)
		ep.Conditions.Serving = sharedBool(ep.Conditions.Serving)
		ep.Conditions.Terminating = sharedBool(ep.Conditions.Terminating)
		ep.NodeName = sharedString(nodeNames, ep.NodeName)
		ep.Zone = sharedString(zones, ep.Zone)
		if r := ep.TargetRef; r != nil {
			// Equal strings, but the constant and the slice's own
			// namespace in place of the decoded copies.
			if r.Kind == "Pod" {
				r.Kind = "Pod"
			}
			if r.Namespace == s.Namespace {
				r.Namespace = s.Namespace
			}
		}
	}
}

// compactSliceMeta drops the trigger time annotation and points the
// label keys and values, and the owner reference fields, that every slice
// of ours holds alike at constants (10,000 Services are 10,000 slices or
// more: ~0.5 KB each in decoded copies and an annotation map).
func compactSliceMeta(s *discovery.EndpointSlice) {
	if _, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		delete(s.Annotations, corev1.EndpointsLastChangeTriggerTime)
		if len(s.Annotations) == 0 {
			s.Annotations = nil
		}
	}
	if _, ok := s.Labels[discovery.LabelManagedBy]; ok {
		labels := make(map[string]string, len(s.Labels))
		for k, v := range s.Labels {
			switch k {
			case discovery.LabelServiceName:
				k = discovery.LabelServiceName
			case discovery.LabelManagedBy:
				k = discovery.LabelManagedBy
				if v == ManagedBy {
					v = ManagedBy
				}
			}
			labels[k] = v
		}
		s.Labels = labels
	}
	for i := range s.OwnerReferences {
		r := &s.OwnerReferences[i]
		if r.APIVersion == "v1" && r.Kind == "Service" {
			r.APIVersion, r.Kind = "v1", "Service"
		}
		r.Controller = sharedBool(r.Controller)
		r.BlockOwnerDeletion = sharedBool(r.BlockOwnerDeletion)
	}
}

func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	default:
		return &sharedFalse
	}
}

func sharedString(t *internTable[string], s *string) *string {
	if s == nil {
		return nil
	}
	return t.get(*s, func() *string { v := *s; return &v })
}
