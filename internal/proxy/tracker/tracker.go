// Package tracker turns Service and EndpointSlice objects into the proxy
// model (internal/proxy) and records which services changed since the last
// sync, in the shape of kube-proxy's servicechangetracker: for each service
// key it remembers the model as it was at the last sync (previous) and as it
// is now (current); a change that returns an object to its synced form is
// dropped, so a flapping update costs no sync work.
//
// Services and slices are kept as the compact Svcs and Slices the
// informers cache (never mutated) and the model of a key is rebuilt from
// them on every event for that key, so the cost of an event follows the
// size of one service. OnService, OnEndpointSlice and Convert take API
// objects and compact them first.
package tracker

import (
	"cmp"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/flatnet/flatnet/internal/proxy"
)

// defaultAffinityTimeout is the API default for sessionAffinityConfig.clientIP.timeoutSeconds.
const defaultAffinityTimeout = 10800 * time.Second

// Tracker holds the services of one address family and what changed.
type Tracker struct {
	ipv6 bool

	mu       sync.Mutex // protects the fields below
	services map[string]*Svc
	// slices: service key -> its slices, sorted by name (a map per
	// service cost 400 bytes for the one slice most services have).
	slices map[string][]*Slice
	models map[string]*proxy.Service
	// keys are the models' keys, sorted, as of the last Take; stale when
	// a key came or went since (an endpoint change leaves them: a sync
	// then sorts nothing).
	keys      []string
	keysStale bool
	// previous holds, for every key changed since the last Take, the model
	// at the last Take (nil when the service did not exist then).
	previous map[string]*proxy.Service

	// For metrics, since the last Take: the keys changed by a Service
	// event, the number of EndpointSlice events that changed something,
	// and the slices' last-change-trigger-times per key.
	serviceEvents map[string]bool
	// servicePending counts the keys of serviceEvents still in previous
	// (kept per event: counting at each event would cost O(services)
	// per event, O(n²) over a cold start's initial list).
	servicePending int
	endpointEvents int
	triggers       map[string][]time.Time
	// start: trigger times from before the tracker existed are not
	// this proxy's latency.
	start time.Time
}

// New returns a tracker for IPv4 (ipv6 false) or IPv6 services.
func New(ipv6 bool) *Tracker {
	return &Tracker{
		ipv6:     ipv6,
		services: map[string]*Svc{},
		slices:   map[string][]*Slice{},
		models:   map[string]*proxy.Service{},
		previous: map[string]*proxy.Service{},

		serviceEvents: map[string]bool{},
		triggers:      map[string][]time.Time{},
		start:         time.Now(),
	}
}

// OnService records svc as added or updated.
func (t *Tracker) OnService(svc *v1.Service) { t.OnSvc(CompactService(svc)) }

// OnServiceDelete records that svc is gone.
func (t *Tracker) OnServiceDelete(svc *v1.Service) { t.OnSvcDelete(CompactService(svc)) }

// OnSvc is OnService for a Service the informer already compacted.
func (t *Tracker) OnSvc(svc *Svc) {
	key := svc.Namespace + "/" + svc.Name
	t.update(key, func() { t.services[key] = svc }, func(changed bool) { t.serviceEvent(key, changed) })
}

// OnSvcDelete is OnServiceDelete for a compacted Service.
func (t *Tracker) OnSvcDelete(svc *Svc) {
	key := svc.Namespace + "/" + svc.Name
	t.update(key, func() { delete(t.services, key) }, func(changed bool) { t.serviceEvent(key, changed) })
}

// OnEndpointSlice records slice's new state. Slices without the
// kubernetes.io/service-name label belong to no service and are ignored.
func (t *Tracker) OnEndpointSlice(slice *discovery.EndpointSlice) { t.OnSlice(CompactSlice(slice)) }

// OnEndpointSliceDelete records that slice is gone.
func (t *Tracker) OnEndpointSliceDelete(slice *discovery.EndpointSlice) {
	t.OnSliceDelete(CompactSlice(slice))
}

// OnSlice is OnEndpointSlice for a slice the informer already compacted.
func (t *Tracker) OnSlice(slice *Slice) {
	key, ok := sliceService(slice)
	if !ok {
		return
	}
	t.update(key, func() {
		l := t.slices[key]
		if i, found := slices.BinarySearchFunc(l, slice.Name, bySliceName); found {
			l[i] = slice
		} else {
			t.slices[key] = slices.Insert(l, i, slice)
		}
	}, func(changed bool) { t.endpointEvent(key, slice, false, changed) })
}

// OnSliceDelete is OnEndpointSliceDelete for a compacted slice.
func (t *Tracker) OnSliceDelete(slice *Slice) {
	key, ok := sliceService(slice)
	if !ok {
		return
	}
	t.update(key, func() {
		l := t.slices[key]
		if i, found := slices.BinarySearchFunc(l, slice.Name, bySliceName); found {
			l = slices.Delete(l, i, i+1)
		}
		if len(l) == 0 {
			delete(t.slices, key)
		} else {
			t.slices[key] = l
		}
	}, func(changed bool) { t.endpointEvent(key, slice, true, changed) })
}

func (t *Tracker) serviceEvent(key string, changed bool) {
	if changed {
		t.serviceEvents[key] = true
	}
}

// endpointEvent notes a slice event for metrics. As kube-proxy: only
// slices of the tracker's family count, and only when they changed
// something; a deletion's trigger time would be the slice's last update,
// not the deletion, so it drops the key's times instead.
func (t *Tracker) endpointEvent(key string, slice *Slice, deleted, changed bool) {
	want := discovery.AddressTypeIPv4
	if t.ipv6 {
		want = discovery.AddressTypeIPv6
	}
	if slice.AddressType != want || !changed {
		return
	}
	t.endpointEvents++
	if deleted {
		delete(t.triggers, key)
		return
	}
	if at := slice.TriggerTime; at.After(t.start) {
		t.triggers[key] = append(t.triggers[key], at)
	}
}

func sliceService(slice *Slice) (string, bool) {
	if slice.Service == "" {
		return "", false
	}
	return slice.Namespace + "/" + slice.Service, true
}

// update applies one event to key's objects, rebuilds its model and tells
// after whether the model changed.
func (t *Tracker) update(key string, apply func(), after func(changed bool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	counted := t.countsAsService(key)
	defer func() {
		switch now := t.countsAsService(key); {
		case now && !counted:
			t.servicePending++
		case !now && counted:
			t.servicePending--
		}
	}()
	before, pending := t.models[key], false
	if _, pending = t.previous[key]; !pending {
		t.previous[key] = before
	}
	apply()
	cur := t.build(key)
	if (before == nil) != (cur == nil) {
		t.keysStale = true
	}
	if cur == nil {
		delete(t.models, key)
	} else {
		t.models[key] = cur
	}
	same := reflect.DeepEqual(t.previous[key], cur)
	if same {
		delete(t.previous, key)
	}
	changed := !same
	if pending {
		changed = !reflect.DeepEqual(before, cur)
	}
	after(changed)
}

// countsAsService says whether key counts in PendingChanges' services.
func (t *Tracker) countsAsService(key string) bool {
	_, ok := t.previous[key]
	return ok && t.serviceEvents[key]
}

// Pending reports whether any service changed since the last Take.
func (t *Tracker) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.previous) > 0
}

// PendingChanges returns, for metrics, how many services a Service event
// left changed, and how many EndpointSlice events of the tracker's family
// arrived, since the last Take.
func (t *Tracker) PendingChanges() (services, endpoints int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.servicePending, t.endpointEvents
}

// Round is what a Take hands over.
type Round struct {
	// Services are every current service, sorted by key. The models are
	// not shared with the tracker's later updates: each event builds
	// fresh ones.
	Services []*proxy.Service
	// Changed holds the keys that changed since the previous Take, each
	// with its model in Services (nil: deleted).
	Changed proxy.Changes
	// Previous holds, for each changed key, its model at the previous
	// Take (nil when it did not exist then): what the last sync
	// programmed, which conntrack cleanup compares with.
	Previous map[string]*proxy.Service
	// TriggerTimes holds, for changed keys, the last-change-trigger-times
	// of the EndpointSlice updates that changed them (for the network
	// programming latency).
	TriggerTimes map[string][]time.Time
}

// Take returns every current service and what changed since the last
// Take, and starts a new round.
func (t *Tracker) Take() Round {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Round{Changed: make(proxy.Changes, len(t.previous)), Previous: t.previous, TriggerTimes: map[string][]time.Time{}}
	for k := range t.previous {
		r.Changed[k] = t.models[k]
		if ts := t.triggers[k]; len(ts) > 0 {
			r.TriggerTimes[k] = ts
		}
	}
	t.previous = map[string]*proxy.Service{}
	t.serviceEvents, t.servicePending, t.endpointEvents, t.triggers = map[string]bool{}, 0, 0, map[string][]time.Time{}
	// Sorted by the map's keys (a sort calling Key() would build n log n
	// strings), which are sorted again only when one came or went.
	if t.keysStale || t.keys == nil {
		t.keys = make([]string, 0, len(t.models))
		for k := range t.models {
			t.keys = append(t.keys, k)
		}
		sort.Strings(t.keys)
		t.keysStale = false
	}
	r.Services = make([]*proxy.Service, len(t.keys))
	for i, k := range t.keys {
		r.Services[i] = t.models[k]
	}
	return r
}

// build returns the model of key from the stored objects, nil when the
// service does not exist or is not proxied (ExternalName).
func (t *Tracker) build(key string) *proxy.Service {
	svc := t.services[key]
	if svc == nil {
		return nil
	}
	return convert(svc, t.slices[key], t.ipv6)
}

func bySliceName(s *Slice, name string) int { return strings.Compare(s.Name, name) }

// Convert builds the model of svc for one family from its EndpointSlices.
// It returns nil for ExternalName services, which the proxy does not serve.
// A headless service (clusterIP None) keeps a zero ClusterIP. Endpoints take
// their port from the slice port of the same name and protocol (named
// targetPorts arrive resolved per pod there); an address listed in two
// slices counts once.
func Convert(svc *v1.Service, slices []*discovery.EndpointSlice, ipv6 bool) *proxy.Service {
	compact := make([]*Slice, len(slices))
	for i, s := range slices {
		compact[i] = CompactSlice(s)
	}
	return convert(CompactService(svc), compact, ipv6)
}

func convert(svc *Svc, slices []*Slice, ipv6 bool) *proxy.Service {
	if svc.Type == v1.ServiceTypeExternalName {
		return nil
	}
	fam := func(a netip.Addr) bool { return a.IsValid() && a.Unmap().Is6() == ipv6 }
	m := &proxy.Service{
		Namespace: svc.Namespace,
		Name:      svc.Name,
		Type:      proxy.ClusterIP,
	}
	switch svc.Type {
	case v1.ServiceTypeNodePort:
		m.Type = proxy.NodePort
	case v1.ServiceTypeLoadBalancer:
		m.Type = proxy.LoadBalancer
	}
	for _, s := range svc.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && fam(a) {
			m.ClusterIP = a.Unmap()
			break
		}
	}
	for _, s := range svc.ExternalIPs {
		if a, err := netip.ParseAddr(s); err == nil && fam(a) {
			m.ExternalIPs = append(m.ExternalIPs, a.Unmap())
		}
	}
	if m.Type == proxy.LoadBalancer {
		for _, ip := range svc.LoadBalancerIPs {
			if a, err := netip.ParseAddr(ip); err == nil && fam(a) {
				m.LoadBalancerIPs = append(m.LoadBalancerIPs, a.Unmap())
			}
		}
	}
	if m.Type == proxy.LoadBalancer {
		for _, r := range svc.SourceRanges {
			p, err := netip.ParsePrefix(strings.TrimSpace(r))
			if err != nil {
				continue // the API server validates these
			}
			m.Firewall = true
			if fam(p.Addr()) {
				m.SourceRanges = append(m.SourceRanges, p.Masked())
			}
		}
	}
	m.AffinityTimeout = svc.AffinityTimeout
	m.ExternalLocal, m.InternalLocal = svc.ExternalLocal, svc.InternalLocal
	if m.Type == proxy.LoadBalancer && m.ExternalLocal && validPort(svc.HealthCheckNodePort) {
		m.HealthCheckNodePort = uint16(svc.HealthCheckNodePort)
	}
	if len(svc.Ports) > 0 {
		m.Ports = make([]proxy.ServicePort, 0, len(svc.Ports))
	}
	for _, sp := range svc.Ports {
		proto := proxy.Protocol(strings.ToLower(string(protocolOf(sp.Protocol))))
		// The API server validates these; a port that slipped through would
		// make nft refuse the whole transaction, so it is left out here.
		if (proto != proxy.TCP && proto != proxy.UDP && proto != proxy.SCTP) || !validPort(sp.Port) {
			continue
		}
		p := proxy.ServicePort{Name: sp.Name, Protocol: proto, Port: uint16(sp.Port)}
		if m.Type != proxy.ClusterIP && validPort(sp.NodePort) {
			p.NodePort = uint16(sp.NodePort)
		}
		p.Endpoints = endpoints(sp, slices, fam)
		m.Ports = append(m.Ports, p)
	}
	return m
}

func validPort(p int32) bool { return p > 0 && p <= 65535 }

func protocolOf(p v1.Protocol) v1.Protocol {
	if p == "" {
		return v1.ProtocolTCP
	}
	return p
}

func endpoints(sp SvcPort, sls []*Slice, fam func(netip.Addr) bool) []proxy.Endpoint {
	n := 0
	for _, sl := range sls {
		n += len(sl.Endpoints)
	}
	out := make([]proxy.Endpoint, 0, n)
	for _, sl := range sls {
		var port *SlicePort
		for i := range sl.Ports {
			if pp := &sl.Ports[i]; pp.Name == sp.Name && pp.Protocol == protocolOf(sp.Protocol) {
				port = pp
				break
			}
		}
		if port == nil || !validPort(port.Port) {
			continue
		}
		for _, e := range sl.Endpoints {
			if !fam(e.Addr) {
				continue
			}
			out = append(out, proxy.Endpoint{IP: e.Addr, Port: uint16(port.Port), Ready: e.Ready, Serving: e.Serving,
				Terminating: e.Terminating, NodeName: e.NodeName})
		}
	}
	// Sorted, and an address:port listed twice counts once, as it came
	// first: a stable sort keeps the first of equals first.
	slices.SortStableFunc(out, func(x, y proxy.Endpoint) int {
		return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.Port, y.Port))
	})
	out = slices.CompactFunc(out, func(x, y proxy.Endpoint) bool { return x.IP == y.IP && x.Port == y.Port })
	if len(out) == 0 {
		return nil // as before: a port without endpoints has none
	}
	return out
}
