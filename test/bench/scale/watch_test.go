package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A harness pod turning Ready is recorded with its lag from the Ready
// condition's time; other pods and other updates are not.
func TestReadyLags(t *testing.T) {
	w := newWatcher(nil)
	pod := func(ns string, ready bool, at time.Time) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at)}}
		}
		return p
	}
	t0 := time.Now()
	for _, lag := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second} {
		w.readyTransition(pod(nsPrefix+"a", false, time.Time{}), pod(nsPrefix+"a", true, time.Now().Add(-lag)))
	}
	w.readyTransition(pod("other", false, time.Time{}), pod("other", true, time.Now().Add(-time.Hour)))            // not ours
	w.readyTransition(pod(nsPrefix+"a", true, time.Now()), pod(nsPrefix+"a", true, time.Now().Add(-time.Hour)))    // was Ready
	w.readyTransition(pod(nsPrefix+"a", false, time.Time{}), pod(nsPrefix+"a", false, time.Now().Add(-time.Hour))) // not Ready
	p50, p99, n := w.lagQuantiles(false, t0)
	if n != 3 || p50.Round(time.Second) != 2*time.Second || p99.Round(time.Second) != 3*time.Second {
		t.Errorf("p50 %s p99 %s n %d, want 2s 3s 3", p50, p99, n)
	}
	if _, _, n := w.lagQuantiles(false, time.Now().Add(time.Second)); n != 0 {
		t.Errorf("%d lags after now", n)
	}
	// stripMeta keeps the Ready condition the lag is read from.
	o, _ := stripMeta(pod(nsPrefix+"a", true, t0))
	if c := podReady(o.(*corev1.Pod)); c == nil || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("stripMeta dropped the Ready condition: %+v", o)
	}
}

// A harness slice updated with a new trigger time is recorded with its lag
// from that time; the same trigger time again, none, or another
// namespace's slice are not. stripMeta keeps the annotation.
func TestSliceLags(t *testing.T) {
	w := newWatcher(nil)
	slice := func(ns string, at time.Time) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s",
			Annotations: map[string]string{"other": "x"}}}
		if !at.IsZero() {
			s.Annotations[corev1.EndpointsLastChangeTriggerTime] = at.UTC().Format(time.RFC3339Nano)
		}
		o, _ := stripMeta(s)
		return o.(*discoveryv1.EndpointSlice)
	}
	t0 := time.Now()
	old := t0.Add(-5 * time.Second)
	w.sliceTriggered(slice(nsPrefix+"a", old), slice(nsPrefix+"a", t0.Add(-2*time.Second)))
	w.sliceTriggered(slice(nsPrefix+"a", time.Time{}), slice(nsPrefix+"a", t0.Add(-time.Second)))
	w.sliceTriggered(slice(nsPrefix+"a", old), slice(nsPrefix+"a", old))         // unchanged
	w.sliceTriggered(slice(nsPrefix+"a", old), slice(nsPrefix+"a", time.Time{})) // none
	w.sliceTriggered(slice("other", old), slice("other", t0.Add(-time.Hour)))    // not ours
	p50, p99, n := w.lagQuantiles(true, t0)
	if n != 2 || p50.Round(time.Second) != 2*time.Second || p99.Round(time.Second) != 2*time.Second {
		t.Errorf("p50 %s p99 %s n %d, want 2s 2s 2", p50, p99, n)
	}
	if a := slice(nsPrefix+"a", old).Annotations; len(a) != 1 {
		t.Errorf("stripMeta kept %v, want the trigger time alone", a)
	}
}
