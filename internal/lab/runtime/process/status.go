package process

import (
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pod status as the kubelet computes it (pkg/kubelet/kubelet_pods.go
// generateAPIPodStatus, getPhase, pkg/kubelet/status/generate.go), from
// the pod and the record only: a pure function.

type statusInput struct {
	Pod        *v1.Pod
	Rec        *podRecord
	NodeIP     string
	SandboxErr string // why the sandbox could not be made, if so
	Now        time.Time
}

const containerIDScheme = "flatnet://"

func mtime(t time.Time) metav1.Time { return metav1.NewTime(t.Truncate(time.Second)) }

// containerReady: running, started, and ready by its probe if it has one.
func containerReady(c *v1.Container, cr *containerRecord) bool {
	if cr == nil || !cr.running() || !cr.Started {
		return false
	}
	if c.ReadinessProbe != nil {
		return cr.Ready
	}
	return true
}

func terminatedState(cr *containerRecord) *v1.ContainerStateTerminated {
	e := cr.LastExit
	t := &v1.ContainerStateTerminated{
		ExitCode:   e.Code,
		Signal:     e.Signal,
		Reason:     e.Reason,
		Message:    e.Message,
		FinishedAt: mtime(e.FinishedAt),
	}
	if !e.StartedAt.IsZero() {
		t.StartedAt = mtime(e.StartedAt)
	}
	if cr.ID != "" {
		t.ContainerID = containerIDScheme + cr.ID
	}
	return t
}

func containerStatus(pod *v1.Pod, c *v1.Container, cr *containerRecord, now time.Time) v1.ContainerStatus {
	s := v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: ""}
	if cr == nil {
		s.State.Waiting = &v1.ContainerStateWaiting{Reason: "ContainerCreating"}
		return s
	}
	s.RestartCount = cr.RestartCount
	if cr.ID != "" {
		s.ContainerID = containerIDScheme + cr.ID
	}
	s.Ready = containerReady(c, cr)
	started := cr.running() && cr.Started
	s.Started = &started
	deleting := pod.DeletionTimestamp != nil
	switch {
	case cr.running():
		s.State.Running = &v1.ContainerStateRunning{StartedAt: mtime(cr.StartedAt)}
		if cr.LastExit != nil {
			s.LastTerminationState.Terminated = terminatedState(cr)
		}
	case cr.LastExit != nil && !deleting && containerRestarts(pod, c, cr.LastExit) && now.Before(cr.NextStart):
		s.State.Waiting = &v1.ContainerStateWaiting{
			Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				cr.NextStart.Sub(cr.LastExit.FinishedAt).Round(time.Second), c.Name, pod.Name, pod.Namespace, pod.UID),
		}
		s.LastTerminationState.Terminated = terminatedState(cr)
	case cr.LastExit != nil:
		s.State.Terminated = terminatedState(cr)
	default:
		reason := cr.StartErrReason
		if reason == "" {
			reason = "ContainerCreating"
		}
		s.State.Waiting = &v1.ContainerStateWaiting{Reason: reason, Message: cr.StartErr}
	}
	return s
}

// podPhase is the kubelet's getPhase: Pending until the init containers
// are done (Failed if one failed for good), then by the regular ones.
func podPhase(pod *v1.Pod, r *podRecord) v1.PodPhase {
	if initFailed(pod, r) {
		return v1.PodFailed
	}
	if !initDone(pod, r) {
		return v1.PodPending
	}
	var waiting, running, stopped, succeeded int
	for _, c := range pod.Spec.Containers {
		cr := r.container(c.Name)
		switch {
		case cr != nil && cr.running():
			running++
		case cr != nil && cr.LastExit != nil:
			stopped++
			if cr.LastExit.Code == 0 {
				succeeded++
			}
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return v1.PodPending
	case running > 0:
		return v1.PodRunning
	case stopped > 0:
		switch pod.Spec.RestartPolicy {
		case v1.RestartPolicyNever:
			if succeeded == stopped {
				return v1.PodSucceeded
			}
			return v1.PodFailed
		case v1.RestartPolicyOnFailure:
			if succeeded == stopped {
				return v1.PodSucceeded
			}
			return v1.PodRunning
		default:
			return v1.PodRunning
		}
	}
	return v1.PodPending
}

// setCondition puts c into conds, keeping the transition time of an
// existing condition of that type whose status did not change.
func setCondition(old []v1.PodCondition, c v1.PodCondition, now time.Time) v1.PodCondition {
	c.LastTransitionTime = mtime(now)
	for _, o := range old {
		if o.Type == c.Type && o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
			c.LastProbeTime = o.LastProbeTime
		}
	}
	return c
}

func boolStatus(b bool) v1.ConditionStatus {
	if b {
		return v1.ConditionTrue
	}
	return v1.ConditionFalse
}

func podStatus(in statusInput) v1.PodStatus {
	pod, r, now := in.Pod, in.Rec, in.Now
	old := pod.Status
	s := v1.PodStatus{
		Phase:              podPhase(pod, r),
		HostIP:             in.NodeIP,
		QOSClass:           old.QOSClass,
		NominatedNodeName:  old.NominatedNodeName,
		ObservedGeneration: pod.Generation,
	}
	if in.NodeIP != "" {
		s.HostIPs = []v1.HostIP{{IP: in.NodeIP}}
	}
	if len(r.IPs) > 0 {
		s.PodIP = r.IPs[0]
		for _, ip := range r.IPs {
			s.PodIPs = append(s.PodIPs, v1.PodIP{IP: ip})
		}
	}
	switch {
	case old.StartTime != nil:
		s.StartTime = old.StartTime
	case !r.StartTime.IsZero():
		t := mtime(r.StartTime)
		s.StartTime = &t
	}
	var unready, uninitialized []string
	initialized := initDone(pod, r)
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cr := r.container(c.Name)
		cs := containerStatus(pod, c, cr, now)
		if !isSidecar(c) {
			// A completed init container counts as ready.
			cs.Ready = initContainerDone(c, cr)
		} else if !cs.Ready {
			unready = append(unready, c.Name)
		}
		if !initContainerDone(c, cr) {
			uninitialized = append(uninitialized, c.Name)
		}
		if cs.State.Waiting != nil && cs.State.Waiting.Reason == "ContainerCreating" && sandboxReady(r) {
			cs.State.Waiting.Reason = "PodInitializing"
		}
		s.InitContainerStatuses = append(s.InitContainerStatuses, cs)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cs := containerStatus(pod, c, r.container(c.Name), now)
		if !initialized && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ContainerCreating" {
			cs.State.Waiting.Reason = "PodInitializing"
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
		if !cs.Ready {
			unready = append(unready, c.Name)
		}
	}
	finished := s.Phase == v1.PodSucceeded || s.Phase == v1.PodFailed

	sandbox := v1.PodCondition{Type: v1.PodReadyToStartContainers, Status: boolStatus(sandboxReady(r) && !finished)}
	if in.SandboxErr != "" && !sandboxReady(r) {
		sandbox.Reason, sandbox.Message = "SandboxCreateFailed", in.SandboxErr
	}
	containersReady := v1.PodCondition{Type: v1.ContainersReady, Status: boolStatus(len(unready) == 0)}
	ready := v1.PodCondition{Type: v1.PodReady, Status: containersReady.Status}
	switch {
	case finished:
		containersReady.Status, containersReady.Reason = v1.ConditionFalse, "PodCompleted"
		ready.Status, ready.Reason = v1.ConditionFalse, "PodCompleted"
	case len(unready) > 0:
		msg := fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
		containersReady.Reason, containersReady.Message = "ContainersNotReady", msg
		ready.Reason, ready.Message = "ContainersNotReady", msg
	default:
		if gate := unmetReadinessGate(pod); gate != "" {
			ready.Status, ready.Reason = v1.ConditionFalse, "ReadinessGatesNotReady"
			ready.Message = fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist or is not True.", gate)
		}
	}
	initCond := v1.PodCondition{Type: v1.PodInitialized, Status: boolStatus(initialized)}
	if !initialized {
		initCond.Reason = "ContainersNotInitialized"
		initCond.Message = fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(uninitialized, " "))
	}
	ours := []v1.PodCondition{sandbox, initCond, ready, containersReady}
	for _, c := range ours {
		c.ObservedGeneration = pod.Generation
		s.Conditions = append(s.Conditions, setCondition(old.Conditions, c, now))
	}
	// Conditions owned by others (PodScheduled, readiness gates, ...) stay.
	for _, o := range old.Conditions {
		mine := false
		for _, c := range ours {
			mine = mine || c.Type == o.Type
		}
		if !mine {
			s.Conditions = append(s.Conditions, o)
		}
	}
	return s
}

func unmetReadinessGate(pod *v1.Pod) string {
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == v1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			return string(g.ConditionType)
		}
	}
	return ""
}
