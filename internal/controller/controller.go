// Package controller is `flatnet controller`, the cluster-wide half of
// flatnet: node IPAM (nodeipam) and, for the lab, which has no
// kube-scheduler, a pod binder (binder), with --endpointslices, the
// EndpointSlice controller (internal/endpointslice), and with a
// load-balancer IP pool, LoadBalancer address allocation (lbipam). All run
// over one informer factory, after one cache sync, until the context ends,
// with /healthz, /metrics and optionally /debug/pprof/ served (metrics.go).
package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/controller/binder"
	"github.com/flatnet/flatnet/internal/controller/lbipam"
	"github.com/flatnet/flatnet/internal/controller/nodeipam"
	"github.com/flatnet/flatnet/internal/endpointslice"
	"github.com/flatnet/flatnet/internal/httpserver"
	"github.com/flatnet/flatnet/internal/kube"
)

// Options are the command's flags.
type Options struct {
	Kubeconfig        string
	ClusterCIDR       string
	NodeCIDRMaskSize  int
	AllocateNodeCIDRs bool
	BindPods          bool
	Workers           int
	// NodeIPAMWorkers is how many Nodes get their podCIDR patched at once.
	NodeIPAMWorkers int
	// EndpointSliceWorkers is how many Services the EndpointSlice
	// controller syncs at once.
	EndpointSliceWorkers int
	// KubeAPIQPS and KubeAPIBurst limit the controller's API client, as
	// kube-controller-manager's flags of the same names do.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// EndpointSlices runs flatnet's EndpointSlice controller (off where
	// kube-controller-manager runs its own).
	EndpointSlices       bool
	MaxEndpointsPerSlice int
	// LoadBalancerIPPool and LoadBalancerIPPoolConfigMap ("ns/name") give
	// LoadBalancer Services addresses (lbipam); either turns it on.
	LoadBalancerIPPool          string
	LoadBalancerIPPoolConfigMap string
	// MetricsBindAddress (host:port) serves /metrics and /healthz, and
	// with Profiling /debug/pprof/; empty: no server.
	MetricsBindAddress string
	Profiling          bool
}

// lbIPAM reports whether o turns load-balancer IP allocation on.
func (o Options) lbIPAM() bool {
	return o.LoadBalancerIPPool != "" || o.LoadBalancerIPPoolConfigMap != ""
}

// lbConfig reads the load-balancer pool flags.
func (o Options) lbConfig() (lbipam.Config, error) {
	pool, err := lbipam.ParsePool(o.LoadBalancerIPPool)
	if err != nil {
		return lbipam.Config{}, fmt.Errorf("--load-balancer-ip-pool: %w", err)
	}
	if o.LoadBalancerIPPoolConfigMap != "" {
		if _, _, err := lbipam.ParseConfigMapName(o.LoadBalancerIPPoolConfigMap); err != nil {
			return lbipam.Config{}, fmt.Errorf("--load-balancer-ip-pool-configmap: %w", err)
		}
	}
	return lbipam.Config{Pool: pool, ConfigMap: o.LoadBalancerIPPoolConfigMap}, nil
}

// Defaults of the rate flags, measured by TestRootNodeIPAMRate (see
// docs/benchmarks.md): node IPAM costs one PATCH per Node (no success
// event, no GET), so the client's QPS is its rate until the API server's
// CPU is, and enough workers keep that many PATCHes in flight.
const (
	DefaultKubeAPIQPS      = 300
	DefaultKubeAPIBurst    = 600
	DefaultNodeIPAMWorkers = 16
	// DefaultEndpointSliceWorkers: see docs/scale.md "Where the programming
	// latency goes".
	DefaultEndpointSliceWorkers = 16
)

// DefaultOptions are the flags' defaults.
func DefaultOptions() Options {
	return Options{
		ClusterCIDR:          "10.244.0.0/16",
		NodeCIDRMaskSize:     24,
		AllocateNodeCIDRs:    true,
		Workers:              2,
		NodeIPAMWorkers:      DefaultNodeIPAMWorkers,
		EndpointSliceWorkers: DefaultEndpointSliceWorkers,
		KubeAPIQPS:           DefaultKubeAPIQPS,
		KubeAPIBurst:         DefaultKubeAPIBurst,
		MaxEndpointsPerSlice: endpointslice.DefaultMaxEndpointsPerSlice,
		MetricsBindAddress:   DefaultMetricsBindAddress,
	}
}

// validate checks the flags that need no API server.
func (o Options) validate() error {
	if !o.AllocateNodeCIDRs && !o.BindPods && !o.EndpointSlices && !o.lbIPAM() {
		return errors.New("nothing to do: --allocate-node-cidrs=false, no --bind-pods, no --endpointslices, no --load-balancer-ip-pool")
	}
	if _, err := o.lbConfig(); err != nil {
		return err
	}
	if o.EndpointSlices && (o.MaxEndpointsPerSlice < 1 || o.MaxEndpointsPerSlice > 1000) {
		return fmt.Errorf("--max-endpoints-per-slice must be 1..1000 (got %d)", o.MaxEndpointsPerSlice)
	}
	if o.Workers < 1 {
		return fmt.Errorf("--workers must be at least 1 (got %d)", o.Workers)
	}
	if o.AllocateNodeCIDRs && (o.NodeIPAMWorkers < 1 || o.NodeIPAMWorkers > 256) {
		return fmt.Errorf("--node-ipam-workers must be 1..256 (got %d)", o.NodeIPAMWorkers)
	}
	if o.EndpointSlices && (o.EndpointSliceWorkers < 1 || o.EndpointSliceWorkers > 256) {
		return fmt.Errorf("--endpointslice-workers must be 1..256 (got %d)", o.EndpointSliceWorkers)
	}
	// client-go reads 0 as its default (5) and a negative QPS as no limit
	// at all: neither is what a flag value should mean.
	if !(o.KubeAPIQPS > 0) {
		return fmt.Errorf("--kube-api-qps must be more than 0 (got %g)", o.KubeAPIQPS)
	}
	if o.KubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-burst must be at least 1 (got %d)", o.KubeAPIBurst)
	}
	return nil
}

// NewCommand returns `flatnet controller`.
func NewCommand() *cobra.Command {
	o := DefaultOptions()
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run flatnet's cluster-wide controller: node pod CIDR allocation (and, for the lab, pod binding)",
		Long: `flatnet controller gives every Node without spec.podCIDR a subnet of the
cluster CIDR (--node-cidr-mask-size bits, /24 by default). Subnets survive
controller restarts (they are read back from the Nodes) and are freed when a
Node is deleted. Nodes that already have a podCIDR (kube-controller-manager
with --allocate-node-cidrs) are left alone.

With --bind-pods it also binds Pods without spec.nodeName to Ready nodes,
round-robin: the lab runs no kube-scheduler. Leave it off in a real cluster.

With --load-balancer-ip-pool and/or --load-balancer-ip-pool-configmap it
gives every Service of type LoadBalancer whose spec.loadBalancerClass is
unset or ` + lbipam.Class + ` one address per IP family of the Service from the
pool (lowest free first; the deprecated spec.loadBalancerIP picks one if it
is in the pool and free), written to status.loadBalancer.ingress, and takes
it back when the Service is deleted or stops being a LoadBalancer. The
pool is comma-separated CIDRs, a-b ranges or addresses
("10.251.0.0/25,10.251.1.10-10.251.1.20"); the ConfigMap's key "pool" has
the same syntax, adds to the flag's and is watched. An address outside a
shrunk pool stays with its Service until released. Something must route
the pool to the nodes (a BGP or static route); the agents' --proxy answers
the addresses on every node.

On --metrics-bind-address (` + DefaultMetricsBindAddress + ` by default; empty turns it off) it
serves, as kube-controller-manager does: /healthz, "ok" while the process
runs (a Deployment's liveness probe); /metrics, Go runtime and process
metrics and client-go's workqueue metrics (workqueue_*, label name:
nodeipam, binder, endpointslice, lbipam); and with --profiling Go's
/debug/pprof/. No authentication: keep it on loopback or a trusted
network. A taken address fails the start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := kube.SignalContext(cmd.Context(), "controller")
			defer cancel()
			return Run(ctx, o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster service account)")
	fs.StringVar(&o.ClusterCIDR, "cluster-cidr", o.ClusterCIDR, "CIDR that node pod subnets are carved from")
	fs.IntVar(&o.NodeCIDRMaskSize, "node-cidr-mask-size", o.NodeCIDRMaskSize, "prefix length of each node's pod subnet")
	fs.BoolVar(&o.AllocateNodeCIDRs, "allocate-node-cidrs", o.AllocateNodeCIDRs, "allocate spec.podCIDR for Nodes that have none")
	fs.BoolVar(&o.BindPods, "bind-pods", false, "bind Pods without a node to Ready nodes round-robin (the lab has no scheduler)")
	fs.BoolVar(&o.EndpointSlices, "endpointslices", false, "write EndpointSlices for Services with a selector (managed-by "+endpointslice.ManagedBy+"); leave off where kube-controller-manager runs its own")
	fs.IntVar(&o.MaxEndpointsPerSlice, "max-endpoints-per-slice", o.MaxEndpointsPerSlice, "most endpoints in one EndpointSlice (1..1000)")
	fs.StringVar(&o.LoadBalancerIPPool, "load-balancer-ip-pool", "", "addresses for Services of type LoadBalancer with spec.loadBalancerClass unset or "+lbipam.Class+
		": comma-separated CIDRs, a-b ranges or addresses, IPv4 and/or IPv6 (empty: none unless --load-balancer-ip-pool-configmap)")
	fs.StringVar(&o.LoadBalancerIPPoolConfigMap, "load-balancer-ip-pool-configmap", "", "namespace/name of a ConfigMap whose key \"pool\" (same syntax) adds to --load-balancer-ip-pool; watched, so an edit takes effect")
	fs.IntVar(&o.Workers, "workers", o.Workers, "concurrent syncs per controller (but node IPAM and EndpointSlices, see --node-ipam-workers and --endpointslice-workers)")
	fs.IntVar(&o.NodeIPAMWorkers, "node-ipam-workers", o.NodeIPAMWorkers, "Nodes whose podCIDR is patched at once (1..256); each waits for its PATCH, so this many requests are in flight")
	fs.IntVar(&o.EndpointSliceWorkers, "endpointslice-workers", o.EndpointSliceWorkers, "--endpointslices: Services synced at once (1..256; kube-controller-manager's --concurrent-service-endpoint-syncs); a sync waits for its writes, so this many can be in flight")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "most requests a second, on average, to the API server (client-side limit)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "most requests at once to the API server above --kube-api-qps")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "host:port of /metrics (Go, process and workqueue metrics) and /healthz; empty turns it off")
	fs.BoolVar(&o.Profiling, "profiling", false, "also serve Go's /debug/pprof/ (heap, CPU, goroutine profiles) on --metrics-bind-address, as kube-controller-manager's --profiling does")
	kube.AddLogFlags(fs)
	return cmd
}

// Run runs the controllers o enables until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	var cfg nodeipam.Config
	if o.AllocateNodeCIDRs {
		p, err := netip.ParsePrefix(o.ClusterCIDR)
		if err != nil {
			return fmt.Errorf("--cluster-cidr %q: %w", o.ClusterCIDR, err)
		}
		cfg = nodeipam.Config{ClusterCIDR: p, NodeMaskSize: o.NodeCIDRMaskSize}
		// Fail on bad flags before connecting.
		if _, err := nodeipam.NewAllocator(p, o.NodeCIDRMaskSize); err != nil {
			return fmt.Errorf("--cluster-cidr/--node-cidr-mask-size: %w", err)
		}
	}
	// Listen before connecting: a taken address fails the start, where a
	// supervisor shows it, not a controller already at work.
	var ln net.Listener
	if o.MetricsBindAddress != "" {
		l, err := httpserver.Listen(o.MetricsBindAddress)
		if err != nil {
			return fmt.Errorf("--metrics-bind-address: %w", err)
		}
		ln = l
	}
	client, err := kube.ClientWithRate(o.Kubeconfig, "flatnet-controller", o.KubeAPIQPS, o.KubeAPIBurst)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	return withServer(ctx, ln, o.Profiling, func(ctx context.Context) error { return run(ctx, client, cfg, o) })
}

func run(ctx context.Context, client kubernetes.Interface, cfg nodeipam.Config, o Options) error {
	logger := klog.FromContext(ctx)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "flatnet-controller"})

	// One factory for the informers the controllers share, so that each
	// Node and Service is listed, watched and cached once (with a second
	// Node cache the caches took 2.2-2.9 s to sync at 5,000 Nodes, 0.7 s
	// without; docs/scale.md). slim keeps what every reader needs.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slim))
	type runner interface {
		Run(context.Context, int) error
	}
	type withWorkers struct {
		runner
		workers int
	}
	var runners []withWorkers
	startFactories := []informers.SharedInformerFactory{factory}
	if o.AllocateNodeCIDRs {
		c, err := nodeipam.New(client, factory.Core().V1().Nodes(), cfg, recorder)
		if err != nil {
			return err
		}
		runners = append(runners, withWorkers{c, o.NodeIPAMWorkers})
	}
	if o.BindPods {
		// The binder's Pod informer is filtered to unbound pods, so it
		// has a factory of its own: the shared one's Pod informer is the
		// EndpointSlice controller's, which must see every pod.
		podFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(slim))
		defer podFactory.Shutdown()
		startFactories = append(startFactories, podFactory)
		b, err := binder.New(client, binder.UnboundPods(podFactory), factory.Core().V1().Nodes(), recorder)
		if err != nil {
			return err
		}
		runners = append(runners, withWorkers{b, o.Workers})
	}
	if o.EndpointSlices {
		e, err := endpointslice.New(client, factory, o.MaxEndpointsPerSlice)
		if err != nil {
			return err
		}
		runners = append(runners, withWorkers{e, o.EndpointSliceWorkers})
	}
	if o.lbIPAM() {
		lbCfg, err := o.lbConfig()
		if err != nil {
			return err
		}
		var cms coreinformers.ConfigMapInformer
		if lbCfg.ConfigMap != "" {
			// A factory that watches the one ConfigMap, not all of them.
			ns, name, _ := lbipam.ParseConfigMapName(lbCfg.ConfigMap)
			cmFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
				informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
					lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
				}))
			defer cmFactory.Shutdown()
			startFactories = append(startFactories, cmFactory)
			cms = cmFactory.Core().V1().ConfigMaps()
		}
		l, err := lbipam.New(client, factory.Core().V1().Services(), cms, lbCfg, recorder)
		if err != nil {
			return err
		}
		runners = append(runners, withWorkers{l, o.Workers})
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, f := range startFactories {
		f.StartWithContext(ctx)
	}
	defer factory.Shutdown()

	logger.Info("Starting", "allocateNodeCIDRs", o.AllocateNodeCIDRs, "bindPods", o.BindPods, "endpointSlices", o.EndpointSlices,
		"loadBalancerIPPool", o.LoadBalancerIPPool, "loadBalancerIPPoolConfigMap", o.LoadBalancerIPPoolConfigMap)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, r := range runners {
		wg.Go(func() {
			if err := r.Run(ctx, r.workers); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel() // one failing stops the process: let it restart whole
			}
		})
	}
	wg.Wait()
	logger.Info("Stopped")
	return errors.Join(errs...)
}

// slim is the shared factory's transform: it drops what none of its
// readers use before the object is cached. They are nodeipam (a Node's
// name and spec.podCIDR(s)), the binder (a Node's labels, taints,
// spec.unschedulable, Ready condition; unbound Pods), the EndpointSlice
// controller (a Node's name and labels; Services; it sets its own
// transform on the Pod and EndpointSlice informers) and lbipam (Services,
// written back with UpdateStatus, where omitted managedFields leave the
// server's as they are; so a Service keeps its annotations, kubectl's
// last-applied copy included). A Node keeps its metadata but
// annotations, its spec and its Ready condition: its status (images,
// volumes, addresses, the other conditions) and managedFields are most of
// it, and the kubelet rewrites them.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case cache.DeletedFinalStateUnknown:
		inner, err := slim(o.Obj)
		o.Obj = inner
		return o, err
	case *corev1.Node:
		n := &corev1.Node{TypeMeta: o.TypeMeta, ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion, Labels: o.Labels,
			CreationTimestamp: o.CreationTimestamp, DeletionTimestamp: o.DeletionTimestamp,
		}, Spec: o.Spec}
		for _, c := range o.Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.Status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
			}
		}
		return n, nil
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}
