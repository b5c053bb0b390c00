package simnodes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/kube"
)

// DefaultParallelism is how many API calls Apply runs at once when asked
// for 0: enough to keep a 2-core apiserver busy (the calls wait on etcd
// more than on CPU).
const DefaultParallelism = 32

// NewClient returns a clientset for kubeconfig with no client-side rate
// limit (QPS < 0) and protobuf on the wire: creating thousands of nodes at
// the default 5 QPS would take minutes, and the lab's admin identity is
// exempt from the apiserver's priority and fairness anyway.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	rc.QPS, rc.Burst = -1, 0
	rc.Timeout = 60 * time.Second
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	return c, nil
}

// List returns lab's simulated nodes as the API has them.
func List(ctx context.Context, c kubernetes.Interface, lab string) (*corev1.NodeList, error) {
	l, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: Selector(lab)})
	if err != nil {
		return nil, fmt.Errorf("listing simulated nodes of lab %s: %w", lab, err)
	}
	return l, nil
}

// Scale makes lab's simulated nodes exactly 1..n (List, Plan, Apply) and
// returns the plan it applied and the list it planned from, which
// WaitReady can follow from instead of listing them all again.
func Scale(ctx context.Context, c kubernetes.Interface, cfg Config, n, parallelism int) (Plan, *corev1.NodeList, error) {
	have, err := List(ctx, c, cfg.Lab)
	if err != nil {
		return Plan{}, nil, err
	}
	p, err := cfg.Plan(have.Items, n)
	if err != nil {
		return Plan{}, nil, err
	}
	return p, have, Apply(ctx, c, p, parallelism)
}

// Create creates simulated nodes from..to (1-based, inclusive) of cfg with
// parallelism calls at once (0: DefaultParallelism); nodes that exist
// already count as created. For a harness that grows a cluster in steps
// without listing it.
func Create(ctx context.Context, c kubernetes.Interface, cfg Config, from, to, parallelism int) error {
	var p Plan
	for i := from; i <= to; i++ {
		n, err := cfg.Node(i)
		if err != nil {
			return err
		}
		p.Create = append(p.Create, n)
	}
	return Apply(ctx, c, p, parallelism)
}

// Apply runs p's calls, parallelism at a time (0: DefaultParallelism).
// A node deleted goes with its pods: they are deleted at once (grace 0),
// since no kubelet is left to confirm they stopped. Errors are collected
// per node; one failing node does not stop the others.
func Apply(ctx context.Context, c kubernetes.Interface, p Plan, parallelism int) error {
	if parallelism <= 0 {
		parallelism = DefaultParallelism
	}
	sortNodes(p.Create)
	sortNodes(p.Update)
	var ops []func(context.Context) error
	for _, n := range p.Create {
		ops = append(ops, func(ctx context.Context) error {
			_, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("creating node %s: %w", n.Name, err)
			}
			return nil
		})
	}
	for _, n := range p.Update {
		ops = append(ops, func(ctx context.Context) error {
			if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("updating node %s: %w", n.Name, err)
			}
			return nil
		})
	}
	for _, name := range p.Delete {
		ops = append(ops, func(ctx context.Context) error { return deleteNode(ctx, c, name) })
	}
	return run(ctx, ops, parallelism)
}

// deleteNode deletes node name's pods (grace 0) and then the node.
func deleteNode(ctx context.Context, c kubernetes.Interface, name string) error {
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String()})
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", name, err)
	}
	var errs []error
	zero := int64(0)
	for _, pod := range pods.Items {
		err := c.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting pod %s/%s of node %s: %w", pod.Namespace, pod.Name, name, err))
		}
	}
	if err := c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting node %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// run runs ops with parallelism workers and joins their errors (at most
// ten are kept, and a count of the rest).
func run(ctx context.Context, ops []func(context.Context) error, parallelism int) error {
	work := make(chan func(context.Context) error)
	var mu sync.Mutex // protects errs, failed
	var errs []error
	failed := 0
	var wg sync.WaitGroup
	for range min(parallelism, len(ops)) {
		wg.Go(func() {
			for op := range work {
				if err := op(ctx); err != nil {
					mu.Lock()
					failed++
					if len(errs) < 10 {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for _, op := range ops {
		if ctx.Err() != nil {
			break
		}
		work <- op
	}
	close(work)
	wg.Wait()
	if failed > len(errs) {
		errs = append(errs, fmt.Errorf("and %d more", failed-len(errs)))
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Timings are how long after a start the simulated nodes reached each
// state.
type Timings struct {
	// PodCIDRs: every wanted node has a podCIDR (flatnet's controller).
	PodCIDRs time.Duration
	// Ready: every wanted node is Ready (kwok).
	Ready time.Duration
}

// WaitReady waits until lab's simulated nodes 1..n all exist, are Ready
// and have a podCIDR, and returns when each of the last two held for all,
// measured from start. It lists the nodes once (or starts from listed,
// Scale's list, when not nil) and then follows a watch from that list
// (listing again when the watch ends), so a wait over thousands of nodes
// costs at most one list and their events: a list of 5,000 Nodes is a
// second of CPU for the apiserver and the lister on a small machine,
// where the agents that lab up has just started are listing them too.
// It ends with ctx, saying how many are missing what.
func WaitReady(ctx context.Context, c kubernetes.Interface, lab string, n int, start time.Time, listed *corev1.NodeList) (Timings, error) {
	var t Timings
	nodes := map[string]nodeState{} // wanted nodes seen, by name
	check := func() bool {
		missing, noCIDR, notReady := count(nodes, n)
		if t.PodCIDRs == 0 && missing == 0 && noCIDR == 0 {
			t.PodCIDRs = time.Since(start)
		}
		if t.Ready == 0 && missing == 0 && notReady == 0 {
			t.Ready = time.Since(start)
		}
		return t.PodCIDRs != 0 && t.Ready != 0
	}
	fail := func(err error) (Timings, error) {
		missing, noCIDR, notReady := count(nodes, n)
		return t, fmt.Errorf("waiting for %d simulated nodes: %d missing, %d without a podCIDR, %d not Ready: %w",
			n, missing, noCIDR, notReady, err)
	}
	opts := metav1.ListOptions{LabelSelector: Selector(lab)}
	// listWatch lists the nodes into nodes and watches from there on
	// (no watch when the list shows them all done).
	listWatch := func() (watch.Interface, error) {
		list := listed
		if list == nil {
			var err error
			if list, err = c.CoreV1().Nodes().List(ctx, opts); err != nil {
				return nil, err
			}
		}
		listed = nil // once: a watch that ends lists afresh
		clear(nodes)
		for i := range list.Items {
			track(nodes, lab, n, &list.Items[i], false)
		}
		if check() {
			return nil, nil
		}
		wopts := opts
		wopts.ResourceVersion = list.ResourceVersion
		return c.CoreV1().Nodes().Watch(ctx, wopts)
	}
	for {
		w, err := listWatch()
		switch {
		case err != nil && ctx.Err() != nil:
			return fail(context.Cause(ctx))
		case err != nil:
			time.Sleep(time.Second) // the apiserver restarts, say
			continue
		case w == nil:
			return t, nil
		}
		done, err := follow(ctx, w, nodes, lab, n, check)
		w.Stop()
		if done {
			return t, nil
		}
		if err != nil {
			return fail(err)
		}
	}
}

// follow applies w's events to nodes until check holds (true), ctx ends
// (its cause), or the watch ends (false, nil: list again).
func follow(ctx context.Context, w watch.Interface, nodes map[string]nodeState, lab string, n int, check func() bool) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			node, isNode := ev.Object.(*corev1.Node)
			if !isNode {
				continue // a bookmark, or an error: the watch ends next
			}
			track(nodes, lab, n, node, ev.Type == watch.Deleted)
			if check() {
				return true, nil
			}
		}
	}
}

// nodeState is what WaitReady needs of a node.
type nodeState struct{ podCIDR, ready bool }

// track records node in nodes when it is one of lab's 1..n (removes it
// when gone).
func track(nodes map[string]nodeState, lab string, n int, node *corev1.Node, gone bool) {
	if i, ok := Index(lab, node.Name); !ok || i > n {
		return
	}
	if gone {
		delete(nodes, node.Name)
		return
	}
	nodes[node.Name] = nodeState{podCIDR: node.Spec.PodCIDR != "", ready: kube.NodeReady(node)}
}

// count tells how many of nodes 1..n are missing, have no podCIDR, are
// not Ready.
func count(nodes map[string]nodeState, n int) (missing, noCIDR, notReady int) {
	for _, s := range nodes {
		if !s.podCIDR {
			noCIDR++
		}
		if !s.ready {
			notReady++
		}
	}
	return n - len(nodes), noCIDR, notReady
}

// Describe says what p does, for people ("create 20, delete 15").
func (p Plan) Describe() string {
	var parts []string
	for _, x := range []struct {
		verb string
		n    int
	}{{"create", len(p.Create)}, {"update", len(p.Update)}, {"delete", len(p.Delete)}} {
		if x.n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", x.verb, x.n))
		}
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, ", ")
}
