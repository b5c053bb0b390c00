package process

import (
	"time"

	v1 "k8s.io/api/core/v1"
)

// The pod plan: what to do next for one pod, computed as data from the
// desired state (the Pod from the API, or nil once it is gone) and the
// actual state (the podRecord, kept current by the worker from process
// exits and probe results). The worker applies the actions through the
// effect interfaces and plans again; plan itself touches nothing.

type actionType string

const (
	actCreateSandbox  actionType = "CreateSandbox"  // netns, CNI ADD, pod files
	actStartContainer actionType = "StartContainer" // one container's process
	actStopContainer  actionType = "StopContainer"  // SIGTERM, then wait for the grace period
	actKillContainer  actionType = "KillContainer"  // SIGKILL every process of the container
	actTeardown       actionType = "Teardown"       // kill what is left, CNI DEL, remove the netns
	actDeletePod      actionType = "DeletePod"      // delete the Pod object (grace 0): no kubelet will
)

type action struct {
	Type      actionType
	Container string
	Grace     time.Duration // StopContainer
	Reason    string        // StopContainer: why (for the event)
}

type planInput struct {
	Pod *v1.Pod // nil: gone from the API
	Rec *podRecord
	Now time.Time
	// SandboxRetryAt delays the next sandbox creation after a failure.
	SandboxRetryAt time.Time
	// DeleteSentAt is when the Pod's deletion was last requested.
	DeleteSentAt time.Time
}

type planResult struct {
	Actions []action
	WakeAt  time.Time // plan again then, at the latest (zero: no timer)
	Done    bool      // nothing is left of the pod: the worker can end
}

const (
	killRetry        = time.Second     // SIGKILL again if the process is still there
	deleteRetry      = 5 * time.Second // ask the API again to delete the pod
	goneGrace        = 2 * time.Second // grace for pods already gone from the API
	defaultGrace     = 30 * time.Second
	initialBackoff   = 10 * time.Second
	maxBackoff       = 300 * time.Second
	backoffResetRun  = 10 * time.Minute // a run this long forgives earlier crashes
	unknownExitCode  = 137
	startErrExitCode = 128
)

func (r *planResult) wake(t time.Time) {
	if r.WakeAt.IsZero() || t.Before(r.WakeAt) {
		r.WakeAt = t
	}
}

// sandboxExists: something of the sandbox may be there to tear down.
func sandboxExists(r *podRecord) bool { return r.Netns != "" || r.SandboxID != "" }

// sandboxReady: the pod has its network and containers can start.
func sandboxReady(r *podRecord) bool {
	if r.HostNetwork {
		return len(r.IPs) > 0
	}
	return r.Netns != "" && r.SandboxID != "" && len(r.IPs) > 0
}

// willRestart says whether restartPolicy restarts a container that exited
// with e.
func willRestart(policy v1.RestartPolicy, e *exitRecord) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return e.Code != 0
	}
	return true // Always, the default
}

func isInit(pod *v1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// isSidecar: an init container with restartPolicy Always, which keeps
// running next to the regular containers.
func isSidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// initFailed: a (non-sidecar) init container failed and restartPolicy
// Never forbids another try: the pod has failed.
func initFailed(pod *v1.Pod, r *podRecord) bool {
	if pod.Spec.RestartPolicy != v1.RestartPolicyNever {
		return false
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cr := r.container(c.Name)
		if !isSidecar(c) && cr != nil && !cr.running() && cr.LastExit != nil && cr.LastExit.Code != 0 {
			return true
		}
	}
	return false
}

// initDone: every init container completed (a sidecar: started).
func initDone(pod *v1.Pod, r *podRecord) bool {
	for i := range pod.Spec.InitContainers {
		if !initContainerDone(&pod.Spec.InitContainers[i], r.container(pod.Spec.InitContainers[i].Name)) {
			return false
		}
	}
	return true
}

func initContainerDone(c *v1.Container, cr *containerRecord) bool {
	if cr == nil {
		return false
	}
	if isSidecar(c) {
		return cr.running() && cr.Started || cr.LastExit != nil // a sidecar ran: later restarts do not hold the pod back
	}
	return !cr.running() && cr.LastExit != nil && cr.LastExit.Code == 0
}

// containerRestarts says whether container c, which exited with e, runs
// again: by restartPolicy for regular containers, on failure (unless
// Never) for init containers, always for sidecars.
func containerRestarts(pod *v1.Pod, c *v1.Container, e *exitRecord) bool {
	switch {
	case isSidecar(c):
		return true
	case isInit(pod, c.Name):
		return e.Code != 0 && pod.Spec.RestartPolicy != v1.RestartPolicyNever
	}
	return willRestart(pod.Spec.RestartPolicy, e)
}

// podFinished: every container has exited for good; the pod is terminal.
func podFinished(pod *v1.Pod, r *podRecord) bool {
	if initFailed(pod, r) {
		return true
	}
	if len(pod.Spec.Containers) == 0 {
		return false
	}
	for _, c := range pod.Spec.Containers {
		cr := r.container(c.Name)
		if cr == nil || cr.running() || cr.LastExit == nil || willRestart(pod.Spec.RestartPolicy, cr.LastExit) {
			return false
		}
	}
	return true
}

// deletionGrace is how long containers get between SIGTERM and SIGKILL.
func deletionGrace(pod *v1.Pod, r *podRecord) time.Duration {
	if pod == nil {
		return min(time.Duration(r.GraceSeconds)*time.Second, goneGrace)
	}
	if pod.DeletionGracePeriodSeconds != nil {
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	return specGrace(pod)
}

func specGrace(pod *v1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return defaultGrace
}

// stop plans stopping container c within grace: SIGTERM once, SIGKILL
// when the grace period is over, SIGKILL again while it lingers.
func stop(out *planResult, c *containerRecord, grace time.Duration, reason string, now time.Time) {
	switch {
	case c.TermSentAt.IsZero():
		out.Actions = append(out.Actions, action{Type: actStopContainer, Container: c.Name, Grace: grace, Reason: reason})
		out.wake(now.Add(grace))
	case !c.KillSentAt.IsZero():
		if next := c.KillSentAt.Add(killRetry); now.Before(next) {
			out.wake(next)
		} else {
			out.Actions = append(out.Actions, action{Type: actKillContainer, Container: c.Name})
		}
	default:
		deadline := c.TermSentAt.Add(min(grace, c.TermGrace))
		if now.Before(deadline) {
			out.wake(deadline)
		} else {
			out.Actions = append(out.Actions, action{Type: actKillContainer, Container: c.Name})
		}
	}
}

func plan(in planInput) planResult {
	var out planResult
	pod, r, now := in.Pod, in.Rec, in.Now

	if pod == nil || pod.DeletionTimestamp != nil {
		grace := deletionGrace(pod, r)
		running := false
		for _, c := range r.Containers {
			if c.running() {
				running = true
				stop(&out, c, grace, "deleting the pod", now)
			}
		}
		if running {
			return out
		}
		if sandboxExists(r) {
			out.Actions = append(out.Actions, action{Type: actTeardown})
			return out
		}
		if pod == nil {
			out.Done = true
			return out
		}
		if next := in.DeleteSentAt.Add(deleteRetry); !in.DeleteSentAt.IsZero() && now.Before(next) {
			out.wake(next)
		} else {
			out.Actions = append(out.Actions, action{Type: actDeletePod})
		}
		return out
	}

	// Containers the runtime decided to kill (failed liveness or startup
	// probe), or a stop already under way.
	for _, c := range r.Containers {
		if c.running() && c.KillReason != "" {
			stop(&out, c, c.KillGrace, c.KillReason, now)
		}
	}

	if podFinished(pod, r) {
		// Sidecars (and anything else still running) stop with the pod.
		running := false
		for _, c := range r.Containers {
			if c.running() {
				running = true
				stop(&out, c, specGrace(pod), "the pod has finished", now)
			}
		}
		if !running && sandboxExists(r) {
			out.Actions = append(out.Actions, action{Type: actTeardown})
		}
		return out
	}

	if !sandboxReady(r) {
		if sandboxExists(r) {
			// Half made (the agent died while creating it): start over.
			out.Actions = append(out.Actions, action{Type: actTeardown})
			return out
		}
		if now.Before(in.SandboxRetryAt) {
			out.wake(in.SandboxRetryAt)
			return out
		}
		out.Actions = append(out.Actions, action{Type: actCreateSandbox})
		return out
	}

	// Init containers one at a time, in order; then the regular ones.
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cr := r.container(c.Name)
		sidecar := isSidecar(c)
		switch {
		case cr != nil && cr.running():
			if sidecar && cr.Started {
				continue
			}
			return out // wait for it to complete (or, a sidecar, to start)
		case !sidecar && initContainerDone(c, cr):
			continue
		case sidecar && initContainerDone(c, cr) && initDone(pod, r):
			// A sidecar that exited after the pod was initialized is
			// restarted, without holding the others back.
			if now.Before(cr.NextStart) {
				out.wake(cr.NextStart)
			} else {
				out.Actions = append(out.Actions, action{Type: actStartContainer, Container: c.Name})
			}
			continue
		}
		if cr != nil && now.Before(cr.NextStart) {
			out.wake(cr.NextStart)
			return out
		}
		out.Actions = append(out.Actions, action{Type: actStartContainer, Container: c.Name})
		return out
	}

	for _, c := range pod.Spec.Containers {
		cr := r.container(c.Name)
		if cr != nil && cr.running() {
			continue
		}
		if cr != nil && cr.LastExit != nil && !willRestart(pod.Spec.RestartPolicy, cr.LastExit) {
			continue
		}
		if cr != nil && now.Before(cr.NextStart) {
			out.wake(cr.NextStart)
			continue
		}
		out.Actions = append(out.Actions, action{Type: actStartContainer, Container: c.Name})
	}
	return out
}

// recordExit updates c for a run that ended: the exit, and when a restart
// may happen (the kubelet's crash-loop back-off: the first restart at once,
// then 10 s doubling to 5 min; a run of 10 min resets it).
func recordExit(c *containerRecord, e exitRecord, now time.Time) {
	c.Proc = nil
	c.LastExit = &e
	c.TermSentAt, c.TermGrace, c.KillSentAt, c.KillReason, c.KillGrace = time.Time{}, 0, time.Time{}, "", 0
	c.Ready, c.Started = false, false
	if !e.StartedAt.IsZero() && e.FinishedAt.Sub(e.StartedAt) >= backoffResetRun {
		c.Backoff = 0
	}
	if c.Backoff == 0 {
		c.NextStart = now
		c.Backoff = initialBackoff
		return
	}
	c.NextStart = e.FinishedAt.Add(c.Backoff)
	c.Backoff = min(2*c.Backoff, maxBackoff)
}

// exitRecordFor describes how a run ended.
func exitRecordFor(e exitInfo, startedAt time.Time) exitRecord {
	r := exitRecord{Code: e.Code, Signal: e.Signal, StartedAt: startedAt, FinishedAt: e.At}
	switch {
	case !e.Known:
		r.Code = unknownExitCode
		r.Reason = "ContainerStatusUnknown"
		r.Message = "The container ended while the agent was not its parent (the agent restarted): its exit code is unknown"
	case e.Code == 0:
		r.Reason = "Completed"
	default:
		r.Reason = "Error"
	}
	return r
}
