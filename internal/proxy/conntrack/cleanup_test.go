package conntrack

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/proxy"
)

func a(s string) netip.Addr      { return netip.MustParseAddr(s) }
func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func ready(ip string) proxy.Endpoint {
	return proxy.Endpoint{IP: a(ip), Port: 5353, Ready: true, Serving: true}
}

// dns is a UDP service with a NodePort, an external IP and endpoints eps.
func dns(eps ...proxy.Endpoint) *proxy.Service {
	return &proxy.Service{
		Namespace: "ns", Name: "dns", Type: proxy.NodePort,
		ClusterIP: a("10.96.0.10"), ExternalIPs: []netip.Addr{a("203.0.113.7")},
		Ports: []proxy.ServicePort{
			{Name: "dns", Protocol: proxy.UDP, Port: 53, NodePort: 30053, Endpoints: eps},
			{Name: "dns-tcp", Protocol: proxy.TCP, Port: 53, NodePort: 30054, Endpoints: eps},
		},
	}
}

func strs(fs []Filter) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.String())
	}
	return out
}

func TestStale(t *testing.T) {
	terminating := proxy.Endpoint{IP: a("10.244.1.3"), Port: 5353, Serving: true, Terminating: true}
	notReady := proxy.Endpoint{IP: a("10.244.1.3"), Port: 5353}
	tests := []struct {
		name      string
		prev, cur *proxy.Service
		want      []string
	}{{
		name: "an endpoint replaced: entries DNATed to the old one, on every address and the NodePort",
		prev: dns(ready("10.244.1.2")),
		cur:  dns(ready("10.244.1.3")),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.2:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353",
			"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.2:5353",
		},
	}, {
		name: "an endpoint added to others: nothing is stale",
		prev: dns(ready("10.244.1.2")),
		cur:  dns(ready("10.244.1.2"), ready("10.244.1.3")),
	}, {
		name: "an endpoint's target port changes: the old address:port is gone",
		prev: dns(ready("10.244.1.2")),
		cur: dns(func() proxy.Endpoint {
			e := ready("10.244.1.2")
			e.Port = 5454
			return e
		}(), ready("10.244.1.3")),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.2:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353",
			"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.2:5353",
		},
	}, {
		name: "a ready endpoint starts terminating but still serves: kept, as kube-proxy",
		prev: dns(ready("10.244.1.2"), ready("10.244.1.3")),
		cur:  dns(ready("10.244.1.2"), terminating),
	}, {
		name: "a serving endpoint stops serving: stale",
		prev: dns(ready("10.244.1.2"), ready("10.244.1.3")),
		cur:  dns(ready("10.244.1.2"), notReady),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.3:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.3:5353",
			"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.3:5353",
		},
	}, {
		name: "the last endpoint goes: its entries go, the port is rejected from now on",
		prev: dns(ready("10.244.1.2")),
		cur:  dns(),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.2:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353",
			"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.2:5353",
		},
	}, {
		name: "the service is deleted",
		prev: dns(ready("10.244.1.2")),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.2:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353",
			"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.2:5353",
		},
	}, {
		name: "no endpoints to some: every entry of the addresses and the NodePort",
		prev: dns(),
		cur:  dns(ready("10.244.1.2")),
		want: []string{
			"udp orig-dst *:30053 reply-src *",
			"udp orig-dst 10.96.0.10:53 reply-src *",
			"udp orig-dst 203.0.113.7:53 reply-src *",
		},
	}, {
		name: "only not-ready endpoints to a ready one: it was rejected, so the same",
		prev: dns(notReady),
		cur:  dns(ready("10.244.1.2")),
		want: []string{
			"udp orig-dst *:30053 reply-src *",
			"udp orig-dst 10.96.0.10:53 reply-src *",
			"udp orig-dst 203.0.113.7:53 reply-src *",
		},
	}, {
		name: "a new service with endpoints: traffic sent before it existed was not DNATed",
		cur:  dns(ready("10.244.1.2")),
		want: []string{
			"udp orig-dst *:30053 reply-src *",
			"udp orig-dst 10.96.0.10:53 reply-src *",
			"udp orig-dst 203.0.113.7:53 reply-src *",
		},
	}, {
		name: "a new service without endpoints: nothing",
		cur:  dns(),
	}, {
		name: "SCTP is cleaned like UDP",
		prev: func() *proxy.Service {
			s := dns(ready("10.244.1.2"))
			s.Ports = s.Ports[:1]
			s.Ports[0].Protocol = proxy.SCTP
			s.Ports[0].NodePort = 0
			s.ExternalIPs = nil
			return s
		}(),
		want: []string{"sctp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353"},
	}, {
		name: "load-balancer IPs are service addresses too",
		prev: func() *proxy.Service {
			s := dns(ready("10.244.1.2"))
			s.Type = proxy.LoadBalancer
			s.ExternalIPs = nil
			s.LoadBalancerIPs = []netip.Addr{a("198.51.100.4")}
			return s
		}(),
		cur: func() *proxy.Service {
			s := dns(ready("10.244.1.3"))
			s.Type = proxy.LoadBalancer
			s.ExternalIPs = nil
			s.LoadBalancerIPs = []netip.Addr{a("198.51.100.4")}
			return s
		}(),
		want: []string{
			"udp orig-dst *:30053 reply-src 10.244.1.2:5353",
			"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.2:5353",
			"udp orig-dst 198.51.100.4:53 reply-src 10.244.1.2:5353",
		},
	}, {
		name: "unchanged",
		prev: dns(ready("10.244.1.2")),
		cur:  dns(ready("10.244.1.2")),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, strs(Stale(tt.prev, tt.cur))); diff != "" {
				t.Errorf("Stale (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReconcile(t *testing.T) {
	services := []*proxy.Service{dns(ready("10.244.1.2"), ready("10.244.1.3")), func() *proxy.Service {
		s := dns()
		s.Name, s.ClusterIP, s.ExternalIPs = "empty", a("10.96.0.11"), nil
		return s
	}()}
	entries := []Entry{
		{proxy.UDP, ap("10.96.0.10:53"), ap("10.244.1.2:5353")},     // live endpoint: kept
		{proxy.UDP, ap("10.96.0.10:53"), ap("10.244.1.9:5353")},     // gone endpoint
		{proxy.UDP, ap("10.96.0.10:53"), ap("10.96.0.10:53")},       // never DNATed
		{proxy.UDP, ap("203.0.113.7:53"), ap("10.244.1.8:5353")},    // gone, external IP
		{proxy.TCP, ap("10.96.0.10:53"), ap("10.244.1.9:5353")},     // TCP: left alone
		{proxy.UDP, ap("10.96.0.11:53"), ap("10.96.0.11:53")},       // no endpoints: left alone
		{proxy.UDP, ap("192.168.1.5:30053"), ap("10.244.1.9:5353")}, // NodePort: left alone
		{proxy.UDP, ap("10.96.0.10:54"), ap("10.96.0.10:54")},       // not a service port
	}
	want := []string{
		"udp orig-dst 10.96.0.10:53 reply-src 10.96.0.10:53",
		"udp orig-dst 10.96.0.10:53 reply-src 10.244.1.9:5353",
		"udp orig-dst 203.0.113.7:53 reply-src 10.244.1.8:5353",
	}
	if diff := cmp.Diff(want, strs(Reconcile(services, entries))); diff != "" {
		t.Errorf("Reconcile (-want +got):\n%s", diff)
	}
}

func TestFilterMatches(t *testing.T) {
	e := Entry{proxy.UDP, ap("10.96.0.10:53"), ap("10.244.1.2:5353")}
	tests := []struct {
		f    Filter
		want bool
	}{
		{Filter{Protocol: proxy.UDP, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: ap("10.244.1.2:5353")}, true},
		{Filter{Protocol: proxy.UDP, OrigDst: a("10.96.0.10"), OrigDstPort: 53}, true},
		{Filter{Protocol: proxy.UDP, OrigDstPort: 53}, true},
		{Filter{Protocol: proxy.SCTP, OrigDstPort: 53}, false},
		{Filter{Protocol: proxy.UDP, OrigDstPort: 54}, false},
		{Filter{Protocol: proxy.UDP, OrigDst: a("10.96.0.11"), OrigDstPort: 53}, false},
		{Filter{Protocol: proxy.UDP, OrigDstPort: 53, ReplySrc: ap("10.244.1.2:5354")}, false},
		{Filter{Protocol: proxy.UDP, OrigDstPort: 53, ReplySrc: ap("10.244.1.3:5353")}, false},
	}
	for _, tt := range tests {
		if got := tt.f.Matches(e); got != tt.want {
			t.Errorf("%s matches %s = %v, want %v", tt.f, e, got, tt.want)
		}
	}
}

// The netlink matcher converts kernel flows (IPv4-mapped or not) and
// applies the filters indexed by protocol and port.
func TestMatcher(t *testing.T) {
	m := newMatcher([]Filter{
		{Protocol: proxy.UDP, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: ap("10.244.1.2:5353")},
		{Protocol: proxy.UDP, OrigDstPort: 30053},
	})
	flow := func(proto uint8, dst string, dport uint16, src string, sport uint16) *netlink.ConntrackFlow {
		f := &netlink.ConntrackFlow{}
		f.Forward.Protocol = proto
		f.Forward.DstIP = netip.MustParseAddr(dst).AsSlice()
		f.Forward.DstPort = dport
		f.Reverse.SrcIP = netip.MustParseAddr(src).AsSlice()
		f.Reverse.SrcPort = sport
		return f
	}
	tests := []struct {
		flow *netlink.ConntrackFlow
		want bool
	}{
		{flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.244.1.2", 5353), true},
		{flow(unix.IPPROTO_UDP, "::ffff:10.96.0.10", 53, "::ffff:10.244.1.2", 5353), true},
		{flow(unix.IPPROTO_UDP, "10.96.0.10", 53, "10.244.1.3", 5353), false},
		{flow(unix.IPPROTO_TCP, "10.96.0.10", 53, "10.244.1.2", 5353), false},
		{flow(unix.IPPROTO_UDP, "192.168.1.5", 30053, "192.168.1.5", 30053), true},
		{flow(unix.IPPROTO_ICMP, "10.96.0.10", 0, "10.244.1.2", 0), false},
	}
	for _, tt := range tests {
		if got := m.MatchConntrackFlow(tt.flow); got != tt.want {
			t.Errorf("match %v = %v, want %v", tt.flow, got, tt.want)
		}
	}
}

func TestFakeDeletes(t *testing.T) {
	f := NewFake()
	live := Entry{proxy.UDP, ap("10.96.0.10:53"), ap("10.244.1.2:5353")}
	stale := Entry{proxy.UDP, ap("10.96.0.10:53"), ap("10.244.1.9:5353")}
	f.Add(false, live, stale)
	n, err := f.Delete(false, []Filter{{Protocol: proxy.UDP, OrigDst: a("10.96.0.10"), OrigDstPort: 53, ReplySrc: ap("10.244.1.9:5353")}})
	if err != nil || n != 1 {
		t.Fatalf("Delete = %d, %v; want 1 entry", n, err)
	}
	if got, _ := f.List(false); !cmp.Equal(got, []Entry{live}, cmp.Comparer(func(x, y Entry) bool { return x == y })) {
		t.Errorf("left %v, want only %v", got, live)
	}
	if got := f.Filters(); len(got) != 1 {
		t.Errorf("recorded filters %v", got)
	}
}
