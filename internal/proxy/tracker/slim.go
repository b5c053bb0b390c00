package tracker

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Slim is the informers' transform (cache.TransformFunc): it keeps of
// Services only what Convert and the tracker read, in place, and turns
// EndpointSlices into Slices, before the object is cached. Everything else (managedFields,
// labels and annotations, selectors, topology, target references, an
// endpoint's other addresses) is more than half of what a cached object
// holds, kept for as long as the object lives; at 10,000 Services that is
// tens of megabytes the proxy never reads. It is idempotent; other
// objects pass unchanged.
func Slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		slimMeta(&o.ObjectMeta)
		s := &o.Spec
		s.Selector, s.LoadBalancerIP, s.ExternalName, s.IPFamilies, s.IPFamilyPolicy = nil, "", "", nil, nil
		s.PublishNotReadyAddresses, s.AllocateLoadBalancerNodePorts, s.LoadBalancerClass, s.TrafficDistribution = false, nil, nil, nil
		for i := range s.Ports {
			s.Ports[i].AppProtocol, s.Ports[i].TargetPort = nil, intstrZero
		}
		ing := o.Status.LoadBalancer.Ingress
		for i := range ing {
			ing[i] = v1.LoadBalancerIngress{IP: ing[i].IP}
		}
		o.Status = v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: ing}}
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

var intstrZero = v1.ServicePort{}.TargetPort

// slimMeta keeps the name, namespace, UID and resourceVersion (the
// informer's) and the deletion timestamp.
func slimMeta(m *metav1.ObjectMeta) {
	*m = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion, UID: m.UID,
		DeletionTimestamp: m.DeletionTimestamp}
}
