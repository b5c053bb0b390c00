package endpointslice

// Pod is what the controller keeps of a pod. At 100,000 pods the pod
// cache is most of the controller's memory, and a corev1.Pod is 1,240
// bytes before any field is set (a Container 408 more, a PodCondition
// 120): Transform turns each pod into this instead, half the heap of a
// trimmed corev1.Pod in the cache (BenchmarkPodCacheHeap; with label sets
// shared, labels.go, 0.38 of it; with PodMeta instead of an ObjectMeta,
// podmeta.go, 61 instead of 69 MiB at 50,000 pods), and every part of
// the controller reads pods as *Pod.

import (
	"maps"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Pod is a pod as the controller reads it. PodMeta keeps name,
// namespace, uid, resourceVersion, labels, and the deletion timestamp
// and grace period; the cache's key and namespace index read it.
type Pod struct {
	PodMeta
	NodeName, Hostname, Subdomain string // spec
	Phase                         corev1.PodPhase
	// IPs are status.podIPs, or status.podIP alone when podIPs is empty
	// (as the API's older clients wrote it).
	IPs []string
	// Ready is the status of the Ready condition ("" without one) and
	// ReadySince its lastTransitionTime in Unix nanoseconds, 0 for none
	// (8 bytes, not a metav1.Time's 24: a Pod is 256 bytes, the Go
	// allocator's class below 288).
	Ready      corev1.ConditionStatus
	ReadySince int64
	// Ports are the containers' ports, in order, then SidecarPorts those
	// of the restartable (sidecar) init containers: where FindPort looks
	// a named targetPort up.
	Ports, SidecarPorts []corev1.ContainerPort
	// template holds Labels, Ports and SidecarPorts when they are
	// interned (PodOf): it keeps their table entry alive while this Pod
	// is cached.
	template *podTemplate
}

var _ runtime.Object = (*Pod)(nil)

// GetObjectKind: a Pod is never encoded; it has no type metadata.
func (p *Pod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject is DeepCopy (the informer's mutation detector calls it).
func (p *Pod) DeepCopyObject() runtime.Object { return p.DeepCopy() }

// DeepCopy returns a copy sharing nothing with p that anyone may write.
func (p *Pod) DeepCopy() *Pod {
	out := *p
	out.Labels = maps.Clone(p.Labels) // template stays: it only keeps the set alive
	if p.DeletionTimestamp != nil {
		out.DeletionTimestamp = p.DeletionTimestamp.DeepCopy()
	}
	if p.DeletionGracePeriodSeconds != nil {
		g := *p.DeletionGracePeriodSeconds
		out.DeletionGracePeriodSeconds = &g
	}
	out.IPs = slices.Clone(p.IPs)
	out.Ports = slices.Clone(p.Ports)
	out.SidecarPorts = slices.Clone(p.SidecarPorts)
	return &out
}

// Equal reports whether p and o say the same, whichever label set keeps
// their labels alive (go-cmp compares Pods with it).
func (p *Pod) Equal(o *Pod) bool {
	if p == nil || o == nil {
		return p == o
	}
	a, b := *p, *o
	a.template, b.template = nil, nil
	return reflect.DeepEqual(a, b)
}

// PodOf is what the controller keeps of p (Transform's result for a pod).
// Its Labels, Ports and SidecarPorts are shared with every other Pod of
// the same: read them, never write them.
func PodOf(p *corev1.Pod) *Pod {
	ls := internTemplate(p.Labels, containerPorts(p.Spec.Containers, false), containerPorts(p.Spec.InitContainers, true))
	out := &Pod{
		template: ls,
		PodMeta: PodMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp:          p.DeletionTimestamp,
			DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds,
		},
		NodeName: p.Spec.NodeName, Hostname: p.Spec.Hostname, Subdomain: p.Spec.Subdomain,
		Phase: p.Status.Phase,
	}
	if ls != nil {
		out.Labels, out.Ports, out.SidecarPorts = ls.m, ls.ports, ls.sidecarPorts
	}
	switch {
	case len(p.Status.PodIPs) > 0:
		out.IPs = make([]string, len(p.Status.PodIPs))
		for i, ip := range p.Status.PodIPs {
			out.IPs[i] = ip.IP
		}
	case p.Status.PodIP != "":
		out.IPs = []string{p.Status.PodIP}
	}
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodReady {
			out.Ready = c.Status
			if !c.LastTransitionTime.IsZero() {
				out.ReadySince = c.LastTransitionTime.UnixNano()
			}
			break
		}
	}
	return out
}

// containerPorts are the ports of cs, in order; of init containers, only
// of the restartable ones.
func containerPorts(cs []corev1.Container, init bool) []corev1.ContainerPort {
	var ports []corev1.ContainerPort
	for i := range cs {
		if init && (cs[i].RestartPolicy == nil || *cs[i].RestartPolicy != corev1.ContainerRestartPolicyAlways) {
			continue
		}
		ports = append(ports, cs[i].Ports...)
	}
	return ports
}

// wanted: not finished (Succeeded/Failed) and has an IP. Terminating pods
// stay, with their conditions saying so.
func (p *Pod) wanted() bool {
	return p.Phase != corev1.PodSucceeded && p.Phase != corev1.PodFailed && len(p.IPs) > 0
}

func (p *Pod) ready() bool { return p.Ready == corev1.ConditionTrue }

// triggerTime is the lastTransitionTime of the Ready condition (zero
// without one) or, if later, when the pod's deletion was accepted.
func (p *Pod) triggerTime() time.Time {
	var t time.Time
	if p.Ready != "" && p.ReadySince != 0 {
		t = time.Unix(0, p.ReadySince)
	}
	if d, g := p.DeletionTimestamp, p.DeletionGracePeriodSeconds; d != nil && g != nil {
		if asked := d.Add(-time.Duration(*g) * time.Second); asked.After(t) {
			t = asked
		}
	}
	return t
}

// endpointsChanged reports whether cur differs from p in anything
// Reconcile or the trigger time tracker reads, labels aside (as
// upstream's podEndpointsChanged, but also phase, node, hostname, ports,
// and by value rather than by pointer).
func (p *Pod) endpointsChanged(cur *Pod) bool {
	return !p.DeletionTimestamp.Equal(cur.DeletionTimestamp) ||
		!ptrEqual(p.DeletionGracePeriodSeconds, cur.DeletionGracePeriodSeconds) ||
		p.UID != cur.UID ||
		p.Phase != cur.Phase ||
		!slices.Equal(p.IPs, cur.IPs) ||
		p.NodeName != cur.NodeName ||
		p.Hostname != cur.Hostname ||
		p.Subdomain != cur.Subdomain ||
		p.Ready != cur.Ready ||
		p.ReadySince != cur.ReadySince ||
		!slices.Equal(p.Ports, cur.Ports) ||
		!slices.Equal(p.SidecarPorts, cur.SidecarPorts)
}

// ptrEqual: both nil, or pointing to equal values.
func ptrEqual[T comparable](a, b *T) bool {
	return a == b || a != nil && b != nil && *a == *b
}
