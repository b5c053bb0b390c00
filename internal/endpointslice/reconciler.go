// Package endpointslice is flatnet's EndpointSlice controller: for every
// Service with a selector it writes discovery.k8s.io/v1 EndpointSlices
// from the matching pods, as kube-controller-manager's controller does,
// under flatnet's own managed-by value.
//
// Design. Plan (this file) is pure: given one Service, its pods, a node
// lookup and the slices that exist, it returns what to create, update and
// delete. It follows the shape of upstream's reconciler
// (k8s.io/endpointslice): endpoints are grouped per address type and per
// port mapping (pods whose named targetPorts resolve to different numbers
// get different slices); existing slices keep the endpoints still wanted
// (updated in place when an endpoint changed), then slices already being
// updated are filled, fullest first, then the leftovers go into the one
// unchanged slice they fit best, and only then into new slices. Deletes
// that would coincide with creates become updates of the doomed slice, so
// a change of ports rewrites a slice instead of churning its name. A
// Service with no endpoints keeps one empty placeholder slice per family,
// as upstream does. Every slice the plan creates or updates (and only
// those) carries the sync's trigger time in the
// endpoints.kubernetes.io/last-change-trigger-time annotation
// (RFC 3339 with nanoseconds, UTC), or loses the annotation when the
// trigger time is zero; the caller computes it (triggertime.go), so the
// plan stays a function of its arguments. Unlike upstream, the order is
// deterministic (pods in name order), so a test can compare plans
// literally. Not done (yet): topology hints / trafficDistribution.
// controller.go applies the plan.
package endpointslice

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
// slices flatnet writes (kube-controller-manager writes
// "endpointslice-controller.k8s.io"; the two never touch each other's).
const ManagedBy = "endpointslice.flatnet.io"

// DefaultMaxEndpointsPerSlice is upstream's default.
const DefaultMaxEndpointsPerSlice = 100

// Plan is what to write for one Service. Create entries have no Name
// (the applier names them from GenerateName).
type Plan struct {
	Create, Update, Delete []*discovery.EndpointSlice
}

// Empty reports whether the plan writes nothing.
func (p Plan) Empty() bool { return len(p.Create)+len(p.Update)+len(p.Delete) == 0 }

// NodeGetter looks up a Node by name; (nil, false) when it does not exist.
type NodeGetter func(name string) (*corev1.Node, bool)

// MissingNodeError reports pods left out because their node is unknown
// (the plan is still valid; the caller retries later).
type MissingNodeError struct{ Pods []string }

func (e *MissingNodeError) Error() string {
	return fmt.Sprintf("pods left out, node not found: %s", strings.Join(e.Pods, ", "))
}

// Reconcile computes the plan that makes existing (the slices labelled
// with svc's name and managed by flatnet) match pods (those selected by
// svc). The slices it creates or updates carry triggerTime (see
// TriggerTimeTracker; zero: none). It never modifies its arguments. A
// non-nil error is a *MissingNodeError; the plan is to be applied anyway.
func Reconcile(svc *corev1.Service, pods []*Pod, nodes NodeGetter, existing []*discovery.EndpointSlice, maxPerSlice int, triggerTime time.Time) (Plan, error) {
	if maxPerSlice < 1 {
		maxPerSlice = DefaultMaxEndpointsPerSlice
	}
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b *Pod) int { return cmp.Compare(a.Name, b.Name) })

	var plan Plan
	families := addressTypes(svc)
	byType := map[discovery.AddressType][]*discovery.EndpointSlice{}
	for _, s := range existing {
		if !slices.Contains(families, s.AddressType) {
			plan.Delete = append(plan.Delete, s)
			continue
		}
		byType[s.AddressType] = append(byType[s.AddressType], s)
	}
	var missing []string
	for _, at := range families {
		p, miss := reconcileType(svc, pods, nodes, byType[at], at, maxPerSlice)
		missing = append(missing, miss...)
		plan.Create = append(plan.Create, p.Create...)
		plan.Update = append(plan.Update, p.Update...)
		plan.Delete = append(plan.Delete, p.Delete...)
	}
	// Creates are new objects and updates deep copies: ours to annotate.
	for _, s := range plan.Create {
		stampTriggerTime(s, triggerTime)
	}
	for _, s := range plan.Update {
		stampTriggerTime(s, triggerTime)
	}
	var err error
	if len(missing) > 0 {
		slices.Sort(missing)
		err = &MissingNodeError{Pods: slices.Compact(missing)}
	}
	return plan, err
}

// group is the desired endpoints sharing one port mapping.
type group struct {
	ports []discovery.EndpointPort
	eps   map[string]discovery.Endpoint // by endpointKey
	order []string                      // keys in pod order
}

func reconcileType(svc *corev1.Service, pods []*Pod, nodes NodeGetter, existing []*discovery.EndpointSlice, at discovery.AddressType, maxPerSlice int) (Plan, []string) {
	var plan Plan
	existingByPorts := map[string][]*discovery.EndpointSlice{}
	for _, s := range existing {
		if !OwnedBy(s, svc) {
			plan.Delete = append(plan.Delete, s) // left by an older Service of the same name
			continue
		}
		k := portsKey(s.Ports)
		existingByPorts[k] = append(existingByPorts[k], s)
	}

	desired := map[string]*group{}
	var groupOrder []string
	var missing []string
	for _, pod := range pods {
		if !pod.wanted() {
			continue
		}
		// A pod whose node is unknown (or unset) is left out, unless the
		// Service publishes everything, as upstream does.
		node, ok := nodes(pod.NodeName)
		if !ok && !svc.Spec.PublishNotReadyAddresses {
			missing = append(missing, pod.Namespace+"/"+pod.Name)
			continue
		}
		ep := podEndpoint(pod, node, svc, at)
		if len(ep.Addresses) == 0 {
			continue
		}
		ports := endpointPorts(svc, pod)
		pk := portsKey(ports)
		g := desired[pk]
		if g == nil {
			g = &group{ports: ports, eps: map[string]discovery.Endpoint{}}
			desired[pk] = g
			groupOrder = append(groupOrder, pk)
		}
		k := endpointKey(&ep)
		if _, dup := g.eps[k]; !dup {
			g.order = append(g.order, k)
		}
		g.eps[k] = ep
	}

	for _, pk := range groupOrder {
		p := reconcilePorts(svc, existingByPorts[pk], desired[pk], at, maxPerSlice)
		plan.Create = append(plan.Create, p.Create...)
		plan.Update = append(plan.Update, p.Update...)
		plan.Delete = append(plan.Delete, p.Delete...)
	}
	for _, pk := range slices.Sorted(maps.Keys(existingByPorts)) {
		if _, ok := desired[pk]; !ok {
			plan.Delete = append(plan.Delete, existingByPorts[pk]...)
		}
	}

	// A Service without endpoints keeps one empty placeholder slice.
	if len(existing) == len(plan.Delete) && len(plan.Create) == 0 {
		ph := newSlice(svc, nil, at)
		if len(plan.Delete) == 1 && isPlaceholder(plan.Delete[0], ph) {
			plan.Delete = nil
		} else {
			plan.Create = append(plan.Create, ph)
		}
	}

	// Turn create+delete pairs into updates of the slice to be deleted
	// (keeping its annotations other than the trigger time, which
	// upstream's rewrite, a fresh object, drops).
	for i := 0; i < len(plan.Delete) && len(plan.Create) > 0; {
		d := plan.Delete[i]
		c := plan.Create[len(plan.Create)-1]
		if d.AddressType != c.AddressType || !OwnedBy(d, svc) {
			i++
			continue
		}
		u := d.DeepCopy()
		u.Labels, u.Ports, u.Endpoints = c.Labels, c.Ports, c.Endpoints
		u.OwnerReferences = c.OwnerReferences
		plan.Create = plan.Create[:len(plan.Create)-1]
		plan.Update = append(plan.Update, u)
		plan.Delete = slices.Delete(plan.Delete, i, i+1)
	}
	// Never create for a Service being deleted (the slices go with it).
	if svc.DeletionTimestamp != nil {
		plan.Create = nil
	}
	return plan, missing
}

// reconcilePorts plans the slices of one port mapping.
func reconcilePorts(svc *corev1.Service, existing []*discovery.EndpointSlice, g *group, at discovery.AddressType, maxPerSlice int) Plan {
	var plan Plan
	left := map[string]bool{}
	for _, k := range g.order {
		left[k] = true
	}
	var updated, unchanged []*discovery.EndpointSlice
	for _, s := range existing {
		var keep []discovery.Endpoint
		changed := false
		for i := range s.Endpoints {
			k := endpointKey(&s.Endpoints[i])
			if !left[k] {
				continue // not wanted, or already placed in another slice
			}
			want := g.eps[k]
			keep = append(keep, want)
			if !changed && !endpointEqual(&want, &s.Endpoints[i]) {
				changed = true
			}
			delete(left, k)
		}
		labels, labelsChanged := sliceLabels(s.Labels, svc)
		switch {
		case len(keep) == 0:
			plan.Delete = append(plan.Delete, s)
		case changed || len(keep) != len(s.Endpoints) || labelsChanged:
			u := s.DeepCopy()
			u.Endpoints, u.Labels = keep, labels
			updated = append(updated, u)
		default:
			unchanged = append(unchanged, s)
		}
	}
	var rest []discovery.Endpoint
	for _, k := range g.order {
		if left[k] {
			rest = append(rest, g.eps[k])
		}
	}

	// Fill the slices being updated anyway, fullest first.
	sort.SliceStable(updated, func(i, j int) bool { return len(updated[i].Endpoints) > len(updated[j].Endpoints) })
	for _, u := range updated {
		n := min(maxPerSlice-len(u.Endpoints), len(rest))
		if n > 0 {
			u.Endpoints = append(u.Endpoints, rest[:n]...)
			rest = rest[n:]
		}
	}
	plan.Update = append(plan.Update, updated...)

	// Leftovers: into the unchanged slice they fill best, else new slices.
	for len(rest) > 0 {
		var fill *discovery.EndpointSlice
		if len(rest) < maxPerSlice {
			best := maxPerSlice
			bi := -1
			for i, s := range unchanged {
				if d := maxPerSlice - len(s.Endpoints) - len(rest); d >= 0 && d < best {
					best, bi = d, i
				}
			}
			if bi >= 0 {
				fill = unchanged[bi].DeepCopy()
				unchanged = slices.Delete(unchanged, bi, bi+1)
				plan.Update = append(plan.Update, fill)
			}
		}
		if fill == nil {
			fill = newSlice(svc, g.ports, at)
			plan.Create = append(plan.Create, fill)
		}
		n := min(maxPerSlice-len(fill.Endpoints), len(rest))
		fill.Endpoints = append(fill.Endpoints, rest[:n]...)
		rest = rest[n:]
	}
	return plan
}

// endpointEqual is apiequality.Semantic.DeepEqual of two endpoints (nil
// and empty slices and maps alike, pointers by what they point to)
// without reflection: a sync compares every endpoint of its Service, and
// the reflective walk allocated and cost about a microsecond an endpoint
// (BenchmarkEndpointEqual).
func endpointEqual(a, b *discovery.Endpoint) bool {
	return slices.Equal(a.Addresses, b.Addresses) &&
		ptrEqual(a.Conditions.Ready, b.Conditions.Ready) &&
		ptrEqual(a.Conditions.Serving, b.Conditions.Serving) &&
		ptrEqual(a.Conditions.Terminating, b.Conditions.Terminating) &&
		ptrEqual(a.Hostname, b.Hostname) &&
		ptrEqual(a.TargetRef, b.TargetRef) &&
		maps.Equal(a.DeprecatedTopology, b.DeprecatedTopology) &&
		ptrEqual(a.NodeName, b.NodeName) &&
		ptrEqual(a.Zone, b.Zone) &&
		hintsEqual(a.Hints, b.Hints)
}

func hintsEqual(a, b *discovery.EndpointHints) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.ForZones, b.ForZones) && slices.Equal(a.ForNodes, b.ForNodes)
}

// stampTriggerTime sets s's last-change-trigger-time annotation to t, in
// UTC with nanoseconds, or removes it when t is zero (a write with no
// known trigger must not keep an older one).
func stampTriggerTime(s *discovery.EndpointSlice, t time.Time) {
	if t.IsZero() {
		delete(s.Annotations, corev1.EndpointsLastChangeTriggerTime)
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = t.UTC().Format(time.RFC3339Nano)
}

// podEndpoint is pod's endpoint of address type at (no addresses when the
// pod has none of that family).
func podEndpoint(pod *Pod, node *corev1.Node, svc *corev1.Service, at discovery.AddressType) discovery.Endpoint {
	serving := pod.ready()
	terminating := pod.DeletionTimestamp != nil
	// ready is never true for a terminating pod, unless the Service asks
	// for not-ready addresses.
	ready := svc.Spec.PublishNotReadyAddresses || (serving && !terminating)
	ep := discovery.Endpoint{
		Addresses: podAddresses(pod, at),
		Conditions: discovery.EndpointConditions{
			Ready: &ready, Serving: &serving, Terminating: &terminating,
		},
		TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
	}
	if pod.NodeName != "" {
		n := pod.NodeName
		ep.NodeName = &n
	}
	if node != nil {
		if z := node.Labels[corev1.LabelTopologyZone]; z != "" {
			ep.Zone = &z
		}
	}
	if pod.Hostname != "" && pod.Subdomain == svc.Name && pod.Namespace == svc.Namespace {
		h := pod.Hostname
		ep.Hostname = &h
	}
	return ep
}

func podAddresses(pod *Pod, at discovery.AddressType) []string {
	var out []string
	for _, ip := range pod.IPs {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			a, err = parseSloppy(ip)
			if err != nil {
				continue
			}
		}
		a = a.Unmap()
		if (a.Is6() && at == discovery.AddressTypeIPv6) || (a.Is4() && at == discovery.AddressTypeIPv4) {
			out = append(out, a.String())
		}
	}
	return out
}

// parseSloppy accepts IPv4 with leading zeros ("010.001.002.003"), which
// old API servers let through and upstream reads as decimal.
func parseSloppy(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("bad IP %q", s)
	}
	var b [4]byte
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("bad IP %q", s)
		}
		b[i] = byte(v)
	}
	return netip.AddrFrom4(b), nil
}

// endpointPorts resolves svc's ports for pod; a named targetPort the pod
// does not have is left out for that pod.
func endpointPorts(svc *corev1.Service, pod *Pod) []discovery.EndpointPort {
	out := []discovery.EndpointPort{}
	if len(svc.Spec.Ports) == 0 && svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return out
	}
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		num, ok := FindPort(pod, sp)
		if !ok {
			continue
		}
		name, proto := sp.Name, sp.Protocol
		out = append(out, discovery.EndpointPort{Name: &name, Port: &num, Protocol: &proto, AppProtocol: sp.AppProtocol})
	}
	return out
}

// FindPort is the container port sp's targetPort means in pod: a number
// as is, a name looked up (same protocol) in the containers and in
// restartable (sidecar) init containers.
func FindPort(pod *Pod, sp *corev1.ServicePort) (int32, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int {
		return int32(tp.IntValue()), true
	}
	for _, ports := range [2][]corev1.ContainerPort{pod.Ports, pod.SidecarPorts} {
		for _, p := range ports {
			if p.Name == tp.StrVal && p.Protocol == sp.Protocol {
				return p.ContainerPort, true
			}
		}
	}
	return 0, false
}

// addressTypes are the slice address types of svc, from spec.ipFamilies
// (or, for Services written before families existed, the ClusterIP's
// family; both for a headless one).
func addressTypes(svc *corev1.Service) []discovery.AddressType {
	var out []discovery.AddressType
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			out = append(out, discovery.AddressTypeIPv4)
		case corev1.IPv6Protocol:
			out = append(out, discovery.AddressTypeIPv6)
		}
	}
	if len(out) > 0 {
		slices.Sort(out)
		return slices.Compact(out)
	}
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is6() && !a.Is4In6() {
			return []discovery.AddressType{discovery.AddressTypeIPv6}
		}
		return []discovery.AddressType{discovery.AddressTypeIPv4}
	}
	return []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6}
}

// newSlice is an empty slice of svc for ports (nil: the placeholder).
func newSlice(svc *corev1.Service, ports []discovery.EndpointPort, at discovery.AddressType) *discovery.EndpointSlice {
	if ports == nil {
		ports = []discovery.EndpointPort{}
	}
	labels, _ := sliceLabels(nil, svc)
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    namePrefix(svc.Name),
			Namespace:       svc.Namespace,
			Labels:          labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef(svc)},
		},
		AddressType: at,
		Ports:       ports,
		Endpoints:   []discovery.Endpoint{},
	}
}

func ownerRef(svc *corev1.Service) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{
		APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		Controller: &t, BlockOwnerDeletion: &t,
	}
}

// namePrefix is "<service>-", or the bare name when the dash would make
// it too long for a name.
func namePrefix(svc string) string {
	if len(svc)+1 > 253 {
		return svc
	}
	return svc + "-"
}

// OwnedBy reports whether s has svc (this very object, by UID) as owner.
func OwnedBy(s *discovery.EndpointSlice, svc *corev1.Service) bool {
	for _, o := range s.OwnerReferences {
		if o.UID == svc.UID && o.Kind == "Service" && o.APIVersion == "v1" {
			return true
		}
	}
	return false
}

func reservedLabel(k string) bool {
	return k == discovery.LabelServiceName || k == discovery.LabelManagedBy || k == corev1.IsHeadlessService
}

// sliceLabels are the labels a slice of svc carries: the Service's own
// (minus reserved keys), the headless marker, service-name and
// managed-by. changed reports whether the mirrored Service labels differ
// from current's.
func sliceLabels(current map[string]string, svc *corev1.Service) (map[string]string, bool) {
	cur, want := map[string]string{}, map[string]string{}
	for k, v := range current {
		if !reservedLabel(k) {
			cur[k] = v
		}
	}
	for k, v := range svc.Labels {
		if !reservedLabel(k) {
			want[k] = v
		}
	}
	changed := !maps.Equal(cur, want)
	// The reserved ones: changed too if they are wrong on the slice.
	headless := svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone
	if headless {
		want[corev1.IsHeadlessService] = ""
	}
	want[discovery.LabelServiceName] = svc.Name
	want[discovery.LabelManagedBy] = ManagedBy
	if current != nil {
		_, hadHeadless := current[corev1.IsHeadlessService]
		if hadHeadless != headless || current[discovery.LabelServiceName] != svc.Name || current[discovery.LabelManagedBy] != ManagedBy {
			changed = true
		}
	}
	return want, changed
}

func isPlaceholder(s, ph *discovery.EndpointSlice) bool {
	return len(s.Endpoints) == 0 && len(s.Ports) == 0 && s.AddressType == ph.AddressType &&
		apiequality.Semantic.DeepEqual(s.Labels, ph.Labels) &&
		apiequality.Semantic.DeepEqual(s.OwnerReferences, ph.OwnerReferences)
}

// endpointKey identifies an endpoint across syncs: its pod and addresses.
func endpointKey(ep *discovery.Endpoint) string {
	var b strings.Builder
	if r := ep.TargetRef; r != nil {
		b.WriteString(r.Namespace + "/" + r.Name + "|")
	}
	a := slices.Clone(ep.Addresses)
	slices.Sort(a)
	b.WriteString(strings.Join(a, ","))
	return b.String()
}

// portsKey identifies a port mapping regardless of order.
func portsKey(ports []discovery.EndpointPort) string {
	parts := make([]string, 0, len(ports))
	for _, p := range ports {
		var s strings.Builder
		if p.Name != nil {
			s.WriteString(*p.Name)
		}
		s.WriteString("/")
		if p.Protocol != nil {
			s.WriteString(string(*p.Protocol))
		}
		s.WriteString("/")
		if p.Port != nil {
			s.WriteString(strconv.Itoa(int(*p.Port)))
		}
		s.WriteString("/")
		if p.AppProtocol != nil {
			s.WriteString(*p.AppProtocol)
		}
		parts = append(parts, s.String())
	}
	slices.Sort(parts)
	return strings.Join(parts, ";")
}
