package endpointslice

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// decodedSlice is slice i of a Service with n endpoints as a client
// decodes it: every field its own allocation (a protobuf round trip, as
// the controller's client speaks).
func decodedSlice(tb testing.TB, i, n int) *discovery.EndpointSlice {
	ns := fmt.Sprintf("ns-%d", i%50)
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("svc-%d-abcde", i), Namespace: ns, ResourceVersion: fmt.Sprint(i),
			Labels:      map[string]string{discovery.LabelServiceName: fmt.Sprintf("svc-%d", i), discovery.LabelManagedBy: ManagedBy},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-12-04T02:50:00.123456789Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: fmt.Sprintf("svc-%d", i),
				UID: types.UID(fmt.Sprintf("10000000-0000-0000-0000-%012d", i)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "flatnet-controller", Operation: metav1.ManagedFieldsOperationUpdate,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:endpoints":{},"f:metadata":{"f:labels":{}},"f:ports":{}}`)}}},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for e := range n {
		p := i*n + e
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", p>>16&255, p>>8&255, p&255)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", p%5000)),
			Zone:       ptr.To(fmt.Sprintf("zone-%d", p%3)),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("web-%d", p), UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", p))},
		})
	}
	b, err := s.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	out := &discovery.EndpointSlice{}
	if err := out.Unmarshal(b); err != nil {
		tb.Fatal(err)
	}
	return out
}

func TestTransformSlice(t *testing.T) {
	s := decodedSlice(t, 7, 4)
	s.Annotations["note"] = "kept"
	want := s.DeepCopy()
	want.ManagedFields = nil
	want.Annotations = map[string]string{"note": "kept"}
	got, err := Transform(s)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(want, got) {
		t.Fatalf("transformed slice differs:\n%+v\nwant\n%+v", got, want)
	}
	// The trigger time alone: no annotations at all.
	if only, _ := Transform(decodedSlice(t, 8, 1)); only.(*discovery.EndpointSlice).Annotations != nil {
		t.Errorf("annotations left: %v", only.(*discovery.EndpointSlice).Annotations)
	}
	// Label keys, our managed-by value and the owner's kind: constants.
	gs := got.(*discovery.EndpointSlice)
	for k, v := range gs.Labels {
		if k == discovery.LabelManagedBy && (unsafe.StringData(k) != unsafe.StringData(discovery.LabelManagedBy) || unsafe.StringData(v) != unsafe.StringData(ManagedBy)) ||
			k == discovery.LabelServiceName && unsafe.StringData(k) != unsafe.StringData(discovery.LabelServiceName) {
			t.Errorf("label %s=%s is a decoded copy, not the constant", k, v)
		}
	}
	if r := gs.OwnerReferences[0]; unsafe.StringData(r.Kind) != unsafe.StringData("Service") || r.Controller != &sharedTrue {
		t.Errorf("owner reference %+v: kind and controller not shared", r)
	}
	// Alike fields share one copy, across slices too.
	other, _ := Transform(decodedSlice(t, 7, 4))
	a, b := got.(*discovery.EndpointSlice).Endpoints, other.(*discovery.EndpointSlice).Endpoints
	if a[0].Conditions.Ready != b[1].Conditions.Terminating && a[0].Conditions.Ready == a[0].Conditions.Terminating {
		t.Error("conditions: true and false share one pointer")
	}
	if a[0].Conditions.Ready != b[0].Conditions.Serving || a[0].NodeName != b[0].NodeName || a[0].Zone != b[0].Zone {
		t.Error("equal conditions, node names and zones are not shared")
	}
	// Twice is once.
	again, _ := Transform(got.(*discovery.EndpointSlice).DeepCopy())
	if !equality.Semantic.DeepEqual(want, again) {
		t.Error("transform not idempotent")
	}
	// A copy shares nothing: writing it leaves the cached slice as it was.
	cp := got.(*discovery.EndpointSlice).DeepCopy()
	*cp.Endpoints[0].Conditions.Ready = false
	*cp.Endpoints[0].NodeName = "elsewhere"
	if !*a[0].Conditions.Ready || *a[0].NodeName == "elsewhere" || !sharedTrue {
		t.Error("a DeepCopy's write reached the shared values")
	}
	runtime.KeepAlive(other)
}

// BenchmarkSliceCacheHeap is the heap a slice informer's store holds for
// 10,000 Services of 10 endpoints each, as decoded and transformed (MiB
// after GC, reported as the metric MiB; run with -benchtime 1x).
func BenchmarkSliceCacheHeap(b *testing.B) {
	const services, perService = 10000, 10
	for _, tc := range []struct {
		name      string
		transform func(*discovery.EndpointSlice)
	}{
		{"managedFields-dropped", func(s *discovery.EndpointSlice) { s.ManagedFields = nil }},
		{"transformed", func(s *discovery.EndpointSlice) { _, _ = Transform(s) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			reportHeap(b, func() any {
				store := map[int]*discovery.EndpointSlice{}
				for i := range services {
					s := decodedSlice(b, i, perService)
					tc.transform(s)
					store[i] = s
				}
				return store
			})
		})
	}
}
