// Package records is the cluster DNS index and the pure answer logic of the
// Kubernetes DNS-based service discovery spec (schema 1.0.1). No sockets here:
// the server (later) turns a Result into a wire message.
//
// Design note.
//   - Where the index lives: in the agent's memory, one Index per cluster zone,
//     fed by plain Upsert/Delete calls per Service, EndpointSlice and Pod (the
//     informer handlers call them; FromClientset fills it in tests).
//   - What it stores: stripped-down objects (the fields DNS needs, as in
//     CoreDNS's plugin/kubernetes/object), never full API objects, plus the
//     records derived from them, built once per change: for every Service a set
//     of owner names (lower case, fully qualified) each with its record sets,
//     the PTR records of its addresses, and for verified pod records the pod
//     IPs per namespace.
//   - How reads stay cheap: a write rebuilds only the one Service it touches
//     (O(its endpoints)) and swaps its names in the shared maps under the write
//     lock; a read takes the read lock, does one or two map lookups and returns
//     the prebuilt records (shared and immutable: callers must not modify them;
//     the slices are capped so an append copies). Nothing is computed per query
//     beyond parsing the name.
package records

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// PodMode is the meaning of a-b-c-d.ns.pod.<zone> records, as CoreDNS's
// "pods" option.
type PodMode int

const (
	// PodsVerified answers only IPs of existing pods in that namespace.
	PodsVerified PodMode = iota
	// PodsInsecure answers any well-formed name with the IP it spells.
	PodsInsecure
	// PodsDisabled answers NXDOMAIN for every pod name.
	PodsDisabled
)

// ParsePodMode reads a flag value.
func ParsePodMode(s string) (PodMode, error) {
	switch s {
	case "verified", "":
		return PodsVerified, nil
	case "insecure":
		return PodsInsecure, nil
	case "disabled":
		return PodsDisabled, nil
	}
	return 0, fmt.Errorf("pod records mode %q: want disabled, insecure or verified", s)
}

func (m PodMode) String() string {
	return [...]string{"verified", "insecure", "disabled"}[m]
}

// Config is the zone an Index serves.
type Config struct {
	// Zone is the cluster domain; cluster.local when empty.
	Zone string
	// TTL of every record and of negative answers; 5 s when zero.
	TTL uint32
	// Pods is the pod records mode; verified by default.
	Pods PodMode
	// ReverseCIDRs (the Service and pod CIDRs) are answered authoritatively:
	// a PTR query for an address inside them that names nothing is NXDOMAIN.
	// Other reverse names are answered when the address is known and
	// forwarded otherwise.
	ReverseCIDRs []netip.Prefix
}

const (
	DefaultZone = "cluster.local"
	DefaultTTL  = 5
	// SchemaVersion is the spec version answered at dns-version.<zone>.
	SchemaVersion = "1.0.1"
)

// tolerateUnreadyAnnotation is the old spelling of
// publishNotReadyAddresses, which CoreDNS still honours.
const tolerateUnreadyAnnotation = "service.alpha.kubernetes.io/tolerate-unready-endpoints"

type key struct{ ns, name string }

// service is the part of a Service DNS needs.
type service struct {
	headless        bool
	externalName    string // FQDN, for type ExternalName
	clusterIPs      []netip.Addr
	ports           []port // named ports only
	publishNotReady bool
}

type port struct {
	name  string // lower case
	proto string // lower case: tcp, udp, sctp
	port  uint16
}

// slice is the part of an EndpointSlice DNS needs.
type slice struct {
	service   string // kubernetes.io/service-name
	ports     []port // named ports only
	endpoints []endpoint
}

type endpoint struct {
	addrs    []netip.Addr
	hostname string
	ready    bool // ready, or unknown
	serving  bool // serving (ready when unknown)
}

// rrsets is one owner name's records, one set per type in type order. A
// name with no records at all is an empty non-terminal: it exists
// (NODATA), it has nothing. (Slices, not maps: a name has one to three
// types, and a small map costs ten times the memory.)
type rrsets []rrset

type rrset struct {
	t   uint16
	rrs []dns.RR
}

// get is the records of type t.
func (s rrsets) get(t uint16) []dns.RR {
	for _, x := range s {
		if x.t == t {
			return x.rrs
		}
	}
	return nil
}

// add returns s with rr added to its type's set.
func (s rrsets) add(rr dns.RR) rrsets {
	t := rr.Header().Rrtype
	for i := range s {
		if s[i].t == t {
			s[i].rrs = append(s[i].rrs, rr)
			return s
		}
	}
	s = append(s, rrset{t: t, rrs: []dns.RR{rr}})
	slices.SortFunc(s, func(a, b rrset) int { return int(a.t) - int(b.t) })
	return s
}

// built is what one Service contributes to the shared maps, in name and
// address order.
type built struct {
	names []named
	ptrs  []addrRRs
}

type named struct {
	name string
	sets rrsets
}

type addrRRs struct {
	a   netip.Addr
	rrs []dns.RR
}

// keyedRRs are the PTR records one Service gives an address.
type keyedRRs struct {
	k   key
	rrs []dns.RR
}

// builder collects a Service's records before they are frozen into a
// built.
type builder struct {
	names map[string]rrsets
	ptrs  map[netip.Addr][]dns.RR
}

// Index holds the cluster's DNS records. It is safe for concurrent use.
type Index struct {
	zone    string // lower case, fully qualified, e.g. "cluster.local."
	svcZone string // "svc." + zone
	podZone string // "pod." + zone
	ttl     uint32
	pods    PodMode
	reverse []netip.Prefix
	soa     *dns.SOA
	soaNs   []dns.RR // the authority section of negative answers, shared
	version *dns.TXT

	// gen counts changes to any answer; the server's packed-reply cache
	// keys on it. Writes that change nothing DNS answers (a pod's status,
	// a ClusterIP Service's slice) leave it alone.
	gen atomic.Uint64
	// podsPending: the pod list is still coming (AwaitPods), so a
	// verified pod name cannot be told missing yet.
	podsPending atomic.Bool

	mu       sync.RWMutex
	services map[key]*service
	slices   map[key]*slice          // by the slice's own name
	bySvc    map[key]map[string]bool // service -> names of its slices
	built    map[key]*built
	names    map[string]rrsets             // owner name -> records
	nsCount  map[string]int                // namespace -> Services with records
	ptrs     map[netip.Addr][]keyedRRs     // address -> PTRs by Service
	podIPs   map[key][]netip.Addr          // pod -> its IPs
	podAddrs map[string]map[netip.Addr]int // namespace -> IP -> pods holding it
	ipNS     map[netip.Addr]map[string]int // IP -> namespace -> pods holding it
}

// New returns an empty Index for cfg.
func New(cfg Config) (*Index, error) {
	zone := strings.ToLower(strings.Trim(cfg.Zone, "."))
	if zone == "" {
		zone = DefaultZone
	}
	zone = dns.Fqdn(zone)
	if _, ok := dns.IsDomainName(zone); !ok {
		return nil, fmt.Errorf("cluster zone %q is not a domain name", cfg.Zone)
	}
	ttl := cfg.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	ix := &Index{
		zone: zone, svcZone: "svc." + zone, podZone: "pod." + zone,
		ttl: ttl, pods: cfg.Pods, reverse: cfg.ReverseCIDRs,
		services: map[key]*service{}, slices: map[key]*slice{}, bySvc: map[key]map[string]bool{},
		built: map[key]*built{}, names: map[string]rrsets{}, nsCount: map[string]int{},
		ptrs: map[netip.Addr][]keyedRRs{}, podIPs: map[key][]netip.Addr{}, podAddrs: map[string]map[netip.Addr]int{},
		ipNS: map[netip.Addr]map[string]int{},
	}
	// The serial carries no meaning: nobody transfers this zone.
	ix.soa = &dns.SOA{
		Hdr: hdr(zone, dns.TypeSOA, ttl), Ns: "ns.dns." + zone, Mbox: "hostmaster." + zone,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: ttl,
	}
	ix.soaNs = []dns.RR{ix.soa}
	ix.version = &dns.TXT{Hdr: hdr("dns-version."+zone, dns.TypeTXT, ttl), Txt: []string{SchemaVersion}}
	return ix, nil
}

// Zone is the served cluster domain, fully qualified.
func (ix *Index) Zone() string { return ix.zone }

// TTL is the TTL of every record and negative answer.
func (ix *Index) TTL() uint32 { return ix.ttl }

// Generation changes whenever an answer may have changed.
func (ix *Index) Generation() uint64 { return ix.gen.Load() }

// AwaitPods says the pods are still being listed: until PodsSynced, a pod
// name in verified mode gets SERVFAIL, which resolvers retry, rather than
// an NXDOMAIN they would cache for a pod that exists. The Service names
// are answered meanwhile (at a restart in a large cluster the pod list
// takes far longer than the Services'). Other pod modes do not read the
// pod list for pod names.
func (ix *Index) AwaitPods() {
	if ix.pods == PodsVerified {
		ix.podsPending.Store(true)
		ix.gen.Add(1)
	}
}

// PodsSynced ends AwaitPods: the pod list is in.
func (ix *Index) PodsSynced() {
	if ix.podsPending.Swap(false) {
		ix.gen.Add(1)
	}
}

// NamespaceOf is the namespace of the pod holding ip, for answers that
// depend on the asker (autopath). An address held by pods of several
// namespaces (host-network pods share the node's) has none.
func (ix *Index) NamespaceOf(ip netip.Addr) (string, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	m := ix.ipNS[ip.Unmap()]
	if len(m) != 1 {
		return "", false
	}
	for ns := range m {
		return ns, true
	}
	return "", false
}

func hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

// UpsertService adds or replaces a Service.
func (ix *Index) UpsertService(s *corev1.Service) {
	k := key{s.Namespace, s.Name}
	st := stripService(s)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.services[k] = st
	ix.rebuild(k)
}

// DeleteService removes a Service and its records; its slices stay until
// they are deleted themselves.
func (ix *Index) DeleteService(namespace, name string) {
	k := key{namespace, name}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	delete(ix.services, k)
	ix.rebuild(k)
}

// UpsertEndpointSlice adds or replaces an EndpointSlice; a slice without
// the kubernetes.io/service-name label belongs to no Service.
func (ix *Index) UpsertEndpointSlice(es *discoveryv1.EndpointSlice) {
	k := key{es.Namespace, es.Name}
	st := stripSlice(es)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	old := ix.slices[k]
	ix.slices[k] = st
	if old != nil && old.service != st.service {
		ix.unlinkSlice(key{k.ns, old.service}, k.name)
	}
	if st.service != "" {
		sk := key{k.ns, st.service}
		if ix.bySvc[sk] == nil {
			ix.bySvc[sk] = map[string]bool{}
		}
		ix.bySvc[sk][k.name] = true
		ix.rebuild(sk)
	}
}

// DeleteEndpointSlice removes an EndpointSlice.
func (ix *Index) DeleteEndpointSlice(namespace, name string) {
	k := key{namespace, name}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	old := ix.slices[k]
	if old == nil {
		return
	}
	delete(ix.slices, k)
	ix.unlinkSlice(key{namespace, old.service}, name)
}

func (ix *Index) unlinkSlice(sk key, slice string) {
	if sk.name == "" {
		return
	}
	delete(ix.bySvc[sk], slice)
	if len(ix.bySvc[sk]) == 0 {
		delete(ix.bySvc, sk)
	}
	ix.rebuild(sk)
}

// UpsertPod records a pod's IPs (for verified pod records).
func (ix *Index) UpsertPod(p *corev1.Pod) {
	k := key{p.Namespace, p.Name}
	var ips []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	if len(ips) == 0 {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if slices.Equal(ix.podIPs[k], ips) {
		return // status churn: nothing DNS answers changed
	}
	ix.dropPod(k)
	if len(ips) == 0 {
		return
	}
	ix.gen.Add(1)
	ix.podIPs[k] = ips
	m := ix.podAddrs[k.ns]
	if m == nil {
		m = map[netip.Addr]int{}
		ix.podAddrs[k.ns] = m
	}
	for _, a := range ips {
		m[a]++
		n := ix.ipNS[a]
		if n == nil {
			n = map[string]int{}
			ix.ipNS[a] = n
		}
		n[k.ns]++
	}
}

// DeletePod forgets a pod.
func (ix *Index) DeletePod(namespace, name string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.dropPod(key{namespace, name})
}

func (ix *Index) dropPod(k key) {
	if _, ok := ix.podIPs[k]; !ok {
		return
	}
	ix.gen.Add(1)
	m := ix.podAddrs[k.ns]
	for _, a := range ix.podIPs[k] {
		if m[a]--; m[a] <= 0 {
			delete(m, a)
		}
		if n := ix.ipNS[a]; n != nil {
			if n[k.ns]--; n[k.ns] <= 0 {
				delete(n, k.ns)
			}
			if len(n) == 0 {
				delete(ix.ipNS, a)
			}
		}
	}
	if len(m) == 0 {
		delete(ix.podAddrs, k.ns)
	}
	delete(ix.podIPs, k)
}

func stripService(s *corev1.Service) *service {
	st := &service{publishNotReady: s.Spec.PublishNotReadyAddresses ||
		s.Annotations[tolerateUnreadyAnnotation] == "true"}
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		if s.Spec.ExternalName != "" {
			st.externalName = dns.Fqdn(strings.ToLower(s.Spec.ExternalName))
		}
		return st
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if ip == corev1.ClusterIPNone {
			st.headless = true
			continue
		}
		if a, err := netip.ParseAddr(ip); err == nil {
			st.clusterIPs = append(st.clusterIPs, a.Unmap())
		}
	}
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			st.ports = append(st.ports, newPort(p.Name, p.Protocol, p.Port))
		}
	}
	return st
}

func newPort(name string, proto corev1.Protocol, num int32) port {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	return port{name: strings.ToLower(name), proto: strings.ToLower(string(proto)), port: uint16(num)}
}

func stripSlice(es *discoveryv1.EndpointSlice) *slice {
	st := &slice{service: es.Labels[discoveryv1.LabelServiceName]}
	for _, p := range es.Ports {
		if p.Name != nil && *p.Name != "" && p.Port != nil {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			st.ports = append(st.ports, newPort(*p.Name, proto, *p.Port))
		}
	}
	for _, e := range es.Endpoints {
		// A nil condition is unknown and counts as ready (the API's rule);
		// serving falls back to ready.
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		serving := ready
		if e.Conditions.Serving != nil {
			serving = *e.Conditions.Serving
		}
		ep := endpoint{ready: ready, serving: serving}
		if e.Hostname != nil {
			ep.hostname = strings.ToLower(*e.Hostname)
		}
		for _, a := range e.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				ep.addrs = append(ep.addrs, ip.Unmap())
			}
		}
		if len(ep.addrs) > 0 {
			st.endpoints = append(st.endpoints, ep)
		}
	}
	return st
}

// rebuild recomputes Service k's records and swaps them into the shared
// maps. Callers hold the write lock.
func (ix *Index) rebuild(k key) {
	var b *built
	if s := ix.services[k]; s != nil {
		if b = ix.build(k, s); len(b.names) == 0 {
			b = nil
		}
	}
	old := ix.built[k]
	if sameBuilt(old, b) {
		return
	}
	ix.gen.Add(1)
	if old != nil {
		for _, n := range old.names {
			delete(ix.names, n.name)
		}
		for _, p := range old.ptrs {
			ks := slices.DeleteFunc(ix.ptrs[p.a], func(x keyedRRs) bool { return x.k == k })
			if len(ks) == 0 {
				delete(ix.ptrs, p.a)
			} else {
				ix.ptrs[p.a] = ks
			}
		}
		if ix.nsCount[k.ns]--; ix.nsCount[k.ns] <= 0 {
			delete(ix.nsCount, k.ns)
		}
		delete(ix.built, k)
	}
	if b == nil {
		return
	}
	ix.built[k] = b
	ix.nsCount[k.ns]++
	for _, n := range b.names {
		ix.names[n.name] = n.sets
	}
	for _, p := range b.ptrs {
		ks := append(ix.ptrs[p.a], keyedRRs{k: k, rrs: p.rrs})
		// In Service order, so that answers are stable.
		slices.SortFunc(ks, func(x, y keyedRRs) int {
			return cmp.Or(strings.Compare(x.k.ns, y.k.ns), strings.Compare(x.k.name, y.k.name))
		})
		ix.ptrs[p.a] = ks
	}
}

// sameBuilt reports whether two builds of a Service hold the same records
// (build is deterministic, so order counts).
func sameBuilt(a, b *built) bool {
	if a == nil || b == nil {
		return a == b
	}
	same := func(x, y []dns.RR) bool {
		return slices.EqualFunc(x, y, func(r1, r2 dns.RR) bool { return dns.IsDuplicate(r1, r2) })
	}
	return slices.EqualFunc(a.names, b.names, func(x, y named) bool {
		return x.name == y.name && slices.EqualFunc(x.sets, y.sets, func(p, q rrset) bool { return p.t == q.t && same(p.rrs, q.rrs) })
	}) && slices.EqualFunc(a.ptrs, b.ptrs, func(x, y addrRRs) bool { return x.a == y.a && same(x.rrs, y.rrs) })
}

func (ix *Index) build(k key, s *service) *built {
	b := &builder{names: map[string]rrsets{}, ptrs: map[netip.Addr][]dns.RR{}}
	owner := k.name + "." + k.ns + "." + ix.svcZone
	switch {
	case s.externalName != "":
		b.add(owner, &dns.CNAME{Hdr: hdr(owner, dns.TypeCNAME, ix.ttl), Target: s.externalName})
	case len(s.clusterIPs) > 0:
		for _, a := range s.clusterIPs {
			b.add(owner, ix.addrRR(owner, a))
			b.ptr(a, ix.ptrRR(a, owner))
		}
		for _, p := range s.ports {
			b.add1(ix.srvRR(p, owner, k))
		}
	case s.headless:
		ix.buildHeadless(b, k, s, owner)
	}
	// Every ancestor of a name up to the Service's name exists: SRV names
	// make _proto.<svc> an empty non-terminal.
	for name := range b.names {
		if i := strings.IndexByte(name, '.'); strings.HasPrefix(name, "_") && i > 0 {
			if parent := name[i+1:]; !hasName(b.names, parent) {
				b.names[parent] = nil
			}
		}
	}
	return b.freeze()
}

func hasName(m map[string]rrsets, name string) bool {
	_, ok := m[name]
	return ok
}

// freeze turns the builder's maps into a built's sorted slices.
func (b *builder) freeze() *built {
	out := &built{names: make([]named, 0, len(b.names)), ptrs: make([]addrRRs, 0, len(b.ptrs))}
	for name, sets := range b.names {
		out.names = append(out.names, named{name: name, sets: slices.Clip(sets)})
	}
	slices.SortFunc(out.names, func(x, y named) int { return strings.Compare(x.name, y.name) })
	for a, rrs := range b.ptrs {
		out.ptrs = append(out.ptrs, addrRRs{a: a, rrs: slices.Clip(rrs)})
	}
	slices.SortFunc(out.ptrs, func(x, y addrRRs) int { return x.a.Compare(y.a) })
	return out
}

func (ix *Index) buildHeadless(b *builder, k key, s *service, owner string) {
	// Slices in name order so that answers are stable.
	names := make([]string, 0, len(ix.bySvc[k]))
	for n := range ix.bySvc[k] {
		names = append(names, n)
	}
	slices.Sort(names)
	seenAddr := map[netip.Addr]bool{}
	seenHost := map[string]bool{}   // "host addr"
	seenTarget := map[string]bool{} // "port target"
	for _, n := range names {
		sl := ix.slices[key{k.ns, n}]
		for _, e := range sl.endpoints {
			if !e.ready && !(s.publishNotReady && e.serving) {
				continue
			}
			for _, a := range e.addrs {
				// The spec's "system-assigned identifier" of an endpoint
				// without a hostname is its address, dashed (as CoreDNS).
				host := e.hostname
				if host == "" {
					host = dashed(a)
				}
				target := host + "." + owner
				if !seenAddr[a] {
					seenAddr[a] = true
					b.add(owner, ix.addrRR(owner, a))
				}
				if hk := host + " " + a.String(); !seenHost[hk] {
					seenHost[hk] = true
					b.add(target, ix.addrRR(target, a))
					b.ptr(a, ix.ptrRR(a, target))
				}
				for _, p := range sl.ports {
					if tk := p.name + "/" + p.proto + " " + target; !seenTarget[tk] {
						seenTarget[tk] = true
						b.add1(ix.srvRR(p, target, k))
					}
				}
			}
		}
	}
}

func (b *builder) add(name string, rr dns.RR) { b.names[name] = b.names[name].add(rr) }

func (b *builder) ptr(a netip.Addr, rr dns.RR) { b.ptrs[a] = append(b.ptrs[a], rr) }

func (b *builder) add1(rr dns.RR) { b.add(rr.Header().Name, rr) }

func (ix *Index) srvRR(p port, target string, k key) *dns.SRV {
	name := "_" + p.name + "._" + p.proto + "." + k.name + "." + k.ns + "." + ix.svcZone
	return &dns.SRV{Hdr: hdr(name, dns.TypeSRV, ix.ttl), Priority: 0, Weight: 100, Port: p.port, Target: target}
}

func (ix *Index) addrRR(name string, a netip.Addr) dns.RR {
	if a.Is4() {
		return &dns.A{Hdr: hdr(name, dns.TypeA, ix.ttl), A: a.AsSlice()}
	}
	return &dns.AAAA{Hdr: hdr(name, dns.TypeAAAA, ix.ttl), AAAA: a.AsSlice()}
}

func (ix *Index) ptrRR(a netip.Addr, target string) dns.RR {
	name, _ := dns.ReverseAddr(a.String())
	return &dns.PTR{Hdr: hdr(name, dns.TypePTR, ix.ttl), Ptr: target}
}

// dashed spells an address as one label: 10-1-2-3, fd00--1.
func dashed(a netip.Addr) string {
	if a.Is4() {
		return strings.ReplaceAll(a.String(), ".", "-")
	}
	return strings.ReplaceAll(a.String(), ":", "-")
}
