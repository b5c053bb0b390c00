package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// Reconciler computes and applies the node's network state from the Node
// list. It acts on the calling thread's network namespace (the agent's;
// tests call it inside netns.Do).
type Reconciler struct {
	NodeName     string
	ClusterCIDRs []netip.Prefix
	CNIConfDir   string
	// CNIConflist is the conflist's style (subnet.Styles; "": flatnet).
	CNIConflist string
	CNIDataDir  string
	// PolicySocket chains the flatnet-policy plugin in the conflist ("": not).
	PolicySocket string
	// NodeIP is the node's underlay address (--node-ip); invalid: the
	// Node's InternalIP (IPv4 first).
	NodeIP netip.Addr
	// Backend computes the cross-node data plane; Kernel is where it is
	// programmed (&routes.Netlink{} and vxlan.Netlink{} for real).
	Backend backend.Backend
	Kernel  backend.Kernel
	// FindUnderlay finds the interface holding the node IP (nil:
	// backend.FindUnderlay, in the calling thread's namespace).
	FindUnderlay func(netip.Addr) (backend.Underlay, error)
	// Annotate patches this node's annotations (a nil value removes
	// one); nil: the annotations are not published.
	Annotate func(ctx context.Context, set map[string]*string) error
	// Masq writes the masquerade table; with Masquerade false the table
	// is removed.
	Masq       *masq.Masq
	Masquerade bool
	// Sysctl sets a sysctl (nil: sysctl.Set, in the calling thread's
	// network namespace).
	Sysctl func(name, value string) error

	// peers is what the last full Reconcile programmed, by peer (nil:
	// Peer must hand over to a full Reconcile); see peers.go.
	peers *peerIndex

	// last* remember what was logged, so a steady state logs nothing.
	lastWaiting   bool
	lastNoIP      bool
	lastUnderlay  string
	lastShadowing []string
}

// Reconcile brings the node in line with nodes. Every step runs even when
// an earlier one fails (a peer with a broken Node must not keep the
// conflist from being written); the failures come back joined.
func (r *Reconciler) Reconcile(ctx context.Context, nodes []*corev1.Node) error {
	logger := klog.FromContext(ctx)
	var errs []error

	if err := r.forwarding(); err != nil {
		errs = append(errs, err)
	}

	var self *corev1.Node
	for _, n := range nodes {
		if n.Name == r.NodeName {
			self = n
		}
	}

	r.peers = nil // rebuilt below when the backend's State is applied
	bn := backendNodes(nodes)
	st, u, ok, err := r.desired(ctx, self, bn)
	if err != nil {
		errs = append(errs, err)
	}
	if ok {
		switch cidrs := r.ownSubnets(self); {
		case len(cidrs) == 0:
			if !r.lastWaiting {
				logger.Info("Waiting for this Node to get a spec.podCIDR (from flatnet controller or kube-controller-manager --allocate-node-cidrs)",
					"node", r.NodeName, "nodeExists", self != nil)
				r.lastWaiting = true
			}
		default:
			r.lastWaiting = false
			if err := r.writeConflist(ctx, cidrs, st.PodMTU); err != nil {
				errs = append(errs, err)
			}
		}
		res, err := backend.Apply(r.Kernel, st)
		logApply(logger, res)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s backend: %w", r.Backend.Name(), err))
		} else {
			r.peers = newPeerIndex(r.NodeName, bn, u, st)
		}
		// Published after the device exists: peers send to it once they
		// see the annotations.
		if err := r.publish(ctx, self, st.Annotations); err != nil {
			errs = append(errs, err)
		}
	}

	if r.Masq != nil {
		if r.Masquerade {
			changed, err := r.Masq.Sync(ctx, r.ClusterCIDRs)
			if err != nil {
				errs = append(errs, err)
			} else if changed {
				logger.Info("Masquerade rules written", "clusterCIDRs", r.ClusterCIDRs)
			}
		} else if err := r.Masq.Remove(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// desired computes the backend's State and returns it with the underlay
// it was computed for. ok false means the backend cannot
// compute one yet: nothing of the data plane (nor the conflist, whose MTU
// depends on it) is touched.
func (r *Reconciler) desired(ctx context.Context, self *corev1.Node, nodes []backend.Node) (backend.State, backend.Underlay, bool, error) {
	logger := klog.FromContext(ctx)
	ip := r.NodeIP
	if !ip.IsValid() && self != nil {
		ip = nodeIP(self)
	}
	u := backend.Underlay{IP: ip}
	var uerr error
	if ip.IsValid() {
		r.lastNoIP = false
		find := r.FindUnderlay
		if find == nil {
			find = backend.FindUnderlay
		}
		u, uerr = find(ip)
		u.IP = ip
		key := fmt.Sprint(uerr)
		if uerr == nil {
			key = fmt.Sprint(u.Link, u.MTU, u.Prefixes)
		}
		if key != r.lastUnderlay {
			r.lastUnderlay = key
			if uerr != nil {
				logger.Info("WARNING: cannot find the node's underlay interface", "nodeIP", ip, "err", uerr.Error())
			} else {
				logger.Info("Underlay", "nodeIP", ip, "interface", u.Link, "mtu", u.MTU, "networks", u.Prefixes)
			}
		}
	}
	st, problems, err := r.Backend.Desired(backend.Input{Self: r.NodeName, Nodes: nodes, Underlay: u})
	if err != nil {
		if !ip.IsValid() {
			// Not an error: the Node has no address yet.
			if !r.lastNoIP {
				logger.Info("Waiting for this Node's InternalIP (or --node-ip): the backend needs the node's underlay address", "backend", r.Backend.Name())
				r.lastNoIP = true
			}
			return st, u, false, nil
		}
		if uerr != nil {
			err = fmt.Errorf("%w: %w", err, uerr)
		}
		return st, u, false, err
	}
	for _, p := range problems {
		logger.Info("Cannot reach a peer node", "backend", r.Backend.Name(), "problem", p.Error())
	}
	return st, u, true, nil
}

// nodeIP is the Node's first IPv4 InternalIP, else its first InternalIP.
func nodeIP(n *corev1.Node) netip.Addr {
	var first netip.Addr
	for _, s := range internalIPs(n) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if a.Is4() {
			return a
		}
		if !first.IsValid() {
			first = a
		}
	}
	return first
}

// publish patches self's flatnet.io/ annotations to want ("" = absent)
// when they differ.
func (r *Reconciler) publish(ctx context.Context, self *corev1.Node, want map[string]string) error {
	if self == nil || r.Annotate == nil {
		return nil // not registered yet: the next reconcile publishes
	}
	set := map[string]*string{}
	for k, v := range want {
		cur, ok := self.Annotations[k]
		switch {
		case v == "" && ok:
			set[k] = nil
		case v != "" && cur != v:
			set[k] = &v
		}
	}
	if len(set) == 0 {
		return nil
	}
	if err := r.Annotate(ctx, set); err != nil {
		return fmt.Errorf("publishing node %s annotations: %w", r.NodeName, err)
	}
	klog.FromContext(ctx).Info("Published node annotations", "annotations", want)
	return nil
}

func logApply(logger klog.Logger, res backend.Result) {
	if v := res.VXLAN; v != nil {
		switch d := v.Device; {
		case d.Delete:
			logger.Info("Re-created the VXLAN device", "device", vxlan.DeviceName, "reason", d.Reason)
		case d.Create:
			logger.Info("Created the VXLAN device", "device", vxlan.DeviceName)
		}
		logEach(logger, "Removed neighbour entry", v.Entries.DelNeighs, func(n vxlan.Neigh) []any { return []any{"entry", n.String()} })
		logEach(logger, "Removed FDB entry", v.Entries.DelFDB, func(f vxlan.FDB) []any { return []any{"entry", f.String()} })
		logEach(logger, "Neighbour entry to peer", v.Entries.SetNeighs, func(n vxlan.Neigh) []any { return []any{"node", n.Node, "entry", n.String()} })
		logEach(logger, "FDB entry to peer", v.Entries.SetFDB, func(f vxlan.FDB) []any { return []any{"node", f.Node, "entry", f.String()} })
	}
	if res.RemovedDevice {
		logger.Info("Removed the VXLAN device (the backend needs none)", "device", vxlan.DeviceName)
	}
	logEach(logger, "Removed route", res.Routes.Delete, func(rt routes.Route) []any { return []any{"route", rt.String()} })
	logEach(logger, "Route to peer", res.Routes.Replace, func(rt routes.Route) []any { return []any{"node", rt.Node, "route", rt.String()} })
}

// logEachMax is how many changes of one kind logEach writes a line each;
// past it, one line counts them and shows the first few, and each has its
// line at verbosity 2. An agent starting among 5,000 peers wrote 5,000
// lines (and 70 ms of CPU) for its routes alone.
const logEachMax = 10

// logEach logs msg with kv(x) for each of xs, or, when there are more than
// logEachMax, one line with their count and the first three.
func logEach[T any](logger klog.Logger, msg string, xs []T, kv func(T) []any) {
	if len(xs) <= logEachMax {
		for _, x := range xs {
			logger.Info(msg, kv(x)...)
		}
		return
	}
	first := make([]any, 0, 3)
	for _, x := range xs[:3] {
		first = append(first, kv(x))
	}
	logger.Info(msg+" (each at -v=2)", "count", len(xs), "first", first)
	if v := logger.V(2); v.Enabled() {
		for _, x := range xs {
			v.Info(msg, kv(x)...)
		}
	}
}

// forwarding turns on IP forwarding for the cluster's families: the node
// routes between cni0, its uplink and its peers.
func (r *Reconciler) forwarding() error {
	v4 := slices.ContainsFunc(r.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is4() })
	v6 := slices.ContainsFunc(r.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() })
	set := r.Sysctl
	if set == nil {
		set = sysctl.Set
	}
	if v4 {
		if err := set("net.ipv4.ip_forward", "1"); err != nil {
			return fmt.Errorf("enabling IPv4 forwarding (the agent needs a writable /proc/sys: privileged, hostNetwork): %w", err)
		}
	}
	if v6 {
		if err := set("net.ipv6.conf.all.forwarding", "1"); err != nil {
			return fmt.Errorf("enabling IPv6 forwarding: %w", err)
		}
	}
	return nil
}

// ownSubnets returns self's pod subnets inside the cluster CIDRs.
func (r *Reconciler) ownSubnets(self *corev1.Node) []netip.Prefix {
	if self == nil {
		return nil
	}
	var out []netip.Prefix
	for _, s := range podCIDRs(self) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

func (r *Reconciler) writeConflist(ctx context.Context, cidrs []netip.Prefix, mtu int) error {
	logger := klog.FromContext(ctx)
	for _, p := range cidrs {
		if !slices.ContainsFunc(r.ClusterCIDRs, func(c netip.Prefix) bool { return c.Contains(p.Addr()) && c.Bits() <= p.Bits() }) {
			// Routing still works; masquerade would treat these pods as
			// outside the cluster. Say so, but do not block the node.
			logger.Info("WARNING: this node's podCIDR is outside --cluster-cidr; traffic between its pods and other nodes' pods will be masqueraded", "podCIDR", p, "clusterCIDRs", r.ClusterCIDRs)
		}
	}
	data, err := subnet.Render(subnet.Config{Style: r.CNIConflist, PodCIDRs: cidrs, DataDir: r.CNIDataDir, MTU: mtu, PolicySocket: r.PolicySocket})
	if err != nil {
		return fmt.Errorf("node %s podCIDRs %v: %w", r.NodeName, cidrs, err)
	}
	changed, err := subnet.Write(r.CNIConfDir, subnet.FileName, data)
	if err != nil {
		return err
	}
	if changed {
		logger.Info("Wrote CNI config", "path", r.CNIConfDir+"/"+subnet.FileName, "style", style(r.CNIConflist), "podCIDRs", cidrs, "mtu", mtu)
	}
	if sh, err := subnet.Shadowing(r.CNIConfDir, subnet.FileName); err == nil && !slices.Equal(sh, r.lastShadowing) {
		r.lastShadowing = sh
		if len(sh) > 0 {
			logger.Info("WARNING: other network configs sort before flatnet's; container runtimes use the first one, so pods will not get flatnet's network",
				"cniConfDir", r.CNIConfDir, "files", sh)
		}
	}
	return nil
}

// style is the conflist style a Reconciler writes.
func style(s string) string {
	if s == "" {
		return subnet.StyleFlatnet
	}
	return s
}
