package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

const (
	benchNamespace = "proxybench"
	managedBy      = "proxybench.flatnet.io"
	triggerTime    = "endpoints.kubernetes.io/last-change-trigger-time"
	servicePort    = 80
	endpointPort   = 8080
	portName       = "http"
	// Endpoints: 10.246.0.0/15, inside the cluster CIDR given to the
	// proxies; every one of them is local in a site's endpoint namespace
	// (an AnyIP route), where one server answers for all (site.go).
	endpointsBase  = "10.246.0.0"
	endpointsRange = "10.246.0.0/15"
	// dataPathService is Service 0's name: the data path's target, sorted
	// after every svc-NNNNN (last in any name-ordered rule list).
	dataPathService = "svc-datapath"
)

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// Bulk creation: the admin user is exempt from the apiserver's
	// priority and fairness; the client's own limiter is set out of the way.
	cfg.QPS, cfg.Burst = 2000, 4000
	return kubernetes.NewForConfig(cfg)
}

func serviceName(i int) string {
	if i == 0 {
		return dataPathService
	}
	return fmt.Sprintf("svc-%05d", i)
}

// endpointIP is the j-th address handed out: 10.246.0.1 onwards (131,070
// of them before the range ends; allocate refuses more).
func endpointIP(j int) string {
	b := netip.MustParseAddr(endpointsBase).As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(j) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

type objects struct {
	c         kubernetes.Interface
	ns        string
	endpoints int // per Service
	workers   int

	mu         sync.Mutex
	clusterIPs map[int]string
	slices     map[int]*discovery.EndpointSlice // as last written, for updates without a GET
	nextIP     atomic.Int64                     // next endpoint address index
}

// newEndpoint hands out the next endpoint address.
func (o *objects) newEndpoint() (string, error) {
	j := int(o.nextIP.Add(1)) - 1
	ip := endpointIP(j)
	if !netip.MustParsePrefix(endpointsRange).Contains(netip.MustParseAddr(ip)) {
		return "", fmt.Errorf("endpoint addresses exhausted after %d (range %s): fewer REPS or sizes", j, endpointsRange)
	}
	return ip, nil
}

// clusterIP is Service i's ClusterIP.
func (o *objects) clusterIP(i int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.clusterIPs[i]
}

// endpointsOf are Service i's endpoint addresses as last written.
func (o *objects) endpointsOf(i int) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ips []string
	for _, e := range o.slices[i].Endpoints {
		ips = append(ips, e.Addresses...)
	}
	return ips
}

// wantIPs is the set of ClusterIPs of Services 0..n-1.
func (o *objects) wantIPs(n int) map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]bool, n)
	for i := 0; i < n; i++ {
		m[o.clusterIPs[i]] = true
	}
	return m
}

func (o *objects) ensureNamespace(ctx context.Context) error {
	_, err := o.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureNode creates a Node object with InternalIP ip for a proxy's
// hostnameOverride: kube-proxy waits up to 30 s at start for its Node to
// have an address. Both proxies get one.
func (o *objects) ensureNode(ctx context.Context, name string, ip netip.Addr) error {
	n, err := o.c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	// The lab's controller writes the new Node too (its pod CIDR).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n, err = o.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}, {Type: corev1.NodeHostName, Address: name}}
		_, err = o.c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	return nil
}

func (o *objects) deleteNode(ctx context.Context, name string) {
	_ = o.c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
}

// create makes Services from..to-1 with their EndpointSlices, workers at
// a time, and returns when the last create returned.
func (o *objects) create(ctx context.Context, from, to int) (time.Time, error) {
	idx := make(chan int)
	errc := make(chan error, o.workers)
	var wg sync.WaitGroup
	var last atomic.Int64
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if err := o.createOne(ctx, i); err != nil {
					errc <- err
					return
				}
				now := time.Now().UnixNano()
				for {
					old := last.Load()
					if now <= old || last.CompareAndSwap(old, now) {
						break
					}
				}
			}
		}()
	}
	var err error
feed:
	for i := from; i < to; i++ {
		select {
		case idx <- i:
		case err = <-errc:
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return time.Unix(0, last.Load()), err
}

func (o *objects) createOne(ctx context.Context, i int) error {
	name := serviceName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.ns, Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy}},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: portName, Port: servicePort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(endpointPort)}},
		},
	}
	got, err := o.c.CoreV1().Services(o.ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", name, err)
	}
	eps := make([]discovery.Endpoint, o.endpoints)
	for j := range eps {
		ip, err := o.newEndpoint()
		if err != nil {
			return err
		}
		eps[j] = discovery.Endpoint{
			Addresses:  []string{ip},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		}
	}
	slice := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: o.ns,
			Labels: map[string]string{
				discovery.LabelServiceName: name,
				discovery.LabelManagedBy:   managedBy,
			},
			Annotations: map[string]string{triggerTime: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discovery.EndpointPort{{Name: ptr.To(portName), Port: ptr.To[int32](endpointPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	written, err := o.c.DiscoveryV1().EndpointSlices(o.ns).Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("endpointslice %s: %w", name, err)
	}
	o.mu.Lock()
	o.clusterIPs[i] = got.Spec.ClusterIP
	o.slices[i] = written
	o.mu.Unlock()
	return nil
}

// setEndpoint gives Service i's first endpoint the address newIP,
// stamping the trigger time as an EndpointSlice controller does, from the
// slice as last written (no GET: only this harness writes these slices).
// It returns the old address and the time just before the API call.
func (o *objects) setEndpoint(ctx context.Context, i int, newIP string) (oldIP string, t0 time.Time, err error) {
	o.mu.Lock()
	s := o.slices[i].DeepCopy()
	o.mu.Unlock()
	oldIP = s.Endpoints[0].Addresses[0]
	s.Endpoints[0].Addresses = []string{newIP}
	t0 = time.Now()
	s.Annotations[triggerTime] = t0.UTC().Format(time.RFC3339Nano)
	written, err := o.c.DiscoveryV1().EndpointSlices(o.ns).Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return oldIP, t0, fmt.Errorf("endpointslice %s: %w", s.Name, err)
	}
	o.mu.Lock()
	o.slices[i] = written
	o.mu.Unlock()
	return oldIP, t0, nil
}
