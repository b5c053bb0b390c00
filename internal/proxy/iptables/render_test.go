package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/ipt"
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

func nodePort(s *proxy.Service, np uint16) *proxy.Service {
	s.Type = proxy.NodePort
	s.Ports[0].NodePort = np
	return s
}

func testConfig() Config {
	return Config{Family: ipt.IPv4, NodeName: node, ClusterCIDRs: []netip.Prefix{clusterCIDR}}
}

// load runs a full sync of services on a new fake.
func load(t testing.TB, services []*proxy.Service) (*ipt.Fake, *Backend) {
	t.Helper()
	return loadWith(t, testConfig(), services)
}

func loadWith(t testing.TB, cfg Config, services []*proxy.Service) (*ipt.Fake, *Backend) {
	t.Helper()
	fake := ipt.NewFake()
	b := NewBackend(fake, cfg)
	if _, err := b.Sync(context.Background(), services, nil, true); err != nil {
		t.Fatalf("full sync: %v", err)
	}
	return fake, b
}

// partial runs a partial sync and returns its restore input ("" if none).
func partial(t *testing.T, fake *ipt.Fake, b *Backend, services []*proxy.Service, changed ...string) string {
	t.Helper()
	n := len(fake.Restores)
	keys := map[string]bool{}
	for _, k := range changed {
		keys["ns/"+k] = true
	}
	if _, err := b.Sync(context.Background(), services, proxy.ChangesOf(services, keys), false); err != nil {
		t.Fatalf("partial sync of %v: %v", changed, err)
	}
	if len(fake.Restores) == n {
		return ""
	}
	return fake.Restores[len(fake.Restores)-1]
}

// reach traces p once per random choice and returns the endpoints reached
// (or "reject"/"drop"/"accept" when not DNATed), and those masqueraded.
func reach(t *testing.T, tr *tracer, p packet) (got, masq []string) {
	t.Helper()
	seen := map[string]bool{}
	for k := 0; k < 4; k++ {
		tr.choice = k
		res, err := tr.trace(p)
		if err != nil {
			t.Fatalf("trace %+v: %v", p, err)
		}
		out := strings.ToLower(res.verdict)
		if res.endpoint != "" {
			out = res.endpoint
		}
		if !seen[out] {
			seen[out] = true
			got = append(got, out)
			if res.masq {
				masq = append(masq, out)
			}
		}
	}
	sort.Strings(got)
	sort.Strings(masq)
	return got, masq
}

func tcp(src, dst netip.Addr, port uint16) packet {
	return packet{src: src, dst: dst, proto: "tcp", port: port}
}

func TestPacketFlows(t *testing.T) {
	local1 := ep("10.244.1.5", 8080, node)
	remote1 := ep("10.244.2.5", 8080, "node-b")
	remote2 := ep("10.244.3.5", 8080, "node-c")

	named := svc("named", "10.96.0.11", 80, ep("10.244.2.6", 8080, "node-b"), ep("10.244.3.6", 9090, "node-c"))
	ext := svc("ext", "10.96.0.12", 80, remote1, remote2)
	ext.ExternalIPs = []netip.Addr{a("172.29.0.7")}
	lb := nodePort(svc("lb", "10.96.0.13", 443, remote1), 30443)
	lb.Type = proxy.LoadBalancer
	lb.LoadBalancerIPs = []netip.Addr{a("172.29.1.9")}
	empty := nodePort(svc("empty", "10.96.0.14", 80), 30014)
	empty.ExternalIPs = []netip.Addr{a("172.29.0.14")}
	emptyUDP := svc("empty-udp", "10.96.0.15", 53)
	emptyUDP.Ports[0].Protocol = proxy.UDP
	mixed := svc("mixed", "10.96.0.16", 80, remote1, terminating(remote2, true))
	draining := svc("draining", "10.96.0.17", 80, terminating(remote1, true), terminating(remote2, false))
	gone := svc("gone", "10.96.0.18", 80, terminating(remote1, false))
	etpLocal := nodePort(svc("etp", "10.96.0.19", 80, local1, remote1), 30019)
	etpLocal.ExternalLocal = true
	etpNoLocal := nodePort(svc("etp-none", "10.96.0.20", 80, remote1), 30020)
	etpNoLocal.ExternalLocal = true
	etpNoLocal.ExternalIPs = []netip.Addr{a("172.29.0.20")}
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
	fwEmpty := svc("fw-empty", "10.96.0.28", 80)
	fwEmpty.Type = proxy.LoadBalancer
	fwEmpty.LoadBalancerIPs = []netip.Addr{a("172.29.1.28")}
	fwEmpty.Firewall, fwEmpty.SourceRanges = true, []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16")}

	fwLocal := nodePort(svc("fw-local", "10.96.0.29", 80, local1, remote1), 30029)
	fwLocal.Type, fwLocal.ExternalLocal, fwLocal.InternalLocal = proxy.LoadBalancer, true, true
	fwLocal.LoadBalancerIPs = []netip.Addr{a("172.29.1.29")}
	fwLocal.Firewall, fwLocal.SourceRanges = true, []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16")}
	udp := svc("dns", "10.96.0.31", 53, ep("10.244.2.53", 5353, "node-b"))
	udp.Ports[0].Protocol = proxy.UDP

	services := []*proxy.Service{
		svc("web", "10.96.0.10", 80, local1, remote1, remote2),
		named, ext, lb, empty, emptyUDP, mixed, draining, gone, etpLocal, etpNoLocal, itpLocal, hairpin, np,
		etpEmpty, itpNoLocal, fw, fw6, fwEmpty, fwLocal, udp,
	}
	fake, _ := load(t, services)
	tr := newTracer(fake, ipt.IPv4, nodeIP)
	fromNode := func(dst string, port uint16) packet {
		return packet{src: nodeIP, dst: a(dst), proto: "tcp", port: port, fromLocal: true}
	}

	tests := []struct {
		name     string
		pkt      packet
		want     []string
		wantMasq []string
	}{
		{"ClusterIP reaches every endpoint", tcp(remotePod, a("10.96.0.10"), 80),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080", "10.244.3.5:8080"}, nil},
		{"ClusterIP from outside the pod network is masqueraded", tcp(outside, a("10.96.0.23"), 80),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"ClusterIP from the node itself is masqueraded", fromNode("10.96.0.23", 80),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"loadBalancerSourceRanges: a client in range reaches the LB IP", tcp(outside, a("172.29.1.26"), 80),
			[]string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"loadBalancerSourceRanges: a client out of range is dropped", tcp(a("172.28.0.1"), a("172.29.1.26"), 80), []string{"drop"}, nil},
		{"loadBalancerSourceRanges: other ports of the LB IP are not touched", tcp(a("172.28.0.1"), a("172.29.1.26"), 81), []string{"accept"}, nil},
		{"loadBalancerSourceRanges: the NodePort is not filtered", tcp(a("172.28.0.1"), nodeIP, 30026),
			[]string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"loadBalancerSourceRanges: the ClusterIP is not filtered", tcp(remotePod, a("10.96.0.26"), 80), []string{"10.244.2.5:8080"}, nil},
		{"loadBalancerSourceRanges of the other family only: dropped", tcp(outside, a("172.29.1.27"), 80), []string{"drop"}, nil},
		{"loadBalancerSourceRanges, no endpoints: out of range dropped", tcp(a("172.28.0.1"), a("172.29.1.28"), 80), []string{"drop"}, nil},
		{"loadBalancerSourceRanges, no endpoints: in range rejected", tcp(outside, a("172.29.1.28"), 80), []string{"reject"}, nil},
		{"ClusterIP wrong port is refused", tcp(remotePod, a("10.96.0.10"), 81), []string{"reject"}, nil},
		{"ClusterIP wrong port, UDP, is refused", packet{src: remotePod, dst: a("10.96.0.10"), proto: "udp", port: 53}, []string{"reject"}, nil},
		{"an address that is not a ClusterIP is not touched", tcp(remotePod, a("10.96.0.99"), 80), []string{"accept"}, nil},
		{"named targetPort resolved per endpoint", tcp(remotePod, a("10.96.0.11"), 80),
			[]string{"10.244.2.6:8080", "10.244.3.6:9090"}, nil},
		{"NodePort on the node address, masqueraded", tcp(outside, nodeIP, 30023),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"NodePort not on a foreign address", tcp(outside, a("172.30.0.99"), 30023), []string{"accept"}, nil},
		{"NodePort not on loopback", packet{src: a("127.0.0.1"), dst: a("127.0.0.1"), proto: "tcp", port: 30023, fromLocal: true},
			[]string{"accept"}, nil},
		{"externalIP", tcp(outside, a("172.29.0.7"), 80),
			[]string{"10.244.2.5:8080", "10.244.3.5:8080"}, []string{"10.244.2.5:8080", "10.244.3.5:8080"}},
		{"LoadBalancer IP", tcp(outside, a("172.29.1.9"), 443), []string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"LoadBalancer NodePort", tcp(outside, nodeIP, 30443), []string{"10.244.2.5:8080"}, []string{"10.244.2.5:8080"}},
		{"no endpoints: ClusterIP rejects", tcp(remotePod, a("10.96.0.14"), 80), []string{"reject"}, nil},
		{"no endpoints: NodePort rejects", tcp(outside, nodeIP, 30014), []string{"reject"}, nil},
		{"no endpoints: externalIP rejects", tcp(outside, a("172.29.0.14"), 80), []string{"reject"}, nil},
		{"no endpoints: from the node itself", fromNode("10.96.0.14", 80), []string{"reject"}, nil},
		{"no endpoints: NodePort from the node itself", fromNode("172.30.0.10", 30014), []string{"reject"}, nil},
		{"no endpoints: UDP too", packet{src: remotePod, dst: a("10.96.0.15"), proto: "udp", port: 53}, []string{"reject"}, nil},
		{"terminating endpoint unused while one is ready", tcp(remotePod, a("10.96.0.16"), 80), []string{"10.244.2.5:8080"}, nil},
		{"terminating serving endpoints used when none is ready", tcp(remotePod, a("10.96.0.17"), 80), []string{"10.244.2.5:8080"}, nil},
		{"terminating non-serving endpoints reject", tcp(remotePod, a("10.96.0.18"), 80), []string{"reject"}, nil},
		{"eTP Local: external traffic only to local endpoints, source kept", tcp(outside, nodeIP, 30019), []string{"10.244.1.5:8080"}, nil},
		{"eTP Local: the node's own traffic is masqueraded", fromNode("172.30.0.10", 30019), []string{"10.244.1.5:8080"}, []string{"10.244.1.5:8080"}},
		{"eTP Local: ClusterIP still uses all endpoints", tcp(remotePod, a("10.96.0.19"), 80),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080"}, nil},
		{"eTP Local: pod traffic to the NodePort short-circuits to all endpoints", tcp(remotePod, nodeIP, 30019),
			[]string{"10.244.1.5:8080", "10.244.2.5:8080"}, nil},
		{"eTP Local: no local endpoint drops external traffic", tcp(outside, nodeIP, 30020), []string{"drop"}, nil},
		{"eTP Local: no local endpoint drops external traffic to an externalIP", tcp(outside, a("172.29.0.20"), 80), []string{"drop"}, nil},
		{"eTP Local: no local endpoint, pod traffic still reaches the others", tcp(remotePod, nodeIP, 30020),
			[]string{"10.244.2.5:8080"}, nil},
		{"eTP Local: no local endpoint, pod traffic to the externalIP too", tcp(remotePod, a("172.29.0.20"), 80),
			[]string{"10.244.2.5:8080"}, nil},
		{"eTP Local: no endpoints at all rejects", tcp(outside, nodeIP, 30024), []string{"reject"}, nil},
		{"iTP Local: ClusterIP only to local endpoints", tcp(remotePod, a("10.96.0.21"), 80), []string{"10.244.1.5:8080"}, nil},
		{"iTP Local: no local endpoint drops", tcp(remotePod, a("10.96.0.25"), 80), []string{"drop"}, nil},
		{"LB, source ranges, both policies Local: in range, to the local endpoint, source kept", tcp(outside, a("172.29.1.29"), 80),
			[]string{"10.244.1.5:8080"}, nil},
		{"LB, source ranges, both policies Local: out of range dropped", tcp(a("172.28.0.1"), a("172.29.1.29"), 80), []string{"drop"}, nil},
		{"LB, both policies Local: pod traffic to the NodePort short-circuits to the local endpoint", tcp(remotePod, nodeIP, 30029),
			[]string{"10.244.1.5:8080"}, nil},
		{"UDP ClusterIP", packet{src: remotePod, dst: a("10.96.0.31"), proto: "udp", port: 53}, []string{"10.244.2.53:5353"}, nil},
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

// The layout is kube-proxy's: one rule per endpoint with the probability
// of picking it among the rest, and a FLATNET-SEP- chain per endpoint.
func TestRenderedRules(t *testing.T) {
	fake, _ := load(t, []*proxy.Service{nodePort(svc("web", "10.96.0.10", 80,
		ep("10.244.1.5", 8080, node), ep("10.244.2.5", 8080, "node-b"), ep("10.244.3.5", 8080, "node-c")), 30080)})
	dump := fake.Dump(ipt.IPv4, "nat")
	svcChain := chainName(prefixSvc, "ns", "web", "tcp", "http")
	sep := chainName(prefixSep, "ns", "web", "tcp", "http", "10.244.1.5:8080")
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"flatnet service portals\" -j FLATNET-SERVICES",
		"-A OUTPUT -m comment --comment \"flatnet service portals\" -j FLATNET-SERVICES",
		"-A POSTROUTING -m comment --comment \"flatnet postrouting rules\" -j FLATNET-POSTROUTING",
		"-A FLATNET-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/web:http cluster IP\" -m tcp --dport 80 -j " + svcChain,
		"-A FLATNET-SERVICES ! -d 127.0.0.0/8 -m comment --comment \"flatnet service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j FLATNET-NODEPORTS",
		"-A FLATNET-NODEPORTS -p tcp -m comment --comment ns/web:http -m tcp --dport 30080 -j " + chainName(prefixExt, "ns", "web", "tcp", "http"),
		"-A " + svcChain + " ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/web:http cluster IP\" -m tcp --dport 80 -j FLATNET-MARK-MASQ",
		"-A " + svcChain + " -m comment --comment \"ns/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.33333333349 -j " + sep,
		"-A " + svcChain + " -m comment --comment \"ns/web:http -> 10.244.2.5:8080\" -m statistic --mode random --probability 0.50000000000 -j ",
		"-A " + svcChain + " -m comment --comment \"ns/web:http -> 10.244.3.5:8080\" -j ",
		"-A " + sep + " -s 10.244.1.5/32 -m comment --comment ns/web:http -j FLATNET-MARK-MASQ",
		"-A " + sep + " -p tcp -m comment --comment ns/web:http -m tcp -j DNAT --to-destination 10.244.1.5:8080",
		"-A FLATNET-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
		"-A FLATNET-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
		"-A FLATNET-POSTROUTING -m comment --comment \"flatnet service traffic requiring SNAT\" -j MASQUERADE --random-fully",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("nat table lacks %q:\n%s", want, dump)
		}
	}
	for _, c := range strings.Fields(dump) {
		if strings.HasPrefix(c, "FLATNET-") && len(c) > 28 {
			t.Errorf("chain name %s is longer than iptables allows (28)", c)
		}
	}
	filter := fake.Dump(ipt.IPv4, "filter")
	for _, want := range []string{
		"-A INPUT -m conntrack --ctstate NEW -m comment --comment \"flatnet load balancer firewall\" -j FLATNET-PROXY-FIREWALL\n" +
			"-A INPUT -m conntrack --ctstate NEW -m comment --comment \"flatnet external services\" -j FLATNET-EXTERNAL-SERVICES\n",
		"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"flatnet load balancer firewall\" -j FLATNET-PROXY-FIREWALL\n" +
			"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"flatnet service portals\" -j FLATNET-SERVICES\n" +
			"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"flatnet external services\" -j FLATNET-EXTERNAL-SERVICES\n",
		"-A FLATNET-SERVICES -d 10.96.0.10/32 -m comment --comment \"ns/web cluster IP, other ports\" -j REJECT --reject-with icmp-port-unreachable",
	} {
		if !strings.Contains(filter, want) {
			t.Errorf("filter table lacks %q:\n%s", want, filter)
		}
	}
}

func TestSessionAffinity(t *testing.T) {
	s := svc("sticky", "10.96.0.30", 80, ep("10.244.2.5", 8080, "node-b"), ep("10.244.3.5", 8080, "node-c"), ep("10.244.4.5", 8080, "node-d"))
	s.AffinityTimeout = 3 * time.Hour
	fake, _ := load(t, []*proxy.Service{s})
	sep := chainName(prefixSep, "ns", "sticky", "tcp", "http", "10.244.4.5:8080")
	dump := fake.Dump(ipt.IPv4, "nat")
	for _, want := range []string{
		"-m recent --rcheck --seconds 10800 --reap --name " + sep + " --mask 255.255.255.255 --rsource -j " + sep,
		"-A " + sep + " -p tcp -m comment --comment ns/sticky:http -m recent --set --name " + sep + " --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.4.5:8080",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("nat table lacks %q:\n%s", want, dump)
		}
	}

	tr := newTracer(fake, ipt.IPv4, nodeIP)
	client := a("10.244.9.9")
	tr.choice = 2
	first, err := tr.trace(tcp(client, a("10.96.0.30"), 80))
	if err != nil {
		t.Fatal(err)
	}
	if first.endpoint != "10.244.4.5:8080" {
		t.Fatalf("first connection went to %s, want 10.244.4.5:8080", first)
	}
	for k := 0; k < 3; k++ {
		tr.choice = k
		res, err := tr.trace(tcp(client, a("10.96.0.30"), 80))
		if err != nil {
			t.Fatal(err)
		}
		if res.endpoint != first.endpoint {
			t.Errorf("connection %d went to %s, want sticky %s", k, res, first)
		}
	}
	// Another client is not stuck to it.
	tr.choice = 0
	other, err := tr.trace(tcp(a("10.244.9.10"), a("10.96.0.30"), 80))
	if err != nil {
		t.Fatal(err)
	}
	if other.endpoint != "10.244.2.5:8080" {
		t.Errorf("other client went to %s, want 10.244.2.5:8080", other)
	}
}

func manyServices(n int) []*proxy.Service {
	out := make([]*proxy.Service, 0, n)
	for i := 0; i < n; i++ {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		s := svc(fmt.Sprintf("svc-%d", i), ip, 80,
			ep(fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), 8080, "node-b"),
			ep(fmt.Sprintf("10.245.%d.%d", i/250, i%250+1), 8080, node))
		if i%3 == 0 && i < 2000 {
			nodePort(s, uint16(30000+i))
		}
		if i%5 == 0 {
			s.AffinityTimeout = 10800 * time.Second
		}
		out = append(out, s)
	}
	return out
}

// sortedDump is both tables, lines sorted: partial syncs insert dispatch
// rules first where a full sync appends them, which only reorders rules
// that match disjoint packets.
func sortedDump(f *ipt.Fake, fam ipt.Protocol) string {
	lines := strings.Split(strings.TrimSpace(f.Dump(fam, "nat")+f.Dump(fam, "filter")), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// requireOrder checks what order must hold in the dispatch chains: the
// NodePorts jump last in nat FLATNET-SERVICES, the ClusterIP catch-alls
// after every port rule in filter FLATNET-SERVICES.
func requireOrder(t *testing.T, f *ipt.Fake, fam ipt.Protocol) {
	t.Helper()
	nat, _ := f.Save(context.Background(), fam, "nat")
	rules := nat.RulesIn(ChainServices)
	for i, r := range rules {
		if r.Target() == ChainNodePorts && i != len(rules)-1 {
			t.Errorf("nat %s: the NodePorts jump is rule %d of %d", ChainServices, i+1, len(rules))
		}
	}
	filter, _ := f.Save(context.Background(), fam, "filter")
	catchAll := false
	for _, r := range filter.RulesIn(ChainServices) {
		isCatchAll := strings.HasSuffix(r.Comment(), "other ports")
		if catchAll && !isCatchAll {
			t.Errorf("filter %s: port rule %q after a catch-all", ChainServices, r.Args)
		}
		catchAll = catchAll || isCatchAll
	}
}

func TestIdempotentFullSync(t *testing.T) {
	services := manyServices(20)
	fake, b := load(t, services)
	first := fake.Dump(ipt.IPv4, "nat") + fake.Dump(ipt.IPv4, "filter")
	again := NewBackend(fake, testConfig()) // and without a remembered state
	for i, bk := range []*Backend{b, again} {
		res, err := bk.Sync(context.Background(), services, nil, true)
		if err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		// Every chain reads back as wanted: nothing to restore.
		if res.Operations != 0 {
			t.Errorf("sync %d wrote %d lines:\n%s", i, res.Operations, fake.Restores[len(fake.Restores)-1])
		}
		if diff := cmp.Diff(first, fake.Dump(ipt.IPv4, "nat")+fake.Dump(ipt.IPv4, "filter")); diff != "" {
			t.Fatalf("sync %d changed the tables (-first +now):\n%s", i, diff)
		}
	}
	// A partial sync with nothing changed runs no restore.
	if in := partial(t, fake, b, services); in != "" {
		t.Errorf("empty partial sync restored:\n%s", in)
	}
	// And a changed service whose rules come out the same neither.
	if in := partial(t, fake, b, services, "svc-3"); in != "" {
		t.Errorf("partial sync of an unchanged service restored:\n%s", in)
	}
}

func TestPartialSync(t *testing.T) {
	services := manyServices(10)
	fake, b := load(t, services)
	ctx := context.Background()

	// Change svc-4: one more endpoint, a new port; delete svc-7; add svc-new.
	changed := manyServices(10)
	s4 := changed[4]
	s4.Ports[0].Endpoints = append(s4.Ports[0].Endpoints, ep("10.246.0.1", 8080, "node-c"))
	s4.Ports = append(s4.Ports, proxy.ServicePort{Name: "metrics", Protocol: proxy.TCP, Port: 9100,
		Endpoints: []proxy.Endpoint{ep("10.246.0.1", 9100, "node-c")}})
	changed = append(changed[:7], changed[8:]...)
	changed = append(changed, svc("svc-new", "10.96.9.9", 80, ep("10.246.0.2", 8080, "node-c")))

	text := partial(t, fake, b, changed, "svc-4", "svc-7", "svc-new")
	for _, s := range services {
		if s.Name == "svc-4" || s.Name == "svc-7" {
			continue
		}
		if strings.Contains(text, "ns/"+s.Name+":") || strings.Contains(text, s.ClusterIP.String()+"/") {
			t.Errorf("partial sync touched unchanged service %s:\n%s", s.Key(), text)
		}
		for _, p := range s.Ports {
			if c := chainName(prefixSvc, "ns", s.Name, "tcp", p.Name); strings.Contains(text, c) {
				t.Errorf("partial sync touched unchanged chain %s:\n%s", c, text)
			}
		}
	}
	for _, c := range []string{ChainServices, ChainNodePorts, ChainExternalServices} {
		if strings.Contains(text, ":"+c+" ") {
			t.Errorf("partial sync rewrote the dispatch chain %s:\n%s", c, text)
		}
	}
	if !strings.Contains(text, "-X "+chainName(prefixSvc, "ns", "svc-7", "tcp", "http")) {
		t.Errorf("partial sync did not delete svc-7's chains:\n%s", text)
	}
	// svc-4's unchanged endpoint chains are not rewritten.
	if c := chainName(prefixSep, "ns", "svc-4", "tcp", "http", "10.244.0.5:8080"); strings.Contains(text, ":"+c) {
		t.Errorf("partial sync rewrote the unchanged %s:\n%s", c, text)
	}

	// The result equals a full sync of the new services from scratch.
	want, _ := load(t, changed)
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("partial sync result differs from a full sync (-full +partial):\n%s", diff)
	}
	requireOrder(t, fake, ipt.IPv4)

	// And packets follow the change.
	tr := newTracer(fake, ipt.IPv4, nodeIP)
	got, _ := reach(t, tr, tcp(remotePod, a("10.96.0.5"), 9100))
	if diff := cmp.Diff([]string{"10.246.0.1:9100"}, got); diff != "" {
		t.Errorf("new port of svc-4 (-want +got):\n%s", diff)
	}
	got, _ = reach(t, tr, tcp(remotePod, a("10.96.0.8"), 80)) // svc-7, deleted
	if diff := cmp.Diff([]string{"accept"}, got); diff != "" {
		t.Errorf("deleted svc-7 (-want +got):\n%s", diff)
	}

	// Going to no endpoints moves the ClusterIP from nat to the filter's reject.
	noEPs := slices.Clone(changed)
	s0 := *noEPs[0]
	s0.Ports = []proxy.ServicePort{{Name: "http", Protocol: proxy.TCP, Port: 80, NodePort: s0.Ports[0].NodePort}}
	noEPs[0] = &s0
	text = partial(t, fake, b, noEPs, "svc-0")
	tr = newTracer(fake, ipt.IPv4, nodeIP)
	got, _ = reach(t, tr, tcp(remotePod, a("10.96.0.1"), 80))
	if diff := cmp.Diff([]string{"reject"}, got); diff != "" {
		t.Errorf("svc-0 without endpoints (-want +got):\n%s", diff)
	}
	if got, _ = reach(t, tr, tcp(outside, nodeIP, 30000)); !slices.Equal(got, []string{"reject"}) {
		t.Errorf("svc-0's NodePort without endpoints: %v, want reject", got)
	}
	if !strings.Contains(text, "-D FLATNET-SERVICES -d 10.96.0.1/32") || !strings.Contains(text, "-I FLATNET-SERVICES 1 -d 10.96.0.1/32") {
		t.Errorf("the ClusterIP's rules were not moved one by one:\n%s", text)
	}
	want, _ = load(t, noEPs)
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("partial sync result differs from a full sync (-full +partial):\n%s", diff)
	}
	requireOrder(t, fake, ipt.IPv4)

	// Each sync was one restore holding both tables.
	for i, in := range fake.Restores {
		if strings.Count(in, "COMMIT") > 2 {
			t.Errorf("restore %d has more than two tables:\n%s", i, in)
		}
	}
	_ = ctx
}

// A partial sync that fails (someone deleted a rule it meant to delete)
// leaves the kernel as it was, and the next sync, full, repairs it.
func TestFailedPartialSyncThenFull(t *testing.T) {
	services := manyServices(4)
	fake, b := load(t, services)
	ctx := context.Background()
	foreign := ipt.NewBuilder("nat")
	foreign.Delete(ChainServices, "-d", "10.96.0.2/32", "-p", "tcp", "-m", "comment", "--comment", "ns/svc-1:http cluster IP", "-m", "tcp", "--dport", "80", "-j", chainName(prefixSvc, "ns", "svc-1", "tcp", "http"))
	if err := fake.Restore(ctx, ipt.IPv4, foreign.Bytes()); err != nil {
		t.Fatal(err)
	}
	gone := slices.Delete(slices.Clone(services), 1, 2)
	if _, err := b.Sync(ctx, gone, proxy.Changes{"ns/svc-1": nil}, false); err == nil {
		t.Fatal("partial sync deleting a missing rule succeeded")
	}
	if _, err := b.Sync(ctx, gone, nil, true); err != nil {
		t.Fatalf("full sync after the failure: %v", err)
	}
	want, _ := load(t, gone)
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// A full sync repairs drift by rewriting only the chains that differ from
// what it wants: a flushed service chain, a dispatch rule deleted.
func TestFullSyncRepairsOnlyDrift(t *testing.T) {
	services := manyServices(6)
	fake, b := load(t, services)
	ctx := context.Background()
	svc2 := chainName(prefixSvc, "ns", "svc-2", "tcp", "http")
	foreign := ipt.NewBuilder("nat")
	foreign.FlushChain(svc2)
	foreign.Delete(ChainNodePorts, "-p", "tcp", "-m", "comment", "--comment", "ns/svc-3:http", "-m", "tcp", "--dport", "30003", "-j", chainName(prefixExt, "ns", "svc-3", "tcp", "http"))
	if err := fake.Restore(ctx, ipt.IPv4, foreign.Bytes()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx, services, nil, true); err != nil {
		t.Fatal(err)
	}
	in := fake.Restores[len(fake.Restores)-1]
	var declared []string
	for _, l := range strings.Split(in, "\n") {
		if strings.HasPrefix(l, ":") {
			declared = append(declared, strings.Fields(l[1:])[0])
		}
	}
	if diff := cmp.Diff([]string{ChainNodePorts, svc2}, declared); diff != "" {
		t.Errorf("chains rewritten (-want +got):\n%s\n%s", diff, in)
	}
	want, _ := load(t, services)
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// A restarted proxy (no state) deletes the chains of services deleted
// while it was down, and leaves other writers' chains alone.
func TestFullSyncRemovesStaleChains(t *testing.T) {
	services := manyServices(6)
	fake, _ := load(t, services)
	ctx := context.Background()
	others := "*filter\n:FLATNET-NP - [0:0]\n:FLATNET-NP-E-X - [0:0]\n-A FLATNET-NP -j FLATNET-NP-E-X\n-I FORWARD 1 -j FLATNET-NP\nCOMMIT\n" +
		"*nat\n:FLATNET-HOSTPORT-DNAT - [0:0]\n:FLATNET-SVC-OLDVERSIONXXXXXXXX - [0:0]\n-A FLATNET-SVC-OLDVERSIONXXXXXXXX -j RETURN\n" +
		"-A PREROUTING -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT\n-A OUTPUT -j FLATNET-SVC-OLDVERSIONXXXXXXXX\nCOMMIT\n"
	if err := fake.Restore(ctx, ipt.IPv4, []byte(others)); err != nil {
		t.Fatal(err)
	}
	b := NewBackend(fake, testConfig())
	if _, err := b.Sync(ctx, services[:2], nil, true); err != nil {
		t.Fatal(err)
	}
	want, _ := load(t, services[:2])
	if err := want.Restore(ctx, ipt.IPv4, []byte("*filter\n:FLATNET-NP - [0:0]\n:FLATNET-NP-E-X - [0:0]\n-A FLATNET-NP -j FLATNET-NP-E-X\n-I FORWARD 1 -j FLATNET-NP\nCOMMIT\n"+
		"*nat\n:FLATNET-HOSTPORT-DNAT - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

// The jumps from the built-in chains are inserted first once, and never
// moved: a rule another writer put before them stays there.
func TestJumpsOnlyWhenMissing(t *testing.T) {
	fake, b := load(t, manyServices(2))
	ctx := context.Background()
	if err := fake.Restore(ctx, ipt.IPv4, []byte("*filter\n-I FORWARD 1 -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx, manyServices(2), nil, true); err != nil {
		t.Fatal(err)
	}
	filter, _ := fake.Save(ctx, ipt.IPv4, "filter")
	fwd := filter.RulesIn("FORWARD")
	if len(fwd) != 4 || fwd[0].Target() != "ACCEPT" {
		t.Errorf("FORWARD after a full sync: %v", fwd)
	}
	// A jump deleted by hand comes back at the next full sync, first.
	del := ipt.NewBuilder("nat")
	for _, j := range jumps() {
		if j.Table == tableNat && j.Chain == "OUTPUT" {
			del.Delete(j.Chain, j.Args...)
		}
	}
	if err := fake.Restore(ctx, ipt.IPv4, del.Bytes()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx, manyServices(2), nil, true); err != nil {
		t.Fatal(err)
	}
	nat, _ := fake.Save(ctx, ipt.IPv4, "nat")
	if out := nat.RulesIn("OUTPUT"); len(out) != 1 || out[0].Target() != ChainServices {
		t.Errorf("nat OUTPUT after a full sync: %v", out)
	}
}

func TestIPv6(t *testing.T) {
	s := nodePort(svc("v6", "fd00:96::10", 80, ep("fd00:244::5", 8080, "node-b")), 30080)
	s.AffinityTimeout = time.Minute
	v4 := svc("v4only", "10.96.0.10", 80, ep("10.244.2.5", 8080, "node-b"))
	empty := nodePort(svc("empty6", "fd00:96::11", 80), 30081)
	fake, _ := loadWith(t, Config{Family: ipt.IPv6, NodeName: node, ClusterCIDRs: []netip.Prefix{clusterCIDR, netip.MustParsePrefix("fd00:244::/48")}},
		[]*proxy.Service{s, v4, empty})
	nodeIP6 := a("fd00:30::10")
	tr := newTracer(fake, ipt.IPv6, nodeIP6)
	got, masq := reach(t, tr, tcp(a("fd00:31::5"), nodeIP6, 30080))
	if diff := cmp.Diff([]string{"[fd00:244::5]:8080"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if len(masq) != 1 {
		t.Errorf("NodePort traffic not masqueraded")
	}
	if got, _ := reach(t, tr, tcp(a("fd00:31::5"), nodeIP6, 30081)); !slices.Equal(got, []string{"reject"}) {
		t.Errorf("NodePort without endpoints: %v", got)
	}
	if got, _ := reach(t, tr, packet{src: a("::1"), dst: a("::1"), proto: "tcp", port: 30080, fromLocal: true}); !slices.Equal(got, []string{"accept"}) {
		t.Errorf("NodePort on ::1: %v", got)
	}
	dump := fake.Dump(ipt.IPv6, "nat") + fake.Dump(ipt.IPv6, "filter")
	if strings.Contains(dump, "10.96.0.10") || strings.Contains(dump, "10.244.0.0/16") {
		t.Errorf("IPv4 rendered into the ip6tables tables:\n%s", dump)
	}
	if v4dump := fake.Dump(ipt.IPv4, "nat"); strings.Contains(v4dump, "FLATNET") {
		t.Errorf("the IPv6 backend wrote iptables (IPv4):\n%s", v4dump)
	}
}

// With several pod networks the off-cluster masquerade goes through one
// chain that returns for each.
func TestSeveralClusterCIDRs(t *testing.T) {
	cfg := testConfig()
	cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("10.250.0.0/16"))
	fake, _ := loadWith(t, cfg, []*proxy.Service{svc("web", "10.96.0.10", 80, ep("10.244.2.5", 8080, "node-b"))})
	tr := newTracer(fake, ipt.IPv4, nodeIP)
	for _, tc := range []struct {
		src  netip.Addr
		masq bool
	}{{remotePod, false}, {a("10.250.1.1"), false}, {outside, true}} {
		_, masq := reach(t, tr, tcp(tc.src, a("10.96.0.10"), 80))
		if (len(masq) > 0) != tc.masq {
			t.Errorf("from %s: masqueraded %v, want %v", tc.src, masq, tc.masq)
		}
	}
}

func TestConflictingServicesDoNotBreakTheSync(t *testing.T) {
	first := svc("a-first", "10.96.0.40", 80, ep("10.244.2.5", 8080, "node-b"))
	second := svc("b-second", "10.96.0.41", 80, ep("10.244.3.5", 8080, "node-c"))
	first.ExternalIPs = []netip.Addr{a("172.29.0.50")}
	second.ExternalIPs = []netip.Addr{a("172.29.0.50")}
	nodePort(first, 30050)
	nodePort(second, 30050)
	ctx := context.Background()
	fake := ipt.NewFake()
	b := NewBackend(fake, testConfig())
	res, err := b.Sync(ctx, []*proxy.Service{second, first}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 2 || !strings.Contains(errors.Join(res.Conflicts...).Error(), "ns/b-second") {
		t.Fatalf("conflicts = %v, want two for ns/b-second", res.Conflicts)
	}
	check := func(when string) {
		t.Helper()
		tr := newTracer(fake, ipt.IPv4, nodeIP)
		if got, _ := reach(t, tr, tcp(outside, a("172.29.0.50"), 80)); !slices.Equal(got, []string{"10.244.2.5:8080"}) {
			t.Errorf("%s: externalIP went to %v, want its owner's 10.244.2.5:8080", when, got)
		}
		if got, _ := reach(t, tr, tcp(outside, nodeIP, 30050)); !slices.Equal(got, []string{"10.244.2.5:8080"}) {
			t.Errorf("%s: NodePort went to %v, want its owner's 10.244.2.5:8080", when, got)
		}
		// The loser still works on its ClusterIP.
		if got, _ := reach(t, tr, tcp(remotePod, a("10.96.0.41"), 80)); !slices.Equal(got[:1], []string{"10.244.3.5:8080"}) {
			t.Errorf("%s: second ClusterIP went to %v", when, got)
		}
	}
	check("full sync")
	// A partial sync of the loser keeps out of the owner's rules.
	second.Ports[0].Endpoints = append(second.Ports[0].Endpoints, ep("10.244.4.5", 8080, "node-d"))
	res, err = b.Sync(ctx, []*proxy.Service{first, second}, proxy.Changes{"ns/b-second": second}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Conflicts) != 2 {
		t.Errorf("conflicts after partial sync = %v, want 2", res.Conflicts)
	}
	check("partial sync")
}

// A LoadBalancer with loadBalancerSourceRanges added and changed by
// partial syncs: its firewall rules keep their order (the RETURNs of the
// allowed ranges before the DROP).
func TestPartialSyncFirewall(t *testing.T) {
	fake, b := load(t, manyServices(2))
	fw := svc("fw", "10.96.0.28", 80)
	fw.Type = proxy.LoadBalancer
	fw.LoadBalancerIPs = []netip.Addr{a("172.29.1.28")}
	fw.Firewall = true
	fw.SourceRanges = []netip.Prefix{netip.MustParsePrefix("172.31.0.0/16"), netip.MustParsePrefix("172.27.0.0/16")}
	check := func(when string, src netip.Addr, want string) {
		t.Helper()
		got, _ := reach(t, newTracer(fake, ipt.IPv4, nodeIP), tcp(src, a("172.29.1.28"), 80))
		if !slices.Equal(got, []string{want}) {
			t.Errorf("%s: from %s: %v, want %s", when, src, got, want)
		}
	}
	partial(t, fake, b, append(manyServices(2), fw), "fw")
	check("no endpoints", outside, "reject")
	check("no endpoints", a("172.27.0.1"), "reject")
	check("no endpoints", a("172.28.0.1"), "drop")
	fw.Ports[0].Endpoints = []proxy.Endpoint{ep("10.244.2.5", 8080, "node-b")}
	partial(t, fake, b, append(manyServices(2), fw), "fw")
	check("with an endpoint", a("172.27.0.1"), "10.244.2.5:8080")
	check("with an endpoint", a("172.28.0.1"), "drop")
	want, _ := load(t, append(manyServices(2), fw))
	if diff := cmp.Diff(sortedDump(want, ipt.IPv4), sortedDump(fake, ipt.IPv4)); diff != "" {
		t.Fatalf("(-full +partial):\n%s", diff)
	}
}

func TestHeadlessServiceIsLeftToDNS(t *testing.T) {
	s := svc("headless", "10.96.0.50", 80, ep("10.244.2.5", 8080, "node-b"))
	s.ClusterIP = netip.Addr{}
	fake, _ := load(t, []*proxy.Service{s})
	if dump := sortedDump(fake, ipt.IPv4); strings.Contains(dump, "10.244.2.5") || strings.Contains(dump, prefixSvc) {
		t.Errorf("headless service rendered:\n%s", dump)
	}
}

func TestNodePortAddresses(t *testing.T) {
	np := nodePort(svc("np", "10.96.0.23", 80, ep("10.244.2.5", 8080, "node-b")), 30023)
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
			cfg := testConfig()
			for _, s := range tc.addrs {
				cfg.NodePortAddresses = append(cfg.NodePortAddresses, netip.MustParsePrefix(s))
			}
			fake, _ := loadWith(t, cfg, []*proxy.Service{np})
			// The node has two addresses: nodeIP (172.30.0.10) and 172.30.9.10.
			got, _ := reach(t, newTracer(fake, ipt.IPv4, nodeIP, a("172.30.9.10")), tcp(outside, tc.dst, 30023))
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCleanup(t *testing.T) {
	ctx := context.Background()
	fake := ipt.NewFake()
	others := "*filter\n:FLATNET-NP - [0:0]\n-I FORWARD 1 -j FLATNET-NP\nCOMMIT\n" +
		"*nat\n:FLATNET-HOSTPORT-DNAT - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j FLATNET-HOSTPORT-DNAT\nCOMMIT\n"
	for _, fam := range []ipt.Protocol{ipt.IPv4, ipt.IPv6} {
		if err := fake.Restore(ctx, fam, []byte(others)); err != nil {
			t.Fatal(err)
		}
	}
	before := sortedDump(fake, ipt.IPv4) + "\n" + sortedDump(fake, ipt.IPv6)
	for _, fam := range []ipt.Protocol{ipt.IPv4, ipt.IPv6} {
		cfg := testConfig()
		cfg.Family = fam
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("10.250.0.0/16"), netip.MustParsePrefix("fd00::/48"), netip.MustParsePrefix("fd01::/48"))
		services := manyServices(5)
		s6 := nodePort(svc("v6", "fd00:96::10", 80, ep("fd00:244::5", 8080, "node-b")), 30080)
		if _, err := NewBackend(fake, cfg).Sync(ctx, append(services, s6), nil, true); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(fake.Dump(ipt.IPv6, "nat"), prefixSep) || !strings.Contains(fake.Dump(ipt.IPv4, "nat"), ChainNonPodMasq) {
		t.Fatalf("nothing to clean up:\n%s", sortedDump(fake, ipt.IPv6))
	}
	for i := 0; i < 2; i++ {
		n := len(fake.Restores)
		if err := Cleanup(ctx, fake); err != nil {
			t.Fatalf("cleanup %d: %v", i, err)
		}
		if diff := cmp.Diff(before, sortedDump(fake, ipt.IPv4)+"\n"+sortedDump(fake, ipt.IPv6)); diff != "" {
			t.Fatalf("cleanup %d left (-want +got):\n%s", i, diff)
		}
		if i == 1 && len(fake.Restores) != n {
			t.Errorf("a second cleanup restored %q", fake.Restores[n:])
		}
	}
}

func BenchmarkFullSync10k(b *testing.B) {
	services := manyServices(10000)
	r := New(testConfig())
	for i := 0; i < b.N; i++ {
		_, in := r.Full(services, nil)
		_ = in.Bytes()
	}
}

func BenchmarkPartialSyncOneOf10k(b *testing.B) {
	services := manyServices(10000)
	r := New(testConfig())
	st, _ := r.Full(services, nil)
	changed := map[string]bool{"ns/svc-42": true}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := *services[42]
		s.Ports = slices.Clone(s.Ports)
		s.Ports[0].Endpoints = slices.Clone(s.Ports[0].Endpoints[:i%2+1])
		next := slices.Clone(services)
		next[42] = &s
		var in *Input
		st, in = r.Partial(next, st, changed)
		_ = in.Bytes()
	}
}
