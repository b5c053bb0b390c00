package process

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// The Node object: registered at start (or updated if it exists: its spec,
// and so the podCIDR the controller gave it, is left alone), then a status
// heartbeat every d.heartbeat, and at once when network readiness changes.
// Ready needs a CNI network config, as the kubelet's NetworkReady does: the
// agent writes it after the controller has given the node its pod CIDR.
//
// The apiserver's TaintNodesByCondition admission gives every new Node the
// node.kubernetes.io/not-ready:NoSchedule taint, and in a cluster the node
// lifecycle controller (kube-controller-manager) lifts it once the node is
// Ready. The lab runs no such controller, so the runtime keeps that one
// taint in step with its Ready condition.

const maxPods = 110

func (c *core) nodeLoop(ctx context.Context) {
	log := c.log
	backoff := 500 * time.Millisecond
	for {
		err := c.registerNode(ctx)
		if err == nil {
			break
		}
		log.Error(err, "Registering the node failed; retrying", "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	netErr := c.d.net.ready()
	lastBeat := c.d.now()
	if err := c.updateNodeStatus(ctx, netErr); err != nil {
		log.Error(err, "Updating node status failed")
	}
	tick := time.NewTicker(c.d.netPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		e := c.d.net.ready()
		changed := (e == nil) != (netErr == nil)
		netErr = e
		if !changed && c.d.now().Sub(lastBeat) < c.d.heartbeat {
			continue
		}
		if changed {
			log.Info("Network readiness changed", "ready", e == nil, "reason", errString(e))
		}
		if err := c.updateNodeStatus(ctx, netErr); err != nil {
			log.Error(err, "Updating node status failed")
			continue
		}
		lastBeat = c.d.now()
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (c *core) nodeLabels() map[string]string {
	return map[string]string{
		"kubernetes.io/hostname":  c.cfg.NodeName,
		"kubernetes.io/os":        runtime.GOOS,
		"kubernetes.io/arch":      runtime.GOARCH,
		"beta.kubernetes.io/os":   runtime.GOOS,
		"beta.kubernetes.io/arch": runtime.GOARCH,
	}
}

func (c *core) registerNode(ctx context.Context) error {
	nodes := c.cfg.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.cfg.NodeName, Labels: c.nodeLabels()}}
		c.fillNodeStatus(n, c.d.net.ready())
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating node %s: %w", c.cfg.NodeName, err)
		}
		c.log.Info("Registered node")
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", c.cfg.NodeName, err)
	}
	missing := false
	for k, v := range c.nodeLabels() {
		if node.Labels[k] != v {
			missing = true
		}
	}
	if missing {
		n := node.DeepCopy()
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		for k, v := range c.nodeLabels() {
			n.Labels[k] = v
		}
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating node %s labels: %w", c.cfg.NodeName, err)
		}
	}
	c.log.Info("Node already registered; taking it over")
	return nil
}

func (c *core) updateNodeStatus(ctx context.Context, netErr error) error {
	nodes := c.cfg.Client.CoreV1().Nodes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Deleted under us: register again.
			return c.registerNode(ctx)
		}
		if err != nil {
			return err
		}
		n := node.DeepCopy()
		c.fillNodeStatus(n, netErr)
		if _, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		return c.syncNotReadyTaint(ctx, netErr == nil)
	})
}

// syncNotReadyTaint adds or removes the not-ready NoSchedule taint.
func (c *core) syncNotReadyTaint(ctx context.Context, ready bool) error {
	nodes := c.cfg.Client.CoreV1().Nodes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := withNotReadyTaint(node.Spec.Taints, !ready)
		if len(want) == len(node.Spec.Taints) {
			return nil
		}
		n := node.DeepCopy()
		n.Spec.Taints = want
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// withNotReadyTaint returns taints with the not-ready NoSchedule taint
// present or absent.
func withNotReadyTaint(taints []v1.Taint, present bool) []v1.Taint {
	var out []v1.Taint
	has := false
	for _, t := range taints {
		if t.Key == v1.TaintNodeNotReady && t.Effect == v1.TaintEffectNoSchedule {
			has = true
			if !present {
				continue
			}
		}
		out = append(out, t)
	}
	if present && !has {
		out = append(out, v1.Taint{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoSchedule})
	}
	return out
}

// fillNodeStatus sets addresses, capacity, node info and conditions.
func (c *core) fillNodeStatus(n *v1.Node, netErr error) {
	now := metav1.NewTime(c.d.now().Truncate(time.Second))
	n.Status.Addresses = []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: c.cfg.NodeIP},
		{Type: v1.NodeHostName, Address: c.cfg.NodeName},
	}
	capacity := v1.ResourceList{
		v1.ResourcePods:   *resource.NewQuantity(maxPods, resource.DecimalSI),
		v1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.NodeInfo = v1.NodeSystemInfo{
		KubeletVersion:          "v1.37.2-flatnet-lab",
		ContainerRuntimeVersion: "flatnet://" + plugin.Version,
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
		KernelVersion:           kernelVersion(),
		OSImage:                 "flatnet lab node",
	}
	ready := v1.NodeCondition{
		Type: v1.NodeReady, Status: v1.ConditionTrue,
		Reason: "KubeletReady", Message: "flatnet lab runtime is posting ready status",
	}
	if netErr != nil {
		ready.Status, ready.Reason = v1.ConditionFalse, "KubeletNotReady"
		ready.Message = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:" + netErr.Error()
	}
	want := []v1.NodeCondition{
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: v1.NodeDiskPressure, Status: v1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: v1.NodePIDPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		ready,
	}
	var conds []v1.NodeCondition
	for _, w := range want {
		w.LastHeartbeatTime = now
		w.LastTransitionTime = now
		for _, o := range n.Status.Conditions {
			if o.Type == w.Type && o.Status == w.Status {
				w.LastTransitionTime = o.LastTransitionTime
			}
		}
		conds = append(conds, w)
	}
	for _, o := range n.Status.Conditions {
		known := false
		for _, w := range want {
			known = known || w.Type == o.Type
		}
		if !known {
			conds = append(conds, o)
		}
	}
	n.Status.Conditions = conds
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func kernelVersion() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
