package process

// The pod worker's loop: take Pod updates and events, plan, apply, save the
// record, write the status. What the actions do lives by concern in
// sandbox.go (network namespace, CNI, pod files), containers.go (start,
// watch, adopt) and probes.go (probe loops and their verdicts).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// worker runs one pod: see the package comment. Only its run goroutine
// touches rec and the fields below "owned by run"; the informer and the
// process/probe goroutines talk to it through update, gone and post.
type worker struct {
	c   *core
	key string
	uid types.UID
	dir string
	log klog.Logger

	mu     sync.Mutex // protects pod, isGone, next, events
	pod    *v1.Pod
	isGone bool
	next   *v1.Pod // a newer pod of the same name, waiting for this one to end
	events []workerEvent
	wake   chan struct{}

	// Owned by run.
	rec            *podRecord
	runs           map[string]*containerRun
	watchers       sync.WaitGroup // the goroutines of runs: exit watchers, probe loops
	sandboxErr     string
	sandboxRetryAt time.Time
	sandboxBackoff time.Duration
	deleteSentAt   time.Time
	retryAt        time.Time
	retryBackoff   time.Duration
	lastWritten    *v1.PodStatus
	statusRetryAt  time.Time
}

// containerRun is what watches a live container: its exit and its probes.
type containerRun struct {
	proc     procID
	cancel   context.CancelFunc
	counters map[probeKind]*probeCounter
}

type eventKind int

const (
	evExit eventKind = iota
	evProbe
)

type workerEvent struct {
	kind      eventKind
	container string
	proc      procID
	exit      exitInfo
	probe     probeKind
	ok        bool
	msg       string
}

func newWorker(c *core, rec *podRecord, pod *v1.Pod) *worker {
	key := rec.Namespace + "/" + rec.Name
	return &worker{
		c:    c,
		key:  key,
		uid:  rec.UID,
		dir:  podDir(c.cfg.StateDir, rec.Namespace, rec.Name),
		log:  c.log.WithValues("pod", key, "uid", rec.UID),
		pod:  pod,
		wake: make(chan struct{}, 1),
		rec:  rec,
		runs: map[string]*containerRun{},
		// A pod the API no longer has (found in the state dir): clean up.
		isGone: pod == nil,
	}
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// update takes a new version of the Pod from the informer.
func (w *worker) update(pod *v1.Pod) {
	w.mu.Lock()
	switch {
	case pod.UID != w.uid:
		// Same name, another pod: this one is gone; the new one waits.
		w.isGone, w.pod, w.next = true, nil, pod
	case !w.isGone:
		w.pod = pod
	}
	w.mu.Unlock()
	w.poke()
}

// gone says the Pod with uid was deleted from the API.
func (w *worker) gone(uid types.UID) {
	w.mu.Lock()
	if uid == w.uid {
		w.isGone, w.pod = true, nil
	} else if w.next != nil && w.next.UID == uid {
		w.next = nil
	}
	w.mu.Unlock()
	w.poke()
}

func (w *worker) post(ev workerEvent) {
	w.mu.Lock()
	w.events = append(w.events, ev)
	w.mu.Unlock()
	w.poke()
}

func (w *worker) snapshot() *v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.isGone {
		return nil
	}
	return w.pod
}

func (w *worker) save() {
	if err := w.rec.save(w.dir); err != nil {
		w.log.Error(err, "Saving the pod record failed")
	}
}

func (w *worker) event(pod *v1.Pod, typ, reason, format string, args ...any) {
	if pod != nil {
		w.c.recorder.Eventf(pod, typ, reason, format, args...)
	}
}

const resync = time.Minute

func (w *worker) run(ctx context.Context) {
	w.adopt(ctx)
	w.save()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			w.stopWatching()
			return
		case <-w.wake:
		case <-timer.C:
		}
		pod := w.snapshot()
		w.drainEvents(pod)
		res := w.step(ctx, pod)
		if res.Done {
			w.finish(ctx)
			return
		}
		w.save()
		if pod != nil {
			w.syncStatus(ctx, pod)
		}
		wakeAt := res.WakeAt
		for _, t := range []time.Time{w.retryAt, w.statusRetryAt} {
			if !t.IsZero() && (wakeAt.IsZero() || t.Before(wakeAt)) {
				wakeAt = t
			}
		}
		d := resync
		if !wakeAt.IsZero() {
			d = max(wakeAt.Sub(w.c.d.now()), 0) + 5*time.Millisecond
		}
		timer.Reset(d)
	}
}

// step plans and applies until nothing is left to do now.
func (w *worker) step(ctx context.Context, pod *v1.Pod) planResult {
	for range 20 {
		now := w.c.d.now()
		res := plan(planInput{Pod: pod, Rec: w.rec, Now: now, SandboxRetryAt: w.sandboxRetryAt, DeleteSentAt: w.deleteSentAt})
		if res.Done || len(res.Actions) == 0 {
			return res
		}
		if now.Before(w.retryAt) {
			res.wake(w.retryAt)
			return res
		}
		var errs []error
		for _, a := range res.Actions {
			if err := w.apply(ctx, pod, a); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", a.Type, a.Container, err))
			}
		}
		w.save()
		if len(errs) > 0 {
			w.retryBackoff = min(max(2*w.retryBackoff, time.Second), 30*time.Second)
			w.retryAt = now.Add(w.retryBackoff)
			w.log.Error(errors.Join(errs...), "Pod step failed; retrying", "in", w.retryBackoff)
			res.wake(w.retryAt)
			return res
		}
		w.retryAt, w.retryBackoff = time.Time{}, 0
		w.drainEvents(pod)
	}
	return planResult{WakeAt: w.c.d.now().Add(time.Second)}
}

func (w *worker) apply(ctx context.Context, pod *v1.Pod, a action) error {
	now := w.c.d.now()
	switch a.Type {
	case actCreateSandbox:
		w.createSandbox(ctx, pod)
	case actStartContainer:
		w.startContainer(ctx, pod, a.Container)
	case actStopContainer:
		cr := w.rec.container(a.Container)
		w.log.Info("Stopping container", "container", a.Container, "grace", a.Grace, "reason", a.Reason)
		w.event(pod, v1.EventTypeNormal, "Killing", "Stopping container %s (%s)", a.Container, a.Reason)
		cr.TermSentAt, cr.TermGrace = now, a.Grace
		if a.Grace <= 0 {
			cr.KillSentAt = now
			w.c.d.procs.killAll(*cr.Proc)
			return nil
		}
		return w.c.d.procs.signal(*cr.Proc, syscall.SIGTERM)
	case actKillContainer:
		cr := w.rec.container(a.Container)
		w.log.Info("Killing container", "container", a.Container)
		cr.KillSentAt = now
		w.c.d.procs.killAll(*cr.Proc)
	case actTeardown:
		return w.teardown(ctx)
	case actDeletePod:
		return w.deletePod(ctx, pod)
	}
	return nil
}

func (w *worker) deletePod(ctx context.Context, pod *v1.Pod) error {
	w.deleteSentAt = w.c.d.now()
	zero := int64(0)
	uid := pod.UID
	err := w.c.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting pod: %w", err)
	}
	w.log.Info("Pod stopped and deleted")
	return nil
}

// drainEvents applies process exits and probe results to the record.
func (w *worker) drainEvents(pod *v1.Pod) {
	w.mu.Lock()
	evs := w.events
	w.events = nil
	w.mu.Unlock()
	for _, ev := range evs {
		cr := w.rec.container(ev.container)
		run := w.runs[ev.container]
		if cr == nil || cr.Proc == nil || *cr.Proc != ev.proc || run == nil {
			continue // about an earlier run
		}
		switch ev.kind {
		case evExit:
			w.containerExited(pod, cr, run, ev)
		case evProbe:
			w.probeResult(pod, cr, run, ev)
		}
	}
}

// finish removes what is left of the pod and lets the core start a newer
// pod of the same name.
func (w *worker) finish(ctx context.Context) {
	w.stopWatching()
	if err := os.RemoveAll(w.dir); err != nil {
		w.log.Error(err, "Removing the pod state dir failed")
	}
	w.log.Info("Pod cleaned up")
	w.c.workerDone(ctx, w)
}

// syncStatus writes the pod's status when it differs from what the API
// has (or what was last written, the informer lagging behind).
func (w *worker) syncStatus(ctx context.Context, pod *v1.Pod) {
	now := w.c.d.now()
	if now.Before(w.statusRetryAt) {
		return
	}
	st := podStatus(statusInput{Pod: pod, Rec: w.rec, NodeIP: w.c.cfg.NodeIP, SandboxErr: w.sandboxErr, Now: now})
	if apiequality.Semantic.DeepEqual(st, pod.Status) || (w.lastWritten != nil && apiequality.Semantic.DeepEqual(st, *w.lastWritten)) {
		return
	}
	// A JSON merge patch of the whole status: lists (conditions, container
	// statuses) are replaced, so nothing stale survives. Conditions set by
	// others are carried over from the informer's copy (podStatus keeps
	// them); the uid makes the patch fail on a newer pod of the same name.
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   st,
	})
	if err != nil {
		w.log.Error(err, "Encoding pod status")
		return
	}
	_, err = w.c.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return
		}
		w.log.Error(err, "Writing pod status failed; retrying")
		w.statusRetryAt = now.Add(time.Second)
		return
	}
	w.statusRetryAt = time.Time{}
	w.lastWritten = &st
}
