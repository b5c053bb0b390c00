package lab

// The lab's kernel objects: the underlay bridge with the host's address,
// and a network namespace per node joined to a bridge by a veth pair. A
// two-subnet lab adds a router namespace (one leg on the first bridge, the
// second underlay's bridge inside it) and a route in the root namespace to
// the second underlay via the router, on the lab's own bridge (so replies
// from the apiserver to nodes there never follow the machine's default
// route). The external host is one more namespace on the first bridge; it
// routes the load-balancer range to the nodes of the first underlay with
// one ECMP route hashing flows by their ports (fib_multipath_hash_policy
// 1), as a BGP router announcing the range from every node would, so
// several connections spread over the nodes. That route lives only in its
// namespace: the root namespace never reaches LoadBalancer IPs.
// Every function here is idempotent: it checks each piece and makes only
// what is missing, so a half-built lab (an interrupted up) is completed.
//
// hostNS stands for the root namespace: "" is the caller's own namespace
// (the lab), a namespace path is used by root tests so they never touch
// the machine's root namespace.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

type kernel struct {
	hostNS string
}

// inHost runs fn in the host namespace.
func (k kernel) inHost(fn func() error) error {
	if k.hostNS == "" {
		return fn()
	}
	return netns.Do(k.hostNS, fn)
}

// segment is a layer-2 network: a bridge and the namespace holding it.
type segment struct {
	ns     string // namespace path; "" is the host (the first underlay)
	bridge string
}

// in runs fn in the namespace holding seg's bridge.
func (k kernel) in(seg segment, fn func() error) error {
	if seg.ns == "" {
		return k.inHost(fn)
	}
	return netns.Do(seg.ns, fn)
}

// route is a static route inside an endpoint: dst via a gateway on eth0,
// or on-link on eth0 when via is the zero Addr.
type route struct {
	dst netip.Prefix
	via netip.Addr
}

// endpoint is a namespace wired to a segment by a veth pair: eth0 inside
// (with a MAC derived from its address), hostVeth on the segment's bridge.
type endpoint struct {
	what     string // for messages: "node lab-node1", "router", "external host"
	netns    string
	hostVeth string
	seg      segment
	ip       netip.Addr
	bits     int
	routes   []route
	// ecmp are routes over several gateways on eth0.
	ecmp    []ecmpRoute
	forward bool // net.ipv4.ip_forward=1 inside
	// sysctls are set inside (and checked by endpointReady).
	sysctls []sysctlValue
}

// ecmpRoute is dst over every gateway in vias on eth0 (two or more: the
// kernel stores a single nexthop as a plain route).
type ecmpRoute struct {
	dst  netip.Prefix
	vias []netip.Addr
}

type sysctlValue struct{ key, value string }

// firstSegment is the first underlay: the bridge in the root namespace.
func (s *Spec) firstSegment() segment { return segment{bridge: s.Bridge} }

// secondSegment is the second underlay: the bridge inside the router.
func (s *Spec) secondSegment() segment {
	return segment{ns: NetnsPath(s.Router.Netns), bridge: s.Router.Bridge}
}

// nodeEndpoint is node n as an endpoint: on its subnet's segment, with a
// route to the other subnet via the router (and no default route).
func (s *Spec) nodeEndpoint(n Node) endpoint {
	e := endpoint{what: "node " + n.Name, netns: n.Netns, hostVeth: n.HostVeth, ip: n.IP,
		bits: s.UnderlayOf(n.Subnet).Bits(), forward: true, seg: s.firstSegment()}
	if s.Router != nil {
		if n.Subnet == 1 {
			e.seg = s.secondSegment()
			e.routes = []route{{s.Underlay, s.Router.IP2}}
		} else {
			e.routes = []route{{s.Underlay2, s.Router.IP}}
		}
	}
	// The service CIDR on-link on eth0: without a route (a node has no
	// default route) a packet to a ClusterIP without endpoints fails at
	// routing ("network is unreachable") before the proxy's reject in the
	// forward hook. Nothing on the underlay answers ARP for it, so a
	// packet to an unknown ClusterIP dies in the node.
	e.routes = append(e.routes, route{dst: s.ServiceCIDR})
	return e
}

// routerEndpoint is the router's leg on the first underlay.
func (s *Spec) routerEndpoint() endpoint {
	return endpoint{what: "router", netns: s.Router.Netns, hostVeth: s.Router.HostVeth, ip: s.Router.IP,
		bits: s.Underlay.Bits(), forward: true, seg: s.firstSegment()}
}

// externalEndpoint is the external host: on the first underlay, reaching
// the second through the router, and the load-balancer range through the
// nodes. It forwards nothing.
func (s *Spec) externalEndpoint() endpoint {
	e := endpoint{what: "external host", netns: s.External.Netns, hostVeth: s.External.HostVeth, ip: s.External.IP,
		bits: s.Underlay.Bits(), seg: s.firstSegment()}
	if s.Router != nil {
		e.routes = []route{{s.Underlay2, s.Router.IP}}
	}
	if gws := s.lbGateways(); len(gws) == 1 {
		e.routes = append(e.routes, route{dst: s.LBPool, via: gws[0]})
	} else if len(gws) > 1 {
		e.ecmp = []ecmpRoute{{dst: s.LBPool, vias: gws}}
		e.sysctls = []sysctlValue{{"net.ipv4.fib_multipath_hash_policy", "1"}}
	}
	return e
}

// lbGateways are the external host's next hops to the load-balancer
// range: every node on the first underlay (none without an LBPool).
func (s *Spec) lbGateways() []netip.Addr {
	if !s.LBPool.IsValid() {
		return nil
	}
	var gws []netip.Addr
	for _, n := range s.Nodes {
		if n.Subnet == 0 {
			gws = append(gws, n.IP)
		}
	}
	return gws
}

// hostRoutes are the routes the lab puts in the root namespace, on its own
// bridge: the second underlay via the router.
func (s *Spec) hostRoutes() []route {
	if s.Router == nil {
		return nil
	}
	return []route{{s.Underlay2, s.Router.IP}}
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

func hasAddr(l netlink.Link, want netip.Addr, bits int) (bool, error) {
	addrs, err := netlinkx.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return false, fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if ok && got.Unmap() == want && ones == bits {
			return true, nil
		}
	}
	return false, nil
}

func isUp(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }

// mainRoutesTo lists the main table's IPv4 routes to dst.
func mainRoutesTo(dst netip.Prefix) ([]netlink.Route, error) {
	got, err := netlinkx.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{Dst: ipNet(dst.Addr(), dst.Bits()), Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes to %s: %w", dst, err)
	}
	return got, nil
}

// hasRoute reports whether the main table routes r.dst via r.via on l.
func hasRoute(l netlink.Link, r route) (bool, error) {
	got, err := mainRoutesTo(r.dst)
	if err != nil {
		return false, err
	}
	for _, x := range got {
		if !r.via.IsValid() {
			if len(x.Gw) == 0 && x.LinkIndex == l.Attrs().Index {
				return true, nil
			}
			continue
		}
		gw, ok := netip.AddrFromSlice(x.Gw)
		if ok && gw.Unmap() == r.via && x.LinkIndex == l.Attrs().Index {
			return true, nil
		}
	}
	return false, nil
}

// hasECMPRoute reports whether the main table routes r.dst over exactly
// r.vias on l.
func hasECMPRoute(l netlink.Link, r ecmpRoute) (bool, error) {
	got, err := mainRoutesTo(r.dst)
	if err != nil {
		return false, err
	}
	for _, x := range got {
		if len(x.MultiPath) != len(r.vias) {
			continue
		}
		want := map[netip.Addr]bool{}
		for _, g := range r.vias {
			want[g] = true
		}
		for _, nh := range x.MultiPath {
			gw, ok := netip.AddrFromSlice(nh.Gw)
			if ok && nh.LinkIndex == l.Attrs().Index {
				delete(want, gw.Unmap())
			}
		}
		if len(want) == 0 {
			return true, nil
		}
	}
	return false, nil
}

// ensureECMPRoute makes the main table route r.dst over r.vias on l
// (replacing another route to r.dst).
func ensureECMPRoute(l netlink.Link, r ecmpRoute) error {
	ok, err := hasECMPRoute(l, r)
	if err != nil || ok {
		return err
	}
	nr := &netlink.Route{Dst: ipNet(r.dst.Addr(), r.dst.Bits()), Protocol: unix.RTPROT_STATIC, Table: unix.RT_TABLE_MAIN}
	for _, g := range r.vias {
		nr.MultiPath = append(nr.MultiPath, &netlink.NexthopInfo{LinkIndex: l.Attrs().Index, Gw: g.AsSlice()})
	}
	if err := netlink.RouteReplace(nr); err != nil {
		return fmt.Errorf("route %s via %v dev %s: %w", r.dst, r.vias, l.Attrs().Name, err)
	}
	return nil
}

// ensureRoute makes the main table route r.dst via r.via on l (replacing
// another route to r.dst).
func ensureRoute(l netlink.Link, r route) error {
	ok, err := hasRoute(l, r)
	if err != nil || ok {
		return err
	}
	nr := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(r.dst.Addr(), r.dst.Bits()),
		Gw: r.via.AsSlice(), Protocol: unix.RTPROT_STATIC, Table: unix.RT_TABLE_MAIN}
	if !r.via.IsValid() {
		nr.Gw, nr.Scope = nil, netlink.SCOPE_LINK
	}
	if err := netlink.RouteReplace(nr); err != nil {
		return fmt.Errorf("route %s via %s dev %s: %w", r.dst, r.via, l.Attrs().Name, err)
	}
	return nil
}

// bridgeReady reports whether a bridge is up and holds addr/bits (when
// addr is valid) and routes.
func bridgeReady(name string, addr netip.Addr, bits int, routes []route) (bool, error) {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if l.Type() != "bridge" || !isUp(l) {
		return false, nil
	}
	if addr.IsValid() {
		if ok, err := hasAddr(l, addr, bits); err != nil || !ok {
			return false, err
		}
	}
	for _, r := range routes {
		if ok, err := hasRoute(l, r); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// ensureBridgeHere makes a bridge named name, up, with addr/bits and
// routes, in the calling namespace.
func ensureBridgeHere(name string, addr netip.Addr, bits int, routes []route) error {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("creating bridge %s: %w", name, err)
		}
		l, err = netlinkx.LinkByName(name)
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	if l.Type() != "bridge" {
		return fmt.Errorf("interface %s exists and is a %s, not the lab's bridge; remove it or pick another --name", name, l.Type())
	}
	ok, err := hasAddr(l, addr, bits)
	if err != nil {
		return err
	}
	if !ok {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
			return fmt.Errorf("adding %s/%d to %s: %w", addr, bits, name, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	for _, r := range routes {
		if err := ensureRoute(l, r); err != nil {
			return err
		}
	}
	return nil
}

// bridgeReady reports whether the underlay bridge exists, is up and holds
// the host address (and, with two subnets, the route to the second one).
func (k kernel) bridgeReady(s *Spec) (bool, error) {
	ready := false
	err := k.inHost(func() error {
		var err error
		ready, err = bridgeReady(s.Bridge, s.HostAddr, s.Underlay.Bits(), s.hostRoutes())
		return err
	})
	return ready, err
}

// ensureBridge creates the underlay bridge with the host address.
func (k kernel) ensureBridge(s *Spec) error {
	return k.inHost(func() error {
		if err := ensureBridgeHere(s.Bridge, s.HostAddr, s.Underlay.Bits(), s.hostRoutes()); err != nil {
			return fmt.Errorf("underlay: %w", err)
		}
		return nil
	})
}

// routerReady reports whether the router is wired: its leg on the first
// underlay and, inside, the second underlay's bridge with its address.
func (k kernel) routerReady(s *Spec) (bool, error) {
	ok, err := k.endpointReady(s.routerEndpoint())
	if err != nil || !ok {
		return false, err
	}
	err = netns.Do(NetnsPath(s.Router.Netns), func() error {
		var err error
		ok, err = bridgeReady(s.Router.Bridge, s.Router.IP2, s.Underlay2.Bits(), nil)
		return err
	})
	return ok, err
}

// ensureRouter creates the router namespace, its leg on the first
// underlay and the second underlay's bridge inside it.
func (k kernel) ensureRouter(s *Spec) error {
	if err := k.ensureEndpoint(s.routerEndpoint()); err != nil {
		return err
	}
	return netns.Do(NetnsPath(s.Router.Netns), func() error {
		if err := ensureBridgeHere(s.Router.Bridge, s.Router.IP2, s.Underlay2.Bits(), nil); err != nil {
			return fmt.Errorf("router: %w", err)
		}
		return nil
	})
}

// nodeReady reports whether node n is fully wired (see endpointReady).
func (k kernel) nodeReady(s *Spec, n Node) (bool, error) {
	if n.Subnet == 1 && s.Router == nil {
		return false, fmt.Errorf("node %s is on the second subnet of a lab without one", n.Name)
	}
	return k.endpointReady(s.nodeEndpoint(n))
}

// ensureNode creates node n's namespace and wires it to its underlay.
func (k kernel) ensureNode(s *Spec, n Node) error {
	if n.Subnet == 1 && s.Router == nil {
		return fmt.Errorf("node %s is on the second subnet of a lab without one", n.Name)
	}
	return k.ensureEndpoint(s.nodeEndpoint(n))
}

// externalReady and ensureExternal are the external host's.
func (k kernel) externalReady(s *Spec) (bool, error) { return k.endpointReady(s.externalEndpoint()) }
func (k kernel) ensureExternal(s *Spec) error        { return k.ensureEndpoint(s.externalEndpoint()) }

// endpointReady reports whether e is fully wired: its namespace exists,
// its host veth is up on the segment's bridge, and inside, lo and eth0 are
// up, eth0 holds the address, the routes are there, and IPv4 forwarding
// is on when e forwards.
func (k kernel) endpointReady(e endpoint) (bool, error) {
	path := NetnsPath(e.netns)
	if err := netns.Check(path); err != nil {
		if errors.Is(err, netns.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if e.seg.ns != "" {
		if err := netns.Check(e.seg.ns); errors.Is(err, netns.ErrNotExist) {
			return false, nil
		}
	}
	ready := false
	err := k.in(e.seg, func() error {
		br, err := netlinkx.LinkByName(e.seg.bridge)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := netlinkx.LinkByName(e.hostVeth)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ready = v.Type() == "veth" && isUp(v) && v.Attrs().MasterIndex == br.Attrs().Index
		return nil
	})
	if err != nil || !ready {
		return false, err
	}
	err = netns.Do(path, func() error {
		ready = false
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return err
		}
		eth, err := netlinkx.LinkByName("eth0")
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ok, err := hasAddr(eth, e.ip, e.bits)
		if err != nil || !ok || !isUp(lo) || !isUp(eth) {
			return err
		}
		for _, r := range e.routes {
			if ok, err := hasRoute(eth, r); err != nil || !ok {
				return err
			}
		}
		for _, r := range e.ecmp {
			if ok, err := hasECMPRoute(eth, r); err != nil || !ok {
				return err
			}
		}
		if e.forward {
			fwd, err := sysctl.Get("net.ipv4.ip_forward")
			if err != nil || fwd != "1" {
				return err
			}
		}
		for _, sc := range e.sysctls {
			if v, err := sysctl.Get(sc.key); err != nil || v != sc.value {
				return err
			}
		}
		ready = true
		return nil
	})
	return ready, err
}

// ensureEndpoint creates e's namespace and wires it to its segment.
func (k kernel) ensureEndpoint(e endpoint) error {
	path := NetnsPath(e.netns)
	if err := netns.Check(path); errors.Is(err, netns.ErrNotExist) {
		if _, err := netns.Create(e.netns); err != nil {
			return fmt.Errorf("%s: %w", e.what, err)
		}
	} else if err != nil {
		return fmt.Errorf("%s: %w", e.what, err)
	}
	h, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("%s: opening netns %s: %w", e.what, path, err)
	}
	defer h.Close()

	// A veth pair lives or dies as a whole, so eth0 inside without our
	// host veth is not ours: remove it, then make the pair.
	hostVethOK := false
	err = k.in(e.seg, func() error {
		v, err := netlinkx.LinkByName(e.hostVeth)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if v.Type() != "veth" {
			return fmt.Errorf("interface %s exists and is a %s, not the veth of %s; remove it", e.hostVeth, v.Type(), e.what)
		}
		hostVethOK = true
		return nil
	})
	if err != nil {
		return err
	}
	var eth0OK bool
	if err := netns.DoHandle(h, func() error {
		eth, err := netlinkx.LinkByName("eth0")
		if netlinkx.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !hostVethOK {
			return netlink.LinkDel(eth)
		}
		eth0OK = true
		return nil
	}); err != nil {
		return fmt.Errorf("%s: %w", e.what, err)
	}
	if hostVethOK && !eth0OK {
		// Our host veth's peer went elsewhere: recreate the pair.
		if err := k.in(e.seg, func() error { return deleteLink(e.hostVeth) }); err != nil {
			return err
		}
		hostVethOK = false
	}

	err = k.in(e.seg, func() error {
		br, err := netlinkx.LinkByName(e.seg.bridge)
		if err != nil {
			return fmt.Errorf("%s: bridge %s: %w", e.what, e.seg.bridge, err)
		}
		if !hostVethOK {
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: e.hostVeth, MasterIndex: br.Attrs().Index},
				PeerName:      "eth0",
				PeerNamespace: netlink.NsFd(int(h)),
				// A MAC derived from the IP: a rebuilt endpoint keeps it,
				// so its peers' ARP entries stay right.
				PeerHardwareAddr: nodeMAC(e.ip),
			}
			if err := netlink.LinkAdd(veth); err != nil {
				return fmt.Errorf("%s: creating veth %s <-> eth0: %w", e.what, e.hostVeth, err)
			}
		}
		v, err := netlinkx.LinkByName(e.hostVeth)
		if err != nil {
			return fmt.Errorf("%s: %w", e.what, err)
		}
		if v.Attrs().MasterIndex != br.Attrs().Index {
			if err := netlink.LinkSetMaster(v, br); err != nil {
				return fmt.Errorf("%s: attaching %s to %s: %w", e.what, e.hostVeth, e.seg.bridge, err)
			}
		}
		if err := netlink.LinkSetUp(v); err != nil {
			return fmt.Errorf("%s: setting %s up: %w", e.what, e.hostVeth, err)
		}
		return nil
	})
	if err != nil {
		return err
	}

	return netns.DoHandle(h, func() error {
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("%s: %w", e.what, err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("%s: lo up: %w", e.what, err)
		}
		eth, err := netlinkx.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("%s: eth0: %w", e.what, err)
		}
		ok, err := hasAddr(eth, e.ip, e.bits)
		if err != nil {
			return err
		}
		if !ok {
			if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(e.ip, e.bits)}); err != nil {
				return fmt.Errorf("%s: adding %s to eth0: %w", e.what, e.ip, err)
			}
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return fmt.Errorf("%s: eth0 up: %w", e.what, err)
		}
		for _, r := range e.routes {
			if err := ensureRoute(eth, r); err != nil {
				return fmt.Errorf("%s: %w", e.what, err)
			}
		}
		for _, r := range e.ecmp {
			if err := ensureECMPRoute(eth, r); err != nil {
				return fmt.Errorf("%s: %w", e.what, err)
			}
		}
		if e.forward {
			// A node routes between its pods and the underlay; the router
			// between the underlays.
			if err := sysctl.Set("net.ipv4.ip_forward", "1"); err != nil {
				return fmt.Errorf("%s: %w", e.what, err)
			}
		}
		for _, sc := range e.sysctls {
			if err := sysctl.Set(sc.key, sc.value); err != nil {
				return fmt.Errorf("%s: %w", e.what, err)
			}
		}
		return nil
	})
}

// deleteLink removes a link by name; a missing one is fine.
func deleteLink(name string) error {
	l, err := netlinkx.LinkByName(name)
	if netlinkx.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// removeEndpoint deletes a host veth (and with it eth0) from the segment's
// namespace, when that still exists, and the namespace netnsName.
// Processes still inside keep the namespace alive, so callers stop them
// first.
func (k kernel) removeEndpoint(what, netnsName, hostVeth string, seg segment) error {
	var errs []error
	segGone := false
	if seg.ns != "" {
		segGone = errors.Is(netns.Check(seg.ns), netns.ErrNotExist)
	}
	if !segGone {
		if err := k.in(seg, func() error { return deleteLink(hostVeth) }); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	if err := netns.Delete(netnsName); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
	}
	return errors.Join(errs...)
}

// removeNode deletes node n's host veth and namespace. routerNetns is the
// lab's router namespace, where nodes on the second subnet have their host
// veths.
func (k kernel) removeNode(n Node, routerNetns string) error {
	seg := segment{}
	if n.Subnet == 1 {
		seg.ns = NetnsPath(routerNetns)
	}
	return k.removeEndpoint("node "+n.Name, n.Netns, n.HostVeth, seg)
}

// removeRouter and removeExternal delete lab name's router and external
// host (by their names, so they go without a lab.json too).
func (k kernel) removeRouter(name string) error {
	return k.removeEndpoint("router", RouterNetns(name), RouterVeth(name), segment{})
}

func (k kernel) removeExternal(name string) error {
	return k.removeEndpoint("external host", ExternalNetns(name), ExternalVeth(name), segment{})
}

// removeBridge deletes the underlay bridge (and the host address and the
// lab's routes on it).
func (k kernel) removeBridge(s *Spec) error {
	return k.inHost(func() error { return deleteLink(s.Bridge) })
}

// linkExists reports whether a link named name exists in the host.
func (k kernel) linkExists(name string) (bool, error) {
	found := false
	err := k.inHost(func() error {
		_, err := netlinkx.LinkByName(name)
		if netlinkx.IsNotFound(err) {
			return nil
		}
		found = err == nil
		return err
	})
	return found, err
}

// nodeMAC is 0a:58 followed by the IPv4 address, as Kubernetes networking
// conventionally derives a MAC from an IP.
func nodeMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
