package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/runtime/containerinit"
	"github.com/flatnet/flatnet/internal/atomicfile"
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

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (w *worker) netnsPath() string {
	if w.rec.Netns == "" {
		return ""
	}
	return filepath.Join(netnsRunDir, w.rec.Netns)
}

func (w *worker) resolvPath() string { return filepath.Join(w.dir, "etc", "resolv.conf") }
func (w *worker) hostsPath() string  { return filepath.Join(w.dir, "etc", "hosts") }

// writePodFiles writes the pod's resolv.conf and hosts.
func (w *worker) writePodFiles(pod *v1.Pod) error {
	if err := os.MkdirAll(filepath.Join(w.dir, "etc"), 0o755); err != nil {
		return err
	}
	nodeConf, err := os.ReadFile(w.c.d.resolvConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading the node's resolv.conf: %w", err)
	}
	if err := atomicfile.WriteFile(w.resolvPath(), podResolvConf(pod, parseResolvConf(nodeConf)), 0o644); err != nil {
		return err
	}
	hosts := hostsFile(pod, w.rec.IPs, clusterDomain)
	if pod.Spec.HostNetwork {
		node, err := os.ReadFile(w.c.d.hostsFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reading the node's hosts file: %w", err)
		}
		hosts = nodeHostsFile(pod, node)
	}
	return atomicfile.WriteFile(w.hostsPath(), hosts, 0o644)
}

func (w *worker) createSandbox(ctx context.Context, pod *v1.Pod) {
	now := w.c.d.now()
	fail := func(err error) {
		w.sandboxErr = err.Error()
		w.sandboxBackoff = min(max(2*w.sandboxBackoff, time.Second), 16*time.Second)
		w.sandboxRetryAt = now.Add(w.sandboxBackoff)
		w.log.Error(err, "Creating the pod sandbox failed", "retryIn", w.sandboxBackoff)
		w.event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
	}
	w.rec.GraceSeconds = int64(specGrace(pod) / time.Second)
	if pod.Spec.HostNetwork {
		w.rec.HostNetwork = true
		w.rec.IPs = []string{w.c.cfg.NodeIP}
		if err := w.writePodFiles(pod); err != nil {
			w.rec.IPs = nil
			fail(err)
			return
		}
		w.sandboxErr = ""
		return
	}
	if _, err := podAttachment(pod, "", ""); err != nil {
		fail(err)
		return
	}
	uid := strings.ReplaceAll(string(pod.UID), "-", "")
	name := w.c.cfg.NetnsPrefix + uid[:min(8, len(uid))]
	if w.c.d.ns.exists(name) {
		name = w.c.cfg.NetnsPrefix + uid // another pod's UID starts the same
	}
	// Recorded before anything exists, so that a crash in between still
	// leaves enough to clean up.
	w.rec.Netns, w.rec.SandboxID = name, randomID(32)
	w.save()
	path, err := w.c.d.ns.create(name)
	if err != nil {
		w.rec.Netns, w.rec.SandboxID = "", ""
		fail(fmt.Errorf("creating network namespace %s: %w", name, err))
		return
	}
	att, _ := podAttachment(pod, w.rec.SandboxID, path)
	ips, err := w.c.d.net.add(ctx, att)
	if err == nil {
		w.rec.IPs = ips
		err = w.writePodFiles(pod)
	}
	if err != nil {
		// Undo: DEL releases what ADD may have reserved. If DEL fails
		// too, the record keeps the sandbox so the teardown is retried.
		if derr := w.c.d.net.del(ctx, att); derr != nil {
			w.log.Error(derr, "Undoing a failed CNI ADD failed; will retry")
		} else if rerr := w.c.d.ns.remove(name); rerr == nil {
			w.rec.Netns, w.rec.SandboxID = "", ""
		}
		w.rec.IPs = nil
		fail(err)
		return
	}
	w.sandboxErr, w.sandboxBackoff = "", 0
	w.log.Info("Pod sandbox ready", "netns", name, "ips", ips)
	w.warnUnsupported(pod)
}

// warnUnsupported says once per sandbox what of the spec the lab ignores,
// rather than let it pass silently.
func (w *worker) warnUnsupported(pod *v1.Pod) {
	var ignored []string
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if len(c.VolumeMounts) > 0 {
				ignored = append(ignored, "volumeMounts of "+c.Name+" (containers see the host's files)")
			}
			if sc := c.SecurityContext; sc != nil && (sc.RunAsUser != nil || sc.RunAsGroup != nil) {
				ignored = append(ignored, "runAsUser/runAsGroup of "+c.Name+" (containers run as root)")
			}
		}
	}
	if len(ignored) > 0 {
		w.event(pod, v1.EventTypeWarning, "Unsupported", "The lab runtime ignores: %s", strings.Join(ignored, "; "))
	}
}

// teardown kills whatever is left in the pod's namespace, runs CNI DEL
// and removes the namespace.
func (w *worker) teardown(ctx context.Context) error {
	path := w.netnsPath()
	if path != "" && w.c.d.ns.exists(w.rec.Netns) {
		w.c.d.procs.killNetns(path)
	}
	if w.rec.SandboxID != "" && !w.rec.HostNetwork {
		att := cniAttachment{
			SandboxID: w.rec.SandboxID,
			NetnsPath: path,
			IfName:    podIfName,
			Args: [][2]string{
				{"IgnoreUnknown", "1"},
				{"K8S_POD_NAMESPACE", w.rec.Namespace},
				{"K8S_POD_NAME", w.rec.Name},
				{"K8S_POD_INFRA_CONTAINER_ID", w.rec.SandboxID},
				{"K8S_POD_UID", string(w.rec.UID)},
			},
		}
		if path != "" && !w.c.d.ns.exists(w.rec.Netns) {
			att.NetnsPath = ""
		}
		if err := w.c.d.net.del(ctx, att); err != nil {
			return err
		}
	}
	if w.rec.Netns != "" {
		if err := w.c.d.ns.remove(w.rec.Netns); err != nil {
			return err
		}
	}
	w.log.Info("Pod sandbox removed", "netns", w.rec.Netns)
	w.rec.Netns, w.rec.SandboxID = "", ""
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

func (w *worker) containerSpec(pod *v1.Pod, name string) *v1.Container {
	if pod == nil {
		return nil
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func (w *worker) hostname(pod *v1.Pod) string {
	if pod.Spec.HostNetwork {
		return w.c.cfg.NodeName
	}
	h, _ := podHostname(pod, clusterDomain)
	return h
}

func (w *worker) env(ctx context.Context, pod *v1.Pod, c *v1.Container) ([]string, error) {
	svcs, err := w.c.services.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing services: %w", err)
	}
	return containerEnv(envInput{
		Pod: pod, Container: c, PodIPs: w.rec.IPs, NodeIP: w.c.cfg.NodeIP,
		Hostname: w.hostname(pod), Services: svcs, PodPath: w.c.cfg.PodPath,
		Sources: w.c.envSources(ctx),
	})
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

const configErrRetry = 2 * time.Second

func (w *worker) startContainer(ctx context.Context, pod *v1.Pod, name string) {
	now := w.c.d.now()
	c := w.containerSpec(pod, name)
	cr := w.rec.container(name)
	if cr == nil {
		cr = &containerRecord{Name: name, Init: isInit(pod, name)}
		w.rec.Containers = append(w.rec.Containers, cr)
	}
	configErr := func(err error) {
		cr.StartErr, cr.StartErrReason = err.Error(), "CreateContainerConfigError"
		cr.NextStart = now.Add(configErrRetry)
		w.log.Error(err, "Container config error", "container", name)
		w.event(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
	}
	env, err := w.env(ctx, pod, c)
	if err != nil {
		configErr(err)
		return
	}
	argv, err := commandLine(c, env)
	if err != nil {
		configErr(err)
		return
	}
	if cr.LastExit != nil {
		cr.RestartCount++
	}
	cr.ID = randomID(16)
	cr.StartErr, cr.StartErrReason = "", ""
	startFailed := func(err error) {
		w.log.Error(err, "Starting container failed", "container", name)
		w.event(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
		recordExit(cr, exitRecord{Code: startErrExitCode, Reason: "StartError", Message: err.Error(), StartedAt: now, FinishedAt: now}, now)
	}
	prog := argv[0]
	if c.WorkingDir != "" && strings.Contains(prog, "/") && !filepath.IsAbs(prog) {
		prog = filepath.Join(c.WorkingDir, prog)
	}
	if _, err := containerinit.LookPath(prog, envValue(env, "PATH")); err != nil {
		startFailed(fmt.Errorf("exec: %w", err))
		return
	}
	spec := procSpec{
		Argv: argv, Env: env, Workdir: c.WorkingDir, Hostname: w.hostname(pod),
		ResolvFile: w.resolvPath(), HostsFile: w.hostsPath(),
		LogPath: filepath.Join(containerDir(w.dir, name), "log"),
	}
	if !w.rec.HostNetwork {
		spec.NetnsPath = w.netnsPath()
	}
	proc, exits, err := w.c.d.procs.start(spec)
	if err != nil {
		startFailed(err)
		return
	}
	cr.Proc, cr.StartedAt = &proc, now
	cr.Ready, cr.Started = false, c.StartupProbe == nil
	cr.TermSentAt, cr.KillSentAt, cr.KillReason = time.Time{}, time.Time{}, ""
	w.watch(ctx, pod, c, cr, exits, env)
	w.log.Info("Started container", "container", name, "pid", proc.PID, "restartCount", cr.RestartCount)
	w.event(pod, v1.EventTypeNormal, "Started", "Started container %s", name)
}

// watch follows a live container: its exit and its probes.
func (w *worker) watch(ctx context.Context, pod *v1.Pod, c *v1.Container, cr *containerRecord, exits <-chan exitInfo, env []string) {
	rctx, cancel := context.WithCancel(ctx)
	run := &containerRun{proc: *cr.Proc, cancel: cancel, counters: map[probeKind]*probeCounter{}}
	if old := w.runs[cr.Name]; old != nil {
		old.cancel()
	}
	w.runs[cr.Name] = run
	name, proc := cr.Name, *cr.Proc
	go func() {
		select {
		case e := <-exits:
			w.post(workerEvent{kind: evExit, container: name, proc: proc, exit: e})
		case <-rctx.Done():
		}
	}()
	if c == nil || pod == nil {
		return
	}
	var ip string
	if len(w.rec.IPs) > 0 {
		ip = w.rec.IPs[0]
	}
	target := probeTarget{PodIP: ip, Container: c, PID: proc.PID, Env: env}
	for kind, p := range map[probeKind]*v1.Probe{startupProbe: c.StartupProbe, readinessProbe: c.ReadinessProbe, livenessProbe: c.LivenessProbe} {
		if p == nil {
			continue
		}
		run.counters[kind] = &probeCounter{}
		if kind == readinessProbe && cr.Ready {
			// Adopted and ready: stay so until the probe says otherwise.
			run.counters[kind] = &probeCounter{verdict: true, decided: true}
		}
		go w.probeLoop(rctx, name, proc, kind, p, target)
	}
}

func (w *worker) probeLoop(ctx context.Context, name string, proc procID, kind probeKind, p *v1.Probe, t probeTarget) {
	delay, period, _ := probeTiming(p)
	sleep := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if !sleep(delay) {
		return
	}
	for {
		ok, msg := w.c.d.prober.probe(ctx, p, t)
		if ctx.Err() != nil {
			return
		}
		w.post(workerEvent{kind: evProbe, container: name, proc: proc, probe: kind, ok: ok, msg: msg})
		if !sleep(period) {
			return
		}
	}
}

func (w *worker) stopWatching() {
	for n, r := range w.runs {
		r.cancel()
		delete(w.runs, n)
	}
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
		now := w.c.d.now()
		switch ev.kind {
		case evExit:
			run.cancel()
			delete(w.runs, ev.container)
			w.c.d.procs.killAll(ev.proc) // what the first process left behind
			e := exitRecordFor(ev.exit, cr.StartedAt)
			w.log.Info("Container exited", "container", cr.Name, "exitCode", e.Code, "reason", e.Reason)
			recordExit(cr, e, now)
			if c := w.containerSpec(pod, cr.Name); c != nil && pod.DeletionTimestamp == nil && containerRestarts(pod, c, cr.LastExit) && now.Before(cr.NextStart) {
				w.event(pod, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s", cr.Name, pod.Name)
			}
		case evProbe:
			c := w.containerSpec(pod, ev.container)
			if c == nil {
				continue
			}
			p := map[probeKind]*v1.Probe{startupProbe: c.StartupProbe, readinessProbe: c.ReadinessProbe, livenessProbe: c.LivenessProbe}[ev.probe]
			ctr := run.counters[ev.probe]
			if p == nil || ctr == nil || (ev.probe != startupProbe && !cr.Started) {
				continue
			}
			if !ev.ok {
				w.event(pod, v1.EventTypeWarning, "Unhealthy", "%s probe failed: %s", ev.probe, ev.msg)
			}
			verdict, changed := ctr.observe(ev.ok, p)
			if !changed {
				continue
			}
			grace := specGrace(pod)
			if p.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
			}
			switch ev.probe {
			case startupProbe:
				if verdict {
					cr.Started = true
				} else {
					cr.KillReason, cr.KillGrace = "Container "+cr.Name+" failed startup probe, will be restarted", grace
				}
			case readinessProbe:
				cr.Ready = verdict
			case livenessProbe:
				if !verdict {
					cr.KillReason, cr.KillGrace = "Container "+cr.Name+" failed liveness probe, will be restarted", grace
				}
			}
		}
	}
}

// adopt takes over the containers of a record from an earlier agent run.
func (w *worker) adopt(ctx context.Context) {
	pod := w.snapshot()
	now := w.c.d.now()
	var api map[string]v1.ContainerStatus
	if pod != nil {
		api = map[string]v1.ContainerStatus{}
		for _, cs := range pod.Status.ContainerStatuses {
			api[cs.Name] = cs
		}
	}
	nsLost := w.rec.Netns != "" && !w.c.d.ns.exists(w.rec.Netns)
	for _, cr := range w.rec.Containers {
		if cr.Proc == nil {
			continue
		}
		exits, ok := w.c.d.procs.adopt(*cr.Proc)
		if !ok || nsLost {
			w.c.d.procs.killAll(*cr.Proc)
			recordExit(cr, exitRecordFor(exitInfo{At: now}, cr.StartedAt), now)
			continue
		}
		c := w.containerSpec(pod, cr.Name)
		cr.Started = c == nil || c.StartupProbe == nil
		if cs, ok := api[cr.Name]; ok && cs.ContainerID == containerIDScheme+cr.ID {
			cr.Ready = cs.Ready
			if cs.Started != nil {
				cr.Started = *cs.Started
			}
		}
		var env []string
		if c != nil {
			env, _ = w.env(ctx, pod, c)
		}
		w.watch(ctx, pod, c, cr, exits, env)
		w.log.Info("Adopted running container", "container", cr.Name, "pid", cr.Proc.PID)
	}
	if nsLost {
		// The namespace is gone (a reboot?): the pod's network goes with it.
		w.log.Info("Pod network namespace is gone; the sandbox will be made again", "netns", w.rec.Netns)
		w.rec.Netns = ""
		w.rec.IPs = nil
	}
}

// finish removes what is left of the pod and lets the core start a newer
// pod of the same name.
func (w *worker) finish(ctx context.Context) {
	w.stopWatching()
	if err := os.RemoveAll(w.dir); err != nil {
		w.log.Error(err, "Removing the pod state dir failed")
	}
	w.mu.Lock()
	next := w.next
	w.mu.Unlock()
	w.log.Info("Pod cleaned up")
	w.c.workerDone(ctx, w, next)
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
