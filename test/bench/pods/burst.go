package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/test/bench/promhist"
)

// namespace is where the bursts run; label marks their pods.
const (
	namespace = "bench-pods"
	label     = "flatnet.dev/bench"
)

type bench struct {
	c      config
	client kubernetes.Interface
	node   lab.Node
}

// result is one burst of one set.
type result struct {
	Set  string `json:"set"`
	Run  int    `json:"run"`
	Pods int    `json:"pods"`
	// ReadySeconds: the first create -> every pod Ready; StartP50/P90: per
	// pod, the first create -> that pod Ready.
	ReadySeconds float64 `json:"readySeconds"`
	StartP50     float64 `json:"startP50Seconds"`
	StartP90     float64 `json:"startP90Seconds"`
	// GoneSeconds: the first delete -> every pod gone from the API;
	// StopP50/P90 per pod likewise.
	GoneSeconds float64 `json:"goneSeconds"`
	StopP50     float64 `json:"stopP50Seconds"`
	StopP90     float64 `json:"stopP90Seconds"`
	Add         opStats `json:"cniAdd"`
	Del         opStats `json:"cniDel"`
}

// opStats are one verb's CNI timings over a burst, from the runtime's
// histogram.
type opStats struct {
	Count int     `json:"count"`
	Sum   float64 `json:"sumSeconds"`
	// P50, P90: per operation, read from the buckets.
	P50 float64 `json:"p50Seconds"`
	P90 float64 `json:"p90Seconds"`
	// ShareOfWall: Sum over the burst's wall time; ShareOfPod: P50 over
	// the median pod's own start (stop).
	ShareOfWall float64 `json:"shareOfWall"`
	ShareOfPod  float64 `json:"shareOfPod"`
}

// namespace makes the bursts' namespace and waits for its default
// ServiceAccount (pods are refused until the controller made it).
func (b *bench) namespace(ctx context.Context) error {
	_, err := b.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	deadline := time.Now().Add(b.c.Timeout)
	for {
		_, err := b.client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("namespace %s has no default ServiceAccount: %w", namespace, errors.Join(err, ctx.Err()))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pod is burst pod i: one container that sleeps and dies on SIGTERM,
// no probes, so Ready is running.
func pod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%03d", i), Labels: map[string]string{label: "pods"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "sleep", Image: "flatnet:dev", Command: []string{"sleep", "infinity"}}},
		},
	}
}

// burst creates c.Pods pods at once, waits for all Ready, deletes them
// at once and waits for all gone, reading the CNI timings in between.
func (b *bench) burst(ctx context.Context, s set, run int) (result, error) {
	res := result{Set: s.Name, Run: run, Pods: b.c.Pods}
	pods := b.client.CoreV1().Pods(namespace)
	sel := metav1.ListOptions{LabelSelector: label}
	l, err := pods.List(ctx, sel)
	if err != nil {
		return res, fmt.Errorf("listing pods: %w", err)
	}
	if len(l.Items) > 0 {
		return res, fmt.Errorf("%d pods left from before in %s", len(l.Items), namespace)
	}
	before, err := b.cniHist()
	if err != nil {
		return res, err
	}
	// From the list's version on, resumed where it stopped if the
	// apiserver ends it (it did, during 100 creates at once), and read
	// from the start, also while the creates go out.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, l.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = label
			return pods.Watch(ctx, o)
		},
	})
	if err != nil {
		return res, fmt.Errorf("watching pods: %w", err)
	}
	defer w.Stop()
	obs := observe(w)

	t0 := time.Now()
	if err := all(b.c.Pods, func(i int) error {
		_, err := pods.Create(ctx, pod(i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return res, fmt.Errorf("creating pods: %w", err)
	}
	readyAt, err := obs.wait(ctx, b.c.Pods, b.c.Timeout, "Ready", func(o *observed) map[string]time.Time { return o.ready })
	if err != nil {
		return res, err
	}
	mid, err := b.cniHist()
	if err != nil {
		return res, err
	}

	t1 := time.Now()
	if err := all(b.c.Pods, func(i int) error {
		return pods.Delete(ctx, pod(i).Name, metav1.DeleteOptions{})
	}); err != nil {
		return res, fmt.Errorf("deleting pods: %w", err)
	}
	goneAt, err := obs.wait(ctx, b.c.Pods, b.c.Timeout, "gone", func(o *observed) map[string]time.Time { return o.gone })
	if err != nil {
		return res, err
	}
	after, err := b.cniHist()
	if err != nil {
		return res, err
	}

	start, stop := since(readyAt, t0), since(goneAt, t1)
	res.ReadySeconds, res.StartP50, res.StartP90 = start[len(start)-1], quantile(start, 0.5), quantile(start, 0.9)
	res.GoneSeconds, res.StopP50, res.StopP90 = stop[len(stop)-1], quantile(stop, 0.5), quantile(stop, 0.9)
	res.Add = stats(mid.Add.Minus(before.Add), res.ReadySeconds, res.StartP50)
	res.Del = stats(after.Del.Minus(mid.Del), res.GoneSeconds, res.StopP50)
	// Every pod is one ADD and one DEL; anything else (a retried
	// failure, an operation of another pod) would skew the figures.
	var errs []error
	if n := mid.AddErr - before.AddErr + after.AddErr - mid.AddErr; n > 0 {
		errs = append(errs, fmt.Errorf("the runtime counted %v failed CNI ADDs", n))
	}
	if n := after.DelErr - mid.DelErr; n > 0 {
		errs = append(errs, fmt.Errorf("the runtime counted %v failed CNI DELs", n))
	}
	if res.Add.Count != b.c.Pods || res.Del.Count != b.c.Pods || after.Add.Count != mid.Add.Count || mid.Del.Count != before.Del.Count {
		errs = append(errs, fmt.Errorf("CNI operations: %d ADDs and %d DELs for %d pods (ADDs while deleting %v, DELs while starting %v)",
			res.Add.Count, res.Del.Count, b.c.Pods, after.Add.Count-mid.Add.Count, mid.Del.Count-before.Del.Count))
	}
	return res, errors.Join(errs...)
}

// all runs fn(0..n-1) at once and joins the errors.
func all(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = fn(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// observed is what a pod watch saw: when each pod was first Ready, and
// when it was deleted.
type observed struct {
	mu          sync.Mutex // protects the rest
	ready, gone map[string]time.Time
	err         error         // why the watch ended
	changed     chan struct{} // closed and replaced on every change
}

// observe reads w in a goroutine until it ends.
func observe(w watch.Interface) *observed {
	o := &observed{ready: map[string]time.Time{}, gone: map[string]time.Time{}, changed: make(chan struct{})}
	go func() {
		for ev := range w.ResultChan() {
			now := time.Now()
			if ev.Type == watch.Error {
				o.note(func() { o.err = fmt.Errorf("the pod watch: %w", apierrors.FromObject(ev.Object)) })
				return
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			o.note(func() {
				if _, seen := o.ready[p.Name]; !seen && ev.Type != watch.Deleted && podReady(p) {
					o.ready[p.Name] = now
				}
				if ev.Type == watch.Deleted {
					o.gone[p.Name] = now
				}
			})
		}
		o.note(func() { o.err = errors.New("the pod watch ended") })
	}()
	return o
}

func (o *observed) note(fn func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fn()
	close(o.changed)
	o.changed = make(chan struct{})
}

// wait returns a copy of which(o) once it holds n pods.
func (o *observed) wait(ctx context.Context, n int, timeout time.Duration, what string, which func(*observed) map[string]time.Time) (map[string]time.Time, error) {
	deadline := time.After(timeout)
	for {
		o.mu.Lock()
		got, err, changed := maps.Clone(which(o)), o.err, o.changed
		o.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		if err != nil {
			return got, fmt.Errorf("%w with %d of %d pods %s", err, len(got), n, what)
		}
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-deadline:
			return got, fmt.Errorf("%d of %d pods %s after %s", len(got), n, what, timeout)
		case <-changed:
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// since is each time's distance from t0 in seconds, sorted.
func since(at map[string]time.Time, t0 time.Time) []float64 {
	out := make([]float64, 0, len(at))
	for _, t := range at {
		out = append(out, t.Sub(t0).Seconds())
	}
	sort.Float64s(out)
	return out
}

// quantile of sorted xs, nearest rank.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// stats are a burst's CNI timings of one verb: h over its wall time and
// its median pod's own time.
func stats(h promhist.Hist, wall, podP50 float64) opStats {
	o := opStats{Count: int(h.Count), Sum: h.Sum, P50: h.Quantile(0.5), P90: h.Quantile(0.9)}
	if wall > 0 {
		o.ShareOfWall = h.Sum / wall
	}
	if podP50 > 0 {
		o.ShareOfPod = o.P50 / podP50
	}
	return o
}
