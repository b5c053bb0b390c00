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
//     update without managedFields leaves the server's as they are).
//
// The oracle test runs Reconcile on transformed pods and nodes against
// upstream's reconciler on the full objects.

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
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
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}
