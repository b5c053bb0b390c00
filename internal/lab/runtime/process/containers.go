package process

// A pod's containers: starting one (environment, command line, process),
// watching it (its exit and its probes, in goroutines that only post events
// to the worker) and adopting the ones an earlier runtime left running.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/flatnet/flatnet/internal/lab/runtime/process/containerinit"
)

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
	h, _ := podHostname(pod, w.c.cfg.ClusterDomain)
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
	rctx, cancel := context.WithCancel(ctx)
	cr.Proc, cr.StartedAt = &proc, now
	cr.Ready, cr.Started = false, c.StartupProbe == nil
	cr.TermSentAt, cr.KillSentAt, cr.KillReason = time.Time{}, time.Time{}, ""
	w.watch(rctx, cancel, pod, c, cr, exits, false, env)
	w.log.Info("Started container", "container", name, "pid", proc.PID, "restartCount", cr.RestartCount)
	w.event(pod, v1.EventTypeNormal, "Started", "Started container %s", name)
}

// watch follows a live container, its exit and its probes, until rctx
// ends (cancel ends it). Every goroutine it starts is counted in
// w.watchers. An adopted container's exits channel comes from a process
// watcher that ends with rctx and then closes it: the exit watcher waits
// for that, so that no goroutine outlives the worker.
func (w *worker) watch(rctx context.Context, cancel context.CancelFunc, pod *v1.Pod, c *v1.Container, cr *containerRecord, exits <-chan exitInfo, adopted bool, env []string) {
	run := &containerRun{proc: *cr.Proc, cancel: cancel, counters: map[probeKind]*probeCounter{}}
	if old := w.runs[cr.Name]; old != nil {
		old.cancel()
	}
	w.runs[cr.Name] = run
	name, proc := cr.Name, *cr.Proc
	w.watchers.Add(1)
	go func() {
		defer w.watchers.Done()
		select {
		case e, ok := <-exits:
			if ok {
				w.post(workerEvent{kind: evExit, container: name, proc: proc, exit: e})
			}
		case <-rctx.Done():
		}
		if adopted {
			for range exits {
			}
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
		w.watchers.Add(1)
		go func() {
			defer w.watchers.Done()
			w.probeLoop(rctx, name, proc, kind, p, target)
		}()
	}
}

// stopWatching ends the watch of every container and waits for its
// goroutines (a probe in flight is cancelled; see prober.go).
func (w *worker) stopWatching() {
	for n, r := range w.runs {
		r.cancel()
		delete(w.runs, n)
	}
	w.watchers.Wait()
}

// containerExited records the exit of a container's first process.
func (w *worker) containerExited(pod *v1.Pod, cr *containerRecord, run *containerRun, ev workerEvent) {
	now := w.c.d.now()
	run.cancel()
	delete(w.runs, ev.container)
	w.c.d.procs.killAll(ev.proc) // what the first process left behind
	e := exitRecordFor(ev.exit, cr.StartedAt)
	w.log.Info("Container exited", "container", cr.Name, "exitCode", e.Code, "reason", e.Reason)
	recordExit(cr, e, now)
	if c := w.containerSpec(pod, cr.Name); c != nil && pod.DeletionTimestamp == nil && containerRestarts(pod, c, cr.LastExit) && now.Before(cr.NextStart) {
		w.event(pod, v1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s", cr.Name, pod.Name)
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
		rctx, cancel := context.WithCancel(ctx)
		exits, ok := w.c.d.procs.adopt(rctx, *cr.Proc)
		if !ok || nsLost {
			cancel()
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
		w.watch(rctx, cancel, pod, c, cr, exits, true, env)
		w.log.Info("Adopted running container", "container", cr.Name, "pid", cr.Proc.PID)
	}
	if nsLost {
		// The namespace is gone (a reboot?): the pod's network goes with it.
		w.log.Info("Pod network namespace is gone; the sandbox will be made again", "netns", w.rec.Netns)
		w.rec.Netns = ""
		w.rec.IPs = nil
	}
}
