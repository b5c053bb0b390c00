package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft/nfttrace"
	"github.com/flatnet/flatnet/internal/proxy"
)

const node = "node-a"

var (
	nodeIP      = netip.MustParseAddr("172.30.0.10")
	clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	outside     = netip.MustParseAddr("172.31.5.5") // an external client
	remotePod   = netip.MustParseAddr("10.244.9.9") // a pod on another node
)

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(ip string, port uint16, nodeName string) proxy.Endpoint {
	return proxy.Endpoint{IP: a(ip), Port: port, Ready: true, Serving: true, NodeName: nodeName}
}

func terminating(e proxy.Endpoint, serving bool) proxy.Endpoint {
	e.Ready, e.Serving, e.Terminating = false, serving, true
	return e
}

func svc(name, clusterIP string, port uint16, eps ...proxy.Endpoint) *proxy.Service {
	return &proxy.Service{
		Namespace: "ns", Name: name, Type: proxy.ClusterIP, ClusterIP: a(clusterIP),
		Ports: []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: port, Endpoints: eps}},
	}
}

func testConfig() Config {
	return Config{Family: knftables.IPv4Family, NodeName: node, ClusterCIDRs: []netip.Prefix{clusterCIDR}}
}

// load renders a full sync into a new fake.
func load(t testing.TB, services []*proxy.Service) (*knftables.Fake, *Renderer, *State) {
	t.Helper()
	r := New(testConfig())
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	tx := fake.NewTransaction()
	st := r.Full(tx, services, nil, nil)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("full sync: %v\n%s", err, tx)
	}
	return fake, r, st
}

// reach traces p once per numgen choice and returns the endpoints reached
// (or "reject"/"drop"/"accept" when not DNATed) and whether any was masqueraded.
func reach(t *testing.T, tr *nfttrace.Tracer, p nfttrace.Packet) (got []string, masq []string) {
	t.Helper()
	seen := map[string]bool{}
	for k := 0; k < 4; k++ {
		tr.Rand = func(n int) int { return k % n }
		res, err := tr.Trace(p)
		if err != nil {
			t.Fatalf("trace: %v", err)
		}
		out := string(res.Verdict)
		switch {
		case res.Verdict == nfttrace.Reject:
			out = "reject " + res.RejectWith
		case res.DNAT:
			out = res.Endpoint()
		}
		if !seen[out] {
			seen[out] = true
			got = append(got, out)
			if res.Masqueraded {
				masq = append(masq, out)
			}
		}
	}
	sort.Strings(got)
	sort.Strings(masq)
	return got, masq
}

func tcp(src, dst netip.Addr, port uint16) nfttrace.Packet {
	return nfttrace.Packet{Src: src, Dst: dst, Proto: "tcp", DPort: port}
}

func TestPacketFlows(t *testing.T) {
	local1 := ep("10.244.1.5", 8080, node)
	remote1 := ep("10.244.2.5", 8080, "node-b")
	remote2 := ep("10.244.3.5", 8080, "node-c")

	nodePort := func(s *proxy.Service, np uint16) *proxy.Service {
		s.Type = proxy.NodePort
		s.Ports[0].NodePort = np
		return s
	}
	named := svc("named", "10.96.0.11", 80, ep("10.244.2.6", 8080, "node-b"), ep("10.244.3.6", 9090, "node-c"))
	ext := svc("ext", "10.96.0.12", 80, remote1, remote2)
	ext.ExternalIPs = []netip.Addr{a("172.29.0.7")}
	lb := nodePort(svc("lb", "10.96.0.13", 443, remote1), 30443)
	lb.Type = proxy.LoadBalancer
	lb.LoadBalancerIPs = []netip.Addr{a("172.29.1.9")}
	empty := nodePort(svc("empty", "10.96.0.14", 80), 30014)
	emptyUDP := svc("empty-udp", "10.96.0.15", 53)
	emptyUDP.Ports[0].Protocol = proxy.UDP
	mixed := svc("mixed", "10.96.0.16", 80, remote1, terminating(remote2, true))
	draining := svc("draining", "10.96.0.17", 80, terminating(remote1, true), terminating(remote2, false))
	gone := svc("gone", "10.96.0.18", 80, terminating(remote1, false))
	etpLocal := nodePort(svc("etp", "10.96.0.19", 80, local1, remote1), 30019)
	etpLocal.ExternalLocal = true
	etpNoLocal := nodePort(svc("etp-none", "10.96.0.20", 80, remote1), 30020)
	etpNoLocal.ExternalLocal = true
	itpLocal := svc("itp", "10.96.0.21", 80, local1, remote1)
	itpLocal.InternalLocal = true
	hairpin := svc("hairpin", "10.96.0.22", 80, local1, remote1)
	np := nodePort(svc("np", "10.96.0.23", 80, remote1, remote2), 30023)
	etpEmpty := nodePort(svc("etp-empty", "10.96.0.24", 80), 30024)
	etpEmpty.ExternalLocal = true
	itpNoLocal := svc("itp-none", "10.96.0.25", 80, remote1)
	itpNoLocal.InternalLocal = true

	fw := nodePort(svc("fw", "10.96.0.26", 80, remote1), 30026)
	fw.Type = proxy.LoadBalancer
	fw.LoadBalancerIPs = []netip.Addr{a("172.29.1.26")}
	fw.Firewall, fw.SourceRanges = true, []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16"), netip.MustParsePrefix("fd00::/8")}
	fw6 := nodePort(svc("fw6", "10.96.0.27", 80, remote1), 30027)
	fw6.Type = proxy.LoadBalancer
	fw6.LoadBalancerIPs = []netip.Addr{a("172.29.1.27")}
	fw6.Firewall = true // ranges of the other family only

	services := []*proxy.Service{
		svc("web", "10.96.0.10", 80, local1, remote1, remote2),
		named, ext, lb, empty, emptyUDP, mixed, draining, gone, etpLocal, etpNoLocal, itpLocal, hairpin, np,
		etpEmpty, itpNoLocal, fw, fw6,
	}
	fake, _, _ := load(t, services)
	tr := nfttrace.New(fake, nodeIP)

	tests := []struct {
		name     string
		pkt      nfttrace.Packet
		want     []string
		wantMasq []string
	}{
		{"ClusterIP reaches every endpoint", tcp(remotePod, a("10.96.0.10"), 80),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080", "10.244.3.5:8080"}, nil},
		{"ClusterIP from outside the pod network is masqueraded", tcp(outside, a("10.96.0.23"), 80),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"ClusterIP from the node itself is masqueraded", nfttrace.Packet{Src: nodeIP, Dst: a("10.96.0.23"), Proto: "tcp", DPort: 80, Local: true},
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"loadBalancerSourceRanges: a client in range reaches the LB IP", tcp(outside, a("172.29.1.26"), 80),
			[]string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"loadBalancerSourceRanges: a client out of range is dropped", tcp(a("172.28.0.1"), a("172.29.1.26"), 80), []string{"drop"}, nil},
		{"loadBalancerSourceRanges: other ports of the LB IP are not touched", tcp(a("172.28.0.1"), a("172.29.1.26"), 81), []string{"accept"}, nil},
		{"loadBalancerSourceRanges: the NodePort is not filtered", tcp(a("172.28.0.1"), nodeIP, 30026),
			[]string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"loadBalancerSourceRanges: the ClusterIP is not filtered", tcp(remotePod, a("10.96.0.26"), 80), []string{"10.244.2.5:8080"}, nil},
		{"loadBalancerSourceRanges of the other family only: dropped", tcp(outside, a("172.29.1.27"), 80), []string{"drop"}, nil},
		{"ClusterIP wrong port is refused", tcp(remotePod, a("10.96.0.10"), 81), []string{"reject tcp reset"}, nil},
		{"ClusterIP wrong port, UDP, is refused", nfttrace.Packet{Src: remotePod, Dst: a("10.96.0.10"), Proto: "udp", DPort: 53},
			[]string{"reject icmp port-unreachable"}, nil},
		{"an address that is not a ClusterIP is not touched", tcp(remotePod, a("10.96.0.99"), 80), []string{"accept"}, nil},
		{"named targetPort resolved per endpoint", tcp(remotePod, a("10.96.0.11"), 80),
			[]string{"10.244.2.6:8080", "10.244.3.6:9090"}, nil},
		{"NodePort on the node address, masqueraded", tcp(outside, nodeIP, 30023),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"NodePort not on a foreign address", tcp(outside, a("172.30.0.99"), 30023), []string{"accept"}, nil},
		{"NodePort not on loopback", nfttrace.Packet{Src: a("127.0.0.1"), Dst: a("127.0.0.1"), Proto: "tcp", DPort: 30023, Local: true},
			[]string{"accept"}, nil},
		{"externalIP", tcp(outside, a("172.29.0.7"), 80),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"LoadBalancer IP", tcp(outside, a("172.29.1.9"), 443), []string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"LoadBalancer NodePort", tcp(outside, nodeIP, 30443), []string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"no endpoints: ClusterIP rejects with TCP reset", tcp(remotePod, a("10.96.0.14"), 80), []string{"reject tcp reset"}, nil},
		{"no endpoints: NodePort rejects", tcp(outside, nodeIP, 30014), []string{"reject tcp reset"}, nil},
		{"no endpoints: from the node itself", nfttrace.Packet{Src: nodeIP, Dst: a("10.96.0.14"), Proto: "tcp", DPort: 80, Local: true},
			[]string{"reject tcp reset"}, nil},
		{"no endpoints: UDP gets port unreachable", nfttrace.Packet{Src: remotePod, Dst: a("10.96.0.15"), Proto: "udp", DPort: 53},
			[]string{"reject icmp port-unreachable"}, nil},
		{"terminating endpoint unused while one is ready", tcp(remotePod, a("10.96.0.16"), 80), []string{"10.244.2.5:8080"}, nil},
		{"terminating serving endpoints used when none is ready", tcp(remotePod, a("10.96.0.17"), 80), []string{"10.244.2.5:8080"}, nil},
		{"terminating non-serving endpoints reject", tcp(remotePod, a("10.96.0.18"), 80), []string{"reject tcp reset"}, nil},
		{"eTP Local: external traffic only to local endpoints, source kept", tcp(outside, nodeIP, 30019), []string{"10.244.1.5:8080"}, nil},
		{"eTP Local: ClusterIP still uses all endpoints", tcp(remotePod, a("10.96.0.19"), 80),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080"}, nil},
		{"eTP Local: pod traffic to the NodePort short-circuits to all endpoints", tcp(remotePod, nodeIP, 30019),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080"}, nil},
		{"eTP Local: no local endpoint drops external traffic", tcp(outside, nodeIP, 30020), []string{"drop"}, nil},
		{"eTP Local: no local endpoint, pod traffic still reaches the others", tcp(remotePod, nodeIP, 30020),
			[]string{"10.244.2.5:8080"}, nil},
		{"eTP Local: no endpoints at all rejects", tcp(outside, nodeIP, 30024), []string{"reject tcp reset"}, nil},
		{"iTP Local: ClusterIP only to local endpoints", tcp(remotePod, a("10.96.0.21"), 80), []string{"10.244.1.5:8080"}, nil},
		{"iTP Local: no local endpoint drops", tcp(remotePod, a("10.96.0.25"), 80), []string{"drop"}, nil},
		{"hairpin: a pod reaching itself is masqueraded", tcp(a("10.244.1.5"), a("10.96.0.22"), 80),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080"}, []string{"10.244.1.5:8080"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, masq := reach(t, tr, tc.pkt)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("destinations (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMasq, masq); diff != "" {
				t.Errorf("masqueraded (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSessionAffinity(t *testing.T) {
	s := svc("sticky", "10.96.0.30", 80, ep("10.244.2.5", 8080, "node-b"), ep("10.244.3.5", 8080, "node-c"), ep("10.244.4.5", 8080, "node-d"))
	s.AffinityTimeout = 3 * time.Hour
	fake, _, _ := load(t, []*proxy.Service{s})

	var sets []string
	for name, set := range fake.Table.Sets {
		if !strings.HasPrefix(name, "aff-") {
			continue
		}
		sets = append(sets, name)
		if set.Timeout == nil || *set.Timeout != 3*time.Hour {
			t.Errorf("set %s timeout = %v, want 3h", name, set.Timeout)
		}
		if !contains(set.Flags, knftables.DynamicFlag) || !contains(set.Flags, knftables.TimeoutFlag) {
			t.Errorf("set %s flags = %v, want dynamic and timeout", name, set.Flags)
		}
	}
	if len(sets) != 3 {
		t.Fatalf("affinity sets = %v, want one per endpoint (3)", sets)
	}

	tr := nfttrace.New(fake, nodeIP)
	client := a("10.244.9.9")
	tr.Rand = func(int) int { return 2 }
	first, err := tr.Trace(tcp(client, a("10.96.0.30"), 80))
	if err != nil {
		t.Fatal(err)
	}
	if first.Endpoint() != "10.244.4.5:8080" {
		t.Fatalf("first connection went to %s, want 10.244.4.5:8080", first.Endpoint())
	}
	for k := 0; k < 3; k++ {
		tr.Rand = func(n int) int { return k % n }
		res, err := tr.Trace(tcp(client, a("10.96.0.30"), 80))
		if err != nil {
			t.Fatal(err)
		}
		if res.Endpoint() != first.Endpoint() {
			t.Errorf("connection %d went to %s, want sticky %s", k, res.Endpoint(), first.Endpoint())
		}
	}
	// Another client is not stuck to it.
	tr.Rand = func(int) int { return 0 }
	other, err := tr.Trace(tcp(a("10.244.9.10"), a("10.96.0.30"), 80))
	if err != nil {
		t.Fatal(err)
	}
	if other.Endpoint() != "10.244.2.5:8080" {
		t.Errorf("other client went to %s, want 10.244.2.5:8080", other.Endpoint())
	}
}

func contains[T comparable](xs []T, x T) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func manyServices(n int) []*proxy.Service {
	out := make([]*proxy.Service, 0, n)
	for i := 0; i < n; i++ {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		s := svc(fmt.Sprintf("svc-%d", i), ip, 80,
			ep(fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), 8080, "node-b"),
			ep(fmt.Sprintf("10.245.%d.%d", i/250, i%250+1), 8080, node))
		if i%3 == 0 {
			s.Type = proxy.NodePort
			s.Ports[0].NodePort = uint16(30000 + i%2000)
			if i%2000 != i {
				s.Ports[0].NodePort = 0
			}
		}
		if i%5 == 0 {
			s.AffinityTimeout = 10800 * time.Second
		}
		out = append(out, s)
	}
	return out
}

// sortedDump is the fake's table, one line per object, sorted, with the
// endpoint maps resolved: which keys a service port owns, and which key
// each endpoint, depends on the order of earlier syncs, so each "numgen
// random mod N offset K map @endpoints" is written as the anonymous map it
// stands for, values sorted ("numgen random mod N map { 0 : V0 , ... }"),
// and the maps' own elements are left out; a key in [K, K+N) without an
// element shows as MISSING, an element that no rule picks as an "orphan"
// line.
func sortedDump(f *knftables.Fake) string {
	elems := map[string]map[uint64]string{}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(f.Dump()), "\n") {
		m, ok := endpointElement(l)
		if !ok {
			lines = append(lines, l)
			continue
		}
		k, v, _ := strings.Cut(strings.TrimSuffix(m[2], " }"), " : ")
		key, err := strconv.ParseUint(k, 10, 32)
		if err != nil {
			lines = append(lines, "unparsable element: "+l)
			continue
		}
		if elems[m[1]] == nil {
			elems[m[1]] = map[uint64]string{}
		}
		elems[m[1]][key] = v
	}
	for i, l := range lines {
		m := numgenPick.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		n, _ := strconv.ParseUint(m[1], 10, 32)
		off, _ := strconv.ParseUint(m[2], 10, 32)
		vals := make([]string, n)
		for j := range n {
			v, ok := elems[m[4]][off+j]
			if !ok {
				v = "MISSING"
			}
			delete(elems[m[4]], off+j)
			vals[j] = v
		}
		slices.Sort(vals)
		var arms []string
		for j, v := range vals {
			arms = append(arms, fmt.Sprintf("%d : %s", j, v))
		}
		lines[i] = strings.Replace(l, m[0], fmt.Sprintf("numgen random mod %d %s { %s }", n, m[3], strings.Join(arms, " , ")), 1)
	}
	for name, rest := range elems {
		for k, v := range rest {
			lines = append(lines, fmt.Sprintf("orphan element %s { %d : %s }", name, k, v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

var (
	numgenPick  = regexp.MustCompile(`numgen random mod (\d+) offset (\d+) (map|vmap) @((?:` + mapEndpointsPrefix + `|` + mapEndpointChainsPrefix + `)\S+)`)
	endpointElt = regexp.MustCompile(`^add element \S+ \S+ ((?:` + mapEndpointsPrefix + `|` + mapEndpointChainsPrefix + `)\S+) \{ (.*)$`)
)

func endpointElement(line string) ([]string, bool) {
	m := endpointElt.FindStringSubmatch(line)
	return m, m != nil
}

func existing(t *testing.T, f *knftables.Fake) *Existing {
	t.Helper()
	ctx := context.Background()
	chains, err := f.List(ctx, "chains")
	if err != nil {
		t.Fatal(err)
	}
	sets, err := f.List(ctx, "sets")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := f.List(ctx, "maps")
	if err != nil {
		t.Fatal(err)
	}
	return &Existing{Chains: chains, Sets: sets, Maps: maps}
}

func TestIdempotentFullSync(t *testing.T) {
	services := manyServices(20)
	fake, r, st := load(t, services)
	first := fake.Dump()
	for i, prev := range []*State{st, nil} { // with and without a remembered state
		tx := fake.NewTransaction()
		r.Full(tx, services, prev, existing(t, fake))
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		if diff := cmp.Diff(first, fake.Dump()); diff != "" {
			t.Fatalf("sync %d changed the ruleset (-first +now):\n%s", i, diff)
		}
	}
	// A partial sync with nothing changed writes nothing.
	tx := fake.NewTransaction()
	r.Partial(tx, services, st, map[string]bool{})
	if n := tx.NumOperations(); n != 0 {
		t.Errorf("empty partial sync has %d operations:\n%s", n, tx)
	}
}

func TestPartialSync(t *testing.T) {
	services := manyServices(10)
	fake, r, st := load(t, services)
	ctx := context.Background()
	tr := nfttrace.New(fake, nodeIP)

	// Change svc-4: one more endpoint, a new port; delete svc-7; add svc-new.
	changed := manyServices(10)
	s4 := changed[4]
	s4.Ports[0].Endpoints = append(s4.Ports[0].Endpoints, ep("10.246.0.1", 8080, "node-c"))
	s4.Ports = append(s4.Ports, proxy.ServicePort{Name: "metrics", Protocol: proxy.TCP, Port: 9100,
		Endpoints: []proxy.Endpoint{ep("10.246.0.1", 9100, "node-c")}})
	changed = append(changed[:7], changed[8:]...)
	changed = append(changed, svc("svc-new", "10.96.9.9", 80, ep("10.246.0.2", 8080, "node-c")))
	keys := map[string]bool{"ns/svc-4": true, "ns/svc-7": true, "ns/svc-new": true}

	tx := fake.NewTransaction()
	st2 := r.Partial(tx, changed, st, keys)
	text := tx.String()
	for _, s := range services {
		if keys[s.Key()] {
			continue
		}
		if strings.Contains(text, "ns/"+s.Name+"/") || strings.Contains(text, s.ClusterIP.String()+" ") {
			t.Errorf("partial sync touched unchanged service %s:\n%s", s.Key(), text)
		}
	}
	if !strings.Contains(text, "delete chain") {
		t.Errorf("partial sync did not delete svc-7's chains:\n%s", text)
	}
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatalf("partial sync: %v\n%s", err, text)
	}

	// The result equals a full sync of the new services from scratch.
	want, _, _ := load(t, changed)
	if diff := cmp.Diff(sortedDump(want), sortedDump(fake)); diff != "" {
		t.Fatalf("partial sync result differs from a full sync (-full +partial):\n%s", diff)
	}
	if got := len(st2.Chains()); got != countChains(want)-len(r.baseChains()) {
		t.Errorf("state has %d chains, table has %d service chains", got, countChains(want)-len(r.baseChains()))
	}

	// And packets follow the change.
	got, _ := reach(t, tr, tcp(remotePod, a("10.96.0.5"), 9100))
	if diff := cmp.Diff([]string{"10.246.0.1:9100"}, got); diff != "" {
		t.Errorf("new port of svc-4 (-want +got):\n%s", diff)
	}
	got, _ = reach(t, tr, tcp(remotePod, a("10.96.0.8"), 80)) // svc-7, deleted
	if diff := cmp.Diff([]string{"accept"}, got); diff != "" {
		t.Errorf("deleted svc-7 (-want +got):\n%s", diff)
	}

	// Going to no endpoints moves the ClusterIP to the reject map.
	noEPs := append([]*proxy.Service{}, changed...)
	s0 := *noEPs[0]
	s0.Ports = []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, NodePort: s0.Ports[0].NodePort}}
	noEPs[0] = &s0
	tx = fake.NewTransaction()
	r.Partial(tx, noEPs, st2, map[string]bool{"ns/svc-0": true})
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatalf("partial sync to no endpoints: %v\n%s", err, tx)
	}
	got, _ = reach(t, tr, tcp(remotePod, a("10.96.0.1"), 80))
	if diff := cmp.Diff([]string{"reject tcp reset"}, got); diff != "" {
		t.Errorf("svc-0 without endpoints (-want +got):\n%s", diff)
	}
	want, _, _ = load(t, noEPs)
	if diff := cmp.Diff(sortedDump(want), sortedDump(fake)); diff != "" {
		t.Fatalf("partial sync result differs from a full sync (-full +partial):\n%s", diff)
	}
}

func countChains(f *knftables.Fake) int { return len(f.Table.Chains) }

func TestFullSyncRemovesStaleChains(t *testing.T) {
	services := manyServices(6)
	fake, _, _ := load(t, services)
	// A restarted proxy (no state) syncing fewer services.
	r := New(testConfig())
	tx := fake.NewTransaction()
	r.Full(tx, services[:2], nil, existing(t, fake))
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("%v\n%s", err, tx)
	}
	want, _, _ := load(t, services[:2])
	if diff := cmp.Diff(sortedDump(want), sortedDump(fake)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestIPv6(t *testing.T) {
	r := New(Config{Family: knftables.IPv6Family, NodeName: node})
	fake := knftables.NewFake(knftables.IPv6Family, DefaultTable)
	s := svc("v6", "fd00:96::10", 80, ep("fd00:244::5", 8080, "node-b"))
	s.Type = proxy.NodePort
	s.Ports[0].NodePort = 30080
	v4 := svc("v4only", "10.96.0.10", 80, ep("10.244.2.5", 8080, "node-b"))
	tx := fake.NewTransaction()
	r.Full(tx, []*proxy.Service{s, v4}, nil, nil)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("%v\n%s", err, tx)
	}
	tr := nfttrace.New(fake, a("fd00:30::10"))
	got, masq := reach(t, tr, tcp(a("fd00:31::5"), a("fd00:30::10"), 30080))
	if diff := cmp.Diff([]string{"[fd00:244::5]:8080"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if len(masq) != 1 {
		t.Errorf("NodePort traffic not masqueraded")
	}
	if strings.Contains(fake.Dump(), "10.96.0.10") {
		t.Errorf("IPv4 service rendered into the ip6 table")
	}
}

func benchmarkFull(b *testing.B, n int) {
	services := manyServices(n)
	r := New(testConfig())
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tx := fake.NewTransaction()
		r.Full(tx, services, nil, nil)
	}
}

func BenchmarkFullSync1k(b *testing.B)  { benchmarkFull(b, 1000) }
func BenchmarkFullSync10k(b *testing.B) { benchmarkFull(b, 10000) }

func BenchmarkPartialSyncOneOf10k(b *testing.B) {
	services := manyServices(10000)
	r := New(testConfig())
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	tx := fake.NewTransaction()
	st := r.Full(tx, services, nil, nil)
	changed := map[string]bool{"ns/svc-42": true}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := *services[42]
		s.Ports = append([]proxy.ServicePort{}, s.Ports...)
		s.Ports[0].Endpoints = append([]proxy.Endpoint{}, s.Ports[0].Endpoints[:i%2+1]...)
		next := append([]*proxy.Service{}, services...)
		next[42] = &s
		tx := fake.NewTransaction()
		st = r.Partial(tx, next, st, changed)
	}
}

// newPick is a pick of vals at keys [off, off+8) of endpoints-tcp-1, as
// renderService makes it.
func newPick(off uint32, vals ...string) pick {
	p := pick{keys: keyRange{off, 8}, m: "endpoints-tcp-1", vals: vals, sums: make([]uint64, len(vals))}
	for i, v := range vals {
		p.sums[i] = valueSum(v)
	}
	return p
}

func TestDiffPicks(t *testing.T) {
	str := func(os []knftables.Object) []string {
		var out []string
		for _, o := range os {
			e := o.(*knftables.Element)
			out = append(out, strings.TrimSpace(e.Map+" "+strings.Join(e.Key, " . ")+" "+strings.Join(e.Value, " ")))
		}
		return out
	}
	old := newPick(8, "a", "b", "c")
	old.vals = nil // as the state keeps it
	for _, tc := range []struct {
		name       string
		old, nw    pick
		dels, adds []string
	}{
		{"one value changed, one added", old, newPick(8, "a", "x", "c", "d"),
			[]string{"endpoints-tcp-1 9"}, []string{"endpoints-tcp-1 9 x", "endpoints-tcp-1 11 d"}},
		{"shrunk", old, newPick(8, "a", "b"), []string{"endpoints-tcp-1 10"}, nil},
		{"unchanged", old, newPick(8, "a", "b", "c"), nil, nil},
		{"moved to other keys", old, newPick(16, "a", "b"),
			[]string{"endpoints-tcp-1 8", "endpoints-tcp-1 9", "endpoints-tcp-1 10"}, []string{"endpoints-tcp-1 16 a", "endpoints-tcp-1 17 b"}},
		{"new", pick{}, newPick(16, "a"), nil, []string{"endpoints-tcp-1 16 a"}},
		{"gone", old, pick{}, []string{"endpoints-tcp-1 8", "endpoints-tcp-1 9", "endpoints-tcp-1 10"}, nil},
	} {
		dels, adds := diffPicks(tc.old, tc.nw)
		if diff := cmp.Diff(tc.dels, str(dels)); diff != "" {
			t.Errorf("%s: deletes (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(tc.adds, str(adds)); diff != "" {
			t.Errorf("%s: adds (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, nw  []string // nw in endpoint order
		want     []string
		elements int // element deletes and adds diffPicks then makes
	}{
		{"one removed from the middle: the last moves into its place", []string{"a", "b", "c", "d", "e"}, []string{"a", "b", "d", "e"}, []string{"a", "b", "e", "d"}, 3},
		{"one added in the middle: at the end", []string{"a", "b", "c"}, []string{"a", "x", "b", "c"}, []string{"a", "b", "c", "x"}, 1},
		{"one changed: in its place", []string{"a", "b", "c"}, []string{"a", "x", "c"}, []string{"a", "x", "c"}, 2},
		{"old order kept, whatever the new", []string{"c", "a", "b"}, []string{"a", "b", "c"}, []string{"c", "a", "b"}, 0},
		{"shrunk below a kept value", []string{"a", "b", "c", "d"}, []string{"x", "d"}, []string{"x", "d"}, 6},
		{"a value twice", []string{"a", "b", "c", "d"}, []string{"b", "a", "a", "e"}, []string{"a", "b", "a", "e"}, 4},
		{"from nothing", nil, []string{"b", "a"}, []string{"b", "a"}, 2},
		// The modulus held (holdModulus): five keys over four endpoints.
		{"held: the leaver's key takes a copy", []string{"a", "b", "c", "d", "e"}, []string{"a", "b", "d", "e"}, []string{"a", "b", "a", "d", "e"}, 2},
		{"held: the copy stays", []string{"a", "b", "a", "d", "e"}, []string{"a", "b", "d", "e"}, []string{"a", "b", "a", "d", "e"}, 0},
		{"held: the replacement takes the copy's key", []string{"a", "b", "a", "d", "e"}, []string{"a", "b", "x", "d", "e"}, []string{"a", "b", "x", "d", "e"}, 2},
		{"held: the copy's endpoint leaves too", []string{"a", "b", "a", "d", "e"}, []string{"b", "d", "e"}, []string{"b", "b", "d", "d", "e"}, 4},
		{"held: two keys over one endpoint", []string{"a", "b"}, []string{"b"}, []string{"b", "b"}, 2},
		{"held: a second copy goes to another endpoint", []string{"a", "b", "c", "d", "e", "f", "g", "h", "a", "j"}, []string{"a", "b", "c", "d", "e", "f", "g", "h"}, []string{"a", "b", "c", "d", "e", "f", "g", "h", "a", "b"}, 2},
		{"held: a kept copy that would be a third is replaced", []string{"a", "b", "a", "d", "a", "f"}, []string{"a", "b", "d", "f"}, []string{"a", "b", "a", "d", "b", "f"}, 2},
	} {
		old := newPick(8, tc.old...)
		p := newPick(8, tc.nw...)
		p.place(old.sums, len(tc.want))
		if diff := cmp.Diff(tc.want, p.vals); diff != "" {
			t.Errorf("%s: (-want +got):\n%s", tc.name, diff)
		}
		for i, v := range p.vals {
			if p.sums[i] != valueSum(v) {
				t.Errorf("%s: sum %d is not its value's (%s)", tc.name, i, v)
			}
		}
		old.vals = nil
		if dels, adds := diffPicks(old, p); len(dels)+len(adds) != tc.elements {
			t.Errorf("%s: %d element deletes and adds, want %d", tc.name, len(dels)+len(adds), tc.elements)
		}
	}
}

// A partial sync of a 1,000-endpoint service with one endpoint more, less
// or changed writes one to three endpoint-map elements, with and without
// session affinity, and leaves the table as a full sync would.
func TestPartialOneEndpointFewElements(t *testing.T) {
	for _, affinity := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("affinity=%v", affinity), func(t *testing.T) {
			s := frontend(1000)
			s.AffinityTimeout = affinity
			fake, r, st := load(t, []*proxy.Service{s})
			step := func(what string, most int, edit func(eps []proxy.Endpoint) []proxy.Endpoint) {
				t.Helper()
				next := *s
				next.Ports = slices.Clone(s.Ports)
				next.Ports[0].Endpoints = edit(slices.Clone(s.Ports[0].Endpoints))
				s = &next
				tx := fake.NewTransaction()
				st = r.Partial(tx, []*proxy.Service{s}, st, map[string]bool{s.Key(): true})
				if n := endpointElementOps(tx); n > most {
					t.Errorf("%s: %d endpoint-map element operations, want at most %d", what, n, most)
				}
				if err := fake.Run(context.Background(), tx); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				want, _, _ := load(t, []*proxy.Service{s})
				if diff := cmp.Diff(sortedDump(want), sortedDump(fake)); diff != "" {
					t.Fatalf("%s: table differs from a full sync (-full +partial):\n%s", what, diff)
				}
			}
			step("one removed from the middle", 3, func(eps []proxy.Endpoint) []proxy.Endpoint { return slices.Delete(eps, 500, 501) })
			step("one added in the middle", 1, func(eps []proxy.Endpoint) []proxy.Endpoint {
				return slices.Insert(eps, 250, ep("10.250.0.1", 8080, "node-new"))
			})
			step("one changed", 2, func(eps []proxy.Endpoint) []proxy.Endpoint {
				eps[100].Port = 9090
				return eps
			})
		})
	}
}

// frontend is the gateway's frontend at n nodes: a LoadBalancer Service
// with externalTrafficPolicy Local and one endpoint per node, this node's
// first.
func frontend(n int) *proxy.Service {
	eps := make([]proxy.Endpoint, n)
	for i := range eps {
		eps[i] = proxy.Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(i%250 + 1)}), Port: 8080,
			Ready: true, Serving: true, NodeName: fmt.Sprintf("node-%d", i)}
	}
	eps[0].NodeName = node
	s := svc("frontend", "10.96.0.60", 443, eps...)
	s.Type, s.ExternalLocal = proxy.LoadBalancer, true
	s.Ports[0].NodePort = 30443
	s.LoadBalancerIPs = []netip.Addr{a("172.29.1.60")}
	return s
}

var endpointElemOp = regexp.MustCompile(`(?m)^(?:add|delete) element \S+ \S+ (?:` + mapEndpointsPrefix + `|` + mapEndpointChainsPrefix + `)`)

// endpointElementOps counts the endpoint-map elements tx adds or deletes.
func endpointElementOps(tx *knftables.Transaction) int {
	return len(endpointElemOp.FindAllStringIndex(tx.String(), -1))
}

// BenchmarkPartialOneEndpoint is a node joining or leaving a cluster of
// 5,000: each op removes one endpoint of the frontend (a different one
// each time) or adds it back. elemops/op are the endpoint-map elements
// the transaction adds or deletes.
func BenchmarkPartialOneEndpoint(b *testing.B) {
	const n = 5000
	all := frontend(n)
	var less []*proxy.Service
	for k := 1; k < n; k += n / 16 {
		s := *all
		s.Ports = slices.Clone(all.Ports)
		s.Ports[0].Endpoints = slices.Delete(slices.Clone(all.Ports[0].Endpoints), k, k+1)
		less = append(less, &s)
	}
	r := New(testConfig())
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	st := r.Full(fake.NewTransaction(), []*proxy.Service{all}, nil, nil)
	changed := map[string]bool{all.Key(): true}
	var ops, elemOps int
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s := all
		if i%2 == 0 {
			s = less[i/2%len(less)]
		}
		tx := fake.NewTransaction()
		st = r.Partial(tx, []*proxy.Service{s}, st, changed)
		b.StopTimer()
		ops += tx.NumOperations()
		elemOps += endpointElementOps(tx)
		b.StartTimer()
	}
	b.ReportMetric(float64(ops)/float64(b.N), "ops/op")
	b.ReportMetric(float64(elemOps)/float64(b.N), "elemops/op")
}

func TestConflictingServicesDoNotBreakTheSync(t *testing.T) {
	first := svc("a-first", "10.96.0.40", 80, ep("10.244.2.5", 8080, "node-b"))
	second := svc("b-second", "10.96.0.41", 80, ep("10.244.3.5", 8080, "node-c"))
	first.ExternalIPs = []netip.Addr{a("172.29.0.50")}
	second.ExternalIPs = []netip.Addr{a("172.29.0.50")}
	fake, r, st := load(t, []*proxy.Service{second, first})
	if len(st.Conflicts) != 1 || !strings.Contains(st.Conflicts[0].Error(), "ns/b-second") {
		t.Fatalf("conflicts = %v, want one for ns/b-second", st.Conflicts)
	}
	tr := nfttrace.New(fake, nodeIP)
	got, _ := reach(t, tr, tcp(outside, a("172.29.0.50"), 80))
	if diff := cmp.Diff([]string{"10.244.2.5:8080"}, got); diff != "" {
		t.Errorf("externalIP owner (-want +got):\n%s", diff)
	}
	// The loser still works on its ClusterIP.
	got, _ = reach(t, tr, tcp(remotePod, a("10.96.0.41"), 80))
	if diff := cmp.Diff([]string{"10.244.3.5:8080"}, got); diff != "" {
		t.Errorf("second ClusterIP (-want +got):\n%s", diff)
	}
	// A partial sync of the loser keeps out of the owner's element.
	second.Ports[0].Endpoints = append(second.Ports[0].Endpoints, ep("10.244.4.5", 8080, "node-d"))
	tx := fake.NewTransaction()
	st = r.Partial(tx, []*proxy.Service{first, second}, st, map[string]bool{"ns/b-second": true})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("partial sync: %v\n%s", err, tx)
	}
	if len(st.Conflicts) != 1 {
		t.Errorf("conflicts after partial sync = %v, want 1", st.Conflicts)
	}
	got, _ = reach(t, tr, tcp(outside, a("172.29.0.50"), 80))
	if diff := cmp.Diff([]string{"10.244.2.5:8080"}, got); diff != "" {
		t.Errorf("externalIP owner after partial sync (-want +got):\n%s", diff)
	}
}

func TestAffinityTimeoutChange(t *testing.T) {
	s := svc("sticky", "10.96.0.30", 80, ep("10.244.2.5", 8080, "node-b"))
	s.AffinityTimeout = time.Hour
	fake, r, st := load(t, []*proxy.Service{s})
	s2 := *s
	s2.AffinityTimeout = 2 * time.Hour
	tx := fake.NewTransaction()
	r.Partial(tx, []*proxy.Service{&s2}, st, map[string]bool{"ns/sticky": true})
	text := tx.String()
	// The kernel refuses to delete a set that a rule still names.
	del := strings.Index(text, "delete set")
	if del < 0 {
		t.Fatalf("no set re-created for the new timeout:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "@aff-") && strings.HasPrefix(line, "add rule") && strings.Index(text, line) < del {
			t.Errorf("rule naming the set added before its deletion: %s", line)
		}
	}
	for _, prefix := range []string{"flush chain ip flatnet-proxy ep-", "flush chain ip flatnet-proxy svc-"} {
		if i := strings.Index(text, prefix); i < 0 || i > del {
			t.Errorf("%q missing or after the set deletion:\n%s", prefix, text)
		}
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	want, _, _ := load(t, []*proxy.Service{&s2})
	if diff := cmp.Diff(sortedDump(want), sortedDump(fake)); diff != "" {
		t.Fatalf("(-full +partial):\n%s", diff)
	}
}

func TestHeadlessServiceIsLeftToDNS(t *testing.T) {
	s := svc("headless", "10.96.0.50", 80, ep("10.244.2.5", 8080, "node-b"))
	s.ClusterIP = netip.Addr{}
	fake, _, st := load(t, []*proxy.Service{s})
	if chains := st.Chains(); len(chains) != 0 {
		t.Errorf("headless service has chains %v", chains)
	}
	if strings.Contains(fake.Dump(), "10.244.2.5") {
		t.Errorf("headless service endpoint rendered:\n%s", fake.Dump())
	}
}

// requireDeclaredBeforeUse fails t when a rule or map element of tx jumps
// or goes to a chain that neither exists in fake nor is added earlier in
// tx: the kernel refuses such a transaction ("No such file or directory"),
// though knftables' fake accepts it.
func requireDeclaredBeforeUse(t *testing.T, fake *knftables.Fake, tx *knftables.Transaction) {
	t.Helper()
	known := map[string]bool{}
	if fake.Table != nil {
		for name := range fake.Table.Chains {
			known[name] = true
		}
	}
	for _, line := range strings.Split(tx.String(), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "add" && f[1] == "chain" {
			known[f[4]] = true
			continue
		}
		if len(f) < 2 || f[0] != "add" || (f[1] != "rule" && f[1] != "element") {
			continue
		}
		for i := 0; i+1 < len(f); i++ {
			if (f[i] == "goto" || f[i] == "jump") && !known[strings.TrimRight(f[i+1], ",}")] {
				t.Errorf("%q refers to chain %s before it is added:\n%s", line, f[i+1], tx)
			}
		}
	}
}

// A service whose external entry chain refers to its svc- and svl- chains,
// added in a partial sync: every chain is declared before a rule or map
// element refers to it (found in a lab: nft refused the transaction).
func TestPartialSyncDeclaresChainsFirst(t *testing.T) {
	fake, r, st := load(t, manyServices(2))
	lb := svc("lb", "10.96.7.7", 80, ep("10.244.1.2", 8080, "node-a"), ep("10.245.0.2", 8080, "node-b"))
	lb.Type = proxy.LoadBalancer
	lb.ExternalLocal = true
	lb.Ports[0].NodePort = 30777
	lb.LoadBalancerIPs = []netip.Addr{a("10.201.0.7")}
	lb.AffinityTimeout = time.Minute
	tx := fake.NewTransaction()
	r.Partial(tx, append(manyServices(2), lb), st, map[string]bool{"ns/lb": true})
	requireDeclaredBeforeUse(t, fake, tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}

	// The same for a full sync from an empty table.
	empty := knftables.NewFake(knftables.IPv4Family, DefaultTable)
	tx = empty.NewTransaction()
	r.Full(tx, append(manyServices(2), lb), nil, nil)
	requireDeclaredBeforeUse(t, empty, tx)
}

func TestNodePortAddresses(t *testing.T) {
	np := svc("np", "10.96.0.23", 80, ep("10.244.2.5", 8080, "node-b"))
	np.Type, np.Ports[0].NodePort = proxy.NodePort, 30023
	render := func(addrs ...string) *nfttrace.Tracer {
		cfg := testConfig()
		for _, s := range addrs {
			cfg.NodePortAddresses = append(cfg.NodePortAddresses, netip.MustParsePrefix(s))
		}
		fake := knftables.NewFake(knftables.IPv4Family, DefaultTable)
		tx := fake.NewTransaction()
		New(cfg).Full(tx, []*proxy.Service{np}, nil, nil)
		if err := fake.Run(context.Background(), tx); err != nil {
			t.Fatalf("%v\n%s", err, tx)
		}
		// The node has two addresses: nodeIP (172.30.0.10) and 172.30.9.10.
		return nfttrace.New(fake, nodeIP, a("172.30.9.10"))
	}
	tests := []struct {
		name  string
		addrs []string
		dst   netip.Addr
		want  string
	}{
		{"unset: every local address", nil, a("172.30.9.10"), "10.244.2.5:8080"},
		{"in a listed prefix", []string{"172.30.0.0/24"}, nodeIP, "10.244.2.5:8080"},
		{"a local address outside the prefixes", []string{"172.30.0.0/24"}, a("172.30.9.10"), "accept"},
		{"two prefixes", []string{"172.30.0.0/24", "172.30.9.0/24"}, a("172.30.9.10"), "10.244.2.5:8080"},
		{"prefixes of the other family only: every local address", []string{"fd00::/8"}, a("172.30.9.10"), "10.244.2.5:8080"},
		{"a listed prefix does not make a foreign address local", []string{"172.31.0.0/16"}, a("172.31.0.1"), "accept"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := reach(t, render(tc.addrs...), tcp(outside, tc.dst, 30023))
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// Shared set elements (hairpin connections, ClusterIPs) stay while any
// service wants them and go with the last one, in partial syncs.
func TestSharedSetElementsAreRefcounted(t *testing.T) {
	local := ep("10.244.1.5", 8080, node)
	a1 := svc("a", "10.96.0.31", 80, local)
	b1 := svc("b", "10.96.0.32", 80, local) // the same local endpoint
	fake, r, st := load(t, []*proxy.Service{a1, b1})
	ctx := context.Background()
	hairpin := "hairpin-connections { 10.244.1.5 . 10.244.1.5 . tcp . 8080 }"
	elems := func() string {
		t.Helper()
		set, err := fake.ListElements(ctx, "set", setHairpin)
		if err != nil {
			t.Fatal(err)
		}
		ips, err := fake.ListElements(ctx, "set", setClusterIPs)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range append(set, ips...) {
			out = append(out, e.Set+" { "+strings.Join(e.Key, " . ")+" }")
		}
		sort.Strings(out)
		return strings.Join(out, "\n")
	}
	want := "cluster-ips { 10.96.0.31 }\ncluster-ips { 10.96.0.32 }\n" + hairpin
	if got := elems(); got != want {
		t.Fatalf("after the full sync:\n%s\nwant:\n%s", got, want)
	}
	step := func(services []*proxy.Service, changed string, want string) {
		t.Helper()
		tx := fake.NewTransaction()
		st = r.Partial(tx, services, st, map[string]bool{"ns/" + changed: true})
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatalf("partial sync of %s: %v\n%s", changed, err, tx)
		}
		if got := elems(); got != want {
			t.Fatalf("after the partial sync of %s:\n%s\nwant:\n%s", changed, got, want)
		}
	}
	step([]*proxy.Service{b1}, "a", "cluster-ips { 10.96.0.32 }\n"+hairpin) // b still has the endpoint
	step(nil, "b", "")                                                      // the last one lets go
	step([]*proxy.Service{a1}, "a", "cluster-ips { 10.96.0.31 }\n"+hairpin) // and it comes back
	// A full sync from scratch agrees with the partial ones.
	tx := fake.NewTransaction()
	r.Full(tx, []*proxy.Service{a1}, nil, existing(t, fake))
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if got := elems(); got != "cluster-ips { 10.96.0.31 }\n"+hairpin {
		t.Fatalf("after a full sync:\n%s", got)
	}
}
