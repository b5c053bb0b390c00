package compile

import (
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Merging. Compile's statuses are desired data with no transition times;
// the writer turns them into what to write with these, pure functions of
// the object's current status, the desired one and the time. They replace
// our conditions whole (a condition Compile no longer gives, such as a
// PartiallyInvalid that is no longer true, goes away; meta.SetStatusCondition
// alone would keep it), keep a condition's lastTransitionTime while its
// status stays the same, and keep route parents entries of other
// controllers as they are. When the result equals the current status
// (equality.Semantic.DeepEqual) there is nothing to write.

// MergeConditions returns desired with transition times: the current
// condition's when its status is unchanged, now otherwise.
func MergeConditions(current, desired []metav1.Condition, now metav1.Time) []metav1.Condition {
	if desired == nil {
		return nil
	}
	out := make([]metav1.Condition, len(desired))
	for i, d := range desired {
		d.LastTransitionTime = now
		for _, c := range current {
			if c.Type == d.Type && c.Status == d.Status {
				d.LastTransitionTime = c.LastTransitionTime
				break
			}
		}
		out[i] = d
	}
	return out
}

// MergeGatewayClassStatus is what to write for a GatewayClass of ours.
func MergeGatewayClassStatus(current, desired gwv1.GatewayClassStatus, now metav1.Time) gwv1.GatewayClassStatus {
	desired.Conditions = MergeConditions(current.Conditions, desired.Conditions, now)
	return desired
}

// MergeGatewayStatus is what to write for a Gateway of ours: its
// conditions and each listener's (by name) merged.
func MergeGatewayStatus(current, desired gwv1.GatewayStatus, now metav1.Time) gwv1.GatewayStatus {
	out := desired
	out.AttachedListenerSets = current.AttachedListenerSets
	out.Conditions = MergeConditions(current.Conditions, desired.Conditions, now)
	out.Listeners = make([]gwv1.ListenerStatus, len(desired.Listeners))
	for i, l := range desired.Listeners {
		var cur []metav1.Condition
		for _, c := range current.Listeners {
			if c.Name == l.Name {
				cur = c.Conditions
				break
			}
		}
		l.Conditions = MergeConditions(cur, l.Conditions, now)
		out.Listeners[i] = l
	}
	return out
}

// MergeRouteParents is what to write in a route's status.parents: the
// entries of other controllers as they are, then ours (Compile's, for the
// route) with their conditions merged with the current entry for the same
// parentRef.
func MergeRouteParents(current, ours []gwv1.RouteParentStatus, now metav1.Time) []gwv1.RouteParentStatus {
	out := make([]gwv1.RouteParentStatus, 0, len(current)+len(ours))
	for _, p := range current {
		if p.ControllerName != ControllerName {
			out = append(out, p)
		}
	}
	for _, p := range ours {
		var cur []metav1.Condition
		for _, c := range current {
			if c.ControllerName == ControllerName && reflect.DeepEqual(c.ParentRef, p.ParentRef) {
				cur = c.Conditions
				break
			}
		}
		p.Conditions = MergeConditions(cur, p.Conditions, now)
		out = append(out, p)
	}
	return out // never nil: status.parents is a required list
}
