// Package binder is the lab's stand-in for kube-scheduler: it binds every
// Pod without spec.nodeName to a Ready node, round-robin, through the
// pods/binding subresource (as the scheduler does). It honours what a user
// would trip over if it did not: spec.nodeSelector, NoSchedule/NoExecute
// taints (against the pod's tolerations), and spec.unschedulable. It knows
// nothing of resources or affinity; a real cluster runs kube-scheduler and
// leaves --bind-pods off.
package binder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/kube"
)

// ReasonScheduled is the reason of the event on a bound Pod (the
// scheduler's).
const ReasonScheduled = "Scheduled"

// errNoNode is returned when no node fits a pod; the pod is retried when
// nodes change.
var errNoNode = errors.New("no Ready node fits the pod")

// UnboundPods returns the factory's informer for Pods without a node: the
// field selector keeps every bound pod of the cluster out of the cache.
func UnboundPods(factory informers.SharedInformerFactory) cache.SharedIndexInformer {
	return factory.InformerFor(&corev1.Pod{}, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(client, metav1.NamespaceAll, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
			})
	})
}

// Binder binds pods to nodes.
type Binder struct {
	client   kubernetes.Interface
	pods     corelisters.PodLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	mu   sync.Mutex // protects next
	next int        // round-robin position
}

// New returns a binder over the unbound-pod informer (UnboundPods) and the
// Node informer.
func New(client kubernetes.Interface, pods cache.SharedIndexInformer, nodes coreinformers.NodeInformer, recorder record.EventRecorder) (*Binder, error) {
	b := &Binder{
		client:   client,
		pods:     corelisters.NewPodLister(pods.GetIndexer()),
		nodes:    nodes.Lister(),
		recorder: recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "binder"}),
	}
	pr, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    b.enqueuePod,
		UpdateFunc: func(_, cur any) { b.enqueuePod(cur) },
	})
	if err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	// A node that turns Ready (or changes labels/taints) may fit pods
	// that are waiting.
	nr, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { b.enqueueAll() },
		UpdateFunc: func(old, cur any) { b.nodeChanged(old.(*corev1.Node), cur.(*corev1.Node)) },
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes: %w", err)
	}
	b.synced = []cache.InformerSynced{pr.HasSynced, nr.HasSynced}
	return b, nil
}

func (b *Binder) enqueuePod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || !needsBinding(p) {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(p)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	b.queue.Add(key)
}

func (b *Binder) nodeChanged(old, cur *corev1.Node) {
	if kube.NodeReady(old) != kube.NodeReady(cur) || old.Spec.Unschedulable != cur.Spec.Unschedulable ||
		!labels.Equals(old.Labels, cur.Labels) || !slices.EqualFunc(old.Spec.Taints, cur.Spec.Taints, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
		b.enqueueAll()
	}
}

func (b *Binder) enqueueAll() {
	pods, err := b.pods.List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	for _, p := range pods {
		b.enqueuePod(p)
	}
}

// Run binds pods with workers goroutines until ctx ends. The informers
// must be started.
func (b *Binder) Run(ctx context.Context, workers int) error {
	defer b.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("binder")
	ctx = klog.NewContext(ctx, logger)
	if ok, err := kube.WaitForCaches(ctx, "binder", b.synced...); !ok {
		return err
	}
	logger.Info("Started")
	kube.RunWorkers(ctx, b.queue, workers, b.sync, func(ctx context.Context, key string, err error) {
		if errors.Is(err, errNoNode) {
			klog.FromContext(ctx).V(2).Info("Pod waits for a node", "pod", key, "reason", err)
		} else {
			klog.FromContext(ctx).Error(err, "Binding failed; will retry", "pod", key)
		}
	})
	return nil
}

// sync binds one pod, if it still needs it.
func (b *Binder) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not ours to retry
	}
	pod, err := b.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !needsBinding(pod) {
		return nil
	}
	nodes, err := b.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	target := b.pick(pod, nodes)
	if target == "" {
		return fmt.Errorf("%w (%d nodes; checked Ready, spec.unschedulable, nodeSelector, taints)", errNoNode, len(nodes))
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: target},
	}
	err = b.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile
	case apierrors.IsConflict(err):
		return nil // bound meanwhile (pods/binding refuses a second binding)
	case err != nil:
		return fmt.Errorf("binding pod %s to node %s: %w", key, target, err)
	}
	klog.FromContext(ctx).Info("Bound pod", "pod", key, "node", target)
	b.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonScheduled, "Successfully assigned %s to %s", key, target)
	return nil
}

// pick returns the next fitting node round-robin (nodes in name order), or
// "".
func (b *Binder) pick(pod *corev1.Pod, nodes []*corev1.Node) string {
	var fit []string
	for _, n := range nodes {
		if Fits(pod, n) {
			fit = append(fit, n.Name)
		}
	}
	if len(fit) == 0 {
		return ""
	}
	slices.Sort(fit)
	b.mu.Lock()
	defer b.mu.Unlock()
	name := fit[b.next%len(fit)]
	b.next++
	return name
}

// needsBinding reports whether pod waits for a node.
func needsBinding(p *corev1.Pod) bool {
	return p.Spec.NodeName == "" && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// Fits reports whether pod may run on node: Ready, schedulable, matching
// the pod's nodeSelector, and no NoSchedule/NoExecute taint the pod does
// not tolerate.
func Fits(pod *corev1.Pod, node *corev1.Node) bool {
	if !kube.NodeReady(node) || node.Spec.Unschedulable || node.DeletionTimestamp != nil {
		return false
	}
	if !labels.SelectorFromSet(pod.Spec.NodeSelector).Matches(labels.Set(node.Labels)) {
		return false
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), t, false) }) {
			return false
		}
	}
	return true
}
