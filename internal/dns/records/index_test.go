package records

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func ask(t *testing.T, ix *Index, q string, w want) {
	t.Helper()
	name, typ, _ := strings.Cut(q, " ")
	checkAnswer(t, ix.Answer(dns.Question{Name: name, Qtype: dns.StringToType[typ], Qclass: dns.ClassINET}, netip.Addr{}), w)
}

// sizes is every map of the index, to see that updates leave nothing behind.
func sizes(ix *Index) string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return fmt.Sprint(len(ix.services), len(ix.slices), len(ix.bySvc), len(ix.built), len(ix.names),
		len(ix.nsCount), len(ix.ptrs), len(ix.podIPs), len(ix.podAddrs))
}

func TestUpdates(t *testing.T) {
	ix, err := New(Config{ReverseCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	nx := want{rcode: dns.RcodeNameError}
	nxRev := want{rcode: dns.RcodeNameError, ns: strings.Replace(soa, "cluster.local.", "10.in-addr.arpa.", 1)}
	yes := ptr(true)

	// Upserting the same objects twice changes nothing.
	svc := headlessSvc("ns", "h", false)
	sl := epSlice("ns", "h-1", "h", []discoveryv1.EndpointPort{epPort("p", 80)}, ep("10.1.0.5", "a", yes, yes))
	for range 2 {
		ix.UpsertService(svc)
		ix.UpsertEndpointSlice(sl)
	}
	once := sizes(ix)
	ix.UpsertEndpointSlice(sl)
	ix.UpsertService(svc)
	if got := sizes(ix); got != once {
		t.Fatalf("upsert again: map sizes %s, were %s", got, once)
	}
	ask(t, ix, "h.ns.svc.cluster.local. A", want{answer: "h.ns.svc.cluster.local. 5 IN A 10.1.0.5"})
	ask(t, ix, "5.0.1.10.in-addr.arpa. PTR", want{answer: "5.0.1.10.in-addr.arpa. 5 IN PTR a.h.ns.svc.cluster.local."})

	// The endpoint moves: its old name, address and PTR go.
	sl2 := sl.DeepCopy()
	sl2.Endpoints = []discoveryv1.Endpoint{ep("10.1.0.6", "b", yes, yes)}
	ix.UpsertEndpointSlice(sl2)
	ask(t, ix, "h.ns.svc.cluster.local. A", want{answer: "h.ns.svc.cluster.local. 5 IN A 10.1.0.6"})
	ask(t, ix, "a.h.ns.svc.cluster.local. A", nx)
	ask(t, ix, "b.h.ns.svc.cluster.local. A", want{answer: "b.h.ns.svc.cluster.local. 5 IN A 10.1.0.6"})
	ask(t, ix, "5.0.1.10.in-addr.arpa. PTR", nxRev)
	ask(t, ix, "_p._tcp.h.ns.svc.cluster.local. SRV", want{
		answer: "_p._tcp.h.ns.svc.cluster.local. 5 IN SRV 0 100 80 b.h.ns.svc.cluster.local.",
		extra:  "b.h.ns.svc.cluster.local. 5 IN A 10.1.0.6"})

	// The slice is relabelled to another Service: the records move with it.
	ix.UpsertService(headlessSvc("ns", "g", false))
	sl3 := sl2.DeepCopy()
	sl3.Labels[discoveryv1.LabelServiceName] = "g"
	ix.UpsertEndpointSlice(sl3)
	ask(t, ix, "h.ns.svc.cluster.local. A", nx)
	ask(t, ix, "g.ns.svc.cluster.local. A", want{answer: "g.ns.svc.cluster.local. 5 IN A 10.1.0.6"})
	ask(t, ix, "6.0.1.10.in-addr.arpa. PTR", want{answer: "6.0.1.10.in-addr.arpa. 5 IN PTR b.g.ns.svc.cluster.local."})

	// The endpoint stops being ready: the name goes (NXDOMAIN, no ready endpoint).
	sl4 := sl3.DeepCopy()
	sl4.Endpoints[0].Conditions.Ready = ptr(false)
	ix.UpsertEndpointSlice(sl4)
	ask(t, ix, "g.ns.svc.cluster.local. A", nx)
	ix.UpsertEndpointSlice(sl3)

	// A ClusterIP Service changes its address, then becomes headless.
	web := clusterIPSvc("ns", "web", []string{"10.96.0.10"}, svcPort("http", corev1.ProtocolTCP, 80))
	ix.UpsertService(web)
	web2 := web.DeepCopy()
	web2.Spec.ClusterIP, web2.Spec.ClusterIPs = "10.96.0.11", []string{"10.96.0.11"}
	ix.UpsertService(web2)
	ask(t, ix, "10.0.96.10.in-addr.arpa. PTR", nxRev)
	ask(t, ix, "11.0.96.10.in-addr.arpa. PTR", want{answer: "11.0.96.10.in-addr.arpa. 5 IN PTR web.ns.svc.cluster.local."})
	ix.UpsertService(headlessSvc("ns", "web", false))
	ask(t, ix, "web.ns.svc.cluster.local. A", nx)
	ask(t, ix, "11.0.96.10.in-addr.arpa. PTR", nxRev)

	// Pods come, change address and go.
	ix.UpsertPod(pod("ns", "p", "10.1.0.7"))
	ask(t, ix, "10-1-0-7.ns.pod.cluster.local. A", want{answer: "10-1-0-7.ns.pod.cluster.local. 5 IN A 10.1.0.7"})
	ix.UpsertPod(pod("ns", "p", "10.1.0.8"))
	ask(t, ix, "10-1-0-7.ns.pod.cluster.local. A", nx)
	ask(t, ix, "10-1-0-8.ns.pod.cluster.local. A", want{answer: "10-1-0-8.ns.pod.cluster.local. 5 IN A 10.1.0.8"})

	// Deleting everything, in any order, leaves nothing behind.
	ix.DeleteService("ns", "g")
	ask(t, ix, "g.ns.svc.cluster.local. A", nx)
	ix.DeleteEndpointSlice("ns", "h-1")
	ix.DeleteEndpointSlice("ns", "h-1") // again: a no-op
	ix.DeleteService("ns", "h")
	ix.DeleteService("ns", "web")
	ix.DeletePod("ns", "p")
	ask(t, ix, "ns.svc.cluster.local. A", nx)
	ask(t, ix, "ns.pod.cluster.local. A", nx)
	if got := sizes(ix); got != "0 0 0 0 0 0 0 0 0" {
		t.Fatalf("after deleting everything, map sizes %s", got)
	}
}

func TestConfig(t *testing.T) {
	ix, err := New(Config{Zone: "Example.Org.", TTL: 30})
	if err != nil {
		t.Fatal(err)
	}
	ix.UpsertService(clusterIPSvc("ns", "s", []string{"10.96.0.5"}))
	ask(t, ix, "s.ns.svc.example.org. A", want{answer: "s.ns.svc.example.org. 30 IN A 10.96.0.5"})
	ask(t, ix, "s.ns.svc.cluster.local. A", want{notOurs: true})
	if _, err := New(Config{Zone: "bad..zone"}); err == nil {
		t.Error("New accepted zone bad..zone")
	}
	if _, err := ParsePodMode("secure"); err == nil || !strings.Contains(err.Error(), "verified") {
		t.Errorf("ParsePodMode(secure) = %v, want an error naming the modes", err)
	}
}

// TestConcurrentReads runs readers against a writer; meaningful under -race.
func TestConcurrentReads(t *testing.T) {
	ix, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ix.FromClientset(context.Background(), fake.NewClientset(world()...)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, q := range []string{"db.ns1.svc.cluster.local.", "_pg._tcp.db.ns1.svc.cluster.local.", "5.0.1.10.in-addr.arpa."} {
					r := ix.Answer(dns.Question{Name: q, Qtype: dns.TypeANY, Qclass: dns.ClassINET}, netip.Addr{})
					for _, rr := range r.Answer {
						_ = rr.String()
					}
				}
			}
		})
	}
	yes := ptr(true)
	for i := range 200 {
		ix.UpsertEndpointSlice(epSlice("ns1", "db-a", "db", []discoveryv1.EndpointPort{epPort("pg", 5432)},
			ep(fmt.Sprintf("10.1.0.%d", 5+i%3), "", yes, yes)))
		ix.UpsertPod(pod("ns1", "p1", fmt.Sprintf("10.1.1.%d", i%250)))
	}
	close(stop)
	wg.Wait()
}

// FuzzAnswer: no name, type or class makes Answer panic, and every answer
// is well formed and packs.
func FuzzAnswer(f *testing.F) {
	for _, s := range []string{"db.ns1.svc.cluster.local.", "_pg._tcp.db.ns1.svc.cluster.local.", "10-1-0-5.ns1.pod.cluster.local.",
		"fd00--1.ns1.pod.cluster.local.", "5.0.1.10.in-addr.arpa.", "0.1.ip6.arpa.", "ext.ns1.svc.cluster.local.",
		"cluster.local.", ".", "", "a..b.cluster.local.", `\046.svc.cluster.local.`, "WEB.NS1.SVC.CLUSTER.LOCAL"} {
		f.Add(s, uint16(dns.TypeA), uint16(dns.ClassINET))
	}
	f.Add("_http._tcp.web.ns1.svc.cluster.local.", uint16(dns.TypeSRV), uint16(dns.ClassINET))
	f.Add("cluster.local.", uint16(dns.TypeANY), uint16(dns.ClassCHAOS))
	ixs := map[PodMode]*Index{}
	for _, mode := range []PodMode{PodsVerified, PodsInsecure} {
		ix, err := New(Config{Pods: mode, ReverseCIDRs: []netip.Prefix{
			netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00::/8")}})
		if err != nil {
			f.Fatal(err)
		}
		if err := ix.FromClientset(context.Background(), fake.NewClientset(world()...)); err != nil {
			f.Fatal(err)
		}
		ixs[mode] = ix
	}
	f.Fuzz(func(t *testing.T, name string, qtype, qclass uint16) {
		for _, ix := range ixs {
			q := dns.Question{Name: name, Qtype: qtype, Qclass: qclass}
			r := ix.Answer(q, netip.Addr{})
			if r.NotOurs || r.Rcode == dns.RcodeRefused {
				continue
			}
			if !r.Authoritative {
				t.Fatalf("%v: not authoritative", q)
			}
			if (r.Rcode == dns.RcodeNameError || len(r.Answer) == 0) && len(r.Ns) != 1 {
				t.Fatalf("%v: negative answer without one SOA: %v", q, r.Ns)
			}
			if _, ok := dns.IsDomainName(name); !ok {
				continue // the server never sees such a question off the wire
			}
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), qtype)
			r.Fill(m)
			if _, err := m.Pack(); err != nil {
				t.Fatalf("%v: answer does not pack: %v\n%v", q, err, m)
			}
		}
	})
}

// BenchmarkAnswer is the hot path at 10,000 ClusterIP Services.
func BenchmarkAnswer(b *testing.B) {
	ix, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		ix.UpsertService(clusterIPSvc(fmt.Sprintf("ns%d", i%100), fmt.Sprintf("svc%d", i),
			[]string{fmt.Sprintf("10.96.%d.%d", i/256, i%256)}, svcPort("http", corev1.ProtocolTCP, 80)))
	}
	for _, q := range []dns.Question{
		{Name: "svc4242.ns42.svc.cluster.local.", Qtype: dns.TypeA, Qclass: dns.ClassINET},
		{Name: "svc4242.ns42.svc.cluster.local.", Qtype: dns.TypeAAAA, Qclass: dns.ClassINET},
		{Name: "nope.ns42.svc.cluster.local.", Qtype: dns.TypeA, Qclass: dns.ClassINET},
		{Name: "example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET},
	} {
		b.Run(q.Name+dns.TypeToString[q.Qtype], func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ix.Answer(q, netip.Addr{})
				}
			})
		})
	}
}

// TestGeneration: the server's reply cache is only as right as this: every
// change to an answer moves the generation, and churn that changes no
// answer does not (or the cache would never hit in a busy cluster).
func TestGeneration(t *testing.T) {
	ix, _ := New(Config{})
	steps := []struct {
		what  string
		do    func()
		moves bool
	}{
		{"service created", func() { ix.UpsertService(clusterIPSvc("ns1", "web", []string{"10.96.0.10"})) }, true},
		{"same service again", func() { ix.UpsertService(clusterIPSvc("ns1", "web", []string{"10.96.0.10"})) }, false},
		{"slice of a ClusterIP service", func() {
			ix.UpsertEndpointSlice(epSlice("ns1", "web-1", "web", nil, ep("10.244.1.5", "", ptr(true), nil)))
		}, false},
		{"headless service, no endpoints yet (NXDOMAIN before and after)", func() { ix.UpsertService(headlessSvc("ns1", "db", false)) }, false},
		{"its slice", func() {
			ix.UpsertEndpointSlice(epSlice("ns1", "db-1", "db", nil, ep("10.244.1.6", "", ptr(true), nil)))
		}, true},
		{"its slice unchanged", func() {
			ix.UpsertEndpointSlice(epSlice("ns1", "db-1", "db", nil, ep("10.244.1.6", "", ptr(true), nil)))
		}, false},
		{"pod", func() { ix.UpsertPod(pod("ns1", "p", "10.244.1.7")) }, true},
		{"pod status churn", func() { ix.UpsertPod(pod("ns1", "p", "10.244.1.7")) }, false},
		{"pod deleted", func() { ix.DeletePod("ns1", "p") }, true},
		{"pod deleted twice", func() { ix.DeletePod("ns1", "p") }, false},
		{"service deleted", func() { ix.DeleteService("ns1", "web") }, true},
	}
	for _, s := range steps {
		before := ix.Generation()
		s.do()
		if moved := ix.Generation() != before; moved != s.moves {
			t.Errorf("%s: generation moved = %v, want %v", s.what, moved, s.moves)
		}
	}
}

func TestNamespaceOf(t *testing.T) {
	ix, _ := New(Config{})
	ix.UpsertPod(pod("app", "a", "10.244.1.5", "fd00::5"))
	ix.UpsertPod(pod("kube-system", "h1", "10.0.0.1")) // host network: the node's IP
	ix.UpsertPod(pod("monitoring", "h2", "10.0.0.1"))
	for _, c := range []struct {
		ip     string
		ns     string
		wantOK bool
	}{{"10.244.1.5", "app", true}, {"fd00::5", "app", true}, {"::ffff:10.244.1.5", "app", true}, {"10.0.0.1", "", false}, {"10.9.9.9", "", false}} {
		ns, ok := ix.NamespaceOf(netip.MustParseAddr(c.ip))
		if ns != c.ns || ok != c.wantOK {
			t.Errorf("NamespaceOf(%s) = %q %v, want %q %v", c.ip, ns, ok, c.ns, c.wantOK)
		}
	}
	ix.DeletePod("app", "a")
	if _, ok := ix.NamespaceOf(netip.MustParseAddr("10.244.1.5")); ok {
		t.Error("a deleted pod's IP still has a namespace")
	}
}

// TestWatch: the reflectors feed the index, and deletions reach it.
func TestWatch(t *testing.T) {
	cs := fake.NewClientset(world()...)
	ix, _ := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	syncedAsListed(t, ctx, ix, cs, "watching", ix.Watch(ctx, cs, true))
	if _, ok := ix.NamespaceOf(netip.MustParseAddr("10.1.0.5")); !ok {
		t.Error("pods were not watched")
	}
	if err := cs.CoreV1().Services("ns1").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := ix.Answer(dns.Question{Name: "web.ns1.svc.cluster.local.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, netip.Addr{})
		if r.Rcode == dns.RcodeNameError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deleted Service still answered: %v", r.Answer)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkIndexMemory reports the live heap the index holds per ClusterIP
// Service (one named port), at 10,000 Services: what the agent's DNS costs
// in memory beyond its fixed part.
func BenchmarkIndexMemory(b *testing.B) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for range b.N {
		h0 := heap()
		ix, _ := New(Config{})
		for n := range 100 {
			for s := range 100 {
				ix.UpsertService(clusterIPSvc(fmt.Sprintf("ns%d", n), fmt.Sprintf("svc%d", s),
					[]string{fmt.Sprintf("10.96.%d.%d", n, s+1)}, svcPort("http", corev1.ProtocolTCP, 80)))
			}
		}
		b.ReportMetric(float64(heap()-h0)/10000, "heap-bytes/service")
		runtime.KeepAlive(ix)
	}
}

// TestWatchPodsFromInformer: fed from someone else's pod informer (the
// agent's policy's) next to its own watches of Services and slices, the
// index equals one fed by listing everything, and follows a pod's new
// address and its deletion.
func TestWatchPodsFromInformer(t *testing.T) {
	cs := fake.NewClientset(world()...)
	ix, _ := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := informers.NewSharedInformerFactory(cs, 0).Core().V1().Pods().Informer()
	podsSynced, err := ix.WatchPods(inf)
	if err != nil {
		t.Fatal(err)
	}
	go inf.RunWithContext(ctx)
	syncedAsListed(t, ctx, ix, cs, "the pod informer", append(ix.Watch(ctx, cs, false), podsSynced))
	old := netip.MustParseAddr("10.1.0.5")
	ns, ok := ix.NamespaceOf(old)
	if !ok {
		t.Fatal("pods were not fed")
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var p *corev1.Pod
	for i := range pods.Items {
		if pods.Items[i].Status.PodIP == old.String() {
			p = &pods.Items[i]
		}
	}
	if p == nil {
		t.Fatalf("no pod with %s in %s", old, ns)
	}
	moved := netip.MustParseAddr("10.1.9.9")
	p.Status.PodIP, p.Status.PodIPs = moved.String(), []corev1.PodIP{{IP: moved.String()}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new address", func() bool {
		_, gone := ix.NamespaceOf(old)
		_, there := ix.NamespaceOf(moved)
		return !gone && there
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion", func() bool { _, there := ix.NamespaceOf(moved); return !there })
}

// syncedAsListed waits for synced, then checks that ix holds what an
// index fed by listing everything of cs holds.
func syncedAsListed(t *testing.T, ctx context.Context, ix *Index, cs *fake.Clientset, fedBy string, synced []cache.InformerSynced) {
	t.Helper()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("informers did not sync")
	}
	ref, _ := New(Config{})
	if err := ref.FromClientset(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if got, want := sizes(ix), sizes(ref); got != want {
		t.Fatalf("fed by %s: %s, by a list: %s", fedBy, got, want)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAwaitPods: while the pod list is still coming, a verified pod name
// is SERVFAIL (not an NXDOMAIN the asker would cache) and Service names
// are answered; once it is in, pod names are answered by what exists,
// and each step moves the generation (the server's packed replies go).
// Insecure pod names never wait for the list.
func TestAwaitPods(t *testing.T) {
	ix, _ := New(Config{Pods: PodsVerified})
	ix.UpsertService(clusterIPSvc("ns1", "web", []string{"10.96.0.10"}))
	g0 := ix.Generation()
	ix.AwaitPods()
	if ix.Generation() == g0 {
		t.Error("AwaitPods left the generation")
	}
	podQ := func(name string) Result {
		return ix.Answer(dns.Question{Name: name, Qtype: dns.TypeA, Qclass: dns.ClassINET}, netip.Addr{})
	}
	for _, name := range []string{"10-244-1-7.ns1.pod.cluster.local.", "ns1.pod.cluster.local."} {
		if r := podQ(name); r.Rcode != dns.RcodeServerFailure || r.Authoritative || len(r.Ns) > 0 {
			t.Errorf("%s while pods are listed: rcode %s, authoritative %v, %d SOA; want a bare SERVFAIL", name, dns.RcodeToString[r.Rcode], r.Authoritative, len(r.Ns))
		}
	}
	ask(t, ix, "web.ns1.svc.cluster.local. A", want{answer: "web.ns1.svc.cluster.local. 5 IN A 10.96.0.10"})
	ix.UpsertPod(pod("ns1", "p", "10.244.1.7"))
	g1 := ix.Generation()
	ix.PodsSynced()
	if ix.Generation() == g1 {
		t.Error("PodsSynced left the generation")
	}
	ask(t, ix, "10-244-1-7.ns1.pod.cluster.local. A", want{answer: "10-244-1-7.ns1.pod.cluster.local. 5 IN A 10.244.1.7"})
	ask(t, ix, "10-244-1-8.ns1.pod.cluster.local. A", want{rcode: dns.RcodeNameError})
	g2 := ix.Generation()
	ix.PodsSynced()
	if ix.Generation() != g2 {
		t.Error("a second PodsSynced moved the generation")
	}

	insecure, _ := New(Config{Pods: PodsInsecure})
	insecure.AwaitPods()
	ask(t, insecure, "10-244-1-8.ns1.pod.cluster.local. A", want{answer: "10-244-1-8.ns1.pod.cluster.local. 5 IN A 10.244.1.8"})
}
