package endpointslice

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// readySince sets the pod's Ready condition's lastTransitionTime.
func readySince(t time.Time) podOpt {
	return func(p *corev1.Pod) { p.Status.Conditions[0].LastTransitionTime = metav1.NewTime(t) }
}

func createdAt(t time.Time) svcOpt {
	return func(s *corev1.Service) { s.CreationTimestamp = metav1.NewTime(t) }
}

func TestTriggerTimeTracker(t *testing.T) {
	tr := NewTriggerTimeTracker()
	svc := service("s", createdAt(at(0)))
	pods := []*corev1.Pod{
		with(pod("p1", "s", "node-a", "10.1.0.1"), readySince(at(10))),
		with(pod("p2", "s", "node-a", "10.1.0.2"), readySince(at(20))),
		pod("p3", "s", "node-a", "10.1.0.3"), // Ready condition without a time
	}
	clone := func() []*corev1.Pod {
		out := make([]*corev1.Pod, len(pods))
		for i, p := range pods {
			out[i] = p.DeepCopy()
		}
		return out
	}
	steps := []struct {
		name   string
		change func()
		want   time.Time
	}{
		// First sight: the Service's creation, even if pods changed later.
		{"first sight", func() {}, at(0)},
		{"nothing changed", func() {}, time.Time{}},
		{"a pod becomes Ready", func() {
			pods[2] = with(pods[2].DeepCopy(), readySince(at(40)))
		}, at(40)},
		{"the pod goes on unchanged", func() {}, time.Time{}},
		{"a pod turns not ready", func() {
			pods[0] = with(pods[0].DeepCopy(), notReady, readySince(at(50)))
		}, at(50)},
		{"earliest of the changes wins", func() {
			pods[0] = with(pods[0].DeepCopy(), readySince(at(70)))
			pods[1] = with(pods[1].DeepCopy(), readySince(at(60)))
		}, at(60)},
		{"a new pod counts from its Ready time", func() {
			pods = append(pods, with(pod("p4", "s", "node-b", "10.1.0.4"), readySince(at(65))))
		}, at(65)},
		{"a pod going away is no trigger", func() { pods = pods[:3] }, time.Time{}},
		{"a pod without a Ready condition is no trigger", func() {
			p := pod("p5", "s", "node-b", "10.1.0.5")
			p.Status.Conditions = nil
			pods = append(pods, p)
		}, time.Time{}},
		{"a recreated Service (same name) counts from its creation", func() {
			svc = service("s", createdAt(at(90)))
			pods[2] = with(pods[2].DeepCopy(), readySince(at(95)))
		}, at(90)},
		// Deletions (a flatnet extension; upstream stamps none).
		{"a pod's deletion is accepted", func() {
			pods[1] = with(pods[1].DeepCopy(), deleting(at(100), 30))
		}, at(100)},
		{"the terminating pod goes on unchanged", func() {}, time.Time{}},
		{"its Ready transition after that counts", func() {
			pods[1] = with(pods[1].DeepCopy(), notReady, readySince(at(102)))
		}, at(102)},
		{"a removed pod counts from when it was seen removed", func() {
			tr.PodDeleted(ns+"/s", pods[1].Name, at(110))
			tr.PodDeleted(ns+"/s", pods[1].Name, at(111)) // a second sighting: the first counts
			pods = slices.Delete(pods, 1, 2)
		}, at(110)},
		{"the removal counts once", func() {}, time.Time{}},
		{"a pod removed and back under its name counts by its own time", func() {
			tr.PodDeleted(ns+"/s", pods[0].Name, at(120))
			pods[0] = with(pods[0].DeepCopy(), readySince(at(125)))
		}, at(125)},
	}
	for _, st := range steps {
		st.change()
		in := clone()
		got := tr.ComputeEndpointLastChangeTriggerTime(ns, svc, podsOf(pods...))
		if !got.Equal(st.want) {
			t.Errorf("%s: trigger time %v, want %v", st.name, got, st.want)
		}
		if !equality.Semantic.DeepEqual(in, pods) {
			t.Fatalf("%s: pods modified", st.name)
		}
	}

	// Services are tracked apart: another one's first sight is its own.
	other := service("o", createdAt(at(5)))
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, other, podsOf(pods...)); !got.Equal(at(5)) {
		t.Errorf("other service, first sight: %v, want %v", got, at(5))
	}
	if got := tr.ComputeEndpointLastChangeTriggerTime("elsewhere", svc, nil); !got.Equal(at(90)) {
		t.Errorf("same name in another namespace, first sight: %v, want %v", got, at(90))
	}

	// A deleted Service is forgotten: next time is a first sight again,
	// and the others are untouched.
	tr.DeleteService(ns, "s")
	if _, ok := tr.states[ns+"/s"]; ok {
		t.Error("state kept after DeleteService")
	}
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, svc, podsOf(pods...)); !got.Equal(at(90)) {
		t.Errorf("after DeleteService: %v, want the creation time %v", got, at(90))
	}
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, other, podsOf(pods...)); !got.IsZero() {
		t.Errorf("other service after deleting s: %v, want zero", got)
	}
}

// deleting: deletion accepted at asked with a grace period of grace
// seconds, as the API server records it.
func deleting(asked time.Time, grace int64) podOpt {
	return func(p *corev1.Pod) {
		d := metav1.NewTime(asked.Add(time.Duration(grace) * time.Second))
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &d, &grace
	}
}

func TestTriggerTimePodDeletedBeforeFirstSync(t *testing.T) {
	// Removals of pods of a Service never synced are not kept: its first
	// sync gives its creation time, and nothing is left over after.
	tr := NewTriggerTimeTracker()
	tr.PodDeleted(ns+"/s", "p1", at(50))
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, service("s", createdAt(at(0))), nil); !got.Equal(at(0)) {
		t.Errorf("first sync: %v, want the creation time", got)
	}
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, service("s", createdAt(at(0))), nil); !got.IsZero() {
		t.Errorf("second sync: %v, want zero", got)
	}
	// DeleteService forgets removals not yet counted.
	tr.PodDeleted(ns+"/s", "p1", at(60))
	tr.DeleteService(ns, "s")
	if len(tr.removed) != 0 {
		t.Errorf("removals kept after DeleteService: %v", tr.removed)
	}
}

func TestTriggerTimeFirstSightWithoutCreationTime(t *testing.T) {
	// A Service object without a creationTimestamp (never the case with an
	// API server) gives no trigger time, rather than the pods' times: the
	// first sync has nothing to compare them with.
	tr := NewTriggerTimeTracker()
	pods := []*corev1.Pod{with(pod("p1", "s", "node-a", "10.1.0.1"), readySince(at(10)))}
	if got := tr.ComputeEndpointLastChangeTriggerTime(ns, service("s"), podsOf(pods...)); !got.IsZero() {
		t.Errorf("first sight without creationTimestamp: %v, want zero", got)
	}
}

// BenchmarkTriggerTrackerHeap is the heap the tracker keeps for 10,000
// Services of 10 pods each (MiB after GC, reported as the metric MiB;
// run with -benchtime 1x). The pods' names are made beforehand, as the
// pod cache holds them.
func BenchmarkTriggerTrackerHeap(b *testing.B) {
	const services, perService = 10000, 10
	pods := make([][]*Pod, services)
	for s := range pods {
		for i := range perService {
			pods[s] = append(pods[s], &Pod{
				PodMeta: PodMeta{Name: fmt.Sprintf("web-%d-%d", s, i)},
				Ready:   corev1.ConditionTrue, ReadySince: at(s + i).UnixNano(),
			})
		}
	}
	reportHeap(b, func() any {
		tr := NewTriggerTimeTracker()
		for s := range pods {
			tr.ComputeEndpointLastChangeTriggerTime(ns, service(fmt.Sprintf("s-%d", s), createdAt(at(0))), pods[s])
		}
		return tr
	})
}
