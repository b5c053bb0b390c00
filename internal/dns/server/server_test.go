package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/dns/forward"
	"github.com/flatnet/flatnet/internal/dns/records"
)

func ptr[T any](v T) *T { return &v }

func service(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports}}
}

// headless is a headless Service with n ready endpoints 10.1.x.y.
func headless(ix *records.Index, ns, name string, n int) {
	ix.UpsertService(service(ns, name, corev1.ClusterIPNone))
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
	for i := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	ix.UpsertEndpointSlice(es)
}

func pod(ns, name, ip string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	return p
}

// upstream is a resolver on loopback answering example.com-style names.
func upstream(t *testing.T, queries *atomic.Int64) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case strings.EqualFold(q.Name, "example.com.") && q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR("example.com. 60 IN A 198.51.100.7")
			m.Answer = append(m.Answer, rr)
		case strings.EqualFold(q.Name, "example.com."):
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

type testServer struct {
	ix        *records.Index
	srv       *Server
	addr      string // UDP and TCP, same port
	log       *bytes.Buffer
	upQueries atomic.Int64
}

func start(t *testing.T, cfg Config) *testServer {
	t.Helper()
	ts := &testServer{log: &bytes.Buffer{}}
	if cfg.Index == nil {
		ix, err := records.New(records.Config{ReverseCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Index = ix
	}
	ts.ix = cfg.Index
	if cfg.Forwarder == nil {
		f, err := forward.New(forward.Config{Upstreams: []string{upstream(t, &ts.upQueries)}})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Forwarder = f
		if cfg.Metrics == nil {
			cfg.Metrics = NewMetrics(f)
		}
	}
	cfg.QueryLog = &syncWriter{w: ts.log}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts.srv = s
	var pc net.PacketConn
	var l net.Listener
	for range 20 { // the same free port for UDP and TCP
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if l, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if l == nil {
		t.Fatal("no free port for UDP and TCP")
	}
	ts.addr = pc.LocalAddr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, []net.PacketConn{pc}, []net.Listener{l}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return 10 s after its context ended")
		}
	})
	ts.ix.UpsertService(service("ns1", "web", "10.96.0.20", corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}))
	return ts
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

func (ts *testServer) ask(t *testing.T, network, name string, qtype uint16, edns int) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns > 0 {
		m.SetEdns0(uint16(edns), false)
	}
	c := &dns.Client{Net: network, Timeout: 5 * time.Second, UDPSize: 65535}
	r, _, err := c.Exchange(m, ts.addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	if r.Id != m.Id {
		t.Fatalf("reply ID %d, query ID %d", r.Id, m.Id)
	}
	return r
}

func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	return out
}

func TestClusterNameOverUDPAndTCP(t *testing.T) {
	ts := start(t, Config{})
	for _, network := range []string{"udp", "tcp"} {
		for i := range 3 { // the first is built, the others come from the reply cache
			r := ts.ask(t, network, "web.ns1.svc.cluster.local.", dns.TypeA, 0)
			want := []string{"web.ns1.svc.cluster.local. 5 IN A 10.96.0.20"}
			if got := answers(r); fmt.Sprint(got) != fmt.Sprint(want) || !r.Authoritative || !r.RecursionAvailable || r.Rcode != dns.RcodeSuccess {
				t.Fatalf("%s try %d: %v aa=%v ra=%v rcode=%s, want %v aa ra NOERROR", network, i, got, r.Authoritative, r.RecursionAvailable, dns.RcodeToString[r.Rcode], want)
			}
			if r.IsEdns0() != nil {
				t.Fatalf("%s try %d: OPT in the reply to a query without one", network, i)
			}
		}
	}
	// The asker's spelling of the name comes back (0x20 resolvers check it).
	r := ts.ask(t, "udp", "WeB.Ns1.svc.Cluster.Local.", dns.TypeA, 0)
	if r.Question[0].Name != "WeB.Ns1.svc.Cluster.Local." || len(r.Answer) != 1 || r.Answer[0].Header().Name != "WeB.Ns1.svc.Cluster.Local." {
		t.Fatalf("mixed case: question %q answer %v", r.Question[0].Name, answers(r))
	}
	if got := testutil.ToFloat64(ts.srv.m.cacheHits); got < 4 {
		t.Errorf("reply cache hits = %v, want >= 4 (2 repeats per protocol)", got)
	}
}

func TestNegativeAnswers(t *testing.T) {
	ts := start(t, Config{})
	r := ts.ask(t, "udp", "nope.ns1.svc.cluster.local.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA || !r.Authoritative {
		t.Fatalf("missing name: rcode %s ns %v aa %v, want NXDOMAIN with SOA, authoritative", dns.RcodeToString[r.Rcode], r.Ns, r.Authoritative)
	}
	r = ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeAAAA, 0)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 || len(r.Ns) != 1 {
		t.Fatalf("NODATA: rcode %s answer %v ns %v", dns.RcodeToString[r.Rcode], r.Answer, r.Ns)
	}
}

func TestChangesAnsweredAtOnce(t *testing.T) {
	ts := start(t, Config{})
	name := "late.ns1.svc.cluster.local."
	for range 2 { // cache the NXDOMAIN
		if r := ts.ask(t, "udp", name, dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
			t.Fatalf("before create: %s", dns.RcodeToString[r.Rcode])
		}
	}
	ts.ix.UpsertService(service("ns1", "late", "10.96.0.30"))
	if r := ts.ask(t, "udp", name, dns.TypeA, 0); len(r.Answer) != 1 {
		t.Fatalf("after create: rcode %s answer %v, want the A record", dns.RcodeToString[r.Rcode], answers(r))
	}
	ts.ix.DeleteService("ns1", "late")
	if r := ts.ask(t, "udp", name, dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Fatalf("after delete: rcode %s answer %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], answers(r))
	}
}

func TestTruncationAndEDNS0(t *testing.T) {
	ts := start(t, Config{})
	headless(ts.ix, "ns1", "big", 200) // 200 A records: ~3.3 kB compressed
	name := "big.ns1.svc.cluster.local."
	for i := range 2 { // built, then cached: both must truncate
		r := ts.ask(t, "udp", name, dns.TypeA, 0)
		if !r.Truncated || len(r.Answer) >= 200 {
			t.Fatalf("try %d: UDP without EDNS0: TC=%v with %d answers, want TC and fewer than 200", i, r.Truncated, len(r.Answer))
		}
		r.Compress = true // as sent
		if n := r.Len(); n > 512 {
			t.Fatalf("try %d: UDP reply of %d bytes, want <= 512", i, n)
		}
	}
	r := ts.ask(t, "udp", name, dns.TypeA, 1232)
	r.Compress = true
	if !r.Truncated || r.Len() > 1232 {
		t.Fatalf("EDNS0 1232: TC=%v len %d", r.Truncated, r.Len())
	}
	if o := r.IsEdns0(); o == nil || o.UDPSize() != AdvertisedUDPSize {
		t.Fatalf("EDNS0 query: reply OPT %v, want one advertising %d", o, AdvertisedUDPSize)
	}
	for i := range 2 {
		r = ts.ask(t, "udp", name, dns.TypeA, 8192)
		if r.Truncated || len(r.Answer) != 200 {
			t.Fatalf("try %d: EDNS0 8192: TC=%v with %d answers, want all 200", i, r.Truncated, len(r.Answer))
		}
	}
	for i := range 2 {
		r = ts.ask(t, "tcp", name, dns.TypeA, 0)
		if r.Truncated || len(r.Answer) != 200 {
			t.Fatalf("try %d: TCP: TC=%v with %d answers, want all 200", i, r.Truncated, len(r.Answer))
		}
	}
	// EDNS version 1 does not exist: BADVERS.
	m := new(dns.Msg)
	m.SetQuestion("web.ns1.svc.cluster.local.", dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().SetVersion(1)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeBadVers || r.IsEdns0() == nil {
		t.Fatalf("EDNS version 1: rcode %s, want BADVERS with OPT", dns.RcodeToString[r.Rcode])
	}
}

func TestForwardedAndExternalName(t *testing.T) {
	ts := start(t, Config{})
	r := ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	if got := answers(r); len(got) != 1 || !strings.Contains(got[0], "198.51.100.7") || r.Authoritative || !r.RecursionAvailable {
		t.Fatalf("forwarded: %v aa=%v ra=%v", got, r.Authoritative, r.RecursionAvailable)
	}
	r = ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	if n := ts.upQueries.Load(); n != 1 {
		t.Errorf("upstream saw %d queries for two lookups, want 1 (cached)", n)
	}
	if r = ts.ask(t, "udp", "nope.example.", dns.TypeA, 1232); r.Rcode != dns.RcodeNameError || r.IsEdns0() == nil {
		t.Fatalf("forwarded NXDOMAIN: %s, OPT %v", dns.RcodeToString[r.Rcode], r.IsEdns0())
	}
	// An ExternalName Service: the CNAME and its target's address.
	ts.ix.UpsertService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "ext"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}})
	r = ts.ask(t, "udp", "ext.ns1.svc.cluster.local.", dns.TypeA, 0)
	want := "[ext.ns1.svc.cluster.local. 5 IN CNAME example.com. example.com. 60 IN A 198.51.100.7]"
	if got := fmt.Sprint(answers(r)); got != want {
		t.Fatalf("ExternalName: %s, want %s", got, want)
	}
}

func TestNoForwarderMeansServfail(t *testing.T) {
	ix, _ := records.New(records.Config{})
	ts := start(t, Config{Index: ix, Forwarder: failing{}})
	if r := ts.ask(t, "udp", "example.com.", dns.TypeA, 0); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("upstream down: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	// Cluster names never go upstream: still answered.
	if r := ts.ask(t, "udp", "nope.cluster.local.", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Fatalf("cluster name with upstream down: %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
}

type failing struct{}

func (failing) Exchange(context.Context, *dns.Msg) (*dns.Msg, error) {
	return nil, fmt.Errorf("upstream unreachable")
}

func TestAutopath(t *testing.T) {
	ts := start(t, Config{Autopath: true, Search: []string{"corp.example"}})
	ts.ix.UpsertPod(pod("app", "client", "127.0.0.1")) // the asker
	// A Service in another namespace, asked as "web.ns1" from app.
	r := ts.ask(t, "udp", "web.ns1.app.svc.cluster.local.", dns.TypeA, 0)
	want := "[web.ns1.app.svc.cluster.local. 5 IN CNAME web.ns1.svc.cluster.local. web.ns1.svc.cluster.local. 5 IN A 10.96.0.20]"
	if got := fmt.Sprint(answers(r)); got != want || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("autopath to another namespace: %s %s, want %s", dns.RcodeToString[r.Rcode], got, want)
	}
	if got := fmt.Sprint(answers(ts.ask(t, "udp", "web.ns1.app.svc.cluster.local.", dns.TypeA, 0))); got != want {
		t.Fatalf("autopath from the reply cache: %s", got)
	}
	// An external name: through every cluster suffix to upstream.
	r = ts.ask(t, "udp", "example.com.app.svc.cluster.local.", dns.TypeA, 0)
	want = "[example.com.app.svc.cluster.local. 5 IN CNAME example.com. example.com. 60 IN A 198.51.100.7]"
	if got := fmt.Sprint(answers(r)); got != want {
		t.Fatalf("autopath to an external name: %s, want %s", got, want)
	}
	// A name nothing knows: NXDOMAIN for the name asked.
	r = ts.ask(t, "udp", "nope.invalid.app.svc.cluster.local.", dns.TypeA, 0)
	if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Fatalf("autopath miss: %s %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], answers(r))
	}
	// Another namespace's first suffix is not this client's search path.
	if r = ts.ask(t, "udp", "example.com.other.svc.cluster.local.", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Fatalf("not the client's namespace: %s %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], answers(r))
	}
	if got := testutil.ToFloat64(ts.srv.m.autopath); got != 3 {
		t.Errorf("autopath_success_total = %v, want 3 (one from the reply cache)", got)
	}
}

func TestAutopathOff(t *testing.T) {
	ts := start(t, Config{})
	ts.ix.UpsertPod(pod("app", "client", "127.0.0.1"))
	if r := ts.ask(t, "udp", "web.ns1.app.svc.cluster.local.", dns.TypeA, 0); r.Rcode != dns.RcodeNameError {
		t.Fatalf("autopath off: %s %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], answers(r))
	}
}

func TestMetricsAndQueryLog(t *testing.T) {
	ts := start(t, Config{})
	ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0)
	ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0)
	ts.ask(t, "tcp", "nope.ns1.svc.cluster.local.", dns.TypeSRV, 0)
	ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	for _, c := range []struct {
		what string
		got  float64
		want float64
	}{
		{"udp/IPv4/A requests", testutil.ToFloat64(ts.srv.m.requests[0][0][typeIndex(dns.TypeA)]), 3},
		{"tcp/IPv4/SRV requests", testutil.ToFloat64(ts.srv.m.requests[1][0][typeIndex(dns.TypeSRV)]), 1},
		{"NOERROR responses", testutil.ToFloat64(ts.srv.m.responses[dns.RcodeSuccess]), 3},
		{"NXDOMAIN responses", testutil.ToFloat64(ts.srv.m.responses[dns.RcodeNameError]), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// Scraped: the names dashboards use.
	want := "flatnet_dns_responses_total{rcode=\"NXDOMAIN\"} 1"
	if err := testutil.GatherAndCompare(ts.srv.m.Registry(), strings.NewReader(""), "nothing"); err != nil {
		t.Fatal(err)
	}
	if out, err := gathered(ts.srv.m); err != nil || !strings.Contains(out, want) {
		t.Errorf("scrape lacks %s (%v):\n%s", want, err, out)
	}
	if n, err := testutil.GatherAndCount(ts.srv.m.Registry(), "flatnet_dns_forward_requests_total", "flatnet_dns_cache_hits_total", "flatnet_dns_request_duration_seconds"); err != nil || n == 0 {
		t.Errorf("forward, cache and duration metrics: %d series, %v", n, err)
	}
	log := ts.log.String()
	for _, w := range []string{`"A IN web.ns1.svc.cluster.local. udp`, `"SRV IN nope.ns1.svc.cluster.local. tcp`, "NXDOMAIN qr,aa,rd,ra", `"A IN example.com. udp`, "[INFO] 127.0.0.1:"} {
		if !strings.Contains(log, w) {
			t.Errorf("query log lacks %q:\n%s", w, log)
		}
	}
	if n := strings.Count(log, "\n"); n != 4 {
		t.Errorf("query log has %d lines, want 4:\n%s", n, log)
	}
}

func TestBrokenQueries(t *testing.T) {
	ts := start(t, Config{})
	conn, err := net.Dial("udp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A header claiming a question that is not there: FORMERR with the ID.
	conn.Write([]byte{0xAB, 0xCD, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'e'})
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil || r.Id != 0xABCD || r.Rcode != dns.RcodeFormatError {
		t.Fatalf("broken query: %v id %x rcode %d, want FORMERR for ABCD", err, r.Id, r.Rcode)
	}
	// A NOTIFY (opcode 4): NOTIMP.
	m := new(dns.Msg)
	m.SetNotify("cluster.local.")
	if r, _, err = (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, ts.addr); err != nil || r.Rcode != dns.RcodeNotImplemented {
		t.Fatalf("NOTIFY: %v %v, want NOTIMP", err, r)
	}
	// A response is never answered: nothing comes back, and the server
	// still answers the next query.
	m = new(dns.Msg)
	m.SetQuestion("web.ns1.svc.cluster.local.", dns.TypeA)
	m.Response = true
	b, _ := m.Pack()
	conn.Write(b)
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := conn.Read(buf); err == nil {
		t.Fatalf("a response got an answer of %d bytes", n)
	}
	ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0)
}

// TestParseQueryAgreesWithUnpack: for queries miekg/dns packs, the fast
// path's reading is the full unpacker's.
func TestParseQueryAgreesWithUnpack(t *testing.T) {
	for _, tc := range []struct {
		name string
		edns int
		do   bool
	}{{"a.b.", 0, false}, {"web.ns1.svc.cluster.local.", 1232, false}, {"x.", 4096, true}, {".", 512, false}} {
		m := new(dns.Msg)
		m.SetQuestion(tc.name, dns.TypeAAAA)
		if tc.edns > 0 {
			m.SetEdns0(uint16(tc.edns), tc.do)
		}
		b, _ := m.Pack()
		q, ok := parseQuery(b)
		if !ok || q.edns != (tc.edns > 0) || q.do != tc.do || (tc.edns > 0 && int(q.udpSize) != tc.edns) || q.qEnd != 12+len(b[12:])-optLen(tc.edns) {
			t.Errorf("%+v: parsed %+v ok=%v", tc, q, ok)
		}
	}
	// What the fast path must refuse.
	m := new(dns.Msg)
	m.SetQuestion("a.b.", dns.TypeA)
	m.Response = true
	b, _ := m.Pack()
	if _, ok := parseQuery(b); ok {
		t.Error("a response parsed as a plain query")
	}
	m.Response = false
	m.Question = append(m.Question, m.Question[0])
	b, _ = m.Pack()
	if _, ok := parseQuery(b); ok {
		t.Error("two questions parsed as a plain query")
	}
}

func gathered(m *Metrics) (string, error) {
	mfs, err := m.Registry().Gather()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			var labels []string
			for _, l := range mm.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := mm.GetCounter().GetValue()
			fmt.Fprintf(&b, "%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), v)
		}
	}
	return b.String(), nil
}

func optLen(edns int) int {
	if edns > 0 {
		return 11
	}
	return 0
}

// FuzzQuery: no packet makes the server panic, hang or answer with
// something that does not unpack.
func FuzzQuery(f *testing.F) {
	ix, _ := records.New(records.Config{Pods: records.PodsInsecure})
	ix.UpsertService(service("ns1", "web", "10.96.0.20", corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}))
	headless(ix, "ns1", "big", 50)
	ix.UpsertPod(pod("app", "client", "127.0.0.1"))
	s, err := New(Config{Index: ix, Forwarder: failing{}, Autopath: true, Metrics: NewMetrics(nil)})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct {
		name  string
		qtype uint16
		edns  int
	}{{"web.ns1.svc.cluster.local.", dns.TypeA, 0}, {"big.ns1.svc.cluster.local.", dns.TypeA, 1232},
		{"_http._tcp.web.ns1.svc.cluster.local.", dns.TypeSRV, 0}, {"20.0.96.10.in-addr.arpa.", dns.TypePTR, 0},
		{"web.ns1.app.svc.cluster.local.", dns.TypeA, 0}, {"example.com.", dns.TypeA, 0}} {
		m := new(dns.Msg)
		m.SetQuestion(seed.name, seed.qtype)
		if seed.edns > 0 {
			m.SetEdns0(uint16(seed.edns), true)
		}
		b, _ := m.Pack()
		f.Add(b, false)
		f.Add(b, true)
	}
	client := netip.MustParseAddrPort("127.0.0.1:5353")
	f.Fuzz(func(t *testing.T, b []byte, tcp bool) {
		for range 2 { // the second may come from the cache
			reply, _ := s.fast(nil, nil, b, client, tcp, time.Now())
			if reply == nil {
				reply = s.slow(context.Background(), b, client, tcp, time.Now())
			}
			if reply == nil {
				continue
			}
			if !tcp && len(reply) > 512 {
				if q, ok := parseQuery(b); !ok || len(reply) > q.maxSize() {
					m := new(dns.Msg)
					if m.Unpack(b) != nil || m.IsEdns0() == nil || len(reply) > int(m.IsEdns0().UDPSize()) {
						t.Fatalf("UDP reply of %d bytes exceeds what the client takes", len(reply))
					}
				}
			}
			m := new(dns.Msg)
			if err := m.Unpack(reply); err != nil {
				t.Fatalf("reply does not unpack: %v", err)
			}
			if len(b) >= 2 && m.Id != uint16(b[0])<<8|uint16(b[1]) {
				t.Fatalf("reply ID %x, query ID %x%x", m.Id, b[0], b[1])
			}
		}
	})
}

// TestIPv6Socket: the batched read loop on an IPv6 socket (x/net's ipv6
// PacketConn) answers, from the cache too.
func TestIPv6Socket(t *testing.T) {
	pc, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback: %v", err)
	}
	ix, _ := records.New(records.Config{})
	ix.UpsertService(service("ns1", "web", "fd00:96::20"))
	s, err := New(Config{Index: ix})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, []net.PacketConn{pc}, nil); close(done) }()
	defer func() { cancel(); <-done }()
	for i := range 3 {
		m := new(dns.Msg)
		m.SetQuestion("web.ns1.svc.cluster.local.", dns.TypeAAAA)
		r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, pc.LocalAddr().String())
		if err != nil || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), "fd00:96::20") {
			t.Fatalf("try %d over IPv6: %v %v", i, err, r)
		}
	}
}

// blocking is an upstream that answers only when released.
type blocking struct{ release chan struct{} }

func (b blocking) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil, fmt.Errorf("released")
}

// TestSlowQueriesBounded: queries waiting on an upstream are bounded; past
// the bound they are dropped and counted, and cluster names from the
// reply cache are still answered meanwhile.
func TestSlowQueriesBounded(t *testing.T) {
	ix, _ := records.New(records.Config{})
	up := blocking{release: make(chan struct{})}
	ts := start(t, Config{Index: ix, Forwarder: up, Metrics: NewMetrics(nil)})
	defer close(up.release)
	ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0) // cached from now on
	conn, err := net.Dial("udp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range MaxSlowQueries + 100 {
		if i%100 == 0 {
			time.Sleep(5 * time.Millisecond) // let the reader keep up: the socket buffer holds a few hundred
		}
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.example.", i), dns.TypeA)
		b, _ := m.Pack()
		conn.Write(b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(ts.srv.m.drops) < 100 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := testutil.ToFloat64(ts.srv.m.drops); got < 100 {
		t.Fatalf("dropped_requests_total = %v after %d stuck queries, want >= 100", got, MaxSlowQueries+100)
	}
	if r := ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0); len(r.Answer) != 1 {
		t.Fatalf("cluster name while the slow path is full: %v", r)
	}
}

// TestForwardedReplyCachedOneSecond: a forwarded reply is served packed for
// ForwardedReplyTTL (so the TTL it shows is never more than a second
// stale), then asked again; a TTL 0 reply is never kept.
func TestForwardedReplyCachedOneSecond(t *testing.T) {
	var queries atomic.Int64
	f, err := forward.New(forward.Config{Upstreams: []string{upstream(t, &queries)}, CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, Config{Forwarder: f, Metrics: NewMetrics(f)})
	ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	if n := queries.Load(); n != 1 {
		t.Fatalf("two asks within a second reached upstream %d times, want 1", n)
	}
	time.Sleep(ForwardedReplyTTL + 100*time.Millisecond)
	ts.ask(t, "udp", "example.com.", dns.TypeA, 0)
	if n := queries.Load(); n != 2 {
		t.Fatalf("an ask after %s reached upstream %d times in all, want 2", ForwardedReplyTTL, n)
	}
	// NODATA from upstream carries no record, so no TTL: not kept.
	ts.ask(t, "udp", "example.com.", dns.TypeAAAA, 0)
	ts.ask(t, "udp", "example.com.", dns.TypeAAAA, 0)
	if n := queries.Load(); n != 4 {
		t.Fatalf("NODATA without SOA: upstream saw %d queries in all, want 4", n)
	}
}

// TestUDPReadBuffer: the server's UDP sockets get a receive buffer that
// holds a burst of thousands of queries (a full one drops them, and glibc
// retries only after 5 s).
func TestUDPReadBuffer(t *testing.T) {
	ts := start(t, Config{})
	ts.ask(t, "udp", "web.ns1.svc.cluster.local.", dns.TypeA, 0) // serving, so the buffer is set
	out, err := exec.Command("ss", "-uamnH", "src", ts.addr).CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v %s", err, out)
	}
	m := regexp.MustCompile(`rb(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no rb in ss output: %s", out)
	}
	rb, _ := strconv.Atoi(m[1])
	// As root SO_RCVBUFFORCE gives UDPReadBuffer (the kernel doubles it);
	// otherwise net.core.rmem_max caps it.
	want := UDPReadBuffer
	if os.Geteuid() != 0 {
		b, _ := os.ReadFile("/proc/sys/net/core/rmem_max")
		max, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		want = min(want, max)
	}
	if rb < want {
		t.Fatalf("UDP receive buffer %d bytes, want >= %d", rb, want)
	}
	t.Logf("UDP receive buffer: %d bytes", rb)
}

func TestHealthAndReady(t *testing.T) {
	m := NewMetrics(nil)
	var ready atomic.Bool
	srv := httptest.NewServer(m.mux(ready.Load))
	defer srv.Close()
	get := func(path string) int {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if h, r := get("/health"), get("/ready"); h != 200 || r != 503 {
		t.Fatalf("before sync: /health %d /ready %d, want 200 503", h, r)
	}
	ready.Store(true)
	if h, r, mt := get("/health"), get("/ready"), get("/metrics"); h != 200 || r != 200 || mt != 200 {
		t.Fatalf("serving: /health %d /ready %d /metrics %d, want 200s", h, r, mt)
	}
}
