// Package healthcheck answers the questions load balancers and probes ask
// a Service proxy, as kube-proxy's pkg/proxy/healthcheck does:
//
//   - ProxierHealth: /healthz and /livez, "are this node's Service rules
//     keeping up with the API?". Healthy while no change has waited longer
//     than the timeout (kube-proxy: twice the sync period) to be synced;
//     /healthz also fails while the node is being deleted or is tainted
//     for deletion by the cluster autoscaler, so load balancers drain it.
//   - ServiceHealth: one HTTP listener per LoadBalancer Service with
//     externalTrafficPolicy Local, on its spec.healthCheckNodePort on every
//     node address: 200 with the number of local ready endpoints when
//     there is one, 503 otherwise, so the cloud load balancer sends only to
//     nodes that can serve without a second hop.
//
// A node runs one proxier per IP family; each reports through its own
// Family handle, and the node is healthy only when every family is.
package healthcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/flatnet/flatnet/internal/httpserver"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to delete.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// ProxierHealthConfig configures a ProxierHealth.
type ProxierHealthConfig struct {
	NodeName string
	// Timeout is how long a queued change may wait for a sync before the
	// proxy is unhealthy (kube-proxy: 2 × the sync period).
	Timeout time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Served, when set, is told each answer's path and status code (the
	// flatnet_proxy_healthz_total / _livez_total metrics).
	Served func(path string, code int)
}

// ProxierHealth is the node's /healthz and /livez state. Create it with
// NewProxierHealth; proxiers report through Family.
type ProxierHealth struct {
	cfg ProxierHealthConfig

	mu       sync.Mutex // protects the fields below
	families map[string]*familyState
	// nodeEligible is false while the Node is being deleted or carries
	// ToBeDeletedTaint; true until the Node is seen.
	nodeEligible bool
}

type familyState struct {
	lastUpdated  time.Time
	oldestQueued time.Time // zero: nothing waits
}

// NewProxierHealth returns the health of a node's proxiers.
func NewProxierHealth(cfg ProxierHealthConfig) *ProxierHealth {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &ProxierHealth{cfg: cfg, families: map[string]*familyState{}, nodeEligible: true}
}

// Family returns the handle through which one proxier (one IP family)
// reports. A nil *ProxierHealth gives a nil handle, which ignores reports.
func (h *ProxierHealth) Family(name string) *Family {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.families[name] == nil {
		h.families[name] = &familyState{}
	}
	return &Family{h: h, name: name}
}

// Family is one proxier's side of a ProxierHealth.
type Family struct {
	h    *ProxierHealth
	name string
}

// QueuedUpdate says a change is waiting for a sync (or a sync failed, so
// the rules lag the API). The oldest unsynced one counts.
func (f *Family) QueuedUpdate() {
	if f == nil {
		return
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if st := f.h.families[f.name]; st.oldestQueued.IsZero() {
		st.oldestQueued = f.h.cfg.Now()
	}
}

// Updated says a sync succeeded: the rules match what was queued.
func (f *Family) Updated() {
	if f == nil {
		return
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	st := f.h.families[f.name]
	st.oldestQueued = time.Time{}
	st.lastUpdated = f.h.cfg.Now()
}

// IsHealthy reports the proxiers' health, leaving the Node's state out
// (what /livez and the healthCheckNodePorts use).
func (h *ProxierHealth) IsHealthy() bool {
	healthy, _, _ := h.health()
	return healthy
}

// health returns whether every family is healthy, when the rules were
// last updated (the failing family's time when one fails, else the
// latest), and now.
func (h *ProxierHealth) health() (healthy bool, lastUpdated, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now = h.cfg.Now()
	names := make([]string, 0, len(h.families))
	for n := range h.families {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		st := h.families[n]
		if st.lastUpdated.After(lastUpdated) {
			lastUpdated = st.lastUpdated
		}
		if !st.oldestQueued.IsZero() && now.Sub(st.oldestQueued) >= h.cfg.Timeout {
			return false, st.lastUpdated, now
		}
	}
	return true, lastUpdated, now
}

// SyncNode takes the Node's state into account for /healthz: a Node
// being deleted or tainted for deletion is not eligible for traffic.
func (h *ProxierHealth) SyncNode(node *v1.Node) {
	eligible := node.DeletionTimestamp == nil
	for _, t := range node.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			eligible = false
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = eligible
}

func (h *ProxierHealth) eligible() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodeEligible
}

// WatchNode follows the Node named in the config with SyncNode until ctx
// ends (a deleted Node is not eligible).
func (h *ProxierHealth) WatchNode(ctx context.Context, client kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", h.cfg.NodeName).String()
	}))
	sync := func(obj any) {
		if n, ok := obj.(*v1.Node); ok {
			h.SyncNode(n)
		}
	}
	_, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sync,
		UpdateFunc: func(_, obj any) { sync(obj) },
		DeleteFunc: func(any) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.nodeEligible = false
		},
	})
	if err != nil {
		return fmt.Errorf("watching node %s: %w", h.cfg.NodeName, err)
	}
	factory.StartWithContext(ctx)
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// status is the body of /healthz and /livez. Times are RFC 3339
// (kube-proxy prints Go's time.String); nodeEligible is kube-proxy's name
// for nodeHealthy.
type status struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeName     string    `json:"nodeName"`
	NodeHealthy  *bool     `json:"nodeHealthy,omitempty"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
}

// Handler serves /healthz and /livez.
func (h *ProxierHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { h.answer(w, "/healthz", true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { h.answer(w, "/livez", false) })
	return mux
}

func (h *ProxierHealth) answer(w http.ResponseWriter, path string, withNode bool) {
	healthy, lastUpdated, now := h.health()
	st := status{CurrentTime: now, NodeName: h.cfg.NodeName}
	if withNode {
		eligible := h.eligible()
		st.NodeHealthy, st.NodeEligible = &eligible, &eligible
		healthy = healthy && eligible
	}
	code := http.StatusOK
	if healthy {
		// As kube-proxy: a healthy proxy reports "updated now" (it used
		// to report the last sync loop run, changes or not); the
		// metrics tell the real last sync.
		lastUpdated = now
	} else {
		code = http.StatusServiceUnavailable
	}
	st.LastUpdated = lastUpdated
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
	if h.cfg.Served != nil {
		h.cfg.Served(path, code)
	}
}

// Serve serves /healthz and /livez on addr (host:port) until ctx ends. It
// returns the listen error at once, nil when ctx ends.
func (h *ProxierHealth) Serve(ctx context.Context, addr string) error {
	return httpserver.Serve(ctx, addr, h.Handler())
}
