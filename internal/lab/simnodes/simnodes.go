// Package simnodes makes the lab's simulated nodes: Node objects that kwok
// (sigs.k8s.io/kwok) keeps Ready, and whose pods it marks Running with IPs
// from the node's podCIDR, while nothing runs behind them. They load the
// control plane and the real agents as real nodes would (flatnet's
// controller gives them podCIDRs and writes EndpointSlices for their pods;
// every agent programs a route, or VXLAN entries, to each of them), so the
// lab can measure flatnet at thousands of nodes on one machine.
//
// Design: a simulated node is plain data computed from its index alone
// (Config.Node): its name <lab>-sim-00001, its InternalIP the index-th
// address of a range no interface carries, its VTEP MAC made from the
// index. Scaling to n is a pure Plan (compare the nodes the API lists with
// the n wanted: create, update, delete lists) and one Apply, which runs the
// API calls in parallel with a client that has no client-side rate limit.
// Both the lab (`flatnet lab up --simulated-nodes N`) and the scale
// benchmark call them.
//
// What kwok is told: it manages only nodes carrying AnnotationKwok (its
// --manage-nodes-with-annotation-selector), so it never touches a real lab
// node; KwokConfig holds flatnet's own Stages (kwok.go).
//
// What is not real: a simulated InternalIP is held by nobody. The lab makes
// the range on-link on each real node's eth0 (inside the node namespace,
// never in the root namespace), so that host-gw routes via those addresses
// are accepted by the kernel; packets sent along them die unanswered on the
// lab's bridge (ARP gets no reply). Simulated pods answer no traffic.
package simnodes

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/agent/backend"
)

const (
	// AnnotationKwok marks a node kwok manages: kwok runs with
	// --manage-nodes-with-annotation-selector=AnnotationKwok=KwokValue.
	AnnotationKwok = "kwok.x-k8s.io/node"
	// KwokValue is AnnotationKwok's value on simulated nodes.
	KwokValue = "fake"
	// LabelSimulated marks a simulated node; its value is the lab's name.
	// Plan lists nodes by it.
	LabelSimulated = "flatnet.io/simulated"
	// TaintKey keeps the scheduler's pods off simulated nodes (NoSchedule,
	// value KwokValue): a Deployment of the lab must not land where
	// nothing runs. Pods bound with spec.nodeName ignore it.
	TaintKey = AnnotationKwok
	// NameInfix is between the lab's name and the index: <lab>-sim-00001.
	NameInfix = "-sim-"
	// indexDigits is the zero-padded width of the index in a name.
	indexDigits = 5
)

// DefaultIPRange holds the simulated nodes' InternalIPs (index i gets the
// i-th address): outside the lab's underlays (10.250.0.0/16) and its
// default load-balancer range (10.251.0.0/24). The lab checks it against
// the machine's routes like its other ranges.
var DefaultIPRange = netip.MustParsePrefix("10.252.0.0/16")

// Config says how a lab's simulated nodes are made.
type Config struct {
	// Lab is the lab's name: nodes are <Lab>-sim-00001 and so on, and
	// carry LabelSimulated=Lab.
	Lab string
	// IPRange holds the InternalIPs (DefaultIPRange when invalid).
	IPRange netip.Prefix
	// Backend is the lab's backend: vxlan and vxlan-direct nodes carry
	// the flatnet.io/ annotations a vxlan peer reads (backend, VTEP MAC,
	// public IP); host-gw nodes carry none (a host-gw agent reads only
	// podCIDRs and InternalIPs).
	Backend string
}

func (c Config) ipRange() netip.Prefix {
	if c.IPRange.IsValid() {
		return c.IPRange
	}
	return DefaultIPRange
}

// Name is the name of simulated node i (1-based) of lab.
func Name(lab string, i int) string {
	return fmt.Sprintf("%s%s%0*d", lab, NameInfix, indexDigits, i)
}

// Index is the index of simulated node name of lab; false when name is
// not one.
func Index(lab, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, lab+NameInfix)
	if !ok || len(rest) < indexDigits {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 1 || Name(lab, i) != name {
		return 0, false
	}
	return i, true
}

// MaxNodes is how many nodes range r numbers (its addresses without the
// first and the last).
func MaxNodes(r netip.Prefix) int {
	bits := r.Addr().BitLen() - r.Bits()
	if bits >= 31 {
		return 1<<31 - 2
	}
	return max(0, 1<<bits-2)
}

// InternalIP is simulated node i's address: the i-th of range r.
func InternalIP(r netip.Prefix, i int) (netip.Addr, error) {
	if !r.Addr().Is4() {
		return netip.Addr{}, fmt.Errorf("simulated node range %s: want IPv4", r)
	}
	if i < 1 || i > MaxNodes(r) {
		return netip.Addr{}, fmt.Errorf("simulated node %d: range %s numbers nodes 1 to %d", i, r, MaxNodes(r))
	}
	b := r.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
}

// VTEPMAC is simulated node i's VXLAN MAC: locally administered, unicast,
// 06:6b:<i in 32 bits>, so no two simulated nodes share one (a real
// agent's MAC is a hash of its name; 2^-46 odds of meeting one).
func VTEPMAC(i int) string {
	return fmt.Sprintf("06:6b:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i))
}

// Node is simulated node i (1-based) as created: labels, kwok's
// annotation, the taint, and status.addresses (the apiserver keeps a new
// Node's status, and kwok's node stage keeps the addresses it finds).
func (c Config) Node(i int) (*corev1.Node, error) {
	ip, err := InternalIP(c.ipRange(), i)
	if err != nil {
		return nil, err
	}
	name := Name(c.Lab, i)
	ann := map[string]string{AnnotationKwok: KwokValue}
	if c.Backend == backend.VXLAN || c.Backend == backend.VXLANDirect {
		ann[backend.AnnotationBackend] = c.Backend
		ann[backend.AnnotationVTEPMAC] = VTEPMAC(i)
		ann[backend.AnnotationPublicIP] = ip.String()
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				LabelSimulated:           c.Lab,
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				// The kubelet registers a Node with the beta labels too;
				// without them kube-controller-manager's node lifecycle
				// controller adds them, a GET and a PATCH per Node at 20
				// QPS (eight minutes of Node updates at 5,000 nodes).
				"beta.kubernetes.io/os":   "linux",
				"beta.kubernetes.io/arch": "amd64",
			},
			Annotations: ann,
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: TaintKey, Value: KwokValue, Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: ip.String()},
				{Type: corev1.NodeHostName, Address: name},
			},
		},
	}, nil
}

// Selector is the label selector of lab's simulated nodes.
func Selector(lab string) string { return LabelSimulated + "=" + lab }

// Plan is what makes the simulated nodes exactly 1..n.
type Plan struct {
	// Create are the missing nodes, by index.
	Create []*corev1.Node
	// Update are existing nodes with the labels, annotations and taint
	// they lack added (another backend since they were made).
	Update []*corev1.Node
	// Delete are the names of nodes beyond n (or not named as simulated
	// node of this lab), with their pods.
	Delete []string
}

// Empty reports whether p changes nothing.
func (p Plan) Empty() bool { return len(p.Create)+len(p.Update)+len(p.Delete) == 0 }

// Plan compares existing (the nodes listed with Selector) with the n
// nodes wanted. It is pure: existing is not modified.
func (c Config) Plan(existing []corev1.Node, n int) (Plan, error) {
	if n < 0 || n > MaxNodes(c.ipRange()) {
		return Plan{}, fmt.Errorf("%d simulated nodes: range %s holds 0 to %d", n, c.ipRange(), MaxNodes(c.ipRange()))
	}
	var p Plan
	have := map[int]*corev1.Node{}
	for k := range existing {
		e := &existing[k]
		i, ok := Index(c.Lab, e.Name)
		if !ok || i > n {
			p.Delete = append(p.Delete, e.Name)
			continue
		}
		have[i] = e
	}
	for i := 1; i <= n; i++ {
		want, err := c.Node(i)
		if err != nil {
			return Plan{}, err
		}
		e, ok := have[i]
		if !ok {
			p.Create = append(p.Create, want)
			continue
		}
		if u := updated(e, want); u != nil {
			p.Update = append(p.Update, u)
		}
	}
	slices.Sort(p.Delete)
	return p, nil
}

// updated is a copy of have carrying want's labels, annotations and
// taint, or nil when it carries them already. Annotations want does not
// set but that are backend annotations flatnet owns are removed (a vxlan
// lab switched to host-gw).
func updated(have, want *corev1.Node) *corev1.Node {
	labels := maps.Clone(have.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, want.Labels)
	ann := maps.Clone(have.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	for _, k := range []string{backend.AnnotationBackend, backend.AnnotationVTEPMAC, backend.AnnotationPublicIP} {
		if _, ok := want.Annotations[k]; !ok {
			delete(ann, k)
		}
	}
	maps.Copy(ann, want.Annotations)
	taints := slices.Clone(have.Spec.Taints)
	hasTaint := slices.ContainsFunc(taints, func(t corev1.Taint) bool {
		return t.Key == TaintKey && t.Effect == corev1.TaintEffectNoSchedule && t.Value == KwokValue
	})
	if !hasTaint {
		taints = append(taints, want.Spec.Taints...)
	}
	if maps.Equal(labels, have.Labels) && maps.Equal(ann, have.Annotations) && hasTaint {
		return nil
	}
	u := have.DeepCopy()
	u.Labels, u.Annotations, u.Spec.Taints = labels, ann, taints
	return u
}

// sortNodes orders nodes by name (the order Apply creates them in).
func sortNodes(ns []*corev1.Node) {
	slices.SortFunc(ns, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
}
