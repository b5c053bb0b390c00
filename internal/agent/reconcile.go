package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/agent/masq"
	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// Reconciler computes and applies the node's network state from the Node
// list. It acts on the calling thread's network namespace (the agent's;
// tests call it inside netns.Do).
type Reconciler struct {
	NodeName     string
	ClusterCIDRs []netip.Prefix
	CNIConfDir   string
	CNIDataDir   string
	// Routes is the routing table (routes.Netlink{} for real).
	Routes routes.Kernel
	// Masq writes the masquerade table; with Masquerade false the table
	// is removed.
	Masq       *masq.Masq
	Masquerade bool
	// Sysctl sets a sysctl (nil: sysctl.Set, in the calling thread's
	// network namespace).
	Sysctl func(name, value string) error

	// last* remember what was logged, so a steady state logs nothing.
	lastWaiting   bool
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
	switch cidrs := r.ownSubnets(self); {
	case len(cidrs) == 0:
		if !r.lastWaiting {
			logger.Info("Waiting for this Node to get a spec.podCIDR (from flatnet controller or kube-controller-manager --allocate-node-cidrs)",
				"node", r.NodeName, "nodeExists", self != nil)
			r.lastWaiting = true
		}
	default:
		r.lastWaiting = false
		if err := r.writeConflist(ctx, cidrs); err != nil {
			errs = append(errs, err)
		}
	}

	desired, problems := routes.Desired(r.NodeName, Peers(nodes))
	for _, p := range problems {
		logger.Info("Cannot route to a peer node", "problem", p.Error())
	}
	plan, err := routes.Sync(r.Routes, desired)
	for _, rt := range plan.Delete {
		logger.Info("Removed route", "route", rt.String())
	}
	for _, rt := range plan.Replace {
		logger.Info("Route to peer", "node", rt.Node, "route", rt.String())
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("host-gw routes: %w", err))
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

func (r *Reconciler) writeConflist(ctx context.Context, cidrs []netip.Prefix) error {
	logger := klog.FromContext(ctx)
	for _, p := range cidrs {
		if !slices.ContainsFunc(r.ClusterCIDRs, func(c netip.Prefix) bool { return c.Contains(p.Addr()) && c.Bits() <= p.Bits() }) {
			// Routing still works; masquerade would treat these pods as
			// outside the cluster. Say so, but do not block the node.
			logger.Info("WARNING: this node's podCIDR is outside --cluster-cidr; traffic between its pods and other nodes' pods will be masqueraded", "podCIDR", p, "clusterCIDRs", r.ClusterCIDRs)
		}
	}
	data, err := subnet.Render(subnet.Config{PodCIDRs: cidrs, DataDir: r.CNIDataDir})
	if err != nil {
		return fmt.Errorf("node %s podCIDRs %v: %w", r.NodeName, cidrs, err)
	}
	changed, err := subnet.Write(r.CNIConfDir, subnet.FileName, data)
	if err != nil {
		return err
	}
	if changed {
		logger.Info("Wrote CNI config", "path", r.CNIConfDir+"/"+subnet.FileName, "podCIDRs", cidrs)
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
