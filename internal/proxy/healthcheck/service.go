package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Service is one service's health check as one family's proxier sees it.
type Service struct {
	// Port is spec.healthCheckNodePort.
	Port uint16
	// LocalEndpoints counts the node's ready, not terminating endpoints
	// (distinct addresses): a node with only terminating ones should be
	// drained, though they still serve.
	LocalEndpoints int
}

// ServiceHealthConfig configures a ServiceHealth.
type ServiceHealthConfig struct {
	// Listen opens the listener of one health check; net.Listen("tcp",
	// addr) when nil. addr is "0.0.0.0:<port>": every node address, both
	// families (Go's wildcard listener), as kube-proxy.
	Listen func(addr string) (net.Listener, error)
	// ProxyHealthy is the proxy's own health (ProxierHealth.IsHealthy):
	// while it is false every check answers 503, as kube-proxy's do, so
	// a node whose rules lag gets no new traffic. Healthy when nil.
	ProxyHealthy func() bool
}

// ServiceHealth runs the healthCheckNodePort listeners of a node. Create
// it with NewServiceHealth; proxiers report through Family; Close stops
// every listener.
type ServiceHealth struct {
	cfg ServiceHealthConfig

	mu       sync.Mutex // protects the fields below
	families map[string]map[types.NamespacedName]Service
	servers  map[types.NamespacedName]*checkServer
	closed   bool
}

// checkServer is one service's listener.
type checkServer struct {
	port uint16
	srv  *http.Server
	// endpoints is the local endpoint count served (under the
	// ServiceHealth's mu).
	endpoints int
}

// NewServiceHealth returns a ServiceHealth with no listener open.
func NewServiceHealth(cfg ServiceHealthConfig) *ServiceHealth {
	if cfg.Listen == nil {
		cfg.Listen = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	}
	return &ServiceHealth{cfg: cfg, families: map[string]map[types.NamespacedName]Service{}, servers: map[types.NamespacedName]*checkServer{}}
}

// Family returns the handle of one family's proxier. A nil *ServiceHealth
// gives a nil handle, which ignores syncs.
func (s *ServiceHealth) Family(name string) *ServiceFamily {
	if s == nil {
		return nil
	}
	return &ServiceFamily{s: s, name: name}
}

// ServiceFamily is one proxier's side of a ServiceHealth.
type ServiceFamily struct {
	s    *ServiceHealth
	name string
}

// Sync sets the services with a health check node port as this family
// sees them after a sync. Listeners open for services that appear and
// close for those that go; the count each answers with is the largest
// over the families (a dual-stack pod is one endpoint in each). A port
// that cannot be opened is an error, and is tried again at the next Sync.
func (f *ServiceFamily) Sync(services map[types.NamespacedName]Service) error {
	if f == nil {
		return nil
	}
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.families[f.name] = services
	want := map[types.NamespacedName]Service{}
	for _, fam := range sortedFamilies(s.families) {
		for nsn, svc := range s.families[fam] {
			w, ok := want[nsn]
			if !ok {
				want[nsn] = svc
				continue
			}
			w.LocalEndpoints = max(w.LocalEndpoints, svc.LocalEndpoints)
			want[nsn] = w
		}
	}
	for nsn, cs := range s.servers {
		if w, ok := want[nsn]; !ok || w.Port != cs.port {
			_ = cs.srv.Close()
			delete(s.servers, nsn)
		}
	}
	var errs []error
	for _, nsn := range sortedNames(want) {
		w := want[nsn]
		if cs := s.servers[nsn]; cs != nil {
			cs.endpoints = w.LocalEndpoints
			continue
		}
		addr := net.JoinHostPort("0.0.0.0", strconv.Itoa(int(w.Port)))
		ln, err := s.cfg.Listen(addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("health check of service %s on %s: %w", nsn, addr, err))
			continue
		}
		cs := &checkServer{port: w.Port, endpoints: w.LocalEndpoints}
		cs.srv = &http.Server{Handler: s.handler(nsn), ReadHeaderTimeout: 10 * time.Second}
		s.servers[nsn] = cs
		go func() { _ = cs.srv.Serve(ln) }()
	}
	return errors.Join(errs...)
}

// Ports returns the open health check ports by service (for tests and
// logs).
func (s *ServiceHealth) Ports() map[types.NamespacedName]uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[types.NamespacedName]uint16{}
	for nsn, cs := range s.servers {
		out[nsn] = cs.port
	}
	return out
}

// Close closes every listener; later syncs open none.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for nsn, cs := range s.servers {
		_ = cs.srv.Close()
		delete(s.servers, nsn)
	}
}

// serviceStatus is a health check's body, kube-proxy's.
type serviceStatus struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// handler answers any request for nsn: 200 with local endpoints and a
// healthy proxy, else 503.
func (s *ServiceHealth) handler(nsn types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		cs := s.servers[nsn]
		count := 0
		if cs != nil {
			count = cs.endpoints
		}
		s.mu.Unlock()
		healthy := s.cfg.ProxyHealthy == nil || s.cfg.ProxyHealthy()
		var st serviceStatus
		st.Service.Namespace, st.Service.Name = nsn.Namespace, nsn.Name
		st.LocalEndpoints, st.ServiceProxyHealthy = count, healthy
		body, _ := json.MarshalIndent(st, "", "\t")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(body)
	})
}

func sortedFamilies(m map[string]map[types.NamespacedName]Service) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedNames(m map[types.NamespacedName]Service) []types.NamespacedName {
	out := make([]types.NamespacedName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}
