package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSlim checks that the shared factory's transform keeps what nodeipam
// and the binder read and drops the rest.
func TestSlim(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	keep := func() *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}},
			Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}, Unschedulable: true,
				Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
	}
	n := keep()
	n.ManagedFields = mf
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 1}}
	n.Status.VolumesInUse = []corev1.UniqueVolumeName{"v"}
	n.Status.VolumesAttached = []corev1.AttachedVolume{{Name: "v"}}
	got, err := slim(n)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(keep(), got); d != "" {
		t.Errorf("slim(node) (-want +got):\n%s", d)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: mf}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	got, err = slim(svc)
	if err != nil {
		t.Fatal(err)
	}
	if want := (&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}); !cmp.Equal(want, got) {
		t.Errorf("slim(service): %s", cmp.Diff(want, got))
	}
}
