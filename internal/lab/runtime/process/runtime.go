// Package process is the lab's process runtime, a kubelet inside the agent
// (`flatnet agent --lab-runtime`): it registers its Node and keeps it Ready,
// and runs the Pods bound to that node as real processes in network
// namespaces set up through CNI. The lab's other runtime is
// ../containerd (upstream containerd, runc and kubelet per node).
//
// Design. A pod here is
//
//   - a network namespace (/run/netns/<prefix><uid[:8]>) that lives as long as
//     the pod, as a pause container's does, attached with CNI ADD through
//     libcni using the first config in the node's CNI conf dir, with the
//     K8S_POD_* CNI_ARGS and the portMappings and bandwidth capabilities;
//   - one process per container, started by `flatnet container-init` in that
//     namespace and in fresh mount and UTS namespaces, where it mounts the
//     pod's resolv.conf and hosts files and sets the hostname before exec'ing
//     the container's command. The fresh mount namespace is also how the
//     runtime finds every process of a container (no cgroups here).
//
// Each pod has a worker goroutine. It keeps the actual state (podRecord:
// the sandbox, each container's process and history) and, whenever
// something changes (Pod update, process exit, probe result, timer), calls
// the pure plan(desired Pod, actual record) for the next actions, applies
// them through small interfaces (network, namespaces, processes, prober:
// fakes in the unit tests), then writes the status computed by the pure
// podStatus. The record is saved under the state dir after every change,
// so a restarted agent adopts running containers instead of restarting
// them, and cleans up after pods deleted while it was away.
//
// Deletion: SIGTERM, up to the grace period, SIGKILL, then every process
// left in the pod's namespace is killed, CNI DEL, the namespace removed,
// and the Pod object deleted with grace 0 (the kubelet's last step).
package process

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Config configures the runtime of one node.
type Config struct {
	NodeName, NodeIP string
	Client           kubernetes.Interface
	// StateDir holds the pod records, pod files and container logs.
	StateDir string
	// NetnsPrefix starts every pod network namespace's name.
	NetnsPrefix string
	// PodPath is put first on the containers' PATH (the lab's flatnet is
	// there, so `flatnet netexec` resolves).
	PodPath string
	// CNIConfDir, CNIBinDir and CNICacheDir are the node's CNI directories.
	CNIConfDir, CNIBinDir, CNICacheDir string
	// ClusterDNS and ClusterDomain are the kubelet's --cluster-dns and
	// --cluster-domain: the nameservers and search domains of ClusterFirst
	// pods. Without ClusterDNS those pods get the node's resolv.conf and a
	// MissingClusterDNS warning, as from a kubelet without --cluster-dns.
	ClusterDNS    []netip.Addr
	ClusterDomain string // default cluster.local
	// CNIMetrics, when set, times every CNI ADD and DEL (cnimetrics.go).
	CNIMetrics *CNIMetrics
}

// deps are the runtime's effects and clocks; tests replace them.
type deps struct {
	net    network
	ns     namespaces
	procs  processes
	prober prober
	now    func() time.Time
	// heartbeat is the Node status update period; netPoll how often the
	// CNI config dir is checked for node readiness.
	heartbeat, netPoll time.Duration
	resolvConf         string // the node's resolv.conf, for pods
	hostsFile          string // the node's hosts, for host-network pods
}

func (c *Config) validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("no node name"))
	}
	if _, err := netip.ParseAddr(c.NodeIP); err != nil {
		errs = append(errs, fmt.Errorf("node IP %q: %w", c.NodeIP, err))
	}
	if c.Client == nil {
		errs = append(errs, errors.New("no API client"))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("no state dir"))
	}
	if c.CNIConfDir == "" || c.CNIBinDir == "" {
		errs = append(errs, errors.New("CNI conf and bin dirs are required"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("runtime config: %w", errors.Join(errs...))
	}
	if c.NetnsPrefix == "" {
		c.NetnsPrefix = "flatnet-"
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	if c.CNICacheDir == "" {
		c.CNICacheDir = filepath.Join(c.StateDir, "cni-cache")
	}
	return nil
}

// Run registers the node and runs its pods until ctx ends. Containers keep
// running when it returns: a new Run with the same state dir adopts them.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	d, err := realDeps(cfg, "")
	if err != nil {
		return err
	}
	return run(ctx, cfg, d)
}

// realDeps are the effects on the real system. hostNS, when set, is the
// network namespace the node's side of things happens in (CNI plugins,
// probe connections): root tests use a test "node" namespace; the agent
// itself already runs inside its node's namespace.
func realDeps(cfg Config, hostNS string) (deps, error) {
	initBin, err := initBinary(cfg.PodPath)
	if err != nil {
		return deps{}, err
	}
	return deps{
		net:        &cniNetwork{confDir: cfg.CNIConfDir, cacheDir: cfg.CNICacheDir, binDirs: filepath.SplitList(cfg.CNIBinDir), hostNS: hostNS, metrics: cfg.CNIMetrics},
		ns:         realNamespaces{},
		procs:      &realProcesses{initBin: initBin, hostNS: hostNS, owner: cfg.StateDir},
		prober:     realProber{hostNS: hostNS},
		now:        time.Now,
		heartbeat:  10 * time.Second,
		netPoll:    time.Second,
		resolvConf: "/etc/resolv.conf",
		hostsFile:  "/etc/hosts",
	}, nil
}

// core is the state shared by the node loop and the pod workers.
type core struct {
	cfg      Config
	d        deps
	log      klog.Logger
	pods     corelisters.PodLister
	services corelisters.ServiceLister
	recorder record.EventRecorder

	mu      sync.Mutex
	workers map[string]*worker // by namespace/name
	wg      sync.WaitGroup
}

func run(ctx context.Context, cfg Config, d deps) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "pods"), 0o755); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	log := klog.FromContext(ctx).WithValues("node", cfg.NodeName)
	ctx = klog.NewContext(ctx, log)

	podFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + cfg.NodeName }))
	svcFactory := informers.NewSharedInformerFactory(cfg.Client, 0)
	podInf := podFactory.Core().V1().Pods()
	svcInf := svcFactory.Core().V1().Services()
	podInformer := podInf.Informer()
	svcInf.Informer()

	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Client.CoreV1().Events("")})
	defer bc.Shutdown()

	c := &core{
		cfg: cfg, d: d, log: log,
		pods:     podInf.Lister(),
		services: svcInf.Lister(),
		recorder: bc.NewRecorder(scheme.Scheme, v1.EventSource{Component: "flatnet-runtime", Host: cfg.NodeName}),
		workers:  map[string]*worker{},
	}

	var nodeWG sync.WaitGroup
	nodeWG.Add(1)
	go func() {
		defer nodeWG.Done()
		c.nodeLoop(ctx)
	}()

	podFactory.Start(ctx.Done())
	svcFactory.Start(ctx.Done())
	log.Info("Waiting for the pod and service caches")
	for typ, ok := range podFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			nodeWG.Wait()
			return fmt.Errorf("syncing the %v cache: %w", typ, ctx.Err())
		}
	}
	for typ, ok := range svcFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			nodeWG.Wait()
			return fmt.Errorf("syncing the %v cache: %w", typ, ctx.Err())
		}
	}

	c.reconcileRecords(ctx)

	_, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { c.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*v1.Pod); ok {
				c.podGone(pod.Namespace+"/"+pod.Name, pod.UID)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	log.Info("Runtime started", "stateDir", cfg.StateDir, "cniConfDir", cfg.CNIConfDir)
	<-ctx.Done()
	c.wg.Wait()
	nodeWG.Wait()
	log.Info("Runtime stopped; containers keep running")
	return nil
}

// reconcileRecords starts a worker for every pod recorded in the state
// dir: it adopts the pod if the API still has it, else cleans up after it.
func (c *core) reconcileRecords(ctx context.Context) {
	recs, bad := loadRecords(c.cfg.StateDir)
	claimed := map[string]bool{} // netns names and sandbox IDs
	for _, rec := range recs {
		claimed[rec.Netns], claimed[rec.SandboxID] = true, true
	}
	delete(claimed, "")
	for _, rec := range recs {
		pod, err := c.pods.Pods(rec.Namespace).Get(rec.Name)
		if err != nil || pod.UID != rec.UID || pod.Spec.NodeName != c.cfg.NodeName {
			pod = nil
		}
		dir := podDir(c.cfg.StateDir, rec.Namespace, rec.Name)
		for _, f := range staleSideFiles(dir, rec) {
			c.log.Error(nil, "Pod side file does not match state.json (truncated?); rewriting it", "path", f)
		}
		c.log.Info("Found pod from an earlier run", "pod", rec.Namespace+"/"+rec.Name, "adopt", pod != nil)
		c.startWorker(ctx, rec, pod, nil)
	}
	for _, b := range bad {
		c.recoverPod(ctx, b, claimed)
	}
}

// startWorker runs a worker for rec; next is a Pod of the same name that
// waits for it to finish.
func (c *core) startWorker(ctx context.Context, rec *podRecord, pod, next *v1.Pod) {
	w := newWorker(c, rec, pod)
	w.next = next
	c.mu.Lock()
	c.workers[w.key] = w
	c.mu.Unlock()
	c.launch(ctx, w)
}

// launch runs w, which is in c.workers.
func (c *core) launch(ctx context.Context, w *worker) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		w.run(ctx)
	}()
}

// podChanged hands a Pod from the informer to its worker, starting one for
// a new pod.
func (c *core) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok || pod.Spec.NodeName != c.cfg.NodeName {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	// A pod that finished before has nothing to run (this agent has no
	// record of it).
	finished := (pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed) && pod.DeletionTimestamp == nil
	// Looked up, updated or started under c.mu, so an update cannot slip
	// between a worker taking its successor and leaving the map
	// (workerDone), and two callers cannot start two workers for one name.
	c.mu.Lock()
	w, start := c.workers[key], false
	switch {
	case w != nil:
		w.update(pod)
	case !finished:
		w, start = newWorker(c, newRecord(pod, c.d.now()), pod), true
		c.workers[key] = w
	}
	c.mu.Unlock()
	if start {
		c.launch(ctx, w)
	}
}

// podGone tells the worker of a Pod that it is gone from the API.
func (c *core) podGone(key string, uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.workers[key]; w != nil {
		w.gone(uid)
	}
}

// workerDone is called by a worker that has nothing left to do. A newer
// pod of the same name that waited for it gets its own worker.
func (c *core) workerDone(ctx context.Context, w *worker) {
	// The successor is read as the worker leaves the map, both under c.mu
	// (podChanged updates under it too): a pod of the same name that
	// arrives later finds no worker and starts its own.
	c.mu.Lock()
	if c.workers[w.key] == w {
		delete(c.workers, w.key)
	}
	w.mu.Lock()
	next := w.next
	w.mu.Unlock()
	c.mu.Unlock()
	if next == nil || ctx.Err() != nil {
		return
	}
	// The informer may have moved on: start from its current view.
	if cur, err := c.pods.Pods(next.Namespace).Get(next.Name); err == nil && cur.UID == next.UID {
		c.podChanged(ctx, cur)
	}
}

func newRecord(pod *v1.Pod, now time.Time) *podRecord {
	r := &podRecord{
		UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		HostNetwork:  pod.Spec.HostNetwork,
		StartTime:    now,
		GraceSeconds: int64(specGrace(pod) / time.Second),
	}
	for _, ct := range pod.Spec.InitContainers {
		r.Containers = append(r.Containers, &containerRecord{Name: ct.Name, Init: true})
	}
	for _, ct := range pod.Spec.Containers {
		r.Containers = append(r.Containers, &containerRecord{Name: ct.Name})
	}
	return r
}

// envSources reads ConfigMaps and Secrets from the API when a
// container's environment refers to them.
func (c *core) envSources(ctx context.Context) envSources {
	return envSources{
		ConfigMap: func(ns, name string) (*v1.ConfigMap, error) {
			return c.cfg.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		},
		Secret: func(ns, name string) (*v1.Secret, error) {
			return c.cfg.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		},
		IsNotFound: apierrors.IsNotFound,
	}
}
