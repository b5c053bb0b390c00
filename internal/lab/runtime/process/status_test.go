package process

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func cond(s v1.PodStatus, typ v1.PodConditionType) v1.PodCondition {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return v1.PodCondition{}
}

func TestPodStatusLifecycle(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "web", "side")
	pod.Generation = 3
	pod.Spec.Containers[0].ReadinessProbe = &v1.Probe{}
	pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}

	// Nothing yet: Pending, waiting ContainerCreating, no IP.
	rec := newRecord(pod, t0)
	st := podStatus(statusInput{Pod: pod, Rec: rec, NodeIP: "10.250.0.11", SandboxErr: "no CNI config", Now: t0})
	if st.Phase != v1.PodPending || st.PodIP != "" || st.HostIP != "10.250.0.11" {
		t.Fatalf("new pod: phase %s ip %q host %q", st.Phase, st.PodIP, st.HostIP)
	}
	if c := cond(st, v1.PodReadyToStartContainers); c.Status != v1.ConditionFalse || c.Message != "no CNI config" {
		t.Errorf("sandbox condition: %+v", c)
	}
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "ContainerCreating" {
		t.Errorf("container state: %+v", st.ContainerStatuses[0].State)
	}
	if c := cond(st, v1.PodScheduled); c.Status != v1.ConditionTrue {
		t.Errorf("PodScheduled (set by others) was dropped: %+v", st.Conditions)
	}
	if st.ObservedGeneration != 3 {
		t.Errorf("observedGeneration %d", st.ObservedGeneration)
	}

	// Both running; web not yet ready by its probe.
	rec = running(readyRec(pod), "web", "side")
	pod.Status = st
	now := t0.Add(5 * time.Second)
	st = podStatus(statusInput{Pod: pod, Rec: rec, NodeIP: "10.250.0.11", Now: now})
	if st.Phase != v1.PodRunning || st.PodIP != "10.244.1.2" || len(st.PodIPs) != 1 {
		t.Fatalf("running: phase %s ip %q", st.Phase, st.PodIP)
	}
	if c := cond(st, v1.PodReadyToStartContainers); c.Status != v1.ConditionTrue || !c.LastTransitionTime.Equal(&metav1.Time{Time: now}) {
		t.Errorf("sandbox condition should turn True now: %+v", c)
	}
	if c := cond(st, v1.PodReady); c.Status != v1.ConditionFalse || c.Message != "containers with unready status: [web]" {
		t.Errorf("Ready: %+v", c)
	}
	web, side := st.ContainerStatuses[0], st.ContainerStatuses[1]
	if web.Ready || !side.Ready || web.State.Running == nil || web.ContainerID != "flatnet://id-web" || !*web.Started {
		t.Errorf("container statuses: %+v %+v", web, side)
	}
	initTransition := cond(st, v1.PodInitialized).LastTransitionTime

	// The probe passes: Ready; unchanged conditions keep their times.
	rec.container("web").Ready = true
	pod.Status = st
	later := now.Add(time.Minute)
	st = podStatus(statusInput{Pod: pod, Rec: rec, NodeIP: "10.250.0.11", Now: later})
	if c := cond(st, v1.PodReady); c.Status != v1.ConditionTrue || !c.LastTransitionTime.Equal(&metav1.Time{Time: later}) {
		t.Errorf("Ready after probe: %+v", c)
	}
	if c := cond(st, v1.PodInitialized); !c.LastTransitionTime.Equal(&initTransition) {
		t.Errorf("Initialized moved: %v -> %v", initTransition, c.LastTransitionTime)
	}

	// side crashes twice: back-off, restart count, last state.
	exited(rec, "side", 2, later)
	c := rec.container("side")
	c.Proc, c.RestartCount = &procID{PID: 200}, 1
	exited(rec, "side", 2, later.Add(time.Second))
	pod.Status = st
	st = podStatus(statusInput{Pod: pod, Rec: rec, NodeIP: "10.250.0.11", Now: later.Add(2 * time.Second)})
	side = st.ContainerStatuses[1]
	if st.Phase != v1.PodRunning || side.Ready || side.RestartCount != 1 {
		t.Errorf("crash loop: phase %s side %+v", st.Phase, side)
	}
	if w := side.State.Waiting; w == nil || w.Reason != "CrashLoopBackOff" {
		t.Errorf("side state: %+v", side.State)
	}
	if lt := side.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 2 || lt.Reason != "Error" {
		t.Errorf("side last state: %+v", side.LastTerminationState)
	}
}

func TestPodPhase(t *testing.T) {
	for _, tc := range []struct {
		policy v1.RestartPolicy
		codes  []int32 // -1: running, -2: never started
		want   v1.PodPhase
	}{
		{v1.RestartPolicyNever, []int32{0, 0}, v1.PodSucceeded},
		{v1.RestartPolicyNever, []int32{0, 1}, v1.PodFailed},
		{v1.RestartPolicyNever, []int32{-1, 1}, v1.PodRunning},
		{v1.RestartPolicyOnFailure, []int32{0, 0}, v1.PodSucceeded},
		{v1.RestartPolicyOnFailure, []int32{0, 3}, v1.PodRunning},
		{v1.RestartPolicyAlways, []int32{0, 0}, v1.PodRunning},
		{v1.RestartPolicyAlways, []int32{-2, -1}, v1.PodPending},
	} {
		names := []string{"a", "b"}
		pod := testPod(tc.policy, names...)
		rec := readyRec(pod)
		for i, code := range tc.codes {
			switch code {
			case -1:
				running(rec, names[i])
			case -2:
			default:
				exited(rec, names[i], code, t0)
			}
		}
		if got := podPhase(pod, rec); got != tc.want {
			t.Errorf("%s %v: phase %s, want %s", tc.policy, tc.codes, got, tc.want)
		}
	}
}

func TestPodStatusFinished(t *testing.T) {
	pod := testPod(v1.RestartPolicyNever, "job")
	rec := exited(readyRec(pod), "job", 0, t0)
	rec.container("job").LastExit.Reason = "Completed"
	rec.Netns, rec.SandboxID = "", "" // torn down; the IP stays in the status
	st := podStatus(statusInput{Pod: pod, Rec: rec, NodeIP: "10.250.0.11", Now: t0})
	want := v1.ContainerStatus{
		Name: "job", Image: "img", ContainerID: "flatnet://id-job", Started: ptrTo(false),
		State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(t0), FinishedAt: metav1.NewTime(t0), ContainerID: "flatnet://id-job",
		}},
	}
	if d := cmp.Diff(want, st.ContainerStatuses[0]); d != "" {
		t.Errorf("container status (-want +got):\n%s", d)
	}
	if st.Phase != v1.PodSucceeded || st.PodIP != "10.244.1.2" {
		t.Errorf("phase %s ip %q", st.Phase, st.PodIP)
	}
	if c := cond(st, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "PodCompleted" {
		t.Errorf("Ready: %+v", c)
	}
	if c := cond(st, v1.PodReadyToStartContainers); c.Status != v1.ConditionFalse {
		t.Errorf("sandbox condition after teardown: %+v", c)
	}
}

func TestReadinessGates(t *testing.T) {
	pod := testPod("", "a")
	pod.Spec.ReadinessGates = []v1.PodReadinessGate{{ConditionType: "example.com/lb"}}
	rec := running(readyRec(pod), "a")
	st := podStatus(statusInput{Pod: pod, Rec: rec, Now: t0})
	if c := cond(st, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "ReadinessGatesNotReady" {
		t.Errorf("gate unmet: %+v", c)
	}
	if c := cond(st, v1.ContainersReady); c.Status != v1.ConditionTrue {
		t.Errorf("ContainersReady: %+v", c)
	}
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: "example.com/lb", Status: v1.ConditionTrue})
	st = podStatus(statusInput{Pod: pod, Rec: rec, Now: t0})
	if c := cond(st, v1.PodReady); c.Status != v1.ConditionTrue {
		t.Errorf("gate met: %+v", c)
	}
	if c := cond(st, "example.com/lb"); c.Status != v1.ConditionTrue {
		t.Errorf("the gate's own condition was dropped: %+v", st.Conditions)
	}
}

func TestPodStatusInit(t *testing.T) {
	pod := initPod(v1.RestartPolicyAlways, true)
	rec := readyRec(pod)
	running(rec, "side")
	running(rec, "init")
	st := podStatus(statusInput{Pod: pod, Rec: rec, Now: t0})
	if st.Phase != v1.PodPending {
		t.Errorf("phase while initializing: %s", st.Phase)
	}
	if c := cond(st, v1.PodInitialized); c.Status != v1.ConditionFalse || c.Message != "containers with incomplete status: [init]" {
		t.Errorf("Initialized: %+v", c)
	}
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("main while initializing: %+v", st.ContainerStatuses[0].State)
	}
	if len(st.InitContainerStatuses) != 2 || st.InitContainerStatuses[1].State.Running == nil {
		t.Fatalf("init statuses: %+v", st.InitContainerStatuses)
	}

	exited(rec, "init", 0, t0)
	rec.container("init").LastExit.Reason = "Completed"
	running(rec, "main")
	st = podStatus(statusInput{Pod: pod, Rec: rec, Now: t0})
	if st.Phase != v1.PodRunning || cond(st, v1.PodInitialized).Status != v1.ConditionTrue || cond(st, v1.PodReady).Status != v1.ConditionTrue {
		t.Errorf("initialized: %s %+v", st.Phase, st.Conditions)
	}
	ic := st.InitContainerStatuses[1]
	if !ic.Ready || ic.State.Terminated == nil || ic.State.Terminated.Reason != "Completed" {
		t.Errorf("completed init container (Always pod, not restarted): %+v", ic)
	}

	// Never: a failed init container fails the pod.
	pod = initPod(v1.RestartPolicyNever, false)
	rec = exited(readyRec(pod), "init", 1, t0)
	if st := podStatus(statusInput{Pod: pod, Rec: rec, Now: t0}); st.Phase != v1.PodFailed {
		t.Errorf("failed init, Never: phase %s", st.Phase)
	}
}
