package endpointslice

import (
	"fmt"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const ns = "default"

type svcOpt func(*corev1.Service)

func service(name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": name},
			ClusterIP:  "10.96.0.10",
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withPorts(ps ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ps }
}

func dualStack(s *corev1.Service) {
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

func publishNotReady(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }

func headless(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone; s.Spec.Ports = nil }

func svcLabels(l map[string]string) svcOpt { return func(s *corev1.Service) { s.Labels = l } }

type podOpt func(*corev1.Pod)

// pod is a Running, Ready pod of app on node with ips.
func pod(name, app, node string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

// podsOf is what the controller's cache keeps of ps.
func podsOf(ps ...*corev1.Pod) []*Pod {
	out := make([]*Pod, len(ps))
	for i, p := range ps {
		out[i] = PodOf(p)
	}
	return out
}

func with(p *corev1.Pod, opts ...podOpt) *corev1.Pod {
	for _, o := range opts {
		o(p)
	}
	return p
}

func notReady(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }

func terminating(p *corev1.Pod) {
	t := metav1.NewTime(metav1.Now().Rfc3339Copy().Time)
	p.DeletionTimestamp = &t
}

func succeeded(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }

func containerPort(name string, port int32) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name:  fmt.Sprintf("c%d", len(p.Spec.Containers)),
			Ports: []corev1.ContainerPort{{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}},
		})
	}
}

func sidecarPort(name string, port int32) podOpt {
	return func(p *corev1.Pod) {
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{
			Name: "sidecar", RestartPolicy: &always,
			Ports: []corev1.ContainerPort{{Name: name, ContainerPort: port, Protocol: corev1.ProtocolTCP}},
		})
	}
}

func hostname(h, sub string) podOpt {
	return func(p *corev1.Pod) { p.Spec.Hostname, p.Spec.Subdomain = h, sub }
}

func node(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	return n
}

func nodeGetter(nodes []*corev1.Node) NodeGetter {
	return func(name string) (*corev1.Node, bool) {
		for _, n := range nodes {
			if n.Name == name {
				return n, true
			}
		}
		return nil, false
	}
}

// manyPods is n ready pods of app spread over node-a/node-b.
func manyPods(app string, n int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		out = append(out, pod(fmt.Sprintf("%s-%03d", app, i), app, []string{"node-a", "node-b"}[i%2],
			fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)))
	}
	return out
}

var nameSeq atomic.Int64

// nameOnCreate makes a fake clientset name objects created with only
// GenerateName, as the API server does.
func nameOnCreate(c *fake.Clientset) {
	c.PrependReactor("create", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*discovery.EndpointSlice)
		if s.Name == "" {
			s.Name = fmt.Sprintf("%sgen%d", s.GenerateName, nameSeq.Add(1))
		}
		return false, nil, nil
	})
}

// get is the indexed pod namespace/name, nil if none.
func (x *podIndex) get(namespace, name string) *Pod {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, p := range x.byNamespace[namespace] {
		if p.Name == name {
			return p
		}
	}
	return nil
}
