// Package nodeipam gives every Node a pod subnet (spec.podCIDR) carved
// from the cluster CIDR, as kube-controller-manager's
// --allocate-node-cidrs does, for clusters (like the lab) that run without
// it.
//
// Design. The API server is the only store: a Node's spec.podCIDR is its
// allocation. At start the controller waits for the Node cache, records
// every podCIDR it finds (Nodes that kube-controller-manager or an earlier
// run allocated are only recorded, never changed), and only then starts
// allocating; so a restart hands out nothing twice and moves nothing. A
// Node without a podCIDR gets the next free subnet (round-robin, see
// allocator.go) through one merge patch of spec.podCIDR and spec.podCIDRs;
// a deleted Node's subnet goes back to the pool. byNode remembers what
// each Node holds or was just given, so a sync that runs before the cache
// has seen our own patch reuses the same subnet instead of taking another.
// When the pool is empty the Node gets a CIDRNotAvailable event and waits;
// it is retried as soon as a subnet is freed. A successful allocation is
// logged, not an event: as with kube-controller-manager, one write per
// Node is the whole cost, which matters when thousands join at once
// (docs/benchmarks.md, "Node IPAM").
package nodeipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/kube"
)

// ReasonCIDRNotAvailable is the event reason for a Node that finds the
// pool empty.
const ReasonCIDRNotAvailable = "CIDRNotAvailable"

// Config configures the controller.
type Config struct {
	// ClusterCIDR is carved into node subnets.
	ClusterCIDR netip.Prefix
	// NodeMaskSize is the prefix length of each node subnet (e.g. 24).
	NodeMaskSize int
}

// Controller allocates node pod subnets.
type Controller struct {
	client   kubernetes.Interface
	nodes    corelisters.NodeLister
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	mu      sync.Mutex // protects alloc, byNode, waiting
	alloc   *Allocator
	byNode  map[string]netip.Prefix // what each known Node holds or was given
	waiting map[string]bool         // Nodes that found the pool empty
}

// New returns a controller over the Node informer. recorder receives
// events about Nodes (may be a record.FakeRecorder in tests).
func New(client kubernetes.Interface, nodes coreinformers.NodeInformer, cfg Config, recorder record.EventRecorder) (*Controller, error) {
	alloc, err := NewAllocator(cfg.ClusterCIDR, cfg.NodeMaskSize)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		client:   client,
		nodes:    nodes.Lister(),
		recorder: recorder,
		alloc:    alloc,
		byNode:   map[string]netip.Prefix{},
		waiting:  map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodeipam"}),
	}
	reg, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, cur any) {
			o, n := old.(*corev1.Node), cur.(*corev1.Node)
			if o.Spec.PodCIDR != n.Spec.PodCIDR || !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) || n.Spec.PodCIDR == "" {
				c.enqueue(cur)
			}
		},
		DeleteFunc: c.enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("watching nodes: %w", err)
	}
	c.synced = reg.HasSynced
	return c, nil
}

func (c *Controller) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(key)
}

// Run records the subnets existing Nodes hold, then allocates with
// workers goroutines until ctx ends. The informer must be started.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("nodeipam")
	ctx = klog.NewContext(ctx, logger)
	if ok, err := kube.WaitForCaches(ctx, "nodeipam", c.synced); !ok {
		return err
	}
	if err := c.rebuild(ctx); err != nil {
		return err
	}
	logger.Info("Started", "clusterCIDR", c.alloc.Cluster(), "nodeMaskSize", c.alloc.maskSize,
		"subnets", c.alloc.Size(), "inUse", c.alloc.Used())
	kube.RunWorkers(ctx, c.queue, workers, c.sync, func(ctx context.Context, key string, err error) {
		klog.FromContext(ctx).Error(err, "Allocating a pod CIDR failed; will retry", "node", key)
	})
	return nil
}

// rebuild records every podCIDR the cached Nodes hold, before any
// allocation.
func (c *Controller) rebuild(ctx context.Context) error {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range nodes {
		c.recordLocked(ctx, n)
	}
	return nil
}

// sync brings one Node in line: record what it has, give it a subnet when
// it has none, free its subnet when it is gone.
func (c *Controller) sync(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx)
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		c.release(ctx, name)
		return nil
	}
	if err != nil {
		return err
	}
	if node.Spec.PodCIDR != "" || len(node.Spec.PodCIDRs) > 0 {
		c.mu.Lock()
		c.recordLocked(ctx, node)
		c.mu.Unlock()
		return nil
	}

	c.mu.Lock()
	p, ok := c.byNode[name]
	if !ok {
		p, err = c.alloc.Allocate()
		if err != nil {
			c.waiting[name] = true
			c.mu.Unlock()
			msg := fmt.Sprintf("No pod CIDR for node %s: %v. Free one by deleting a Node, or restart the controller with a larger --cluster-cidr or a longer --node-cidr-mask-size", name, err)
			c.recorder.Event(node, corev1.EventTypeWarning, ReasonCIDRNotAvailable, msg)
			return errors.New(msg)
		}
		c.byNode[name] = p
		delete(c.waiting, name)
	}
	c.mu.Unlock()

	if err := patchPodCIDR(ctx, c.client, name, p); err != nil {
		if apierrors.IsNotFound(err) {
			c.release(ctx, name)
			return nil
		}
		// Keep the reservation: the retry patches the same subnet.
		return fmt.Errorf("setting spec.podCIDR=%s on node %s: %w", p, name, err)
	}
	logger.Info("Assigned pod CIDR", "node", name, "podCIDR", p)
	return nil
}

// recordLocked notes the subnet node holds. c.mu must be held.
func (c *Controller) recordLocked(ctx context.Context, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	p, ok := nodeSubnet(node, c.alloc.Cluster())
	if !ok {
		if node.Spec.PodCIDR != "" {
			logger.Info("Node's pod CIDR is outside the cluster CIDR or unreadable; leaving it alone",
				"node", node.Name, "podCIDRs", podCIDRs(node), "clusterCIDR", c.alloc.Cluster())
		}
		return
	}
	if old, had := c.byNode[node.Name]; had {
		if old == p {
			return
		}
		// The Node holds another subnet than the one we reserved (someone
		// else set it first): theirs wins, ours goes back.
		_ = c.alloc.Release(old)
	}
	for other, q := range c.byNode {
		if other != node.Name && q.Overlaps(p) {
			logger.Info("Two nodes hold overlapping pod CIDRs; pods on them will clash",
				"node", node.Name, "podCIDR", p, "otherNode", other, "otherPodCIDR", q)
		}
	}
	if _, err := c.alloc.Occupy(p); err != nil {
		logger.Info("Cannot record node's pod CIDR", "node", node.Name, "podCIDR", p, "err", err)
	}
	c.byNode[node.Name] = p
	delete(c.waiting, node.Name)
}

// release frees the subnet of a deleted Node and wakes Nodes waiting for
// one.
func (c *Controller) release(ctx context.Context, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.byNode[name]
	delete(c.byNode, name)
	delete(c.waiting, name)
	if !ok {
		return
	}
	// Another Node may share the subnet (a misconfigured cluster): keep it
	// taken then.
	for _, q := range c.byNode {
		if q.Overlaps(p) {
			return
		}
	}
	if err := c.alloc.Release(p); err == nil {
		klog.FromContext(ctx).Info("Released pod CIDR of deleted node", "node", name, "podCIDR", p)
		for w := range c.waiting {
			c.queue.Add(w)
		}
	}
}

// nodeSubnet picks the subnet a Node holds in cluster's family: from
// spec.podCIDRs (dual-stack), else spec.podCIDR.
func nodeSubnet(node *corev1.Node, cluster netip.Prefix) (netip.Prefix, bool) {
	for _, s := range podCIDRs(node) {
		p, err := netip.ParsePrefix(s)
		if err == nil && p.Addr().BitLen() == cluster.Addr().BitLen() && cluster.Overlaps(p) {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}

func podCIDRs(node *corev1.Node) []string {
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs
	}
	if node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}
	}
	return nil
}

// patchPodCIDR sets spec.podCIDR and spec.podCIDRs with one merge patch
// (the cached Node is never modified).
func patchPodCIDR(ctx context.Context, client kubernetes.Interface, name string, p netip.Prefix) error {
	patch, err := json.Marshal(map[string]any{
		"spec": map[string]any{"podCIDR": p.String(), "podCIDRs": []string{p.String()}},
	})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
