// Package userspace is the userspace proxy mode: Services served by Go TCP
// and UDP proxies, for nodes with neither nf_tables nor iptables (and for
// debugging: every connection is a log line away).
//
// Design. Every service address and port is a socket of its own in the
// node's namespace, and the kernel's local delivery is the only "rule":
//
//   - one listener per protocol and ClusterIP:port, externalIP:port,
//     load-balancer IP:port, and node address:NodePort (the node's
//     addresses, not 0.0.0.0: loopback stays out as in the kernel modes,
//     and a UDP reply leaves from the address the client sent to);
//   - each ClusterIP, externalIP and load-balancer IP the mode serves is
//     a /32 (/128) on a device of the node: the dummy flatnet-svc where the
//     kernel has the driver, else lo. Either way a pod's packet to the
//     ClusterIP, routed to the node by its default route, is delivered to
//     the listener. Addresses carry IFA_PROTO AddrProto, so a restarted
//     agent (full sync) or Cleanup finds exactly its own, IPv6 included;
//     IPv4 ones on lo also carry the label lo:flatnetsvc. An address the
//     node already has (an externalIP that is a node IP) is not added or
//     removed. Sockets bind with IP_FREEBIND, so the order of address and
//     socket changes does not matter.
//
// A sync computes each service's frontends (address, port, protocol),
// endpoint lists and addresses as plain data (plan.go) and applies the
// difference: sockets opened and closed, addresses added and removed.
// Endpoint changes swap the service port's pool snapshot (pool.go) in
// place: listeners stay open, established connections continue. A service
// port with no usable endpoint has no socket, so the kernel refuses TCP
// with a reset and UDP with ICMP port unreachable, at once.
//
// What it cannot do: the endpoint sees the node's address, never the
// client's (externalTrafficPolicy Local keeps the node-local endpoint
// choice but not the source IP); "drop" verdicts of the kernel modes are
// resets here (a socket cannot drop a SYN); SCTP is not served.
package userspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proxy"
)

// Defaults of Config.
var (
	// DefaultDialTimeouts are kube-proxy userspace's EndpointDialTimeouts:
	// four connect attempts per connection, each after a connect error or
	// timeout going to the next endpoint (round again when there are
	// fewer) with a longer timeout: 3.75 s in all, about what a client's
	// own SYN retransmissions would wait through a kernel mode.
	DefaultDialTimeouts = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}
	// DefaultUDPIdleTimeout is the kernel's unreplied UDP conntrack
	// timeout (nf_conntrack_udp_timeout): a session lives as long as a
	// kernel mode's flow would. kube-proxy's userspace mode used 250 ms,
	// which made every DNS retry a new session.
	DefaultUDPIdleTimeout = 30 * time.Second
)

// Config configures the userspace mode for one IP family.
type Config struct {
	IPv6     bool   // the family served; one Backend per family
	NodeName string // for traffic policy Local
	// ClusterCIDRs are the pod networks: pods on an external address of a
	// Service with externalTrafficPolicy Local keep the internal endpoints.
	ClusterCIDRs []netip.Prefix
	// NodePortAddresses limits NodePorts to the node's addresses in these
	// prefixes (loopback ones included when named); without one of this
	// family, every address of the node but loopback and IPv6 link-local.
	NodePortAddresses []netip.Prefix
	// Interface is the dummy device the service addresses go on
	// (DefaultInterface when ""); lo when the kernel cannot make one.
	Interface string
	// Addrs is the node's addresses; nil: the kernel (Netlink).
	Addrs Addrs
	// NetNS is a namespace path to work in (tests); "": the calling
	// thread's, where the agent runs.
	NetNS          string
	DialTimeouts   []time.Duration // DefaultDialTimeouts when empty
	UDPIdleTimeout time.Duration   // DefaultUDPIdleTimeout when 0
	Logger         klog.Logger     // connection errors at V(2); zero: none
	Now            func() time.Time
}

func (c Config) withDefaults() Config {
	if len(c.DialTimeouts) == 0 {
		c.DialTimeouts = DefaultDialTimeouts
	}
	if c.UDPIdleTimeout == 0 {
		c.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if c.Addrs == nil {
		c.Addrs = &Netlink{Interface: c.Interface}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// sockets is what the sockets share: config, namespace, open connections.
type sockets struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex // protects conns and closed
	conns  map[io.Closer]struct{}
	closed bool
}

// inNS runs fn where the sockets live.
func (rt *sockets) inNS(fn func() error) error {
	if rt.cfg.NetNS == "" {
		return fn()
	}
	return netns.Do(rt.cfg.NetNS, fn)
}

func (rt *sockets) listenConfig() *net.ListenConfig {
	return &net.ListenConfig{Control: freebind}
}

// freebind lets a socket bind a service address before (or without) the
// address being on the device.
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if strings.HasSuffix(network, "6") {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}
	})
	return errors.Join(err, serr)
}

// track remembers an open connection for Close; false after Close.
func (rt *sockets) track(c io.Closer) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return false
	}
	rt.conns[c] = struct{}{}
	return true
}

func (rt *sockets) untrack(c io.Closer) {
	rt.mu.Lock()
	delete(rt.conns, c)
	rt.mu.Unlock()
}

// Backend is the userspace mode. It implements proxy.Backend.
type Backend struct {
	rt      *sockets
	addrs   Addrs
	planner planner

	mu     sync.Mutex // serialises Sync and Close; protects the rest
	closed bool
	// valid says the state below matches the kernel and the sockets;
	// false makes the next sync full.
	valid     bool
	plans     map[string]*svcPlan // by service key
	owners    map[frontendKey]string
	listeners map[frontendKey]listener
	pools     map[string]*pool    // by portID
	addrRefs  map[netip.Addr]int  // services wanting each address
	held      map[netip.Addr]bool // on the device with AddrProto
	other     map[netip.Addr]bool // the node's own: never added or removed
	nodeAddrs []netip.Addr        // where NodePorts listen
}

var _ proxy.Backend = (*Backend)(nil)

// New returns the userspace mode for cfg. Nothing is opened until Sync;
// Close stops it.
func New(cfg Config) *Backend {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		rt:        &sockets{cfg: cfg, ctx: ctx, cancel: cancel, conns: map[io.Closer]struct{}{}},
		addrs:     cfg.Addrs,
		planner:   planner{ipv6: cfg.IPv6, nodeName: cfg.NodeName},
		plans:     map[string]*svcPlan{},
		owners:    map[frontendKey]string{},
		listeners: map[frontendKey]listener{},
		pools:     map[string]*pool{},
		addrRefs:  map[netip.Addr]int{},
	}
}

// Mode is "userspace".
func (b *Backend) Mode() string { return "userspace" }

// ErrClosed is returned by Sync after Close.
var ErrClosed = errors.New("userspace proxy closed")

// Close closes every socket and connection the mode opened. Addresses
// stay, as a kernel mode's rules stay when the agent stops: the next
// agent's first (full) sync keeps what it wants and removes the rest, and
// Cleanup removes them all.
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for k, l := range b.listeners {
		l.close()
		delete(b.listeners, k)
	}
	b.rt.cancel()
	b.rt.mu.Lock()
	b.rt.closed = true
	for c := range b.rt.conns {
		_ = c.Close()
	}
	b.rt.mu.Unlock()
}

// Sync implements proxy.Backend: listeners and addresses follow services.
// A full sync (or the first) reads the node's addresses and reconciles
// every socket and held address; a partial one touches only the changed
// services' sockets, pools and addresses. Sockets that cannot bind
// (another process has the port) are conflicts, retried by the next full
// sync; failing to add or remove an address is an error.
func (b *Backend) Sync(ctx context.Context, services []*proxy.Service, changed proxy.Changes, full bool) (proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var res proxy.SyncResult
	if b.closed {
		return res, ErrClosed
	}
	var err error
	if full || !b.valid {
		err = b.full(services, &res)
	} else {
		err = b.applyAddrs(b.partial(changed, &res), &res)
	}
	b.valid = err == nil
	return res, err
}

// full recomputes every plan from services and the node's addresses.
func (b *Backend) full(services []*proxy.Service, res *proxy.SyncResult) error {
	var held, other []netip.Addr
	if err := b.rt.inNS(func() (err error) { held, other, err = b.addrs.List(); return err }); err != nil {
		return fmt.Errorf("listing the node's addresses: %w", err)
	}
	// The other family's addresses are the other Backend's (dual stack).
	b.held, b.other = map[netip.Addr]bool{}, setOf(other)
	for _, a := range held {
		if b.planner.want(a) {
			b.held[a] = true
		}
	}
	// NodePorts listen on the node's addresses, but not on a ClusterIP
	// someone else put there (the node-local DNS puts the kube-dns one
	// on lo). An externalIP that is a node IP keeps its NodePorts.
	clusterIPs := map[netip.Addr]bool{}
	for _, svc := range services {
		clusterIPs[svc.ClusterIP.Unmap()] = true
	}
	b.nodeAddrs = b.nodeAddrs[:0]
	for _, a := range other {
		if b.nodePortAddr(a) && !clusterIPs[a] {
			b.nodeAddrs = append(b.nodeAddrs, a)
		}
	}
	slices.SortFunc(b.nodeAddrs, netip.Addr.Compare)
	b.nodeAddrs = slices.Compact(b.nodeAddrs)

	plans := make(map[string]*svcPlan, len(services))
	for _, svc := range services {
		plans[svc.Key()] = b.planner.plan(svc, b.nodeAddrs)
	}
	// Owners: a service keeps what it owned, then the rest go to the
	// first claimant in the proxier's order.
	owners := map[frontendKey]string{}
	for key, pl := range plans {
		for fk := range pl.frontends {
			if b.owners[fk] == key {
				owners[fk] = key
			}
		}
	}
	for _, svc := range services {
		b.claim(svc.Key(), plans[svc.Key()], owners, res)
	}
	b.plans, b.owners = plans, owners
	// Pools, in place where they exist.
	live := map[string]bool{}
	for _, pl := range plans {
		for id, t := range pl.ports {
			live[id] = true
			b.setPool(id, t)
		}
	}
	for id, p := range b.pools {
		if !live[id] {
			delete(b.pools, id)
			continue
		}
		p.sweep()
	}
	keys := map[frontendKey]bool{}
	for fk := range b.listeners {
		keys[fk] = true
	}
	for fk := range owners {
		keys[fk] = true
	}
	b.applyListeners(keys, true, res)
	b.addrRefs = map[netip.Addr]int{}
	for _, pl := range plans {
		for _, a := range pl.addrs {
			b.addrRefs[a]++
		}
	}
	addrs := slices.Collect(maps.Keys(b.addrRefs))
	for a := range b.held {
		addrs = append(addrs, a)
	}
	return b.applyAddrs(addrs, res)
}

// partial replans the changed services only; it returns the addresses
// they had or have.
func (b *Backend) partial(changed proxy.Changes, res *proxy.SyncResult) []netip.Addr {
	var addrs []netip.Addr
	next := map[string]*svcPlan{}
	for key, svc := range changed {
		if svc != nil {
			next[key] = b.planner.plan(svc, b.nodeAddrs)
		}
	}
	touched := map[frontendKey]bool{}
	// Release everything first, so that one changed service can take
	// what another changed service gave up in the same sync.
	for key := range changed {
		old := b.plans[key]
		if old == nil {
			continue
		}
		for fk := range old.frontends {
			if b.owners[fk] == key {
				delete(b.owners, fk)
				touched[fk] = true
			}
		}
		for _, a := range old.addrs {
			if b.addrRefs[a]--; b.addrRefs[a] <= 0 {
				delete(b.addrRefs, a)
			}
		}
		addrs = append(addrs, old.addrs...)
		for id := range old.ports {
			if pl := next[key]; pl == nil || pl.ports[id] == nil {
				delete(b.pools, id)
			}
		}
		delete(b.plans, key)
	}
	for _, key := range slices.Sorted(maps.Keys(next)) {
		pl := next[key]
		b.plans[key] = pl
		for fk := range pl.frontends {
			touched[fk] = true
		}
		b.claim(key, pl, b.owners, res)
		for id, t := range pl.ports {
			b.setPool(id, t)
		}
		for _, a := range pl.addrs {
			b.addrRefs[a]++
		}
		addrs = append(addrs, pl.addrs...)
	}
	b.applyListeners(touched, false, res)
	return addrs
}

// claim gives key the frontends of pl nobody else owns; the others are
// conflicts and left out.
func (b *Backend) claim(key string, pl *svcPlan, owners map[frontendKey]string, res *proxy.SyncResult) {
	fks := slices.SortedFunc(maps.Keys(pl.frontends), func(x, y frontendKey) int {
		return strings.Compare(x.String(), y.String())
	})
	for _, fk := range fks {
		if owner, ok := owners[fk]; ok && owner != key {
			res.Conflicts = append(res.Conflicts, &ConflictError{Service: key, Owner: owner, Frontend: fk.String(), Kind: pl.frontends[fk].Kind.String()})
			continue
		}
		owners[fk] = key
	}
}

func (b *Backend) setPool(id string, t *targets) {
	if p, ok := b.pools[id]; ok {
		p.t.Store(t)
		return
	}
	b.pools[id] = newPool(t, b.rt.cfg.Now)
}

// applyListeners makes the sockets of keys match the owners' plans:
// opened, pointed at the current pool, or closed. full also replaces
// sockets that died.
func (b *Backend) applyListeners(keys map[frontendKey]bool, full bool, res *proxy.SyncResult) {
	for _, fk := range slices.SortedFunc(maps.Keys(keys), func(x, y frontendKey) int { return strings.Compare(x.String(), y.String()) }) {
		var spec frontendSpec
		owner, owned := b.owners[fk]
		if owned {
			spec = b.plans[owner].frontends[fk]
		}
		l := b.listeners[fk]
		if l != nil && (!owned || !spec.Listen || (full && l.dead())) {
			l.close()
			delete(b.listeners, fk)
			res.Operations++
			l = nil
		}
		if !owned || !spec.Listen {
			continue
		}
		fe := &frontend{kind: spec.Kind, pool: b.pools[spec.Port]}
		if l != nil {
			l.set(fe)
			continue
		}
		var err error
		switch fk.Proto {
		case proxy.TCP:
			l, err = b.rt.listenTCP(fk.Addr, fe)
		case proxy.UDP:
			l, err = b.rt.listenUDP(fk.Addr, fe)
		}
		res.Operations++
		if err != nil {
			res.Conflicts = append(res.Conflicts, &ConflictError{Service: owner, Frontend: fk.String(), Kind: spec.Kind.String(), Err: err})
			continue
		}
		b.listeners[fk] = l
	}
}

// applyAddrs adds or removes each of addrs as addrRefs wants it.
func (b *Backend) applyAddrs(addrs []netip.Addr, res *proxy.SyncResult) error {
	var errs []error
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, a := range slices.Compact(addrs) {
		want := b.addrRefs[a] > 0 && !b.other[a]
		switch {
		case want && !b.held[a]:
			if err := b.rt.inNS(func() error { return b.addrs.Add(a) }); err != nil {
				errs = append(errs, fmt.Errorf("adding service address %s: %w", a, err))
				continue
			}
			b.held[a] = true
			res.Operations++
		case !want && b.held[a]:
			if err := b.rt.inNS(func() error { return b.addrs.Del(a) }); err != nil {
				errs = append(errs, fmt.Errorf("removing service address %s: %w", a, err))
				continue
			}
			delete(b.held, a)
			res.Operations++
		}
	}
	return errors.Join(errs...)
}

// nodePortAddr says whether NodePorts listen on the node address a.
func (b *Backend) nodePortAddr(a netip.Addr) bool {
	if !b.planner.want(a) || a.IsLinkLocalUnicast() && a.Is6() || a.IsUnspecified() {
		return false
	}
	var ranges []netip.Prefix
	for _, p := range b.rt.cfg.NodePortAddresses {
		if p.Addr().Is6() == b.rt.cfg.IPv6 {
			ranges = append(ranges, p)
		}
	}
	if len(ranges) == 0 {
		return !a.IsLoopback()
	}
	// Loopback only when named, as kube-proxy's --nodeport-addresses
	// 127.0.0.0/8 asks for it.
	return inAny(ranges, a)
}

// ConflictError says a service's frontend is left out: another service
// owns the address and port (Owner), or the socket cannot bind (Err).
type ConflictError struct {
	Service, Owner string
	Frontend, Kind string
	Err            error
}

func (e *ConflictError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("service %s: %s %s: cannot listen: %v; left out until the next full sync", e.Service, e.Kind, e.Frontend, e.Err)
	}
	return fmt.Sprintf("service %s: %s %s is already used by service %s; left out", e.Service, e.Kind, e.Frontend, e.Owner)
}

func (e *ConflictError) Unwrap() error { return e.Err }

// Probe reports whether the mode can run here: it needs netlink in the
// node's namespace to hold the service addresses (adding them also needs
// CAP_NET_ADMIN, which the agent has).
func Probe(ctx context.Context) error {
	if _, _, err := (&Netlink{}).List(); err != nil {
		return fmt.Errorf("userspace proxy mode: %w", err)
	}
	return nil
}

// Cleanup removes every address the userspace mode added in the calling
// thread's namespace, and its dummy device: for an agent that starts in
// another mode. Idempotent.
func Cleanup(ctx context.Context) error {
	n := &Netlink{}
	held, _, err := n.List()
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	var errs []error
	for _, a := range held {
		if err := n.Del(a); err != nil {
			errs = append(errs, err)
		}
	}
	if err := netlinkx.DeleteDummy(DefaultInterface); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func setOf(as []netip.Addr) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool, len(as))
	for _, a := range as {
		m[a] = true
	}
	return m
}
