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
//
// Design (the agent's shape, see internal/agent/routes): topology turns
// the Spec into the objects each part of the lab needs (the underlay, the
// router, each node, the external host), as plain data; a kernelIO reads
// what of them exists into a view, data again; diff compares the two and
// returns a list of fixes, each a plain value with a description. A part
// is ready when no fix names it, and `up` applies a part's fixes in
// order, so every invariant is written once, in diff. The fixes assume
// the ones before them succeed: a namespace or link about to be
// (re)created is empty, so everything that must be on it is listed too,
// and a half-built lab (an interrupted up) is completed by the same code.
// A part whose namespace or veth pair is made anew is rewired: up restarts
// the daemon inside it; any other fix leaves the processes alone.
// Only the kernelIO touches the kernel (netlinkKernel, kernel_netlink.go,
// through internal/netns, netlinkx, sysctl and cni/veth; fakeKernel in
// the tests).
//
// hostNS stands for the root namespace: "" is the caller's own namespace
// (the lab), a namespace path is used by root tests so they never touch
// the machine's root namespace.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// partID names a part of the lab: the unit `up` and `status` report.
type partID string

const (
	partUnderlay partID = "underlay"
	partRouter   partID = "router"
	partExternal partID = "external host"
)

func nodePart(name string) partID { return partID("node " + name) }

// segment is a layer-2 network: a bridge and the namespace holding it.
type segment struct {
	ns     string // namespace path; "" is the host (the first underlay)
	bridge string
}

// route is a main-table route to dst on dev: on-link without vias, via
// one gateway, or over several (ECMP: the kernel stores a single nexthop
// as a plain route). vias are sorted.
type route struct {
	dst  netip.Prefix
	dev  string
	vias []netip.Addr
}

func (r route) String() string {
	s := r.dst.String()
	if len(r.vias) > 0 {
		s += " via " + joinAddrs(r.vias)
	}
	return s + " dev " + r.dev
}

func (r route) equal(o route) bool {
	return r.dst == o.dst && r.dev == o.dev && slices.Equal(r.vias, o.vias)
}

type sysctlValue struct{ key, value string }

// bridge is a bridge with an address and routes on it.
type bridge struct {
	ns     string // namespace path; "" the host
	name   string
	addr   netip.Prefix // address and prefix length (not masked)
	routes []route
}

// endpoint is a namespace wired to a segment by a veth pair: eth0 inside
// (with a MAC derived from its address), hostVeth on the segment's bridge.
type endpoint struct {
	netns    string // name, under /run/netns
	hostVeth string
	seg      segment
	addr     netip.Prefix // eth0's
	routes   []route      // on eth0
	sysctls  []sysctlValue
}

// part is what one part of the lab needs: an endpoint, a bridge, or both
// (the router: its leg first, then the bridge inside it).
type part struct {
	id       partID
	endpoint *endpoint
	bridge   *bridge
}

const ipForward = "net.ipv4.ip_forward"

// topology is the kernel objects of s, part by part in the order `up`
// makes them.
func topology(s *Spec) ([]part, error) {
	parts := []part{{id: partUnderlay, bridge: &bridge{
		name: s.Bridge, addr: netip.PrefixFrom(s.HostAddr, s.Underlay.Bits()), routes: s.hostRoutes()}}}
	if r := s.Router; r != nil {
		parts = append(parts, part{id: partRouter,
			endpoint: &endpoint{netns: r.Netns, hostVeth: r.HostVeth, seg: s.firstSegment(),
				addr: netip.PrefixFrom(r.IP, s.Underlay.Bits()), sysctls: []sysctlValue{{ipForward, "1"}}},
			bridge: &bridge{ns: NetnsPath(r.Netns), name: r.Bridge, addr: netip.PrefixFrom(r.IP2, s.Underlay2.Bits())}})
	}
	for _, n := range s.Nodes {
		if n.Subnet == 1 && s.Router == nil {
			return nil, fmt.Errorf("node %s is on the second subnet of a lab without one", n.Name)
		}
		parts = append(parts, part{id: nodePart(n.Name), endpoint: s.nodeEndpoint(n)})
	}
	if s.External != nil {
		parts = append(parts, part{id: partExternal, endpoint: s.externalEndpoint()})
	}
	return parts, nil
}

// firstSegment is the first underlay: the bridge in the root namespace.
func (s *Spec) firstSegment() segment { return segment{bridge: s.Bridge} }

// secondSegment is the second underlay: the bridge inside the router.
func (s *Spec) secondSegment() segment {
	return segment{ns: NetnsPath(s.Router.Netns), bridge: s.Router.Bridge}
}

func onEth0(dst netip.Prefix, vias ...netip.Addr) route {
	return route{dst: dst, dev: "eth0", vias: vias}
}

// nodeEndpoint is node n as an endpoint: on its subnet's segment, with a
// route to the other subnet via the router (and no default route); it
// forwards between its pods and the underlay.
func (s *Spec) nodeEndpoint(n Node) *endpoint {
	e := &endpoint{netns: n.Netns, hostVeth: n.HostVeth, addr: netip.PrefixFrom(n.IP, s.UnderlayOf(n.Subnet).Bits()),
		seg: s.firstSegment(), sysctls: []sysctlValue{{ipForward, "1"}}}
	if s.Router != nil {
		if n.Subnet == 1 {
			e.seg = s.secondSegment()
			e.routes = []route{onEth0(s.Underlay, s.Router.IP2)}
		} else {
			e.routes = []route{onEth0(s.Underlay2, s.Router.IP)}
		}
	}
	// The service CIDR on-link on eth0: without a route (a node has no
	// default route) a packet to a ClusterIP without endpoints fails at
	// routing ("network is unreachable") before the proxy's reject in the
	// forward hook. Nothing on the underlay answers ARP for it, so a
	// packet to an unknown ClusterIP dies in the node.
	e.routes = append(e.routes, onEth0(s.ServiceCIDR))
	// The simulated nodes' InternalIPs on-link too: a host-gw route to a
	// simulated node's pods goes via its InternalIP, which the kernel
	// accepts only on-link. Nobody holds these addresses: ARP for them
	// goes unanswered on the lab's bridge and the packet dies here.
	if s.SimulatedNodeRange.IsValid() {
		e.routes = append(e.routes, onEth0(s.SimulatedNodeRange))
	}
	return e
}

// externalEndpoint is the external host: on the first underlay, reaching
// the second through the router, and the load-balancer range through the
// nodes. It forwards nothing.
func (s *Spec) externalEndpoint() *endpoint {
	e := &endpoint{netns: s.External.Netns, hostVeth: s.External.HostVeth,
		addr: netip.PrefixFrom(s.External.IP, s.Underlay.Bits()), seg: s.firstSegment()}
	if s.Router != nil {
		e.routes = []route{onEth0(s.Underlay2, s.Router.IP)}
	}
	if gws := s.lbGateways(); len(gws) > 0 {
		slices.SortFunc(gws, netip.Addr.Compare)
		e.routes = append(e.routes, onEth0(s.LBPool, gws...))
		if len(gws) > 1 {
			e.sysctls = []sysctlValue{{"net.ipv4.fib_multipath_hash_policy", "1"}}
		}
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
// bridge: the second underlay via the router, and each node's pod CIDR via
// the node (a node behind the router: via the first node on the first
// underlay, whose backend carries it on), so that the apiserver reaches
// pods. Nothing else: no default route, nothing towards the uplink.
func (s *Spec) hostRoutes() []route {
	var rs []route
	if s.Router != nil {
		rs = append(rs, route{dst: s.Underlay2, dev: s.Bridge, vias: []netip.Addr{s.Router.IP}})
	}
	var relay netip.Addr
	for _, n := range s.Nodes {
		if n.Subnet == 0 {
			relay = n.IP
			break
		}
	}
	for _, n := range s.Nodes {
		cidr, ok := s.PodCIDRs[n.Name]
		if !ok || !within(cidr, s.ClusterCIDR) {
			continue
		}
		via := n.IP
		if n.Subnet != 0 {
			if !relay.IsValid() {
				continue
			}
			via = relay
		}
		rs = append(rs, route{dst: cidr, dev: s.Bridge, vias: []netip.Addr{via}})
	}
	return rs
}

// within reports whether p lies inside outer (a route to anything wider,
// such as 0.0.0.0/0 from a hand-edited record, would replace the machine's
// own routes).
func within(p, outer netip.Prefix) bool {
	return p.IsValid() && outer.IsValid() && p.Bits() >= outer.Bits() && outer.Contains(p.Addr())
}

// view is what a kernelIO read: per namespace path ("" the host) what
// exists of the links, routes and sysctls the topology names; nil for a
// namespace that does not exist.
type view map[string]*nsView

type nsView struct {
	links   map[string]linkView
	routes  []route // main-table IPv4 routes to the destinations asked for
	sysctls map[string]string
}

type linkView struct {
	kind   string // "bridge", "veth", ...
	up     bool
	master string // the bridge it is attached to; "" none
	addrs  []netip.Prefix
}

// query is what to read in one namespace.
type query struct {
	links   []string
	dsts    []netip.Prefix
	sysctls []string
}

// queries lists what to read of parts, per namespace path.
func queries(parts []part) map[string]*query {
	qs := map[string]*query{}
	q := func(ns string) *query {
		if qs[ns] == nil {
			qs[ns] = &query{}
		}
		return qs[ns]
	}
	addRoutes := func(x *query, rs []route) {
		for _, r := range rs {
			x.dsts = append(x.dsts, r.dst)
		}
	}
	for _, p := range parts {
		if e := p.endpoint; e != nil {
			sq := q(e.seg.ns)
			sq.links = append(sq.links, e.seg.bridge, e.hostVeth)
			eq := q(NetnsPath(e.netns))
			eq.links = append(eq.links, "lo", "eth0")
			addRoutes(eq, e.routes)
			for _, sc := range e.sysctls {
				eq.sysctls = append(eq.sysctls, sc.key)
			}
		}
		if b := p.bridge; b != nil {
			bq := q(b.ns)
			bq.links = append(bq.links, b.name)
			addRoutes(bq, b.routes)
		}
	}
	for _, x := range qs {
		slices.Sort(x.links)
		x.links = slices.Compact(x.links)
	}
	return qs
}

// fixOp is what a fix does.
type fixOp int

const (
	fixCreateNetns  fixOp = iota // netns (ns is its path)
	fixCreateBridge              // bridge link
	fixCreateVeth                // veth link on bridge master <-> eth0 in peerNS, with mac
	fixDeleteLink                // delete link (a veth's peer goes with it)
	fixSetMaster                 // attach link to bridge master
	fixSetUp                     // set link up
	fixAddAddr                   // add addr to link
	fixReplaceRoute              // route (replacing any other to its dst)
	fixSetSysctl                 // key=value
	fixRefuse                    // nothing can fix it: why says what to do
	fixDeleteNetns               // netns (for down)
)

// fix is one change that makes the kernel closer to the topology.
type fix struct {
	part   partID
	op     fixOp
	ns     string // where: a namespace path, "" the host
	link   string
	master string
	peerNS string           // fixCreateVeth: path of eth0's namespace
	mac    net.HardwareAddr // fixCreateVeth: eth0's
	addr   netip.Prefix
	route  route
	key    string // fixSetSysctl
	value  string
	why    string // fixDeleteLink, fixRefuse
}

// String describes f for people: the part, the change, where.
func (f fix) String() string {
	var what string
	switch f.op {
	case fixCreateNetns:
		what = "create " + nsName(f.ns)
	case fixDeleteNetns:
		what = "delete " + nsName(f.ns)
	case fixCreateBridge:
		what = "create bridge " + f.link
	case fixCreateVeth:
		return fmt.Sprintf("%s: create veth %s on %s in %s <-> eth0 (%s) in %s", f.part, f.link, f.master, nsName(f.ns), f.mac, nsName(f.peerNS))
	case fixDeleteLink:
		what = "delete " + f.link
		if f.why != "" {
			what += " (" + f.why + ")"
		}
	case fixSetMaster:
		what = fmt.Sprintf("attach %s to %s", f.link, f.master)
	case fixSetUp:
		what = "set " + f.link + " up"
	case fixAddAddr:
		what = fmt.Sprintf("add %s to %s", f.addr, f.link)
	case fixReplaceRoute:
		what = "route " + f.route.String()
	case fixSetSysctl:
		what = fmt.Sprintf("sysctl %s=%s", f.key, f.value)
	case fixRefuse:
		what = "cannot fix: " + f.why
	}
	if f.op != fixCreateNetns && f.op != fixDeleteNetns {
		what += " in " + nsName(f.ns)
	}
	return fmt.Sprintf("%s: %s", f.part, what)
}

func nsName(path string) string {
	if path == "" {
		return "the host"
	}
	return "netns " + strings.TrimPrefix(path, "/run/netns/")
}

// diff lists the fixes that make v hold parts, part by part in order.
// It is pure.
func diff(parts []part, v view) []fix {
	d := differ{v: v, fresh: map[string]bool{}}
	for _, p := range parts {
		d.part = p.id
		if p.endpoint != nil {
			d.endpoint(*p.endpoint)
		}
		if p.bridge != nil {
			d.bridge(*p.bridge)
		}
	}
	return d.fixes
}

// differ carries what diff assumed so far: fresh namespaces and links
// ("ns\x00link") are about to be created, so they hold nothing yet.
type differ struct {
	v     view
	part  partID
	fresh map[string]bool
	fixes []fix
}

func (d *differ) add(f fix) {
	f.part = d.part
	d.fixes = append(d.fixes, f)
}

// ns returns what the view holds of namespace path (empty when it is
// missing or about to be created).
func (d *differ) ns(path string) *nsView {
	if n := d.v[path]; n != nil && !d.fresh[path] {
		return n
	}
	return &nsView{}
}

// link returns link name in namespace path as the view has it (absent
// when the link or the namespace is about to be created).
func (d *differ) link(path, name string) (linkView, bool) {
	if d.fresh[path+"\x00"+name] {
		return linkView{}, false
	}
	l, ok := d.ns(path).links[name]
	return l, ok
}

func (d *differ) routes(path string, rs []route) {
	n := d.ns(path)
	for _, r := range rs {
		have := false
		if !d.fresh[path+"\x00"+r.dev] {
			have = slices.ContainsFunc(n.routes, r.equal)
		}
		if !have {
			d.add(fix{op: fixReplaceRoute, ns: path, route: r})
		}
	}
}

// upWithAddr lists adding addr (when valid) to a link and setting it up,
// as far as l (what the view has of it) or a just created link lacks them.
func (d *differ) upWithAddr(path, name string, l linkView, created bool, addr netip.Prefix) {
	if addr.IsValid() && (created || !slices.Contains(l.addrs, addr)) {
		d.add(fix{op: fixAddAddr, ns: path, link: name, addr: addr})
	}
	if created || !l.up {
		d.add(fix{op: fixSetUp, ns: path, link: name})
	}
}

func (d *differ) bridge(b bridge) {
	l, ok := d.link(b.ns, b.name)
	if ok && l.kind != "bridge" {
		d.add(fix{op: fixRefuse, ns: b.ns, link: b.name,
			why: fmt.Sprintf("interface %s exists and is a %s, not the lab's bridge; remove it or pick another --name", b.name, l.kind)})
		return
	}
	if !ok {
		d.add(fix{op: fixCreateBridge, ns: b.ns, link: b.name})
		d.fresh[b.ns+"\x00"+b.name] = true
	}
	d.upWithAddr(b.ns, b.name, l, !ok, b.addr)
	d.routes(b.ns, b.routes)
}

func (d *differ) endpoint(e endpoint) {
	path := NetnsPath(e.netns)
	if d.v[path] == nil {
		d.add(fix{op: fixCreateNetns, ns: path})
		d.fresh[path] = true
	}
	hv, hvOK := d.link(e.seg.ns, e.hostVeth)
	if hvOK && hv.kind != "veth" {
		d.add(fix{op: fixRefuse, ns: e.seg.ns, link: e.hostVeth,
			why: fmt.Sprintf("interface %s exists and is a %s, not the lab's veth to %s; remove it", e.hostVeth, hv.kind, e.netns)})
		return
	}
	_, ethOK := d.link(path, "eth0")
	// A veth pair lives or dies as a whole: one end without the other
	// is not ours (the peer went elsewhere, or another eth0): remove it,
	// then make the pair again.
	if hvOK && !ethOK {
		d.add(fix{op: fixDeleteLink, ns: e.seg.ns, link: e.hostVeth, why: "its eth0 in " + nsName(path) + " is gone"})
	}
	if ethOK && !hvOK {
		d.add(fix{op: fixDeleteLink, ns: path, link: "eth0", why: "its host end " + e.hostVeth + " is gone"})
	}
	created := !hvOK || !ethOK
	if created {
		// The host end is born on the bridge and up (veth.Create).
		d.add(fix{op: fixCreateVeth, ns: e.seg.ns, link: e.hostVeth, master: e.seg.bridge, peerNS: path,
			// A MAC derived from the IP: a rebuilt endpoint keeps it,
			// so its peers' ARP entries stay right.
			mac: nodeMAC(e.addr.Addr())})
		d.fresh[path+"\x00eth0"] = true
	} else {
		if hv.master != e.seg.bridge {
			d.add(fix{op: fixSetMaster, ns: e.seg.ns, link: e.hostVeth, master: e.seg.bridge})
		}
		if !hv.up {
			d.add(fix{op: fixSetUp, ns: e.seg.ns, link: e.hostVeth})
		}
	}
	if lo, _ := d.link(path, "lo"); !lo.up {
		d.add(fix{op: fixSetUp, ns: path, link: "lo"})
	}
	eth, _ := d.link(path, "eth0")
	d.upWithAddr(path, "eth0", eth, created, e.addr)
	d.routes(path, e.routes)
	n := d.ns(path)
	for _, sc := range e.sysctls {
		if n.sysctls[sc.key] != sc.value {
			d.add(fix{op: fixSetSysctl, ns: path, key: sc.key, value: sc.value})
		}
	}
}

// kernelIO is the narrow door to the kernel: read what the queries name
// (per namespace path), apply one fix. netlinkKernel implements it;
// fakeKernel in the tests.
type kernelIO interface {
	read(qs map[string]*query) (view, error)
	apply(f fix) error
}

// kernel is the lab's view of its kernel objects.
type kernel struct {
	io kernelIO
}

// newKernel returns the kernel of the namespace at hostNS ("" this one).
func newKernel(hostNS string) kernel { return kernel{io: netlinkKernel{hostNS: hostNS}} }

// plan returns the fixes s needs now, in the order to apply them.
func (k kernel) plan(s *Spec) ([]fix, error) {
	parts, err := topology(s)
	if err != nil {
		return nil, err
	}
	v, err := k.io.read(queries(parts))
	if err != nil {
		return nil, err
	}
	return diff(parts, v), nil
}

// apply applies fixes in order and stops at the first failure.
func (k kernel) apply(fixes []fix) error {
	for _, f := range fixes {
		if err := k.io.apply(f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

// fixesOf are the fixes of part id.
func fixesOf(fixes []fix, id partID) []fix {
	var out []fix
	for _, f := range fixes {
		if f.part == id {
			out = append(out, f)
		}
	}
	return out
}

// ready reports whether no fix names part id.
func ready(fixes []fix, id partID) bool {
	return !slices.ContainsFunc(fixes, func(f fix) bool { return f.part == id })
}

// removeEndpoint deletes a host veth (and with it eth0) from the segment's
// namespace, when that still exists, and the namespace netnsName.
// Processes still inside keep the namespace alive, so callers stop them
// first.
func (k kernel) removeEndpoint(id partID, netnsName, hostVeth string, seg segment) error {
	var errs []error
	for _, f := range []fix{
		{part: id, op: fixDeleteLink, ns: seg.ns, link: hostVeth},
		{part: id, op: fixDeleteNetns, ns: NetnsPath(netnsName)},
	} {
		if err := k.io.apply(f); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		}
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
	return k.removeEndpoint(nodePart(n.Name), n.Netns, n.HostVeth, seg)
}

// removeRouter and removeExternal delete lab name's router and external
// host (by their names, so they go without a lab.json too).
func (k kernel) removeRouter(name string) error {
	return k.removeEndpoint(partRouter, RouterNetns(name), RouterVeth(name), segment{})
}

func (k kernel) removeExternal(name string) error {
	return k.removeEndpoint(partExternal, ExternalNetns(name), ExternalVeth(name), segment{})
}

// removeBridge deletes the underlay bridge (and the host address and the
// lab's routes on it).
func (k kernel) removeBridge(s *Spec) error {
	return k.io.apply(fix{part: partUnderlay, op: fixDeleteLink, link: s.Bridge})
}

// linkExists reports whether a link named name exists in the host.
func (k kernel) linkExists(name string) (bool, error) {
	v, err := k.io.read(map[string]*query{"": {links: []string{name}}})
	if err != nil {
		return false, err
	}
	_, ok := v[""].links[name]
	return ok, nil
}

// rewired reports whether a fix of part id makes its namespace or its
// veth pair anew: a process inside must start again (it holds the old
// namespace, or the old eth0 under its devices).
func rewired(fixes []fix, id partID) bool {
	return slices.ContainsFunc(fixes, func(f fix) bool {
		return f.part == id && (f.op == fixCreateNetns || f.op == fixCreateVeth)
	})
}

// nodeMAC is 0a:58 followed by the IPv4 address, as Kubernetes networking
// conventionally derives a MAC from an IP.
func nodeMAC(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}
