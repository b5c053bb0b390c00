package process

// The worker's side of probing: one goroutine per probe posts results;
// the run goroutine turns them into Started, Ready or a kill through the
// probe counters (prober.go runs a probe once).

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
)

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

// probeResult turns one probe result into the container's Started and
// Ready, or a kill when a startup or liveness probe gives up on it.
func (w *worker) probeResult(pod *v1.Pod, cr *containerRecord, run *containerRun, ev workerEvent) {
	c := w.containerSpec(pod, ev.container)
	if c == nil {
		return
	}
	p := map[probeKind]*v1.Probe{startupProbe: c.StartupProbe, readinessProbe: c.ReadinessProbe, livenessProbe: c.LivenessProbe}[ev.probe]
	ctr := run.counters[ev.probe]
	if p == nil || ctr == nil || (ev.probe != startupProbe && !cr.Started) {
		return
	}
	if !ev.ok {
		w.event(pod, v1.EventTypeWarning, "Unhealthy", "%s probe failed: %s", ev.probe, ev.msg)
	}
	verdict, changed := ctr.observe(ev.ok, p)
	if !changed {
		return
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
