package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestSlim checks that the shared factory's transform keeps what nodeipam,
// the binder and the EndpointSlice controller read and drops the rest.
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
	n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0"}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: metav1.Now()},
	}
	n.Status.NodeInfo.KubeletVersion = "v1.37.2"
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
	svc = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: "{}"}}}
	if got, _ = slim(svc.DeepCopy()); !cmp.Equal(svc, got) {
		t.Errorf("slim(service) must keep the annotations lbipam writes back: %s", cmp.Diff(svc, got))
	}
	gone := cache.DeletedFinalStateUnknown{Key: "n1", Obj: n}
	if got, _ = slim(gone); !cmp.Equal(cache.DeletedFinalStateUnknown{Key: "n1", Obj: keep()}, got) {
		t.Errorf("slim(DeletedFinalStateUnknown): %s", cmp.Diff(cache.DeletedFinalStateUnknown{Key: "n1", Obj: keep()}, got))
	}
}
