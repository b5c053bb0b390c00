package process

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testPod(policy v1.RestartPolicy, names ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "0123456789ab"},
		Spec:       v1.PodSpec{RestartPolicy: policy, NodeName: "n1"},
	}
	for _, n := range names {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: n, Image: "img", Command: []string{"sleep", "1000"}})
	}
	return p
}

func readyRec(pod *v1.Pod) *podRecord {
	r := newRecord(pod, t0)
	r.Netns, r.SandboxID, r.IPs = "fl-01234567", "sb", []string{"10.244.1.2"}
	return r
}

func running(r *podRecord, names ...string) *podRecord {
	for i, n := range names {
		c := r.container(n)
		c.Proc, c.StartedAt, c.ID, c.Started = &procID{PID: 100 + i, StartTicks: 1}, t0, "id-"+n, true
	}
	return r
}

func exited(r *podRecord, name string, code int32, at time.Time) *podRecord {
	c := r.container(name)
	c.ID = "id-" + name
	recordExit(c, exitRecord{Code: code, Reason: "Error", StartedAt: t0, FinishedAt: at}, at)
	return r
}

func acts(as ...action) []action { return as }

func TestPlan(t *testing.T) {
	deleting := func(p *v1.Pod, grace int64) *v1.Pod {
		p = p.DeepCopy()
		ts := metav1.NewTime(t0)
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
		return p
	}
	for _, tc := range []struct {
		name string
		in   planInput
		want planResult
	}{
		{
			name: "new pod: sandbox first",
			in:   planInput{Pod: testPod("", "a"), Rec: newRecord(testPod("", "a"), t0), Now: t0},
			want: planResult{Actions: acts(action{Type: actCreateSandbox})},
		},
		{
			name: "sandbox retry not due",
			in:   planInput{Pod: testPod("", "a"), Rec: newRecord(testPod("", "a"), t0), Now: t0, SandboxRetryAt: t0.Add(4 * time.Second)},
			want: planResult{WakeAt: t0.Add(4 * time.Second)},
		},
		{
			name: "sandbox ready: start every container",
			in:   planInput{Pod: testPod("", "a", "b"), Rec: readyRec(testPod("", "a", "b")), Now: t0},
			want: planResult{Actions: acts(action{Type: actStartContainer, Container: "a"}, action{Type: actStartContainer, Container: "b"})},
		},
		{
			name: "all running: nothing to do",
			in:   planInput{Pod: testPod("", "a", "b"), Rec: running(readyRec(testPod("", "a", "b")), "a", "b"), Now: t0},
			want: planResult{},
		},
		{
			name: "half-made sandbox is torn down first",
			in: planInput{Pod: testPod("", "a"), Rec: func() *podRecord {
				r := newRecord(testPod("", "a"), t0)
				r.Netns, r.SandboxID = "fl-x", "sb"
				return r
			}(), Now: t0},
			want: planResult{Actions: acts(action{Type: actTeardown})},
		},
		{
			name: "Always: first crash restarts at once",
			in:   planInput{Pod: testPod(v1.RestartPolicyAlways, "a"), Rec: exited(readyRec(testPod("", "a")), "a", 0, t0), Now: t0},
			want: planResult{Actions: acts(action{Type: actStartContainer, Container: "a"})},
		},
		{
			name: "Always: in back-off",
			in: planInput{Pod: testPod(v1.RestartPolicyAlways, "a"), Rec: func() *podRecord {
				r := exited(readyRec(testPod("", "a")), "a", 1, t0)
				r.container("a").Proc = nil
				exited(r, "a", 1, t0.Add(time.Second)) // second crash: 10 s back-off
				return r
			}(), Now: t0.Add(2 * time.Second)},
			want: planResult{WakeAt: t0.Add(11 * time.Second)},
		},
		{
			name: "OnFailure: success is final, failure restarts",
			in: planInput{Pod: testPod(v1.RestartPolicyOnFailure, "ok", "bad"), Rec: func() *podRecord {
				r := readyRec(testPod("", "ok", "bad"))
				exited(r, "ok", 0, t0)
				exited(r, "bad", 2, t0)
				return r
			}(), Now: t0},
			want: planResult{Actions: acts(action{Type: actStartContainer, Container: "bad"})},
		},
		{
			name: "Never: a sibling still runs",
			in: planInput{Pod: testPod(v1.RestartPolicyNever, "a", "b"), Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a", "b")), "b")
				return exited(r, "a", 1, t0)
			}(), Now: t0},
			want: planResult{},
		},
		{
			name: "Never: all exited, the pod is finished and its network released",
			in:   planInput{Pod: testPod(v1.RestartPolicyNever, "a"), Rec: exited(readyRec(testPod("", "a")), "a", 1, t0), Now: t0},
			want: planResult{Actions: acts(action{Type: actTeardown})},
		},
		{
			name: "deleting: SIGTERM with the pod's grace",
			in:   planInput{Pod: deleting(testPod("", "a"), 7), Rec: running(readyRec(testPod("", "a")), "a"), Now: t0},
			want: planResult{Actions: acts(action{Type: actStopContainer, Container: "a", Grace: 7 * time.Second, Reason: "deleting the pod"}), WakeAt: t0.Add(7 * time.Second)},
		},
		{
			name: "deleting: grace not over",
			in: planInput{Pod: deleting(testPod("", "a"), 7), Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a")), "a")
				r.container("a").TermSentAt, r.container("a").TermGrace = t0, 7*time.Second
				return r
			}(), Now: t0.Add(3 * time.Second)},
			want: planResult{WakeAt: t0.Add(7 * time.Second)},
		},
		{
			name: "deleting: grace over, SIGKILL",
			in: planInput{Pod: deleting(testPod("", "a"), 7), Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a")), "a")
				r.container("a").TermSentAt, r.container("a").TermGrace = t0, 7*time.Second
				return r
			}(), Now: t0.Add(7 * time.Second)},
			want: planResult{Actions: acts(action{Type: actKillContainer, Container: "a"})},
		},
		{
			name: "deleting: a shorter grace (force delete) cuts the wait",
			in: planInput{Pod: deleting(testPod("", "a"), 1), Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a")), "a")
				r.container("a").TermSentAt, r.container("a").TermGrace = t0, 30*time.Second
				return r
			}(), Now: t0.Add(2 * time.Second)},
			want: planResult{Actions: acts(action{Type: actKillContainer, Container: "a"})},
		},
		{
			name: "deleting: all stopped, tear down",
			in:   planInput{Pod: deleting(testPod("", "a"), 7), Rec: exited(readyRec(testPod("", "a")), "a", 143, t0), Now: t0},
			want: planResult{Actions: acts(action{Type: actTeardown})},
		},
		{
			name: "deleting: torn down, delete the Pod",
			in:   planInput{Pod: deleting(testPod("", "a"), 7), Rec: exited(newRecord(testPod("", "a"), t0), "a", 143, t0), Now: t0},
			want: planResult{Actions: acts(action{Type: actDeletePod})},
		},
		{
			name: "deleting: delete asked recently",
			in:   planInput{Pod: deleting(testPod("", "a"), 7), Rec: newRecord(testPod("", "a"), t0), Now: t0.Add(time.Second), DeleteSentAt: t0},
			want: planResult{WakeAt: t0.Add(deleteRetry)},
		},
		{
			name: "gone from the API: short grace, then done",
			in:   planInput{Pod: nil, Rec: running(readyRec(testPod("", "a")), "a"), Now: t0},
			want: planResult{Actions: acts(action{Type: actStopContainer, Container: "a", Grace: goneGrace, Reason: "deleting the pod"}), WakeAt: t0.Add(goneGrace)},
		},
		{
			name: "gone and clean: done",
			in:   planInput{Pod: nil, Rec: newRecord(testPod("", "a"), t0), Now: t0},
			want: planResult{Done: true},
		},
		{
			name: "liveness failure stops the container with the probe's grace",
			in: planInput{Pod: testPod("", "a"), Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a")), "a")
				r.container("a").KillReason, r.container("a").KillGrace = "liveness", 3*time.Second
				return r
			}(), Now: t0},
			want: planResult{Actions: acts(action{Type: actStopContainer, Container: "a", Grace: 3 * time.Second, Reason: "liveness"}), WakeAt: t0.Add(3 * time.Second)},
		},
		{
			name: "killed, still there: SIGKILL again after a second",
			in: planInput{Pod: nil, Rec: func() *podRecord {
				r := running(readyRec(testPod("", "a")), "a")
				r.container("a").TermSentAt, r.container("a").KillSentAt = t0, t0
				return r
			}(), Now: t0.Add(500 * time.Millisecond)},
			want: planResult{WakeAt: t0.Add(killRetry)},
		},
		{
			name: "config error retry not due",
			in: planInput{Pod: testPod("", "a"), Rec: func() *podRecord {
				r := readyRec(testPod("", "a"))
				r.container("a").NextStart = t0.Add(2 * time.Second)
				return r
			}(), Now: t0},
			want: planResult{WakeAt: t0.Add(2 * time.Second)},
		},
		{
			name: "host network: no netns needed",
			in: planInput{Pod: func() *v1.Pod { p := testPod("", "a"); p.Spec.HostNetwork = true; return p }(), Rec: func() *podRecord {
				r := newRecord(testPod("", "a"), t0)
				r.HostNetwork, r.IPs = true, []string{"10.250.0.11"}
				return r
			}(), Now: t0},
			want: planResult{Actions: acts(action{Type: actStartContainer, Container: "a"})},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := plan(tc.in)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
}

func TestRecordExitBackoff(t *testing.T) {
	c := &containerRecord{Name: "a"}
	at := t0
	var waits []time.Duration
	for range 8 {
		c.Proc = &procID{PID: 1}
		recordExit(c, exitRecord{Code: 1, StartedAt: at, FinishedAt: at.Add(time.Second)}, at.Add(time.Second))
		waits = append(waits, c.NextStart.Sub(at.Add(time.Second)))
		at = c.NextStart
		if c.Proc != nil || c.LastExit == nil {
			t.Fatal("exit not recorded")
		}
	}
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second}
	if d := cmp.Diff(want, waits); d != "" {
		t.Errorf("back-off (-want +got):\n%s", d)
	}
	// A long run forgives.
	recordExit(c, exitRecord{Code: 1, StartedAt: at, FinishedAt: at.Add(11 * time.Minute)}, at.Add(11*time.Minute))
	if !c.NextStart.Equal(at.Add(11*time.Minute)) || c.Backoff != initialBackoff {
		t.Errorf("after a long run: next start %v backoff %v", c.NextStart.Sub(at), c.Backoff)
	}
}

func initPod(policy v1.RestartPolicy, sidecar bool) *v1.Pod {
	p := testPod(policy, "main")
	always := v1.ContainerRestartPolicyAlways
	if sidecar {
		p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: "side", Command: []string{"sleep", "1000"}, RestartPolicy: &always})
	}
	p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: "init", Command: []string{"true"}})
	return p
}

func TestPlanInitContainers(t *testing.T) {
	start := func(n string) action { return action{Type: actStartContainer, Container: n} }
	for _, tc := range []struct {
		name  string
		pod   *v1.Pod
		setup func(r *podRecord)
		want  planResult
	}{
		{"init first", initPod("", false), func(r *podRecord) {}, planResult{Actions: acts(start("init"))}},
		{"init running: wait", initPod("", false), func(r *podRecord) { running(r, "init") }, planResult{}},
		{"init done: regular containers", initPod("", false), func(r *podRecord) { exited(r, "init", 0, t0) }, planResult{Actions: acts(start("main"))}},
		{"init failed: retried (Always)", initPod(v1.RestartPolicyAlways, false), func(r *podRecord) { exited(r, "init", 1, t0) }, planResult{Actions: acts(start("init"))}},
		{"init failed, Never: the pod failed", initPod(v1.RestartPolicyNever, false), func(r *podRecord) { exited(r, "init", 1, t0) }, planResult{Actions: acts(action{Type: actTeardown})}},
		{"sidecar before the next init", initPod("", true), func(r *podRecord) {}, planResult{Actions: acts(start("side"))}},
		{"sidecar started: next init", initPod("", true), func(r *podRecord) { running(r, "side") }, planResult{Actions: acts(start("init"))}},
		{"sidecar not yet started (startup probe): wait", initPod("", true), func(r *podRecord) {
			running(r, "side")
			r.container("side").Started = false
		}, planResult{}},
		{"sidecar exited after init: restarted alongside", initPod("", true), func(r *podRecord) {
			exited(r, "init", 0, t0)
			exited(r, "side", 0, t0)
			running(r, "main")
		}, planResult{Actions: acts(start("side"))}},
		{"Never pod finished: the sidecar is stopped before teardown", initPod(v1.RestartPolicyNever, true), func(r *podRecord) {
			exited(r, "init", 0, t0)
			running(r, "side")
			exited(r, "main", 0, t0)
		}, planResult{Actions: acts(action{Type: actStopContainer, Container: "side", Grace: defaultGrace, Reason: "the pod has finished"}), WakeAt: t0.Add(defaultGrace)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := readyRec(tc.pod)
			tc.setup(r)
			got := plan(planInput{Pod: tc.pod, Rec: r, Now: t0})
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("plan (-want +got):\n%s", d)
			}
		})
	}
}
