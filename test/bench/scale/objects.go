package main

// The objects, spread the way ClusterLoader2's load test spreads them:
// one namespace per 100 nodes, every Service selecting its own pods
// (label scale.flatnet.io/svc), pods bound to simulated nodes round-robin
// (spec.nodeName: the lab runs no scheduler for them; kwok plays their
// kubelet and gives them IPs from their node's podCIDR).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

const (
	nsPrefix = "scale-"
	svcLabel = "scale.flatnet.io/svc"
	image    = "registry.k8s.io/pause:3.10.2"
)

// layout is how many of what, and where.
type layout struct {
	Namespaces, Services, Pods int
	nodes                      []string // simulated nodes, pods go round-robin
}

func (l layout) ns(i int) string                { return fmt.Sprintf("%s%03d", nsPrefix, i) }
func (l layout) svcPerNs() int                  { return max(1, l.Services/l.Namespaces) }
func (l layout) svcName(i int) string           { return fmt.Sprintf("svc-%05d", i) }
func (l layout) podName(p string, i int) string { return fmt.Sprintf("%s-%06d", p, i) }

func (l layout) namespace(i int) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: l.ns(i)}}
}

func (l layout) service(ns, i int) *corev1.Service {
	name := l.svcName(i)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.ns(ns)},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{svcLabel: name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// pod is pod number i (of a series named prefix) in namespace ns: it
// belongs to Service i mod svcPerNs of its namespace and runs on node
// (seq mod nodes), seq counting pods over the whole run so that every
// series spreads evenly.
func (l layout) pod(prefix string, ns, i, seq int) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: l.podName(prefix, i), Namespace: l.ns(ns),
			Labels: map[string]string{svcLabel: l.svcName(i % l.svcPerNs())},
		},
		Spec: corev1.PodSpec{
			NodeName:                      l.nodes[seq%len(l.nodes)],
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "app", Image: image,
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
}

// podRef names one pod the harness made.
type podRef struct{ ns, name string }

// parallel runs fn(0..n-1) on workers goroutines; a failed call is
// retried (the apiserver sheds load with 429s and timeouts when it is
// busy) up to 5 times; the first error that survives stops the rest.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				var err error
				for try := range 5 {
					if err = fn(ctx, i); err == nil || !retriable(err) {
						break
					}
					time.Sleep(time.Duration(100<<try) * time.Millisecond)
				}
				if err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func retriable(err error) bool {
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || errors.Is(err, context.DeadlineExceeded)
}

// createPods creates pods (existing ones count as created: a rerun of a
// phase after a failure goes on).
func createPods(ctx context.Context, c kubernetes.Interface, pods []*corev1.Pod, workers int) error {
	return parallel(ctx, len(pods), workers, func(ctx context.Context, i int) error {
		_, err := c.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

func deletePods(ctx context.Context, c kubernetes.Interface, refs []podRef, workers int) error {
	return parallel(ctx, len(refs), workers, func(ctx context.Context, i int) error {
		err := c.CoreV1().Pods(refs[i].ns).Delete(ctx, refs[i].name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}
