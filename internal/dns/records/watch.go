package records

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Watch feeds ix from f's Service and EndpointSlice informers, and its Pod
// informer when pods is set (verified pod records, autopath). The
// informers keep trimmed copies (transforms drop managed fields and every
// field DNS does not read), which is most of the memory a cluster's worth
// of objects costs. Call before f is started; wait on the returned
// HasSynced functions before answering, or existing names would be
// NXDOMAIN for a moment.
func (ix *Index) Watch(f informers.SharedInformerFactory, pods bool) ([]cache.InformerSynced, error) {
	var synced []cache.InformerSynced
	svc := f.Core().V1().Services().Informer()
	eps := f.Discovery().V1().EndpointSlices().Informer()
	add := []struct {
		what string
		inf  cache.SharedIndexInformer
		tf   cache.TransformFunc
		up   func(any)
		del  func(ns, name string)
	}{
		{"services", svc, trimService, func(o any) {
			if s, ok := o.(*corev1.Service); ok {
				ix.UpsertService(s)
			}
		}, ix.DeleteService},
		{"endpointslices", eps, trimSlice, func(o any) {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				ix.UpsertEndpointSlice(s)
			}
		}, ix.DeleteEndpointSlice},
	}
	if pods {
		add = append(add, struct {
			what string
			inf  cache.SharedIndexInformer
			tf   cache.TransformFunc
			up   func(any)
			del  func(ns, name string)
		}{"pods", f.Core().V1().Pods().Informer(), trimPod, func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				ix.UpsertPod(p)
			}
		}, ix.DeletePod})
	}
	for _, a := range add {
		if err := a.inf.SetTransform(a.tf); err != nil {
			return nil, fmt.Errorf("watching %s: %w", a.what, err)
		}
		del := a.del
		reg, err := a.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    a.up,
			UpdateFunc: func(_, cur any) { a.up(cur) },
			DeleteFunc: func(o any) {
				if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				if m, ok := o.(metav1.Object); ok {
					del(m.GetNamespace(), m.GetName())
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("watching %s: %w", a.what, err)
		}
		synced = append(synced, reg.HasSynced)
	}
	return synced, nil
}

// trimMeta keeps what identifies an object and what DNS reads of its
// metadata.
func trimMeta(m *metav1.ObjectMeta, keepLabel, keepAnnotation string) {
	m.ManagedFields = nil
	m.OwnerReferences = nil
	m.Finalizers = nil
	if v, ok := m.Labels[keepLabel]; ok && keepLabel != "" {
		m.Labels = map[string]string{keepLabel: v}
	} else {
		m.Labels = nil
	}
	if v, ok := m.Annotations[keepAnnotation]; ok && keepAnnotation != "" {
		m.Annotations = map[string]string{keepAnnotation: v}
	} else {
		m.Annotations = nil
	}
}

func trimService(o any) (any, error) {
	s, ok := o.(*corev1.Service)
	if !ok {
		return o, nil
	}
	trimMeta(&s.ObjectMeta, "", tolerateUnreadyAnnotation)
	s.Spec.Selector = nil
	s.Status = corev1.ServiceStatus{}
	return s, nil
}

func trimSlice(o any) (any, error) {
	es, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return o, nil
	}
	trimMeta(&es.ObjectMeta, discoveryv1.LabelServiceName, "")
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		e.TargetRef, e.NodeName, e.Zone, e.Hints, e.DeprecatedTopology = nil, nil, nil, nil, nil
	}
	return es, nil
}

func trimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	trimMeta(&p.ObjectMeta, "", "")
	p.Spec = corev1.PodSpec{HostNetwork: p.Spec.HostNetwork}
	p.Status = corev1.PodStatus{PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs}
	return p, nil
}
