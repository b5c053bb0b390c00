package conntrack

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/flatnet/flatnet/internal/proxy"
)

// cleaned says which protocols have stale entries worth deleting: the
// connectionless ones. A TCP client learns of a dead endpoint by a reset.
func cleaned(p proxy.Protocol) bool { return p == proxy.UDP || p == proxy.SCTP }

// Stale returns the filters for the entries one service's change made
// stale; prev is the service as the last sync programmed it and cur as
// it is now (either may be nil: created, deleted). Two cases, as
// kube-proxy's:
//
//   - an endpoint that could receive traffic (ready or serving) no longer
//     can: entries of the service's addresses and NodePort whose reply
//     comes from it (they were DNATed to it) are deleted, so the client's
//     next packet picks a live endpoint;
//   - a port goes from no usable endpoint (rejected, or no service at
//     all) to some: every entry for its addresses and NodePort is deleted,
//     since one created meanwhile was never DNATed and would keep
//     bypassing the new rules.
//
// Ports are matched by name and protocol, as the API identifies them.
// Traffic policies are not looked at: a change of policy does not break
// established flows, for UDP as for TCP.
func Stale(prev, cur *proxy.Service) []Filter {
	var out []Filter
	if prev != nil {
		for i := range prev.Ports {
			pp := &prev.Ports[i]
			if !cleaned(pp.Protocol) {
				continue
			}
			now := map[netip.AddrPort]bool{}
			if cp := port(cur, pp.Name, pp.Protocol); cp != nil {
				now = serving(cp.Endpoints)
			}
			for ep := range serving(pp.Endpoints) {
				if now[ep] {
					continue
				}
				for _, ip := range addresses(prev) {
					out = append(out, Filter{Protocol: pp.Protocol, OrigDst: ip, OrigDstPort: pp.Port, ReplySrc: ep})
				}
				if pp.NodePort != 0 {
					out = append(out, Filter{Protocol: pp.Protocol, OrigDstPort: pp.NodePort, ReplySrc: ep})
				}
			}
		}
	}
	if cur != nil {
		for i := range cur.Ports {
			cp := &cur.Ports[i]
			if !cleaned(cp.Protocol) || !proxy.HasUsable(cp.Endpoints, "") {
				continue
			}
			if pp := port(prev, cp.Name, cp.Protocol); pp != nil && proxy.HasUsable(pp.Endpoints, "") {
				continue
			}
			for _, ip := range addresses(cur) {
				out = append(out, Filter{Protocol: cp.Protocol, OrigDst: ip, OrigDstPort: cp.Port})
			}
			if cp.NodePort != 0 {
				out = append(out, Filter{Protocol: cp.Protocol, OrigDstPort: cp.NodePort})
			}
		}
	}
	return sortFilters(out)
}

// Reconcile returns filters for the listed entries that are stale
// whatever happened before: sent to a service address and port that has
// serving endpoints, but answered by none of them (DNATed to an endpoint
// that is gone, or never DNATed). This is kube-proxy's reconciler; the
// proxier runs it once, at start, when it cannot know what changed while
// it was down. NodePorts are left out: an entry to some address at a
// NodePort number may be any flow through the node.
func Reconcile(services []*proxy.Service, entries []Entry) []Filter {
	type frontend struct {
		proto proxy.Protocol
		dst   netip.AddrPort
	}
	want := map[frontend]map[netip.AddrPort]bool{}
	for _, svc := range services {
		for i := range svc.Ports {
			sp := &svc.Ports[i]
			if !cleaned(sp.Protocol) {
				continue
			}
			eps := serving(sp.Endpoints)
			if len(eps) == 0 {
				continue // rejected: nothing is stale, nothing is answered
			}
			for _, ip := range addresses(svc) {
				want[frontend{sp.Protocol, netip.AddrPortFrom(ip, sp.Port)}] = eps
			}
		}
	}
	var out []Filter
	for _, e := range entries {
		eps, ok := want[frontend{e.Protocol, e.OrigDst}]
		if !ok || eps[e.ReplySrc] {
			continue
		}
		out = append(out, Filter{Protocol: e.Protocol, OrigDst: e.OrigDst.Addr(), OrigDstPort: e.OrigDst.Port(), ReplySrc: e.ReplySrc})
	}
	return sortFilters(out)
}

func port(svc *proxy.Service, name string, proto proxy.Protocol) *proxy.ServicePort {
	if svc == nil {
		return nil
	}
	for i := range svc.Ports {
		if svc.Ports[i].Name == name && svc.Ports[i].Protocol == proto {
			return &svc.Ports[i]
		}
	}
	return nil
}

// serving is the set of endpoints that may have been sent traffic: the
// ready ones and the serving terminating ones.
func serving(eps []proxy.Endpoint) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for _, ep := range eps {
		if ep.Ready || ep.Serving {
			out[netip.AddrPortFrom(ep.IP, ep.Port)] = true
		}
	}
	return out
}

// addresses are the service's own addresses: ClusterIP, external IPs,
// load-balancer IPs.
func addresses(svc *proxy.Service) []netip.Addr {
	var out []netip.Addr
	if svc.ClusterIP.IsValid() {
		out = append(out, svc.ClusterIP)
	}
	out = append(out, svc.ExternalIPs...)
	return append(out, svc.LoadBalancerIPs...)
}

// sortFilters sorts and deduplicates, so callers and tests see one order.
func sortFilters(fs []Filter) []Filter {
	slices.SortFunc(fs, func(a, b Filter) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.OrigDst.Compare(b.OrigDst),
			cmp.Compare(a.OrigDstPort, b.OrigDstPort), a.ReplySrc.Compare(b.ReplySrc))
	})
	return slices.Compact(fs)
}
