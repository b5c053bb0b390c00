package tracker

import (
	"maps"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Slim is the informers' transform (cache.TransformFunc): it keeps of
// Services and EndpointSlices only what Convert and the tracker read, in
// place, before the object is cached. Everything else (managedFields,
// labels and annotations, selectors, topology, target references, an
// endpoint's other addresses) is about half of what a cached object
// holds, kept for as long as the object lives; at 10,000 Services that is
// tens of megabytes the proxy never reads. It is idempotent; other
// objects pass unchanged.
func Slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		slimMeta(&o.ObjectMeta, "", "")
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
		slimMeta(&o.ObjectMeta, discovery.LabelServiceName, v1.EndpointsLastChangeTriggerTime)
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			// Only the first address counts (Convert).
			addrs := e.Addresses
			if len(addrs) > 1 {
				addrs = addrs[:1:1]
			}
			*e = discovery.Endpoint{Addresses: addrs, Conditions: e.Conditions, NodeName: e.NodeName}
		}
		for i := range o.Ports {
			o.Ports[i].AppProtocol = nil
		}
	case cache.DeletedFinalStateUnknown:
		if _, err := Slim(o.Obj); err != nil {
			return nil, err
		}
	}
	return obj, nil
}

var intstrZero = v1.ServicePort{}.TargetPort

// slimMeta keeps the name, namespace, UID and resourceVersion (the
// informer's), and at most one label and one annotation (their maps
// trimmed in place).
func slimMeta(m *metav1.ObjectMeta, label, annotation string) {
	*m = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion, UID: m.UID,
		DeletionTimestamp: m.DeletionTimestamp, Labels: only(m.Labels, label), Annotations: only(m.Annotations, annotation)}
}

// only trims m to key; nil when key is absent.
func only(m map[string]string, key string) map[string]string {
	if _, ok := m[key]; !ok || key == "" {
		return nil
	}
	maps.DeleteFunc(m, func(k, _ string) bool { return k != key })
	return m
}
