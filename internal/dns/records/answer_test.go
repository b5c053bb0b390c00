package records

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func meta(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

func svcPort(name string, proto corev1.Protocol, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port}
}

func clusterIPSvc(ns, name string, ips []string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: meta(ns, name), Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeClusterIP, ClusterIP: ips[0], ClusterIPs: ips, Ports: ports}}
}

func headlessSvc(ns, name string, publishNotReady bool) *corev1.Service {
	s := clusterIPSvc(ns, name, []string{corev1.ClusterIPNone})
	s.Spec.PublishNotReadyAddresses = publishNotReady
	return s
}

func externalSvc(ns, name, target string) *corev1.Service {
	return &corev1.Service{ObjectMeta: meta(ns, name), Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeExternalName, ExternalName: target}}
}

func ptr[T any](v T) *T { return &v }

func epPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}
}

// ep is an endpoint; ready and serving nil mean unknown.
func ep(ip, hostname string, ready, serving *bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving}}
	if hostname != "" {
		e.Hostname = ptr(hostname)
	}
	return e
}

func epSlice(ns, name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	m := meta(ns, name)
	m.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	return &discoveryv1.EndpointSlice{ObjectMeta: m, AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps}
}

func pod(ns, name string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: meta(ns, name)}
	p.Status.PodIP = ips[0]
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// world is the cluster every table case asks about.
func world() []runtime.Object {
	yes, no := ptr(true), ptr(false)
	pg := []discoveryv1.EndpointPort{epPort("pg", 5432), {Port: ptr(int32(9999))}}
	return []runtime.Object{
		clusterIPSvc("default", "kubernetes", []string{"10.96.0.1"}, svcPort("https", corev1.ProtocolTCP, 443)),
		clusterIPSvc("ns1", "web", []string{"10.96.0.10", "fd00:96::10"},
			svcPort("http", corev1.ProtocolTCP, 80), svcPort("", corev1.ProtocolTCP, 8080),
			svcPort("dns", corev1.ProtocolUDP, 53)),
		headlessSvc("ns1", "db", false),
		epSlice("ns1", "db-a", "db", pg,
			ep("10.1.0.5", "db-0", yes, yes), ep("10.1.0.6", "", nil, nil), ep("10.1.0.7", "db-2", no, yes)),
		epSlice("ns1", "db-b", "db", pg, ep("fd00:1::5", "db-0", yes, yes)),
		headlessSvc("ns1", "empty", false),
		epSlice("ns1", "empty-a", "empty", nil, ep("10.1.0.9", "", no, no)),
		headlessSvc("ns1", "pub", true),
		epSlice("ns1", "pub-a", "pub", nil, ep("10.1.0.20", "", no, yes), ep("10.1.0.21", "", no, no)),
		externalSvc("ns1", "ext", "www.Example.com"),
		externalSvc("ns1", "alias", "web.ns1.svc.cluster.local"),
		externalSvc("ns1", "podalias", "10-1-0-5.ns1.pod.cluster.local."),
		externalSvc("ns1", "apex", "Cluster.Local"),
		externalSvc("ns1", "loop1", "loop2.ns1.svc.cluster.local"),
		externalSvc("ns1", "loop2", "loop1.ns1.svc.cluster.local"),
		pod("ns1", "p1", "10.1.0.5", "fd00:1::5"),
	}
}

const soa = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"

type want struct {
	rcode   int    // NOERROR unless set
	answer  string // zone-file lines
	ns      string // the cluster SOA when the answer is negative, unless set
	extra   string
	target  string
	notOurs bool
}

func TestAnswer(t *testing.T) {
	reverse := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/64")}
	cases := []struct {
		q    string // "name TYPE"
		mode PodMode
		want want
	}{
		// 2.2 schema version.
		{q: "dns-version.cluster.local. TXT", want: want{answer: `dns-version.cluster.local. 5 IN TXT "1.0.1"`}},
		{q: "dns-version.cluster.local. A", want: want{}},
		// 2.3 ClusterIP Services: A/AAAA per family, case-insensitive.
		{q: "kubernetes.default.svc.cluster.local. A", want: want{answer: "kubernetes.default.svc.cluster.local. 5 IN A 10.96.0.1"}},
		{q: "kubernetes.default.svc.cluster.local. AAAA", want: want{}},
		{q: "web.ns1.svc.cluster.local. A", want: want{answer: "web.ns1.svc.cluster.local. 5 IN A 10.96.0.10"}},
		{q: "web.ns1.svc.cluster.local. AAAA", want: want{answer: "web.ns1.svc.cluster.local. 5 IN AAAA fd00:96::10"}},
		{q: "WEB.Ns1.svc.Cluster.Local. A", want: want{answer: "WEB.Ns1.svc.Cluster.Local. 5 IN A 10.96.0.10"}},
		{q: "web.ns1.svc.cluster.local. MX", want: want{}},
		{q: "web.ns1.svc.cluster.local. ANY", want: want{answer: `
			web.ns1.svc.cluster.local. 5 IN A 10.96.0.10
			web.ns1.svc.cluster.local. 5 IN AAAA fd00:96::10`}},
		// SRV for named ports only, target's addresses in Additional.
		{q: "_http._tcp.web.ns1.svc.cluster.local. SRV", want: want{
			answer: "_http._tcp.web.ns1.svc.cluster.local. 5 IN SRV 0 100 80 web.ns1.svc.cluster.local.",
			extra: `web.ns1.svc.cluster.local. 5 IN A 10.96.0.10
				web.ns1.svc.cluster.local. 5 IN AAAA fd00:96::10`}},
		{q: "_DNS._UDP.web.ns1.svc.cluster.local. SRV", want: want{
			answer: "_DNS._UDP.web.ns1.svc.cluster.local. 5 IN SRV 0 100 53 web.ns1.svc.cluster.local.",
			extra: `web.ns1.svc.cluster.local. 5 IN A 10.96.0.10
				web.ns1.svc.cluster.local. 5 IN AAAA fd00:96::10`}},
		{q: "_http._tcp.web.ns1.svc.cluster.local. A", want: want{}},
		{q: "_http._udp.web.ns1.svc.cluster.local. SRV", want: want{rcode: dns.RcodeNameError}},
		{q: "_tcp.web.ns1.svc.cluster.local. SRV", want: want{}}, // empty non-terminal
		{q: "_8080._tcp.web.ns1.svc.cluster.local. SRV", want: want{rcode: dns.RcodeNameError}},
		// PTR for every ClusterIP.
		{q: "10.0.96.10.in-addr.arpa. PTR", want: want{answer: "10.0.96.10.in-addr.arpa. 5 IN PTR web.ns1.svc.cluster.local."}},
		{q: "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa. PTR", want: want{
			answer: "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa. 5 IN PTR web.ns1.svc.cluster.local."}},
		{q: "10.0.96.10.in-addr.arpa. A", want: want{ns: strings.Replace(soa, "cluster.local.", "96.10.in-addr.arpa.", 1)}},
		// 2.4 headless: one record per ready endpoint; not-ready ones left out.
		{q: "db.ns1.svc.cluster.local. A", want: want{answer: `
			db.ns1.svc.cluster.local. 5 IN A 10.1.0.5
			db.ns1.svc.cluster.local. 5 IN A 10.1.0.6`}},
		{q: "db.ns1.svc.cluster.local. AAAA", want: want{answer: "db.ns1.svc.cluster.local. 5 IN AAAA fd00:1::5"}},
		{q: "db-0.db.ns1.svc.cluster.local. A", want: want{answer: "db-0.db.ns1.svc.cluster.local. 5 IN A 10.1.0.5"}},
		{q: "db-0.db.ns1.svc.cluster.local. AAAA", want: want{answer: "db-0.db.ns1.svc.cluster.local. 5 IN AAAA fd00:1::5"}},
		{q: "10-1-0-6.db.ns1.svc.cluster.local. A", want: want{answer: "10-1-0-6.db.ns1.svc.cluster.local. 5 IN A 10.1.0.6"}},
		{q: "db-2.db.ns1.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "10-1-0-7.db.ns1.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "_pg._tcp.db.ns1.svc.cluster.local. SRV", want: want{
			answer: `_pg._tcp.db.ns1.svc.cluster.local. 5 IN SRV 0 100 5432 db-0.db.ns1.svc.cluster.local.
				_pg._tcp.db.ns1.svc.cluster.local. 5 IN SRV 0 100 5432 10-1-0-6.db.ns1.svc.cluster.local.`,
			extra: `db-0.db.ns1.svc.cluster.local. 5 IN A 10.1.0.5
				db-0.db.ns1.svc.cluster.local. 5 IN AAAA fd00:1::5
				10-1-0-6.db.ns1.svc.cluster.local. 5 IN A 10.1.0.6`}},
		{q: "5.0.1.10.in-addr.arpa. PTR", want: want{answer: "5.0.1.10.in-addr.arpa. 5 IN PTR db-0.db.ns1.svc.cluster.local."}},
		{q: "6.0.1.10.in-addr.arpa. PTR", want: want{answer: "6.0.1.10.in-addr.arpa. 5 IN PTR 10-1-0-6.db.ns1.svc.cluster.local."}},
		{q: "7.0.1.10.in-addr.arpa. PTR", want: want{notOurs: true}}, // not ready, outside the reverse CIDRs
		// No ready endpoint: NXDOMAIN, as the spec says.
		{q: "empty.ns1.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		// publishNotReadyAddresses: every serving endpoint.
		{q: "pub.ns1.svc.cluster.local. A", want: want{answer: "pub.ns1.svc.cluster.local. 5 IN A 10.1.0.20"}},
		// 2.5 ExternalName: the CNAME; the server resolves the target.
		{q: "ext.ns1.svc.cluster.local. A", want: want{answer: "ext.ns1.svc.cluster.local. 5 IN CNAME www.example.com.", target: "www.example.com."}},
		{q: "ext.ns1.svc.cluster.local. CNAME", want: want{answer: "ext.ns1.svc.cluster.local. 5 IN CNAME www.example.com."}},
		{q: "alias.ns1.svc.cluster.local. A", want: want{answer: `
			alias.ns1.svc.cluster.local. 5 IN CNAME web.ns1.svc.cluster.local.
			web.ns1.svc.cluster.local. 5 IN A 10.96.0.10`}},
		{q: "podalias.ns1.svc.cluster.local. A", want: want{answer: `
			podalias.ns1.svc.cluster.local. 5 IN CNAME 10-1-0-5.ns1.pod.cluster.local.
			10-1-0-5.ns1.pod.cluster.local. 5 IN A 10.1.0.5`}},
		{q: "apex.ns1.svc.cluster.local. A", want: want{answer: "apex.ns1.svc.cluster.local. 5 IN CNAME cluster.local.", ns: soa}},
		{q: "loop1.ns1.svc.cluster.local. A", want: want{answer: `
			loop1.ns1.svc.cluster.local. 5 IN CNAME loop2.ns1.svc.cluster.local.
			loop2.ns1.svc.cluster.local. 5 IN CNAME loop1.ns1.svc.cluster.local.`}},
		// Names that exist without records, and names that do not exist.
		{q: "ns1.svc.cluster.local. A", want: want{}},
		{q: "nons.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "nope.ns1.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "a.b.c.ns1.svc.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "svc.cluster.local. A", want: want{}},
		{q: "cluster.local. A", want: want{}},
		{q: "cluster.local. SOA", want: want{answer: soa}},
		{q: "other.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		// Outside every zone served: forward.
		{q: "example.com. A", want: want{notOurs: true}},
		{q: "xcluster.local. A", want: want{notOurs: true}},
		{q: "4.3.2.1.in-addr.arpa. PTR", want: want{notOurs: true}},
		{q: "10.in-addr.arpa. PTR", want: want{notOurs: true}},
		// Inside the reverse CIDRs: authoritative.
		{q: "99.0.97.10.in-addr.arpa. PTR", want: want{rcode: dns.RcodeNameError,
			ns: strings.Replace(soa, "cluster.local.", "97.10.in-addr.arpa.", 1)}},
		{q: "0.96.10.in-addr.arpa. PTR", want: want{ns: strings.Replace(soa, "cluster.local.", "96.10.in-addr.arpa.", 1)}},
		{q: "9.0.96.10.in-addr.arpa. PTR", want: want{rcode: dns.RcodeNameError,
			ns: strings.Replace(soa, "cluster.local.", "96.10.in-addr.arpa.", 1)}},
		// Pod records, verified (the default): existing pods' IPs only.
		{q: "10-1-0-5.ns1.pod.cluster.local. A", want: want{answer: "10-1-0-5.ns1.pod.cluster.local. 5 IN A 10.1.0.5"}},
		{q: "fd00-1--5.ns1.pod.cluster.local. AAAA", want: want{answer: "fd00-1--5.ns1.pod.cluster.local. 5 IN AAAA fd00:1::5"}},
		{q: "10-1-0-5.ns1.pod.cluster.local. AAAA", want: want{}},
		{q: "10-1-0-99.ns1.pod.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "10-1-0-5.ns2.pod.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		{q: "ns1.pod.cluster.local. A", want: want{}},
		{q: "ns2.pod.cluster.local. A", want: want{rcode: dns.RcodeNameError}},
		// insecure: any well-formed name.
		{q: "10-1-0-99.ns2.pod.cluster.local. A", mode: PodsInsecure, want: want{answer: "10-1-0-99.ns2.pod.cluster.local. 5 IN A 10.1.0.99"}},
		{q: "fd00--1.ns2.pod.cluster.local. AAAA", mode: PodsInsecure, want: want{answer: "fd00--1.ns2.pod.cluster.local. 5 IN AAAA fd00::1"}},
		{q: "1-2-3.ns2.pod.cluster.local. A", mode: PodsInsecure, want: want{rcode: dns.RcodeNameError}},
		{q: "010-1-0-5.ns2.pod.cluster.local. A", mode: PodsInsecure, want: want{rcode: dns.RcodeNameError}},
		{q: "ns2.pod.cluster.local. A", mode: PodsInsecure, want: want{}},
		// disabled: none.
		{q: "10-1-0-5.ns1.pod.cluster.local. A", mode: PodsDisabled, want: want{rcode: dns.RcodeNameError}},
	}
	cs := fake.NewClientset(world()...)
	indexes := map[PodMode]*Index{}
	for _, mode := range []PodMode{PodsVerified, PodsInsecure, PodsDisabled} {
		ix, err := New(Config{Pods: mode, ReverseCIDRs: reverse})
		if err != nil {
			t.Fatal(err)
		}
		if err := ix.FromClientset(context.Background(), cs); err != nil {
			t.Fatal(err)
		}
		indexes[mode] = ix
	}
	for _, c := range cases {
		t.Run(c.mode.String()+" "+c.q, func(t *testing.T) {
			name, typ, _ := strings.Cut(c.q, " ")
			q := dns.Question{Name: name, Qtype: dns.StringToType[typ], Qclass: dns.ClassINET}
			checkAnswer(t, indexes[c.mode].Answer(q, netip.Addr{}), c.want)
		})
	}
}

func checkAnswer(t *testing.T, got Result, w want) {
	t.Helper()
	if w.notOurs {
		if !got.NotOurs {
			t.Fatalf("answered %+v, want NotOurs", got)
		}
		return
	}
	if got.NotOurs {
		t.Fatal("NotOurs, want an answer")
	}
	if !got.Authoritative {
		t.Error("not authoritative")
	}
	if got.Rcode != w.rcode {
		t.Errorf("rcode %s, want %s", dns.RcodeToString[got.Rcode], dns.RcodeToString[w.rcode])
	}
	if w.ns == "" && (w.answer == "" || w.rcode != dns.RcodeSuccess) {
		w.ns = soa
	}
	if got.Target != w.target {
		t.Errorf("target %q, want %q", got.Target, w.target)
	}
	for _, s := range []struct {
		section   string
		got       []dns.RR
		wantLines string
	}{{"answer", got.Answer, w.answer}, {"authority", got.Ns, w.ns}, {"additional", got.Extra, w.extra}} {
		g, want := rrText(s.got), zoneText(t, s.wantLines)
		if !slices.Equal(g, want) {
			t.Errorf("%s:\n%s\nwant:\n%s", s.section, strings.Join(g, "\n"), strings.Join(want, "\n"))
		}
	}
}

func rrText(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		out = append(out, rr.String())
	}
	return out
}

// zoneText parses zone-file lines with dns.NewRR and prints them back, so
// that both sides are spelled the same.
func zoneText(t *testing.T, text string) []string {
	t.Helper()
	out := []string{}
	for line := range strings.SplitSeq(text, "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		rr, err := dns.NewRR(line)
		if err != nil {
			t.Fatalf("bad zone line %q: %v", line, err)
		}
		out = append(out, rr.String())
	}
	return out
}
