package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	clientPod  = "dnsperf"
	clientIP   = "127.0.0.1"        // dnsperf's source address
	nowhere    = "dnsbench-no-node" // the client Pod's node: none by that name, so nothing runs it
	managedBy  = "dnsbench.flatnet.io"
	appLabel   = "dnsbench.flatnet.io/app"
	clientApp  = "dnsperf-client" // matches no Service's selector
	sliceOwner = "kubernetes.io/service-name"
)

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	// Bulk creation: the admin user is exempt from priority and fairness;
	// the client's own limiter is set out of the way.
	cfg.QPS, cfg.Burst = 2000, 4000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfig(cfg)
}

func objectsCmd(args []string) error {
	fs := flag.NewFlagSet("objects", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "the lab's admin kubeconfig")
	nss := fs.Int("namespaces", 100, "namespaces ns0..")
	svcs := fs.Int("services", 100, "Services per namespace svc0..")
	workers := fs.Int("workers", 32, "concurrent creates")
	timeout := fs.Duration("timeout", 10*time.Minute, "longest wait for the objects and their EndpointSlices")
	_ = fs.Parse(args)
	c, err := newClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	t0 := time.Now()
	for ns := range *nss {
		if err := ignoreExists(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", ns), Labels: map[string]string{managedBy: "true"}},
		}, metav1.CreateOptions{})); err != nil {
			return fmt.Errorf("namespace ns%d: %w", ns, err)
		}
	}
	if err := createServices(ctx, c, *nss, *svcs, *workers); err != nil {
		return err
	}
	fmt.Printf("dnsbench: %d namespaces × %d Services created in %.1fs (%d workers)\n", *nss, *svcs, time.Since(t0).Seconds(), *workers)
	if err := createClientPod(ctx, c); err != nil {
		return err
	}
	t1 := time.Now()
	if err := waitSlices(ctx, c, *nss, *svcs); err != nil {
		return err
	}
	fmt.Printf("dnsbench: an EndpointSlice for each Service %.1fs after the last create\n", time.Since(t1).Seconds())
	return nil
}

func ignoreExists[T any](_ T, err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// createServices creates svcN in nsM for every N, M, workers at a time;
// the first error stops the rest.
func createServices(ctx context.Context, c kubernetes.Interface, nss, svcs, workers int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= nss*svcs || ctx.Err() != nil {
					return
				}
				ns, name := fmt.Sprintf("ns%d", i/svcs), fmt.Sprintf("svc%d", i%svcs)
				err := ignoreExists(c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{managedBy: "true"}},
					Spec: corev1.ServiceSpec{
						Type:     corev1.ServiceTypeClusterIP,
						Selector: map[string]string{appLabel: name},
						Ports: []corev1.ServicePort{{
							Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
						}},
					},
				}, metav1.CreateOptions{}))
				if err != nil {
					cancel(fmt.Errorf("service %s/%s: %w", ns, name, err))
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// createClientPod makes the Pod that says 127.0.0.1 is a client in
// clientNS: bound to a node that does not exist (no runtime starts it, no
// scheduler binds it), its status written through the status subresource
// as a kubelet would.
func createClientPod(ctx context.Context, c kubernetes.Interface) error {
	pods := c.CoreV1().Pods(clientNS)
	p, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: clientPod, Labels: map[string]string{managedBy: "true", appLabel: clientApp}},
		Spec: corev1.PodSpec{
			NodeName:   nowhere,
			Containers: []corev1.Container{{Name: "dnsperf", Image: "dnsperf.invalid/none"}},
		},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = pods.Get(ctx, clientPod, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("client pod: %w", err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = clientIP
	p.Status.PodIPs = []corev1.PodIP{{IP: clientIP}}
	if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("client pod %s/%s status (podIP %s): %w", clientNS, clientPod, clientIP, err)
	}
	return nil
}

// waitSlices polls until every Service has an EndpointSlice (labelled with
// its name), as the servers' informers will see them.
func waitSlices(ctx context.Context, c kubernetes.Interface, nss, svcs int) error {
	have := 0
	for {
		seen := map[string]bool{}
		opts := metav1.ListOptions{LabelSelector: sliceOwner, Limit: 2000}
		for {
			l, err := c.DiscoveryV1().EndpointSlices("").List(ctx, opts)
			if err != nil {
				return fmt.Errorf("listing EndpointSlices (%d of %d Services have one): %w", have, nss*svcs, err)
			}
			for i := range l.Items {
				s := &l.Items[i]
				if strings.HasPrefix(s.Namespace, "ns") && strings.HasPrefix(s.Labels[sliceOwner], "svc") {
					seen[s.Namespace+"/"+s.Labels[sliceOwner]] = true
				}
			}
			if opts.Continue = l.Continue; opts.Continue == "" {
				break
			}
		}
		if have = len(seen); have >= nss*svcs {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for EndpointSlices: %d of %d Services have one (is the lab's controller running?): %w", have, nss*svcs, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}
