package compile

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestMergeConditions(t *testing.T) {
	then := metav1.NewTime(epoch)
	now := metav1.NewTime(epoch.Add(time.Hour))
	current := []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 1, LastTransitionTime: then},
		{Type: "ResolvedRefs", Status: metav1.ConditionTrue, Reason: "ResolvedRefs", ObservedGeneration: 1, LastTransitionTime: then},
		{Type: "PartiallyInvalid", Status: metav1.ConditionTrue, Reason: "UnsupportedValue", ObservedGeneration: 1, LastTransitionTime: then},
	}
	desired := []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 2},
		{Type: "ResolvedRefs", Status: metav1.ConditionFalse, Reason: "BackendNotFound", ObservedGeneration: 2},
	}
	want := []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 2, LastTransitionTime: then},
		{Type: "ResolvedRefs", Status: metav1.ConditionFalse, Reason: "BackendNotFound", ObservedGeneration: 2, LastTransitionTime: now},
	}
	if diff := cmp.Diff(want, MergeConditions(current, desired, now)); diff != "" {
		t.Errorf("MergeConditions (-want +got):\n%s", diff)
	}
}

func TestMergeRouteParents(t *testing.T) {
	then := metav1.NewTime(epoch)
	now := metav1.NewTime(epoch.Add(time.Hour))
	ref := func(name string) gwv1.ParentReference {
		return gwv1.ParentReference{Group: ptrTo(gwv1.Group(gwv1.GroupName)), Kind: ptrTo(gwv1.Kind("Gateway")), Name: gwv1.ObjectName(name)}
	}
	accepted := func(gen int64, t metav1.Time) []metav1.Condition {
		return []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: gen, LastTransitionTime: t}}
	}
	current := []gwv1.RouteParentStatus{
		{ParentRef: ref("theirs"), ControllerName: "example.com/other", Conditions: accepted(1, then)},
		{ParentRef: ref("gone"), ControllerName: ControllerName, Conditions: accepted(1, then)},
		{ParentRef: ref("gw"), ControllerName: ControllerName, Conditions: accepted(1, then)},
	}
	ours := []gwv1.RouteParentStatus{{ParentRef: ref("gw"), ControllerName: ControllerName, Conditions: accepted(2, metav1.Time{})}}
	want := []gwv1.RouteParentStatus{
		{ParentRef: ref("theirs"), ControllerName: "example.com/other", Conditions: accepted(1, then)},
		{ParentRef: ref("gw"), ControllerName: ControllerName, Conditions: accepted(2, then)},
	}
	got := MergeRouteParents(current, ours, now)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MergeRouteParents (-want +got):\n%s", diff)
	}
	// Merging again changes nothing: the writer has nothing to write.
	if again := MergeRouteParents(got, ours, now); !equality.Semantic.DeepEqual(again, got) {
		t.Error("not idempotent")
	}
	if got := MergeRouteParents(nil, nil, now); got == nil || len(got) != 0 {
		t.Errorf("no parents: %#v, want an empty list (parents is required)", got)
	}
}

// TestMergeGatewayStatus: a Compile's statuses, merged twice, need no
// second write, and a listener keeps its transition times.
func TestMergeGatewayStatus(t *testing.T) {
	in := loadConformance(t, "gateway-with-attached-routes.yaml")
	out := Compile(in)
	k := gwKey("gateway-with-two-attached-routes")
	t1 := metav1.NewTime(epoch)
	t2 := metav1.NewTime(epoch.Add(time.Minute))
	first := MergeGatewayStatus(gwv1.GatewayStatus{}, out.Gateways[k], t1)
	second := MergeGatewayStatus(first, Compile(in).Gateways[k], t2)
	if !equality.Semantic.DeepEqual(first, second) {
		t.Errorf("a second merge changed the status:\n%s", cmp.Diff(first, second))
	}
	if tt := second.Listeners[0].Conditions[0].LastTransitionTime; !tt.Equal(&t1) {
		t.Errorf("listener condition time %v, want %v", tt, t1)
	}
	cls := MergeGatewayClassStatus(gwv1.GatewayClassStatus{}, out.GatewayClasses["flatnet"], t1)
	if len(cls.SupportedFeatures) == 0 || !cls.Conditions[0].LastTransitionTime.Equal(&t1) {
		t.Errorf("class status %+v", cls)
	}
}
