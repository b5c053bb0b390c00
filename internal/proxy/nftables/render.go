// Package nftables renders flatnet's Service proxy into one knftables
// transaction against its own table.
//
// Design. A packet's lookup must cost the same at 10 or 50,000 services, so
// nothing walks a list of services: the base chains hand the packet to
// verdict maps keyed by (address . protocol . port) and (protocol . port) for
// NodePorts, and each element jumps straight to that service port's chain.
//
//	prerouting/output (nat, dstnat)  -> services
//	  daddr . l4proto . dport vmap @service-ips       -> svc-* | svl-* | ext-*
//	  fib daddr local, l4proto . dport vmap @service-nodeports -> ext-*
//	input/forward/output (filter, filter-10), ct state new -> no-endpoints
//	  same keys in @no-endpoint-services / @no-endpoint-nodeports -> reject-chain
//	  any other port of a ClusterIP (@cluster-ips)              -> reject-chain
//	postrouting (nat, srcnat) -> masquerading: masquerade what carries the mark
//
// Per service port: svc-* picks among all usable endpoints, svl-* among the
// node's own (traffic policy Local), ext-* is the entry for NodePorts,
// externalIPs and load-balancer IPs (masquerade for policy Cluster, source
// kept for Local). The pick is one rule, "dnat ip addr . port to numgen
// random mod N offset K map @endpoints-tcp-7": the services share named
// endpoint maps (per protocol, 16 of each, see endpointMapName), each
// service port owning keys [K, K+N) of one. Not one anonymous map per
// service port, as kube-proxy writes: the kernel binds each anonymous set
// to its rule by walking the whole transaction, so a ruleset of 10,000 of
// them took 54 s to commit, against about 1 s now (docs/proxy.md, "Table
// layout"). With session affinity each endpoint has an ep-* chain that
// records the client in a per-endpoint dynamic set (timeout = affinity
// timeout) and DNATs, and the pick is "numgen random mod N offset K vmap
// @endpoint-chains-3". Hairpin traffic (an endpoint reaching itself) is
// masqueraded in postrouting. A service port without usable
// endpoints is never in @service-ips: its keys sit in the no-endpoint maps
// and the filter chains reject (TCP reset, ICMP port unreachable), so a client
// fails at once instead of timing out.
//
// Syncs. Render keeps, per service, the objects it wrote (a State). A partial
// sync diffs the changed services' old and new objects and emits only those
// changes. A dispatch chain keeps its keys while its endpoints fit, and each
// endpoint its key (pick.place; numgen random picks uniformly in any order),
// so a node joining or leaving a 5,000-endpoint service changes one to three
// map elements and the rule's mod N, not every element after the endpoint's
// place in the sorted list. A full sync rewrites everything, endpoints in
// the model's order (flushing maps and chains inside the same transaction,
// so packets see the old or the new ruleset, never a gap), and deletes
// chains and sets it finds in the table but no longer wants. The table
// itself is never flushed, and affinity sets are kept unless their timeout
// changed.
package nftables

import (
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"hash/maphash"
	"maps"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy"
)

// Names of the fixed objects in the table.
const (
	DefaultTable = "flatnet-proxy"

	chainNatPrerouting  = "nat-prerouting"
	chainNatOutput      = "nat-output"
	chainNatPostrouting = "nat-postrouting"
	chainFilterInput    = "filter-input"
	chainFilterForward  = "filter-forward"
	chainFilterOutput   = "filter-output"
	chainServices       = "services"
	chainNoEndpoints    = "no-endpoints"
	chainReject         = "reject-chain"
	chainMarkMasq       = "mark-for-masquerade"
	chainMasquerading   = "masquerading"
	chainFwPrerouting   = "firewall-prerouting"
	chainFwOutput       = "firewall-output"
	chainFwCheck        = "firewall-check"

	mapServiceIPs        = "service-ips"
	mapServiceNodePorts  = "service-nodeports"
	mapNoEndpointIPs     = "no-endpoint-services"
	mapNoEndpointNodePts = "no-endpoint-nodeports"
	mapFirewallIPs       = "firewall-ips"
	// The endpoint maps: every service port's numgen picks a key in its
	// own range of one of them (see slots). endpoints-<proto>-<shard>:
	// key -> endpoint address . port; endpoint-chains-<shard>: key ->
	// goto ep-* (session affinity). See endpointMapName.
	mapEndpointsPrefix      = "endpoints-"
	mapEndpointChainsPrefix = "endpoint-chains-"
	endpointShards          = 16

	// Sets whose elements several services may want (refcounted in State).
	setClusterIPs = "cluster-ips"         // every ClusterIP: off-cluster masquerade
	setHairpin    = "hairpin-connections" // ep . ep . proto . port of local endpoints

	// DefaultMasqueradeMark is the packet mark bit asking for masquerade.
	DefaultMasqueradeMark = 0x4000
)

// Config says how to render. Family picks the table family (ip or ip6): a
// dual-stack node runs one renderer per family, as kube-proxy does.
type Config struct {
	Family   knftables.Family
	Table    string // DefaultTable when empty
	NodeName string // for traffic policy Local
	// ClusterCIDRs are the pod networks: pod traffic to an externalTrafficPolicy
	// Local address is short-circuited to the internal endpoints.
	ClusterCIDRs   []netip.Prefix
	MasqueradeMark uint32 // DefaultMasqueradeMark when zero
	// NodePortAddresses limits NodePorts to the node's addresses in these
	// prefixes (kube-proxy's nodePortAddresses); without a prefix of this
	// family (as kube-proxy reads it): every local address but loopback.
	NodePortAddresses []netip.Prefix
	// ModulusHold is how long a partial sync may keep a dispatch rule's
	// modulus over fewer endpoints (holdModulus); 0: never.
	ModulusHold time.Duration
	// Now is the clock of ModulusHold (time.Now when nil).
	Now func() time.Time
}

// DefaultModulusHold is the agent's ModulusHold: longer than a replaced
// pod usually takes to be Ready again.
const DefaultModulusHold = 10 * time.Second

func (c Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c Config) withDefaults() Config {
	if c.Family == "" {
		c.Family = knftables.IPv4Family
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MasqueradeMark == 0 {
		c.MasqueradeMark = DefaultMasqueradeMark
	}
	return c
}

func (c Config) v6() bool { return c.Family == knftables.IPv6Family }

func (c Config) ipKw() string {
	if c.v6() {
		return "ip6"
	}
	return "ip"
}

func (c Config) addrType() string {
	if c.v6() {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

func (c Config) wantAddr(a netip.Addr) bool {
	return a.IsValid() && (a.Is4() || a.Is4In6()) != c.v6()
}

// elemKey names one map element.
type elemKey struct{ Map, Key string }

// draft is what renderService builds for one service, in maps (a name
// written twice is one object), before compact sorts it into objects.
type draft struct {
	chains map[string][]string      // chain -> rules
	sets   map[string]time.Duration // affinity set -> timeout
	elems  map[elemKey]string       // map element -> verdict
	picks  map[string]pick          // dispatch chain -> its endpoint-map elements
	// shared are elements of the shared sets (cluster-ips,
	// hairpin-connections) this service wants; others may want them too.
	shared map[elemKey]bool
}

func newDraft() *draft {
	return &draft{chains: map[string][]string{}, sets: map[string]time.Duration{}, elems: map[elemKey]string{}, picks: map[string]pick{}, shared: map[elemKey]bool{}}
}

// objects are what one service owns in the table, each list sorted by
// name or key. The State keeps one per service for as long as the
// service lives, so it is kept small: sorted slices rather than maps, and
// a chain's rules only until the transaction is written (then their hash
// says whether a later render changed them).
type objects struct {
	chains []chainObj
	sets   []setObj
	elems  []elemObj
	shared []elemKey
}

type chainObj struct {
	name  string
	rules []string // nil once written
	sum   uint64   // rulesSum(rules)
	// sets are the service's affinity sets the rules name: a chain must
	// be rewritten when one of them is recreated.
	sets []string
	// pick: the endpoint-map elements its numgen picks among, if any.
	pick
}

// pick is a dispatch chain's elements in an endpoint map: keys off,
// off+1, ... hold vals (an endpoint's "address . port", or "goto ep-…").
// Only the values' hashes are kept once written (a partial sync compares
// them): at 10,000 services the strings would be most of the state.
type pick struct {
	keys keyRange
	m    string   // the endpoint map (interned: endpointMapName)
	sums []uint64 // valueSum of each value
	vals []string // nil once written
	// heldSince is when the pick began holding its modulus over fewer
	// endpoints (Unix nanoseconds; 0: every value is its own endpoint).
	// See holdModulus.
	heldSince int64
}

func valueSum(v string) uint64 { return maphash.String(ruleSeed, v) }

// key is the key of p's element at index i.
func (p *pick) key(i int) []string {
	return []string{strconv.FormatUint(uint64(p.keys.off)+uint64(i), 10)}
}

// element is p's element at index i.
func (p *pick) element(i int) *knftables.Element {
	return &knftables.Element{Map: p.m, Key: p.key(i), Value: []string{p.vals[i]}}
}

// elements are all of p's elements.
func (p *pick) elements() []knftables.Object {
	out := make([]knftables.Object, len(p.vals))
	for i := range p.vals {
		out[i] = p.element(i)
	}
	return out
}

// diffPicks returns the element deletes and adds that turn old into nw
// (either may be the zero pick). Elements are built only for the indices
// that change: a large pick mostly does not.
func diffPicks(old, nw pick) (dels, adds []knftables.Object) {
	del := func(i int) {
		dels = append(dels, &knftables.Element{Map: old.m, Key: old.key(i)})
	}
	if old.m != nw.m || old.keys.off != nw.keys.off {
		for i := range old.sums {
			del(i)
		}
		return dels, nw.elements()
	}
	for i := range max(len(old.sums), len(nw.sums)) {
		switch {
		case i >= len(nw.sums):
			del(i)
		case i >= len(old.sums):
			adds = append(adds, nw.element(i))
		case old.sums[i] != nw.sums[i]:
			del(i)
			adds = append(adds, nw.element(i))
		}
	}
	return dels, adds
}

// place reorders p's values, given in endpoint order, for a chain that
// keeps its keys and map: a value old (the sums at those keys) already
// holds keeps its index, and the rest fill the free indices in order, so
// one endpoint more or less changes one to three elements, not every
// element after it. Indices stay 0..mod-1: when the pick shrank, the values
// beyond its new end move down into the gaps.
//
// mod > len(p.vals) holds the modulus (holdModulus): the pick grows to mod
// values, the indices no endpoint of p takes holding a second copy of one
// that does (fillers): at an index whose old value is still one of p's,
// that value (a filler that stays), else p's values in turn.
func (p *pick) place(old []uint64, mod int) {
	if mod > len(p.vals) {
		for range mod - len(p.vals) {
			p.vals, p.sums = append(p.vals, ""), append(p.sums, 0) // free, filled below
		}
		defer p.fill(old)
	}
	if slices.Equal(old, p.sums) {
		return
	}
	n := len(p.sums)
	// first[s]-1 is the first index of p with sum s not yet placed
	// (0: none), next[i]-1 the one after i; taken marks a placed one.
	const taken = -1
	first := make(map[uint64]int32, n)
	next := make([]int32, n)
	for i := n - 1; i >= 0; i-- {
		next[i] = first[p.sums[i]]
		first[p.sums[i]] = int32(i) + 1
	}
	at := make([]int32, n) // at[k]: the index of p placed at k, -1 while free
	for k := range at {
		at[k] = -1
		if k >= len(old) {
			continue
		}
		if i := first[old[k]] - 1; i >= 0 {
			at[k] = i
			first[old[k]] = next[i]
			next[i] = taken
		}
	}
	free := 0
	for i := range n {
		if next[i] == taken {
			continue
		}
		for at[free] >= 0 {
			free++
		}
		at[free] = int32(i)
	}
	// Move value at[k] to k, in place, one cycle of the permutation at a
	// time; -1 marks the indices done.
	for k := range at {
		if at[k] < 0 {
			continue
		}
		v, sum := p.vals[k], p.sums[k]
		for j := k; ; {
			i := int(at[j])
			at[j] = -1
			if i == k {
				p.vals[j], p.sums[j] = v, sum
				break
			}
			p.vals[j], p.sums[j] = p.vals[i], p.sums[i]
			j = i
		}
	}
}

// fill gives each index place left free (an empty value) a filler, a
// second copy of one of p's endpoints, never a third (holdModulus allows
// fewer copies than endpoints): first the old value at that index when it
// is still an endpoint without a copy (a filler that stays), then the
// endpoints without a copy in turn.
func (p *pick) fill(old []uint64) {
	var endpoints []int // the indices of p's own values
	bySum := map[uint64]string{}
	keys := map[uint64]int{} // how many keys hold each value
	for i, v := range p.vals {
		if v != "" {
			endpoints = append(endpoints, i)
			bySum[p.sums[i]] = v
			keys[p.sums[i]]++
		}
	}
	for k, v := range p.vals {
		if v != "" || k >= len(old) {
			continue
		}
		if v, ok := bySum[old[k]]; ok && keys[old[k]] < 2 {
			p.vals[k], p.sums[k] = v, old[k]
			keys[old[k]]++
		}
	}
	next := 0
	for k, v := range p.vals {
		if v != "" {
			continue
		}
		i := endpoints[next%len(endpoints)]
		for tries := 1; keys[p.sums[i]] >= 2 && tries < len(endpoints); tries++ {
			next++
			i = endpoints[next%len(endpoints)]
		}
		next++
		p.vals[k], p.sums[k] = p.vals[i], p.sums[i]
		keys[p.sums[i]]++
	}
}

// holdModulus returns the modulus a dispatch chain whose previous pick is
// prev keeps over its n endpoints in a partial sync, or 0 for n.
//
// Why. The rule "numgen random mod N ... map @endpoints-…" names N, so
// an endpoint leaving and its replacement joining rewrites the rule twice,
// and a transaction that adds a rule with a dnat or a lookup makes the
// kernel validate the whole table at commit: at 10,000 services that is
// ~10 ms of every churn sync, where an element change costs ~1 ms
// (docs/scale.md, "Why a churn partial sync costs 20-30 ms"). So when an
// endpoint leaves, the chain keeps its modulus and the leaver's key takes
// a second copy of another endpoint (pick.fill); its replacement takes
// that key back, and the rule is never touched. Bounded: at most one
// copy per four endpoints (at least one), so no endpoint gets more than
// twice its share, and for at most ModulusHold; after that the next sync
// of the service (Backend.Sync asks for one) rewrites the rule with the
// exact count. Full syncs always write the exact count.
func (r *Renderer) holdModulus(prev pick, n int, now int64) int {
	mod := len(prev.sums)
	switch {
	case r.cfg.ModulusHold <= 0, n < 1, mod <= n, mod-n > max(1, n/4):
		return 0
	case prev.heldSince != 0 && now-prev.heldSince >= int64(r.cfg.ModulusHold):
		return 0
	}
	return mod
}

// noteHolds records whether service key's objects o hold a modulus, and
// since when.
func (s *State) noteHolds(key string, o *objects) {
	var since int64
	for _, c := range o.chains {
		if c.heldSince != 0 && (since == 0 || c.heldSince < since) {
			since = c.heldSince
		}
	}
	if since == 0 {
		delete(s.held, key)
		return
	}
	if s.held == nil {
		s.held = map[string]int64{}
	}
	s.held[key] = since
}

// WithHoldsDue returns changed plus every service of services whose chain
// has held its modulus for hold by now, so that this sync writes their
// exact count; changed itself is not modified.
func (s *State) WithHoldsDue(services []*proxy.Service, changed proxy.Changes, hold time.Duration, now time.Time) proxy.Changes {
	if s == nil || len(s.held) == 0 {
		return changed
	}
	var due map[string]bool
	for key, since := range s.held {
		if _, ok := changed[key]; !ok && now.UnixNano()-since >= int64(hold) {
			if due == nil {
				due = map[string]bool{}
			}
			due[key] = true
		}
	}
	if len(due) == 0 {
		return changed
	}
	out := make(proxy.Changes, len(changed)+len(due))
	maps.Copy(out, changed)
	for _, svc := range services {
		if key := svc.Key(); due[key] {
			out[key] = svc
			if delete(due, key); len(due) == 0 {
				break
			}
		}
	}
	return out
}

// NextHoldDue is the time from now until the first held modulus is due
// (WithHoldsDue), at least a millisecond; 0 when none is held.
func (s *State) NextHoldDue(hold time.Duration, now time.Time) time.Duration {
	if s == nil || len(s.held) == 0 {
		return 0
	}
	first := int64(math.MaxInt64)
	for _, since := range s.held {
		first = min(first, since)
	}
	return max(time.Millisecond, time.Duration(first+int64(hold)-now.UnixNano()))
}

// keyRange is a dispatch chain's keys in the endpoint maps: [off, off+size),
// size a power of two, of which the first N (its endpoint count) are used.
type keyRange struct{ off, size uint32 }

// slots hands out keyRanges. A service port keeps its range while its
// endpoints fit, so an endpoint change rewrites map elements (and the rule
// only when N changes), never the offset; a range that no longer fits goes
// back to the free list of its size, for the next service port of that
// size. A full sync starts from zero again.
type slots struct {
	next uint32
	free map[uint32][]uint32 // size -> free offsets
}

func (s *slots) alloc(n int) keyRange {
	size := uint32(1)
	for int(size) < n {
		size <<= 1
	}
	if f := s.free[size]; len(f) > 0 {
		s.free[size] = f[:len(f)-1]
		return keyRange{f[len(f)-1], size}
	}
	r := keyRange{s.next, size}
	s.next += size
	return r
}

func (s *slots) release(r keyRange) {
	if r.size == 0 {
		return
	}
	if s.free == nil {
		s.free = map[uint32][]uint32{}
	}
	s.free[r.size] = append(s.free[r.size], r.off)
}

// allocator gives a dispatch chain its key range for n endpoints, as a
// pick without values: the chain's previous pick when it keeps that range
// (so that place can keep its values where they are), else a fresh range;
// and hold, the modulus the chain keeps over its n endpoints (0: n), see
// holdModulus. With keysOnlyToHold (one endpoint, which needs no map
// unless the chain holds) it allocates nothing and returns the zero pick
// unless the chain holds.
type allocator func(chain string, n int, keysOnlyToHold bool) (prev pick, hold int)

type setObj struct {
	name    string
	timeout time.Duration
}

type elemObj struct {
	key     elemKey
	verdict string
}

// compact turns d into objects, each list sorted.
func (d *draft) compact() *objects {
	o := &objects{}
	if len(d.chains) > 0 {
		o.chains = make([]chainObj, 0, len(d.chains))
		for _, name := range sortedNames(d.chains) {
			rules := d.chains[name]
			c := chainObj{name: name, rules: rules, sum: rulesSum(rules), pick: d.picks[name]}
			for set := range d.sets {
				if usesSet(rules, set) {
					c.sets = append(c.sets, set)
				}
			}
			o.chains = append(o.chains, c)
		}
	}
	for _, name := range sortedNames(d.sets) {
		o.sets = append(o.sets, setObj{name, d.sets[name]})
	}
	if len(d.elems) > 0 {
		o.elems = make([]elemObj, 0, len(d.elems))
		for _, k := range sortedKeysOf(d.elems) {
			o.elems = append(o.elems, elemObj{k, d.elems[k]})
		}
	}
	if len(d.shared) > 0 {
		o.shared = sortedKeysOf(d.shared)
	}
	return o
}

// written drops the rules and endpoint-map values, which the transaction
// now holds.
func (o *objects) written() {
	for i := range o.chains {
		o.chains[i].rules = nil
		o.chains[i].vals = nil
	}
}

func (o *objects) chain(name string) (chainObj, bool) {
	i, ok := slices.BinarySearchFunc(o.chains, name, func(c chainObj, n string) int { return strings.Compare(c.name, n) })
	if !ok {
		return chainObj{}, false
	}
	return o.chains[i], true
}

func (o *objects) set(name string) (time.Duration, bool) {
	i, ok := slices.BinarySearchFunc(o.sets, name, func(s setObj, n string) int { return strings.Compare(s.name, n) })
	if !ok {
		return 0, false
	}
	return o.sets[i].timeout, true
}

func (o *objects) elem(k elemKey) (string, bool) {
	i, ok := slices.BinarySearchFunc(o.elems, k, func(e elemObj, k elemKey) int { return compareElemKeys(e.key, k) })
	if !ok {
		return "", false
	}
	return o.elems[i].verdict, true
}

// ruleSeed makes rulesSum's hashes; they are only compared within the
// process.
var ruleSeed = maphash.MakeSeed()

// rulesSum hashes a chain's rules (64 bits: a collision, which would
// leave a changed chain unwritten until the next full sync, has odds of
// 2^-64 per comparison).
func rulesSum(rules []string) uint64 {
	var h maphash.Hash
	h.SetSeed(ruleSeed)
	for _, r := range rules {
		n := len(r)
		_ = h.WriteByte(byte(n))
		_ = h.WriteByte(byte(n >> 8))
		_ = h.WriteByte(byte(n >> 16))
		_, _ = h.WriteString(r)
	}
	return h.Sum64()
}

// State is what the previous sync wrote, per service key.
type State struct {
	services map[string]*objects
	slots    slots
	// owners maps each element to the service that wrote it: two services
	// claiming one key (an externalIP:port, a NodePort) would make the kernel
	// refuse the whole transaction, so the first claim wins.
	owners map[elemKey]string
	// shared counts, per shared-set element, the services wanting it: it
	// is in the kernel while the count is positive.
	shared map[elemKey]int
	// Conflicts lists the elements the last sync left out for that reason.
	Conflicts []error
	// held maps each service with a chain holding its modulus to the
	// earliest heldSince of its chains.
	held map[string]int64
}

// claim drops from o the elements another service owns, records o's own.
func (s *State) claim(key string, o *objects) {
	kept := o.elems[:0]
	for _, e := range o.elems {
		if owner, ok := s.owners[e.key]; ok && owner != key {
			s.Conflicts = append(s.Conflicts, &proxy.ConflictError{Service: key, Owner: owner, What: e.key.Map, Key: e.key.Key})
			continue
		}
		s.owners[e.key] = key
		kept = append(kept, e)
	}
	clear(o.elems[len(kept):])
	o.elems = kept
}

// endpointMapName is the endpoint map a dispatch chain's numgen reads:
// one set of maps per protocol, as nft 1.0.6 wants (a map typed "ip daddr
// . tcp dport" refuses a UDP rule, and "th dport" refuses every one), each
// spread over endpointShards maps by the chain's name. Spread because the
// kernel's cost is per map: each rule bound to a map walks the map's
// elements, and each element added checks every rule bound to it, so one
// map for 10,000 service ports commits in about 13 s and 16 maps in under
// one (docs/proxy.md, "Programming the kernel").
func endpointMapName(chain string, proto proxy.Protocol, affinity bool) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(chain))
	shard := h.Sum32() % endpointShards
	if affinity {
		return endpointChainMapNames[shard]
	}
	return endpointMapNames[proto][shard]
}

// endpointMapNames are the endpoint maps' names by protocol (the model
// carries TCP, UDP and SCTP only: the tracker drops other ports), and
// endpointChainMapNames the endpoint-chains maps', made once.
var endpointMapNames, endpointChainMapNames = func() (map[proxy.Protocol][]string, []string) {
	byProto := map[proxy.Protocol][]string{}
	var chains []string
	for shard := range endpointShards {
		for _, p := range []proxy.Protocol{proxy.TCP, proxy.UDP, proxy.SCTP} {
			byProto[p] = append(byProto[p], mapEndpointsPrefix+string(p)+"-"+strconv.Itoa(shard))
		}
		chains = append(chains, mapEndpointChainsPrefix+strconv.Itoa(shard))
	}
	return byProto, chains
}()

// endpointMaps are every endpoint map's name and typeof.
func (r *Renderer) endpointMaps() []*knftables.Map {
	var out []*knftables.Map
	for shard := range endpointShards {
		for _, p := range []proxy.Protocol{proxy.TCP, proxy.UDP, proxy.SCTP} {
			out = append(out, &knftables.Map{Name: endpointMapNames[p][shard],
				TypeOf: "numgen random mod 1 : " + r.cfg.ipKw() + " daddr . " + string(p) + " dport"})
		}
		out = append(out, &knftables.Map{Name: endpointChainMapNames[shard], TypeOf: "numgen random mod 1 : verdict"})
	}
	return out
}

// release forgets o's elements.
func (s *State) release(key string, o *objects) {
	for _, e := range o.elems {
		if s.owners[e.key] == key {
			delete(s.owners, e.key)
		}
	}
}

// Chains returns the names of every per-service chain in the state, sorted.
func (s *State) Chains() []string {
	var out []string
	if s == nil {
		return nil
	}
	for _, o := range s.services {
		for _, c := range o.chains {
			out = append(out, c.name)
		}
	}
	sort.Strings(out)
	return out
}

// Existing lists what a full sync found in the table (from knftables List),
// so it can delete what it no longer wants after a restart.
type Existing struct {
	Chains []string
	Sets   []string
	Maps   []string
}

// Renderer renders Services into transactions.
type Renderer struct {
	cfg Config
}

// New returns a renderer for cfg.
func New(cfg Config) *Renderer { return &Renderer{cfg: cfg.withDefaults()} }

// Config returns the effective configuration.
func (r *Renderer) Config() Config { return r.cfg }

// Full writes the whole ruleset into tx and returns the new state. prev may be
// nil (after a restart); existing, when given, names the table's current
// chains and sets so that stale ones are deleted.
func (r *Renderer) Full(tx *knftables.Transaction, services []*proxy.Service, prev *State, existing *Existing) *State {
	next := &State{services: map[string]*objects{}, owners: map[elemKey]string{}, shared: map[elemKey]int{}}
	// In key order: the first claim wins. Each key is built once (a sort
	// calling Key() would build n log n of them).
	type keyed struct {
		key string
		svc *proxy.Service
	}
	sorted := make([]keyed, len(services))
	for i, svc := range services {
		sorted[i] = keyed{svc.Key(), svc}
	}
	slices.SortFunc(sorted, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	alloc := func(_ string, n int, keysOnlyToHold bool) (pick, int) {
		if keysOnlyToHold {
			return pick{}, 0
		}
		return pick{keys: next.slots.alloc(n)}, 0
	}
	for _, ks := range sorted {
		key, svc := ks.key, ks.svc
		o := r.renderService(svc, alloc)
		next.claim(key, o)
		next.services[key] = o
		for _, k := range o.shared {
			next.shared[k]++
		}
	}
	base := r.baseChains()

	tx.Add(&knftables.Table{Comment: knftables.PtrTo("flatnet service proxy")})
	r.addBaseObjects(tx)
	// Flush everything we rewrite, inside this transaction.
	for _, name := range sortedNames(base) {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointIPs, mapNoEndpointNodePts, mapFirewallIPs} {
		tx.Flush(&knftables.Map{Name: m})
	}
	for _, set := range []string{setClusterIPs, setHairpin} {
		tx.Flush(&knftables.Set{Name: set})
	}
	wantChains := map[string]bool{}
	wantSets := map[string]time.Duration{}
	for _, o := range next.services {
		for _, c := range o.chains {
			wantChains[c.name] = true
		}
		for _, s := range o.sets {
			wantSets[s.name] = s.timeout
		}
	}
	var stale []string
	known := map[string]bool{}
	if prev != nil {
		for _, c := range prev.Chains() {
			known[c] = true
		}
	}
	if existing != nil {
		for _, c := range existing.Chains {
			if _, isBase := base[c]; !isBase {
				known[c] = true
			}
		}
	}
	for _, c := range sortedNames(known) {
		if !wantChains[c] {
			tx.Flush(&knftables.Chain{Name: c})
			stale = append(stale, c)
		}
	}
	for _, c := range sortedNames(wantChains) {
		tx.Add(&knftables.Chain{Name: c})
		tx.Flush(&knftables.Chain{Name: c})
	}
	// The endpoint maps are replaced, not flushed, once the flushes above
	// have unbound every rule from them: a flushed map keeps its old
	// elements until the commit, and each rule bound to it walks them
	// (and each element added checks every bound rule), so rewriting a
	// table of 10,000 Services into its flushed maps took three times its
	// first sync (BenchmarkSync in internal/nft/nfnl: full against cold).
	inTable := map[string]bool{}
	if existing != nil {
		for _, m := range existing.Maps {
			inTable[m] = true
		}
	}
	for _, m := range r.endpointMaps() {
		if inTable[m.Name] {
			tx.Delete(&knftables.Map{Name: m.Name})
			tx.Add(m)
		} else {
			tx.Flush(m)
		}
	}
	// Sets: after the flushes nothing refers to them.
	prevSets := map[string]time.Duration{}
	if prev != nil {
		for _, o := range prev.services {
			for _, s := range o.sets {
				prevSets[s.name] = s.timeout
			}
		}
	}
	if existing != nil {
		for _, s := range existing.Sets {
			if s == setClusterIPs || s == setHairpin {
				continue // the table's own, not a service's
			}
			if _, ok := prevSets[s]; !ok {
				prevSets[s] = -1 // unknown timeout: keep if wanted
			}
		}
	}
	for _, s := range sortedNames(prevSets) {
		d := prevSets[s]
		want, ok := wantSets[s]
		if !ok || (d >= 0 && d != want) {
			tx.Delete(&knftables.Set{Name: s})
		}
	}
	for _, s := range sortedNames(wantSets) {
		tx.Add(r.affinitySet(s, wantSets[s]))
	}
	for _, name := range sortedNames(base) {
		for _, rule := range base[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: rule})
		}
	}
	// Every rule before any element: a rule bound to an endpoint map
	// walks the map's elements, and an element added checks the rules
	// bound to its map, so rules into empty maps cost the least.
	keys := sortedNames(next.services)
	for _, key := range keys {
		for _, c := range next.services[key].chains {
			for _, rule := range c.rules {
				tx.Add(&knftables.Rule{Chain: c.name, Rule: rule})
			}
		}
	}
	for _, key := range keys {
		o := next.services[key]
		for _, e := range o.elems {
			tx.Add(element(e.key, e.verdict))
		}
		for _, c := range o.chains {
			for _, e := range c.elements() {
				tx.Add(e)
			}
		}
		o.written()
	}
	for _, k := range sortedKeysOf(next.shared) {
		tx.Add(setElement(k))
	}
	for _, c := range stale {
		tx.Delete(&knftables.Chain{Name: c})
	}
	return next
}

// Partial writes into tx only what changed for the services named in
// changed (keys "namespace/name"; a key absent from services was deleted),
// relative to prev, and returns the new state. prev must come from an earlier
// sync whose transaction ran; it is updated in place (so the cost follows
// the change, not the service count) and returned. If the transaction then
// fails, resync with Full(prev=nil, existing). With prev nil, Partial is Full.
func (r *Renderer) Partial(tx *knftables.Transaction, services []*proxy.Service, prev *State, changed map[string]bool) *State {
	if prev == nil {
		return r.Full(tx, services, nil, nil)
	}
	return r.partial(tx, prev, proxy.ChangesOf(services, changed))
}

// partial is Partial with the changed services' models at hand (the
// proxier's rounds carry them), prev not nil.
func (r *Renderer) partial(tx *knftables.Transaction, prev *State, changed proxy.Changes) *State {
	next := prev
	next.Conflicts = nil
	now := r.cfg.now().UnixNano()
	for _, key := range sortedNames(changed) {
		if old := prev.services[key]; old != nil {
			next.release(key, old)
		}
	}
	if next.shared == nil {
		next.shared = map[elemKey]int{}
	}
	sharedDelta := map[elemKey]int{}
	var (
		delElems  []knftables.Object
		flushes   []knftables.Object
		delSets   []knftables.Object
		addSets   []knftables.Object
		addChains []knftables.Object
		adds      []knftables.Object // rules and elements
		delChains []knftables.Object
	)
	for _, key := range sortedNames(changed) {
		old := prev.services[key]
		if old == nil {
			old = &objects{}
		}
		nw := &objects{}
		delete(next.services, key)
		if svc := changed[key]; svc != nil {
			// A chain keeps its keys while its endpoints fit in them,
			// and its values their keys (pick.place).
			alloc := func(chain string, n int, keysOnlyToHold bool) (pick, int) {
				if oc, ok := old.chain(chain); ok && oc.keys.size >= uint32(n) {
					if hold := r.holdModulus(oc.pick, n, now); hold > 0 || !keysOnlyToHold {
						return oc.pick, hold
					}
				}
				if keysOnlyToHold {
					return pick{}, 0
				}
				return pick{keys: next.slots.alloc(n)}, 0
			}
			nw = r.renderService(svc, alloc)
			next.claim(key, nw)
			next.services[key] = nw
		}
		next.noteHolds(key, nw)
		for _, c := range old.chains {
			nc, _ := nw.chain(c.name)
			if nc.keys != c.keys {
				next.slots.release(c.keys)
			}
			dels, as := diffPicks(c.pick, nc.pick)
			delElems = append(delElems, dels...)
			adds = append(adds, as...)
		}
		for _, c := range nw.chains {
			if _, ok := old.chain(c.name); !ok {
				adds = append(adds, c.elements()...)
			}
		}
		for _, e := range old.elems {
			if v, ok := nw.elem(e.key); !ok || v != e.verdict {
				delElems = append(delElems, element(e.key, e.verdict))
			}
		}
		for _, k := range old.shared {
			sharedDelta[k]--
		}
		for _, k := range nw.shared {
			sharedDelta[k]++
		}
		// A set is deleted only after every rule naming it is flushed (the
		// kernel refuses to delete a set in use), so a set whose timeout
		// changed marks the chains that use it as changed.
		goneSets := map[string]bool{}
		for _, s := range old.sets {
			if d, ok := nw.set(s.name); !ok || d != s.timeout {
				goneSets[s.name] = true
				delSets = append(delSets, &knftables.Set{Name: s.name})
			}
		}
		same := func(c chainObj) bool {
			oc, ok := old.chain(c.name)
			return ok && oc.sum == c.sum && !slices.ContainsFunc(oc.sets, func(s string) bool { return goneSets[s] })
		}
		for _, c := range old.chains {
			if nc, ok := nw.chain(c.name); !ok {
				flushes = append(flushes, &knftables.Chain{Name: c.name})
				delChains = append(delChains, &knftables.Chain{Name: c.name})
			} else if !same(nc) {
				flushes = append(flushes, &knftables.Chain{Name: c.name})
			}
		}
		for _, s := range nw.sets {
			if d, ok := old.set(s.name); !ok || d != s.timeout {
				addSets = append(addSets, r.affinitySet(s.name, s.timeout))
			}
		}
		for _, c := range nw.chains {
			if same(c) {
				continue
			}
			addChains = append(addChains, &knftables.Chain{Name: c.name})
			for _, rule := range c.rules {
				adds = append(adds, &knftables.Rule{Chain: c.name, Rule: rule})
			}
		}
		for _, e := range nw.elems {
			if v, ok := old.elem(e.key); !ok || v != e.verdict {
				adds = append(adds, element(e.key, e.verdict))
			}
		}
		nw.written()
	}
	// A shared element goes when its last service lets go of it and
	// comes with its first.
	for _, k := range sortedKeysOf(sharedDelta) {
		before := next.shared[k]
		after := before + sharedDelta[k]
		if after > 0 {
			next.shared[k] = after
		} else {
			delete(next.shared, k)
		}
		switch {
		case before > 0 && after <= 0:
			delElems = append(delElems, setElement(k))
		case before <= 0 && after > 0:
			adds = append(adds, setElement(k))
		}
	}
	for _, o := range delElems {
		tx.Delete(o)
	}
	for _, o := range flushes {
		tx.Flush(o)
	}
	for _, o := range delSets {
		tx.Delete(o)
	}
	// Every chain is declared before a rule or element refers to it (an
	// ext- chain's rules go to its svc- and svl- chains, which sort after
	// it): the kernel refuses a jump to a chain not yet added.
	for _, os := range [][]knftables.Object{addSets, addChains, adds} {
		for _, o := range os {
			tx.Add(o)
		}
	}
	for _, o := range delChains {
		tx.Delete(o)
	}
	return next
}

func (r *Renderer) affinitySet(name string, timeout time.Duration) *knftables.Set {
	return &knftables.Set{
		Name:    name,
		Type:    r.cfg.addrType(),
		Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: knftables.PtrTo(timeout),
	}
}

func element(k elemKey, verdict string) *knftables.Element {
	return &knftables.Element{Map: k.Map, Key: strings.Split(k.Key, " . "), Value: []string{verdict}}
}

// setElement is an element of a shared set (elemKey.Map names the set).
func setElement(k elemKey) *knftables.Element {
	return &knftables.Element{Set: k.Map, Key: strings.Split(k.Key, " . ")}
}

// addBaseObjects adds (idempotently) the fixed chains and maps.
func (r *Renderer) addBaseObjects(tx *knftables.Transaction) {
	base := func(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio knftables.BaseChainPriority) {
		tx.Add(&knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &prio})
	}
	base(chainNatPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority)
	base(chainNatOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority)
	base(chainNatPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority)
	base(chainFilterInput, knftables.FilterType, knftables.InputHook, "filter - 10")
	base(chainFilterForward, knftables.FilterType, knftables.ForwardHook, "filter - 10")
	base(chainFilterOutput, knftables.FilterType, knftables.OutputHook, "filter - 10")
	// Before DNAT (dstnat - 10), spelled as a number: nft 1.0 refuses the
	// dstnat keyword in a filter chain on the output hook.
	base(chainFwPrerouting, knftables.FilterType, knftables.PreroutingHook, "-110")
	base(chainFwOutput, knftables.FilterType, knftables.OutputHook, "-110")
	for _, c := range []string{chainServices, chainNoEndpoints, chainReject, chainMarkMasq, chainMasquerading, chainFwCheck} {
		tx.Add(&knftables.Chain{Name: c})
	}
	at := r.cfg.addrType()
	tx.Add(&knftables.Map{Name: mapServiceIPs, Type: at + " . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapNoEndpointIPs, Type: at + " . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapServiceNodePorts, Type: "inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapNoEndpointNodePts, Type: "inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapFirewallIPs, Type: at + " . inet_proto . inet_service : verdict"})
	for _, m := range r.endpointMaps() {
		tx.Add(m)
	}
	tx.Add(&knftables.Set{Name: setClusterIPs, Type: at})
	tx.Add(&knftables.Set{Name: setHairpin, Type: at + " . " + at + " . inet_proto . inet_service"})
}

// baseChains returns the fixed chains' rules.
func (r *Renderer) baseChains() map[string][]string {
	ip := r.cfg.ipKw()
	loopback := "127.0.0.0/8"
	if r.cfg.v6() {
		loopback = "::1"
	}
	mark := fmt.Sprintf("0x%x", r.cfg.MasqueradeMark)
	nodePorts := func(m string) string {
		return ip + " daddr != " + loopback + r.nodePortDaddr() + " fib daddr type local meta l4proto . th dport vmap @" + m
	}
	return map[string][]string{
		chainNatPrerouting:  {"jump " + chainServices},
		chainNatOutput:      {"jump " + chainServices},
		chainNatPostrouting: {"jump " + chainMasquerading},
		chainFilterInput:    {"ct state new jump " + chainNoEndpoints},
		chainFilterForward:  {"ct state new jump " + chainNoEndpoints},
		chainFilterOutput:   {"ct state new jump " + chainNoEndpoints},
		chainFwPrerouting:   {"jump " + chainFwCheck},
		chainFwOutput:       {"jump " + chainFwCheck},
		chainFwCheck:        {ip + " daddr . meta l4proto . th dport vmap @" + mapFirewallIPs},
		chainServices: append(r.offClusterMasq(),
			ip+" daddr . meta l4proto . th dport vmap @"+mapServiceIPs,
			nodePorts(mapServiceNodePorts),
		),
		chainNoEndpoints: {
			ip + " daddr . meta l4proto . th dport vmap @" + mapNoEndpointIPs,
			nodePorts(mapNoEndpointNodePts),
			// Still addressed to a ClusterIP after DNAT: a port the
			// service does not have. Refused at once, as kube-proxy
			// does, instead of routed to nowhere.
			ip + " daddr @" + setClusterIPs + " goto " + chainReject,
		},
		chainReject: {
			"meta l4proto tcp reject with tcp reset",
			"reject",
		},
		chainMarkMasq: {"mark set mark or " + mark},
		chainMasquerading: {
			"mark and " + mark + " != 0 mark set mark xor " + mark + " masquerade fully-random",
			// Hairpin: a pod that reached itself through a service.
			"ct status dnat " + ip + " saddr . " + ip + " daddr . meta l4proto . th dport @" + setHairpin + " masquerade fully-random",
		},
	}
}

// nodePortDaddr is the destination match NodePorts add to "a local
// address": "" for every one, " ip daddr { ... }" for nodePortAddresses.
func (r *Renderer) nodePortDaddr() string {
	var ps []string
	for _, p := range r.cfg.NodePortAddresses {
		if p.Addr().Is4() != r.cfg.v6() {
			ps = append(ps, p.Masked().String())
		}
	}
	switch len(ps) {
	case 0:
		return ""
	case 1:
		return " " + r.cfg.ipKw() + " daddr " + ps[0]
	}
	return " " + r.cfg.ipKw() + " daddr { " + strings.Join(ps, " , ") + " }"
}

// renderService computes one service's chains, sets and map elements.
func (r *Renderer) renderService(svc *proxy.Service, alloc allocator) *objects {
	o := newDraft()
	if !r.cfg.wantAddr(svc.ClusterIP) {
		// Headless (left to DNS) or another family's service.
		return o.compact()
	}
	o.shared[elemKey{setClusterIPs, svc.ClusterIP.String()}] = true
	ip := r.cfg.ipKw()
	// Per service, whatever the port: its external addresses of this
	// family, and the firewall its load-balancer IPs pass.
	var extAddrs, lbIPs []netip.Addr
	for _, a := range svc.ExternalIPs {
		if r.cfg.wantAddr(a) {
			extAddrs = append(extAddrs, a)
		}
	}
	for _, a := range svc.LoadBalancerIPs {
		if r.cfg.wantAddr(a) {
			extAddrs = append(extAddrs, a)
			lbIPs = append(lbIPs, a)
		}
	}
	fw := ""
	if len(lbIPs) > 0 {
		fw = r.firewall(svc)
	}
	for i := range svc.Ports {
		sp := &svc.Ports[i]
		portName := sp.Name
		if portName == "" {
			portName = strconv.Itoa(int(sp.Port))
		}
		id := svc.Namespace + "/" + svc.Name + "/" + string(sp.Protocol) + "/" + portName
		h := hash(id)
		svcChain, localChain, extChain := "svc-"+h+"-"+id, "svl-"+h+"-"+id, "ext-"+h+"-"+id

		hasNodePort := sp.NodePort != 0 && (svc.Type == proxy.NodePort || svc.Type == proxy.LoadBalancer)
		hasExternal := hasNodePort || len(extAddrs) > 0
		pe := proxy.SplitEndpoints(svc, sp, r.cfg.NodeName, hasExternal, r.usable)
		all, local, internalEPs := pe.All, pe.Local, pe.Internal
		needAll, needLocal := pe.NeedAll, pe.NeedLocal
		internalChain := svcChain
		if svc.InternalLocal {
			internalChain = localChain
		}

		// Endpoint chains exist only for session affinity (they record
		// the client in the endpoint's affinity set); otherwise the
		// service chain DNATs in one rule, as kube-proxy's does.
		epChains := map[netip.AddrPort]string{}
		epChain := func(ep proxy.Endpoint) string {
			ap := netip.AddrPortFrom(ep.IP, ep.Port)
			if c, ok := epChains[ap]; ok {
				return c
			}
			eh := hash(id + "/" + ap.String())
			c := "ep-" + eh + "-" + id + "__" + strings.ReplaceAll(ep.IP.String(), ":", ".") + "/" + strconv.Itoa(int(ep.Port))
			epChains[ap] = c
			set := "aff-" + eh
			o.sets[set] = svc.AffinityTimeout
			o.chains[c] = []string{
				"update @" + set + " { " + ip + " saddr }",
				"meta l4proto " + string(sp.Protocol) + " dnat to " + ap.String(),
			}
			return c
		}
		dispatch := func(chain string, eps []proxy.Endpoint) {
			proto := "meta l4proto " + string(sp.Protocol)
			single := len(eps) == 1 && svc.AffinityTimeout == 0
			prev, hold := alloc(chain, len(eps), single)
			if single && hold == 0 {
				o.chains[chain] = []string{proto + " dnat to " + netip.AddrPortFrom(eps[0].IP, eps[0].Port).String()}
				return
			}
			pk := pick{keys: prev.keys, m: endpointMapName(chain, sp.Protocol, svc.AffinityTimeout > 0),
				sums: make([]uint64, len(eps)), vals: make([]string, len(eps))}
			if svc.AffinityTimeout > 0 || prev.m != pk.m {
				// With affinity an endpoint's rule goes with it, so the
				// chain is rewritten anyway.
				hold = 0
			}
			mod := max(hold, len(eps))
			numgen := "numgen random mod " + strconv.Itoa(mod) + " offset " + strconv.FormatUint(uint64(pk.keys.off), 10)
			var rules []string
			var val []byte // "address . port", built without a string per part
			for i, ep := range eps {
				if svc.AffinityTimeout > 0 {
					c := epChain(ep)
					rules = append(rules, ip+" saddr @aff-"+hash(id+"/"+netip.AddrPortFrom(ep.IP, ep.Port).String())+" goto "+c)
					pk.vals[i] = "goto " + c
				} else {
					val = strconv.AppendUint(append(ep.IP.AppendTo(val[:0]), " . "...), uint64(ep.Port), 10)
					pk.vals[i] = string(val)
				}
				pk.sums[i] = valueSum(pk.vals[i])
			}
			if prev.m == pk.m {
				pk.place(prev.sums, mod)
				if mod > len(eps) {
					pk.heldSince = cmp.Or(prev.heldSince, r.cfg.now().UnixNano())
				}
			}
			o.picks[chain] = pk
			if svc.AffinityTimeout > 0 {
				o.chains[chain] = append(rules, numgen+" vmap @"+pk.m)
			} else {
				o.chains[chain] = []string{proto + " dnat " + ip + " addr . port to " + numgen + " map @" + pk.m}
			}
		}
		// Hairpin: this node's endpoints may be reached by themselves.
		// (Every endpoint of this node in all is also in local.)
		for _, ep := range local {
			a := ep.IP.String()
			o.shared[elemKey{setHairpin, a + " . " + a + " . " + string(sp.Protocol) + " . " + strconv.Itoa(int(ep.Port))}] = true
		}
		if needAll {
			dispatch(svcChain, all)
		}
		if needLocal {
			dispatch(localChain, local)
		}
		// extReachable: the external entry has somewhere to send some
		// packets. With policy Local and no endpoint on this node, pods
		// still reach the service through it (short-circuited to the
		// internal endpoints) and outside clients are dropped, not
		// rejected, as kube-proxy does: the load balancer's health check
		// already steers them away, and a reset would end connections a
		// retry could have saved.
		extReachable := pe.ExtReachable
		if hasExternal && extReachable {
			var rules []string
			if svc.ExternalLocal {
				if len(internalEPs) > 0 {
					for _, cidr := range r.cfg.ClusterCIDRs {
						if cidr.Addr().Is4() != r.cfg.v6() {
							rules = append(rules, ip+" saddr "+cidr.String()+" goto "+internalChain)
						}
					}
				}
				if len(local) > 0 {
					rules = append(rules, "fib saddr type local jump "+chainMarkMasq, "goto "+localChain)
				} else {
					rules = append(rules, "drop")
				}
			} else {
				rules = append(rules, "jump "+chainMarkMasq, "goto "+svcChain)
			}
			o.chains[extChain] = rules
		}

		proto := string(sp.Protocol)
		port := strconv.Itoa(int(sp.Port))
		if fw != "" {
			fwChain := "fw-" + h + "-" + id
			o.chains[fwChain] = []string{fw}
			for _, a := range lbIPs {
				o.elems[elemKey{mapFirewallIPs, a.String() + " . " + proto + " . " + port}] = "goto " + fwChain
			}
		}
		switch {
		case len(internalEPs) > 0:
			o.elems[elemKey{mapServiceIPs, svc.ClusterIP.String() + " . " + proto + " . " + port}] = "goto " + internalChain
		case len(all) > 0:
			// internalTrafficPolicy Local with endpoints only on other
			// nodes: dropped, as kube-proxy does (the policy promises
			// traffic never leaves the node).
			o.elems[elemKey{mapServiceIPs, svc.ClusterIP.String() + " . " + proto + " . " + port}] = "drop"
		default:
			o.elems[elemKey{mapNoEndpointIPs, svc.ClusterIP.String() + " . " + proto + " . " + port}] = "goto " + chainReject
		}
		for _, a := range extAddrs {
			if extReachable {
				o.elems[elemKey{mapServiceIPs, a.String() + " . " + proto + " . " + port}] = "goto " + extChain
			} else {
				o.elems[elemKey{mapNoEndpointIPs, a.String() + " . " + proto + " . " + port}] = "goto " + chainReject
			}
		}
		if hasNodePort {
			np := proto + " . " + strconv.Itoa(int(sp.NodePort))
			if extReachable {
				o.elems[elemKey{mapServiceNodePorts, np}] = "goto " + extChain
			} else {
				o.elems[elemKey{mapNoEndpointNodePts, np}] = "goto " + chainReject
			}
		}
	}
	return o.compact()
}

// firewall is the rule of a LoadBalancer Service's fw- chain, which every
// packet to one of its load-balancer IPs and ports passes before DNAT
// (priority dstnat - 10, -110): drop unless the source is in
// spec.loadBalancerSourceRanges. "" when the Service has no ranges. A
// Service whose ranges are all of the other family drops everything on
// this one (kube-proxy would leave it open; a user who lists ranges expects
// the rest kept out). Only the load-balancer IPs are filtered, as in
// kube-proxy: NodePorts and externalIPs are not.
func (r *Renderer) firewall(svc *proxy.Service) string {
	if svc.Type != proxy.LoadBalancer || !svc.Firewall {
		return ""
	}
	var ranges []string
	for _, p := range svc.SourceRanges {
		if p.Addr().Is4() != r.cfg.v6() {
			ranges = append(ranges, p.String())
		}
	}
	switch len(ranges) {
	case 0:
		return "drop"
	case 1:
		return r.cfg.ipKw() + " saddr != " + ranges[0] + " drop"
	}
	return r.cfg.ipKw() + " saddr != { " + strings.Join(ranges, " , ") + " } drop"
}

// offClusterMasq is the rule that masquerades ClusterIP traffic from
// outside the pod network (a host-network client, a router sending to the
// service CIDR), as kube-proxy does when it knows the cluster CIDR: the
// endpoint's reply then comes back through this node to be un-DNATed,
// whatever route the endpoint's node has to the client. It matches
// ClusterIPs only (@cluster-ips), so NodePort and external traffic keep
// their own policy. Without cluster CIDRs nothing tells pods apart, and
// there is no rule.
func (r *Renderer) offClusterMasq() []string {
	var cidrs []string
	for _, c := range r.cfg.ClusterCIDRs {
		if c.Addr().Is4() != r.cfg.v6() {
			cidrs = append(cidrs, c.String())
		}
	}
	if len(cidrs) == 0 {
		return nil
	}
	src := cidrs[0]
	if len(cidrs) > 1 {
		src = "{ " + strings.Join(cidrs, " , ") + " }"
	}
	ip := r.cfg.ipKw()
	return []string{fmt.Sprintf("%s daddr @%s %s saddr != %s jump %s", ip, setClusterIPs, ip, src, chainMarkMasq)}
}

// usable is proxy.Usable(eps, node) without the endpoints of the other
// family or without a port, in one allocation, or none when it keeps every
// endpoint (it runs twice per service port on every render, and a large
// service's endpoints are mostly all usable).
func (r *Renderer) usable(eps []proxy.Endpoint, node string) []proxy.Endpoint {
	ready := slices.ContainsFunc(eps, func(ep proxy.Endpoint) bool { return ep.Ready && (node == "" || ep.NodeName == node) })
	keep := func(ep proxy.Endpoint) bool {
		if node != "" && ep.NodeName != node {
			return false
		}
		if ready && !ep.Ready || !ready && !(ep.Serving && ep.Terminating) {
			return false
		}
		return r.cfg.wantAddr(ep.IP) && ep.Port != 0
	}
	n := 0
	for _, ep := range eps {
		if keep(ep) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		return eps[:n:n] // read only: the renderer never writes an endpoint
	}
	out := make([]proxy.Endpoint, 0, n)
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// hash is a short stable name part, so long names stay unique when cut.
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:8]
}

// usesSet says whether a rule names set.
func usesSet(rules []string, set string) bool {
	for _, r := range rules {
		if strings.Contains(r, "@"+set+" ") {
			return true
		}
	}
	return false
}

func compareElemKeys(a, b elemKey) int {
	return cmp.Or(cmp.Compare(a.Map, b.Map), cmp.Compare(a.Key, b.Key))
}

// sortedKeysOf returns m's element keys in order (map, then key).
func sortedKeysOf[V any](m map[elemKey]V) []elemKey {
	out := make([]elemKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, compareElemKeys)
	return out
}

// sortedNames returns m's keys in order.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
