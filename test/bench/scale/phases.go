package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/test/bench/promhist"
)

var metaGet = metav1.GetOptions{}

// metricsAddr is where the agent serves /metrics, in its node's namespace.
const metricsAddr = "127.0.0.1:10249"

const (
	mProgramming = "flatnet_network_programming_duration_seconds"
	mFullSync    = "flatnet_sync_full_proxy_rules_duration_seconds"
	mPartialSync = "flatnet_sync_partial_proxy_rules_duration_seconds"
	mSync        = "flatnet_sync_proxy_rules_duration_seconds"
)

// nodes: the lab grows to N simulated nodes; the controller gives each a
// podCIDR and kwok makes it Ready.
//
// The controller is stopped while the Nodes are made, and started again
// (by lab up) once they all exist: node IPAM then meets every Node
// waiting, as after a controller restart or at a cluster's bring-up, and
// the podCIDRs time is its own, from its process start. With it running,
// the time from the first Node created to the last podCIDR is bounded by
// how fast this machine's apiserver takes 5,000 creates (33 s here),
// whatever node IPAM does. The controller starts once the cluster has
// settled (below), as it would be when a controller restarts.
//
// The lab already holds one simulated node (so that the control plane
// runs with its many-nodes flags from the start and does not restart
// here): the times are of the nodes made in this phase.
func (b *bench) nodes(ctx context.Context, p *phase) error {
	if err := proc.Stop(b.spec.StateDir, lab.ProcController, 10*time.Second); err != nil {
		return err
	}
	t0 := time.Now()
	if err := simnodes.Create(ctx, b.client, b.spec.SimConfig(), 1, b.c.Nodes, 0); err != nil {
		return fmt.Errorf("creating %d simulated nodes: %w", b.c.Nodes, err)
	}
	// Settled before the controller starts: kwok has made every Node
	// Ready and kube-controller-manager has taken the not-ready taint
	// off, so node IPAM has the apiserver to itself.
	if err := waitFor(ctx, "simulated nodes Ready and untainted", 200*time.Millisecond, func() (bool, string) {
		st := b.w.nodeStats(t0)
		return st.n >= b.c.Nodes && st.settled >= b.c.Nodes, fmt.Sprintf("%d nodes, %d Ready, %d untainted", st.n, st.ready, st.settled)
	}); err != nil {
		return err
	}
	p.Values["settledSeconds"] = round(time.Since(t0).Seconds(), 2)
	if err := b.labUp(ctx, b.c.Nodes); err != nil {
		return err
	}
	ctl, ok := b.agentUsage(lab.ProcController)
	if !ok {
		return fmt.Errorf("the controller is not running after lab up")
	}
	ctlStart := time.Now().Add(-ctl.Started)
	err := waitFor(ctx, "simulated nodes with podCIDRs and Ready", time.Second, func() (bool, string) {
		st := b.w.nodeStats(t0)
		return st.n >= b.c.Nodes && st.cidr >= b.c.Nodes && st.ready >= b.c.Nodes,
			fmt.Sprintf("%d nodes, %d with podCIDRs, %d Ready", st.n, st.cidr, st.ready)
	})
	st := b.w.nodeStats(t0)
	p.Values["nodes"] = float64(st.n)
	p.Values["createSeconds"] = round(st.lastCreated.Sub(st.firstCreated).Seconds(), 2)
	p.Values["podCIDRsFromControllerStartSeconds"] = round(st.lastCIDR.Sub(ctlStart).Seconds(), 2)
	p.Values["readySeconds"] = round(st.lastReady.Sub(st.firstCreated).Seconds(), 2)
	if err != nil {
		return err
	}
	b.lay.nodes = b.w.simNodes()
	sort.Strings(b.lay.nodes)
	return nil
}

// expectedPeers is how many peer routes a real agent should hold.
func (b *bench) expectedPeers() int { return len(b.w.simNodes()) + len(b.spec.Nodes) - 1 }

// agentStart: each real agent stopped, its peer routes deleted (a stopped
// agent leaves them, as flannel does), and started again by lab up; the
// time from its process start to every peer route back in its namespace,
// watched while lab up runs (lab up goes on with its other steps after
// starting the agent).
func (b *bench) agentStart(ctx context.Context, p *phase) error {
	for i, n := range b.spec.Nodes {
		name, ns, own := b.agent(i)
		if err := proc.Stop(b.spec.StateDir, name, 10*time.Second); err != nil {
			return err
		}
		if err := deletePeerRoutes(ns, b.cluster, own); err != nil {
			return err
		}
		if got, err := peerRoutes(ns, b.cluster, own); err != nil || got != 0 {
			return fmt.Errorf("%s: %d peer routes left after deleting them (%v)", n.Name, got, err)
		}
		routes, stop, err := b.watchPeerRoutes(ns, own)
		if err != nil {
			return err
		}
		up := make(chan error, 1)
		go func() { up <- b.labUp(ctx, b.c.Nodes) }()
		want := b.expectedPeers()
		var at usage
		err = waitFor(ctx, n.Name+"'s peer routes", 20*time.Millisecond, func() (bool, string) {
			u, running := b.agentUsage(name)
			if !running {
				return false, "agent not started yet"
			}
			if got := routes.Len(); got < want {
				return false, fmt.Sprintf("%d of %d routes (%v)", got, want, routes.Err())
			}
			at = u
			return true, ""
		})
		stop()
		if uerr := <-up; uerr != nil {
			return uerr
		}
		if err != nil {
			return err
		}
		p.Values[n.Name+".routes"] = float64(want)
		p.Values[n.Name+".secondsFromStart"] = round(at.Started.Seconds(), 3)
		p.Values[n.Name+".cpuSeconds"] = round(at.CPU, 3)
		p.Values[n.Name+".rssMiB"] = round(at.RSSMiB, 1)
	}
	return nil
}

// watchPeerRoutes keeps the set of peer routes in a lab node's namespace
// from the kernel's route notifications until stop: listing 5,000 routes
// every few milliseconds took most of a CPU from the agent being timed.
func (b *bench) watchPeerRoutes(ns string, own netip.Prefix) (routes *netlinkx.RouteSet, stop func(), err error) {
	done := make(chan struct{})
	routes, err = netlinkx.RouteWatch(filepath.Join(netns.RunDir, ns), isPeerRoute(b.cluster, own), done)
	if err != nil {
		return nil, nil, err
	}
	return routes, func() { close(done) }, nil
}

// idleRate is an agent's CPU seconds per second over d, doing nothing in
// particular (its heartbeats, resyncs): subtracted from a phase's CPU.
func (b *bench) idleRate(name string, d time.Duration) float64 {
	u0, _ := b.agentUsage(name)
	time.Sleep(d)
	u1, _ := b.agentUsage(name)
	return (u1.CPU - u0.CPU) / d.Seconds()
}

// peerChurn: 10 % of the simulated nodes deleted, then made again by lab
// up; the first real agent's CPU per node event, its idle rate
// subtracted, beside the anchor's (anchor.go) over the same window.
func (b *bench) peerChurn(ctx context.Context, p *phase) error {
	name, ns, own := b.agent(0)
	routes, stop, err := b.watchPeerRoutes(ns, own)
	if err != nil {
		return err
	}
	defer stop()
	anc, err := startAnchor(ctx, anchorFlag, b.spec.Kubeconfig())
	if err != nil {
		return err
	}
	defer anc.stop()
	a0, _ := anc.usage()
	ti := time.Now()
	idle := b.idleRate(name, 5*time.Second)
	a1, _ := anc.usage()
	anchorIdle := (a1.CPU - a0.CPU) / time.Since(ti).Seconds()
	k := max(1, b.c.Nodes/10)
	victims := b.lay.nodes[len(b.lay.nodes)-k:]
	ev0, _, _ := b.w.counts()
	all0 := b.w.allNodeEvents()
	u0, _ := b.agentUsage(name)
	a0, _ = anc.usage()
	t0 := time.Now()
	err = parallel(ctx, len(victims), b.c.Workers, func(ctx context.Context, i int) error {
		err := b.client.CoreV1().Nodes().Delete(ctx, victims[i], metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	want := b.expectedPeers() + len(victims) // the watcher may not have seen them go yet
	if err := waitFor(ctx, "peer routes removed", 50*time.Millisecond, func() (bool, string) {
		got := routes.Len()
		return got <= want-k, fmt.Sprintf("%d routes, want %d", got, want-k)
	}); err != nil {
		return err
	}
	p.Values["removedSeconds"] = round(time.Since(t0).Seconds(), 2)
	if err := b.labUp(ctx, b.c.Nodes); err != nil {
		return err
	}
	want = b.c.Nodes + len(b.spec.Nodes) - 1
	if err := waitFor(ctx, "peer routes back", 50*time.Millisecond, func() (bool, string) {
		got := routes.Len()
		return got >= want, fmt.Sprintf("%d routes, want %d", got, want)
	}); err != nil {
		return err
	}
	u1, _ := b.agentUsage(name)
	a1, _ = anc.usage()
	ev1, _, _ := b.w.counts()
	d := time.Since(t0).Seconds()
	ev := ev1 - ev0
	cpu := u1.CPU - u0.CPU - idle*d
	anchorCPU := a1.CPU - a0.CPU - anchorIdle*d
	if u1.PID != u0.PID {
		return fmt.Errorf("agent %s restarted during the phase (pid %d -> %d)", name, u0.PID, u1.PID)
	}
	p.Values["nodesReplaced"] = float64(k)
	p.Values["nodeEvents"] = float64(ev)
	p.Values["allNodeEvents"] = float64(b.w.allNodeEvents() - all0) // with kwok's and the controllers' updates
	p.Values["agentCPUSeconds"] = round(cpu, 3)
	p.Values["agentIdleCPUPerSecond"] = round(idle, 4)
	p.Values["agentMicrosecondsPerNodeEvent"] = round(cpu/float64(max(1, ev))*1e6, 1)
	p.Values["anchorCPUSeconds"] = round(anchorCPU, 3)
	p.Values["anchorIdleCPUPerSecond"] = round(anchorIdle, 4)
	p.Values["anchorMicrosecondsPerNodeEvent"] = round(anchorCPU/float64(max(1, ev))*1e6, 1)
	if anchorCPU > 0 {
		p.Values["agentToAnchorRatio"] = round(cpu/anchorCPU, 2)
	}
	b.lay.nodes = b.w.simNodes()
	sort.Strings(b.lay.nodes)
	return nil
}

// objects: namespaces, Services, then pods; until every endpoint is ready.
func (b *bench) objects(ctx context.Context, p *phase) error {
	c := b.c
	b.lay.Namespaces = max(1, c.Nodes/100)
	b.lay.Services, b.lay.Pods = c.Services, c.Pods
	l := b.lay
	if err := parallel(ctx, l.Namespaces, c.Workers, func(ctx context.Context, i int) error {
		_, err := b.client.CoreV1().Namespaces().Create(ctx, l.namespace(i), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	// The default ServiceAccount must exist before a pod can be created.
	if err := waitFor(ctx, "default service accounts", 200*time.Millisecond, func() (bool, string) {
		for i := range l.Namespaces {
			if _, err := b.client.CoreV1().ServiceAccounts(l.ns(i)).Get(ctx, "default", metaGet); err != nil {
				return false, err.Error()
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	per := l.svcPerNs()
	t0 := time.Now()
	if err := parallel(ctx, l.Namespaces*per, c.Workers, func(ctx context.Context, i int) error {
		_, err := b.client.CoreV1().Services(l.ns(i/per)).Create(ctx, l.service(i/per, i%per), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	p.Values["servicesCreateSeconds"] = round(time.Since(t0).Seconds(), 2)
	// The controller's anchor runs from here to the end of the run: its
	// caches fill with the pods as the controller's do.
	anc, err := startAnchor(ctx, controllerAnchorFlag, b.spec.Kubeconfig())
	if err != nil {
		return err
	}
	b.ctlAnc = anc
	m0 := b.controllerMark()
	t1 := time.Now()
	pods := b.makePods("pod", 0, c.Pods)
	if err := createPods(ctx, b.client, pods, c.Workers); err != nil {
		return err
	}
	p.Values["podsCreateSeconds"] = round(time.Since(t1).Seconds(), 2)
	if err := b.waitEndpoints(ctx); err != nil {
		return err
	}
	p.Values["allEndpointsReadySeconds"] = round(time.Since(t1).Seconds(), 2)
	b.settleController(ctx)
	ctl1 := b.controllerCost(p, m0)
	p.Values["controllerRSSMiB"] = round(ctl1.RSSMiB, 1)
	p.Values["controllerPeakRSSMiB"] = round(ctl1.HWMMiB, 1)
	return nil
}

// controllerMark is where a phase's controller cost is counted from.
type controllerMark struct {
	podEv, sliceEv int
	usage          usage // the controller process's
	anchor         usage // its anchor's, if it runs
}

func (b *bench) controllerMark() controllerMark {
	_, pe, _ := b.w.counts()
	m := controllerMark{podEv: pe, sliceEv: b.w.sliceEvents(), usage: labProcs(b.spec.StateDir)[lab.ProcController]}
	if b.ctlAnc != nil {
		m.anchor, _ = b.ctlAnc.usage()
	}
	return m
}

// controllerCost records the controller's cost since m0: its CPU, the pod
// events it received and the slice events its writes made (creates,
// updates, deletes: a write each), and the CPU per pod event. It returns
// the controller's usage now.
func (b *bench) controllerCost(p *phase, m0 controllerMark) usage {
	m1 := b.controllerMark()
	pe, cpu := m1.podEv-m0.podEv, m1.usage.CPU-m0.usage.CPU
	p.Values["podEvents"] = float64(pe)
	p.Values["sliceWrites"] = float64(m1.sliceEv - m0.sliceEv)
	p.Values["controllerCPUSeconds"] = round(cpu, 2)
	p.Values["controllerMillisecondsPerPodEvent"] = round(cpu/float64(max(1, pe))*1e3, 3)
	if b.ctlAnc != nil && m1.anchor.PID == m0.anchor.PID {
		acpu := m1.anchor.CPU - m0.anchor.CPU
		p.Values["anchorMillisecondsPerPodEvent"] = round(acpu/float64(max(1, pe))*1e3, 3)
		if acpu > 0 {
			p.Values["controllerToAnchorRatio"] = round(cpu/acpu, 2)
		}
	}
	return m1.usage
}

// makePods makes pods from..from+n-1 of series prefix, spread over the
// namespaces, their Services and the nodes, and records them as live.
func (b *bench) makePods(prefix string, from, n int) []*corev1.Pod {
	l := b.lay
	out := make([]*corev1.Pod, 0, n)
	for i := from; i < from+n; i++ {
		ns := i % l.Namespaces
		pod := l.pod(prefix, ns, i/l.Namespaces, b.seq)
		b.seq++
		out = append(out, pod)
		b.live = append(b.live, podRef{pod.Namespace, pod.Name})
	}
	return out
}

// waitEndpoints waits until the slices hold one ready endpoint per live pod.
func (b *bench) waitEndpoints(ctx context.Context) error {
	return waitFor(ctx, "ready endpoints", 200*time.Millisecond, func() (bool, string) {
		_, _, ready := b.w.counts()
		return ready == len(b.live), fmt.Sprintf("%d ready endpoints of %d pods", ready, len(b.live))
	})
}

// settleController waits until the controller's CPU stops moving (its
// last syncs after the endpoints are all in), at most a minute.
func (b *bench) settleController(ctx context.Context) {
	prev := -1.0
	for range 60 {
		u := labProcs(b.spec.StateDir)[lab.ProcController]
		if u.CPU-prev < 0.02 {
			return
		}
		prev = u.CPU
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// agentHist reads the first real agent's histograms.
func (b *bench) agentHist() (map[string]promhist.Hist, error) {
	ns := lab.NetnsPath(b.spec.Nodes[0].Netns)
	mf, err := promhist.Scrape(ns, metricsAddr)
	if err != nil {
		return nil, err
	}
	out := map[string]promhist.Hist{}
	for _, m := range []string{mProgramming, mFullSync, mPartialSync, mSync} {
		out[m] = promhist.Histogram(mf, m)
	}
	return out, nil
}

// settleAgent waits until the agent's sync count stops moving for 3 s.
func (b *bench) settleAgent(ctx context.Context) (map[string]promhist.Hist, error) {
	var last map[string]promhist.Hist
	still := 0
	for still < 6 {
		h, err := b.agentHist()
		if err != nil {
			return nil, err
		}
		if last != nil && h[mSync].Count == last[mSync].Count {
			still++
		} else {
			still = 0
		}
		last = h
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return last, nil
}

// proxyRestart: the first agent restarted with every Service and endpoint
// in place: its first full sync.
func (b *bench) proxyRestart(ctx context.Context, p *phase) error {
	name := lab.AgentProc(b.spec.Nodes[0].Name)
	if err := proc.Stop(b.spec.StateDir, name, 10*time.Second); err != nil {
		return err
	}
	if err := b.labUp(ctx, b.c.Nodes); err != nil {
		return err
	}
	var h map[string]promhist.Hist
	var at usage
	if err := waitFor(ctx, "the first full proxy sync", 50*time.Millisecond, func() (bool, string) {
		var err error
		h, err = b.agentHist()
		if err != nil || h[mFullSync].Count < 1 {
			return false, fmt.Sprint(err)
		}
		at, _ = b.agentUsage(name)
		return true, ""
	}); err != nil {
		return err
	}
	f := h[mFullSync]
	p.Values["firstFullSyncSeconds"] = round(f.Sum/f.Count, 3)
	p.Values["syncedSecondsFromStart"] = round(at.Started.Seconds(), 2)
	p.Values["agentCPUSecondsUntilSynced"] = round(at.CPU, 2)
	if _, err := b.settleAgent(ctx); err != nil {
		return err
	}
	u, _ := b.agentUsage(name)
	p.Values["agentRSSMiB"] = round(u.RSSMiB, 1)
	p.Values["agentRSSMiBPer1000Pods"] = round(u.RSSMiB/float64(len(b.live))*1000, 2)
	return nil
}

// readyLags adds to p the lags the harness saw since t0: pods' Ready
// (watcher.readyTransition) and slices' trigger times
// (watcher.sliceTriggered).
func (b *bench) readyLags(p *phase, t0 time.Time) {
	for _, l := range []struct {
		name  string
		slice bool
	}{{"readySeenLag", false}, {"sliceSeenLag", true}} {
		p50, p99, n := b.w.lagQuantiles(l.slice, t0)
		if n == 0 {
			continue
		}
		p.Values[l.name+"Count"] = float64(n)
		p.Values[l.name+"P50Seconds"] = round(p50.Seconds(), 3)
		p.Values[l.name+"P99Seconds"] = round(p99.Seconds(), 3)
	}
}

// programmed records the programming latency and partial sync quantiles
// of the histograms' difference.

func programmed(p *phase, before, after map[string]promhist.Hist) {
	lat := after[mProgramming].Minus(before[mProgramming])
	part := after[mPartialSync].Minus(before[mPartialSync])
	p.Values["programmingCount"] = lat.Count
	p.Values["programmingP50Seconds"] = round(lat.Quantile(0.5), 3)
	p.Values["programmingP99Seconds"] = round(lat.Quantile(0.99), 3)
	p.Values["partialSyncs"] = part.Count
	p.Values["partialSyncP50Seconds"] = round(part.Quantile(0.5), 4)
	p.Values["partialSyncP99Seconds"] = round(part.Quantile(0.99), 4)
	full := after[mFullSync].Minus(before[mFullSync])
	p.Values["fullSyncs"] = full.Count
}

// burst: Burst pods at once into the existing Services.
func (b *bench) burst(ctx context.Context, p *phase) error {
	before, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	lagFrom := time.Now()
	t0 := time.Now()
	if err := createPods(ctx, b.client, b.makePods("burst", 0, b.c.Burst), b.c.Workers); err != nil {
		return err
	}
	if err := b.waitEndpoints(ctx); err != nil {
		return err
	}
	p.Values["allEndpointsReadySeconds"] = round(time.Since(t0).Seconds(), 2)
	after, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	b.readyLags(p, lagFrom)
	programmed(p, before, after)
	return nil
}

// churn: ChurnRate pods created and as many of the oldest deleted every
// second, for ChurnFor.
func (b *bench) churn(ctx context.Context, p *phase) error {
	before, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	lagFrom := time.Now()
	m0 := b.controllerMark()
	tick := time.NewTicker(time.Second / time.Duration(max(1, b.c.ChurnRate)))
	defer tick.Stop()
	end := time.Now().Add(b.c.ChurnFor)
	n := 0
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		old := b.live[0]
		b.live = b.live[1:]
		// One series, so the churn spreads over the Services as the
		// other phases do (each pod its own series put them all in one
		// Service of one namespace: a single hot Service).
		pod := b.makePods("churn", n, 1)[0]
		n++
		go func() {
			_, _ = b.client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
			_ = b.client.CoreV1().Pods(old.ns).Delete(ctx, old.name, metav1.DeleteOptions{})
		}()
	}
	if err := b.waitEndpoints(ctx); err != nil {
		return err
	}
	after, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	b.readyLags(p, lagFrom)
	programmed(p, before, after)
	p.Values["podsReplaced"] = float64(n)
	b.controllerCost(p, m0)
	return nil
}

// rolling: 10 % of the pods replaced as fast as the API takes it.
func (b *bench) rolling(ctx context.Context, p *phase) error {
	before, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	lagFrom := time.Now()
	k := len(b.live) / 10
	old := append([]podRef(nil), b.live[:k]...)
	b.live = b.live[k:]
	m0 := b.controllerMark()
	t0 := time.Now()
	if err := deletePods(ctx, b.client, old, b.c.Workers); err != nil {
		return err
	}
	if err := createPods(ctx, b.client, b.makePods("roll", 0, k), b.c.Workers); err != nil {
		return err
	}
	if err := b.waitEndpoints(ctx); err != nil {
		return err
	}
	p.Values["podsReplaced"] = float64(k)
	p.Values["allEndpointsReadySeconds"] = round(time.Since(t0).Seconds(), 2)
	after, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	b.readyLags(p, lagFrom)
	programmed(p, before, after)
	b.settleController(ctx)
	b.controllerCost(p, m0)
	return nil
}

// servicesChurn: 1 % more Services (selecting existing pods), then deleted.
func (b *bench) servicesChurn(ctx context.Context, p *phase) error {
	before, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	lagFrom := time.Now()
	l := b.lay
	k := max(1, b.c.Services/100)
	mk := func(i int) *corev1.Service {
		s := l.service(i%l.Namespaces, i/l.Namespaces%l.svcPerNs())
		s.Name = fmt.Sprintf("extra-%05d", i)
		return s
	}
	t0 := time.Now()
	if err := parallel(ctx, k, b.c.Workers, func(ctx context.Context, i int) error {
		s := mk(i)
		_, err := b.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	mid, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	p.Values["servicesAdded"] = float64(k)
	p.Values["addedAndSettledSeconds"] = round(time.Since(t0).Seconds(), 2)
	if err := parallel(ctx, k, b.c.Workers, func(ctx context.Context, i int) error {
		s := mk(i)
		err := b.client.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	after, err := b.settleAgent(ctx)
	if err != nil {
		return err
	}
	b.readyLags(p, lagFrom)
	programmed(p, before, after)
	p.Values["partialSyncsWhileAdding"] = mid[mPartialSync].Minus(before[mPartialSync]).Count
	return nil
}

func (b *bench) phase(name string) *phase {
	for _, p := range b.res.Phases {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// checks compares the run with issue 16's targets (a phase that did not
// run is left out).
func (b *bench) checks() {
	add := func(phaseName, key, what, target, unit string, limit float64) {
		p := b.phase(phaseName)
		if p == nil {
			return
		}
		v, ok := p.Values[key]
		if !ok {
			return
		}
		b.res.Checks = append(b.res.Checks, check{What: what, Target: target, Measured: v, Unit: unit, Pass: v >= 0 && v <= limit})
	}
	add("nodes", "podCIDRsFromControllerStartSeconds", fmt.Sprintf("%d podCIDRs assigned (controller start, the Nodes waiting, to last podCIDR)", b.c.Nodes), "≤ 20 s", "s", 20)
	add("objects", "controllerMillisecondsPerPodEvent", "EndpointSlice controller CPU per pod event", "≤ 0.5 ms", "ms", 0.5)
	add("objects", "controllerPeakRSSMiB", "controller peak RSS", "≤ 300 MiB", "MiB", 300)
	add("burst", "programmingP99Seconds", fmt.Sprintf("network programming p99, %d-pod burst", b.c.Burst), "≤ 2 s", "s", 2)
	add("churn", "programmingP99Seconds", fmt.Sprintf("network programming p99, churn %d pods/s", b.c.ChurnRate), "≤ 1 s", "s", 1)
	for _, n := range b.spec.Nodes {
		add("agent-start", n.Name+".secondsFromStart", "agent "+n.Name+": all peer routes after start", "≤ 1 s", "s", 1)
	}
	add("peer-churn", "agentMicrosecondsPerNodeEvent", "agent CPU per peer event", "≤ 50 µs", "µs", 50)
	add("proxy-restart", "firstFullSyncSeconds", "proxy full sync", "≤ 2 s", "s", 2)
	add("churn", "partialSyncP50Seconds", "proxy partial sync (median, churn)", "≤ 20 ms", "s", 0.02)
}

// table prints the checks and every phase's values as Markdown.
func (r *result) table(w io.Writer) {
	fmt.Fprintf(w, "\nscale run %s: %d simulated nodes, %d pods, %d Services, %d real node(s), %s; load at start %s; complete %v\n\n",
		r.Started.Format(time.RFC3339), r.Size["nodes"], r.Size["pods"], r.Size["services"], r.Size["realNodes"], r.Backend, r.Load, r.Complete)
	fmt.Fprintln(w, "| check | target | measured | |")
	fmt.Fprintln(w, "|---|---|---:|---|")
	for _, c := range r.Checks {
		mark := "pass"
		if !c.Pass {
			mark = "**miss**"
		}
		v := c.Measured
		unit := c.Unit
		if unit == "s" && v < 0.1 && v >= 0 {
			v, unit = v*1000, "ms"
		}
		fmt.Fprintf(w, "| %s | %s | %s %s | %s |\n", c.What, c.Target, fmtNum(v), unit, mark)
	}
	fmt.Fprintln(w, "\n| phase | seconds | values | CPU s per process |")
	fmt.Fprintln(w, "|---|---:|---|---|")
	for _, p := range r.Phases {
		var vals, cpu []string
		for _, k := range sortedKeys(p.Values) {
			vals = append(vals, k+" "+fmtNum(p.Values[k]))
		}
		for _, k := range sortedKeys(p.CPU) {
			if p.CPU[k] >= 0.05 {
				cpu = append(cpu, k+" "+fmtNum(p.CPU[k]))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", p.Name, fmtNum(p.Seconds), strings.Join(vals, ", "), strings.Join(cpu, ", "))
	}
	fmt.Fprintln(w, "\n| process at the end | CPU s | RSS MiB | peak RSS MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	for _, k := range sortedKeys(r.Procs) {
		u := r.Procs[k]
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", k, fmtNum(u.CPU), fmtNum(u.RSSMiB), fmtNum(u.HWMMiB))
	}
}

func fmtNum(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
