package process

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

func TestHostsFile(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-0"}}
	got := string(hostsFile(pod, []string{"10.244.1.7"}, "cluster.local"))
	want := "# Kubernetes-managed hosts file.\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\n" +
		"fe00::0\tip6-mcastprefix\n" +
		"fe00::1\tip6-allnodes\n" +
		"fe00::2\tip6-allrouters\n" +
		"10.244.1.7\tweb-0\n"
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("hosts (-want +got):\n%s", d)
	}
	pod.Spec.Hostname, pod.Spec.Subdomain = "h", "sub"
	pod.Spec.HostAliases = []v1.HostAlias{{IP: "10.1.2.3", Hostnames: []string{"a", "b"}}}
	got = string(hostsFile(pod, []string{"10.244.1.7", "fd00::7"}, "cluster.local"))
	for _, line := range []string{
		"10.244.1.7\th.sub.ns.svc.cluster.local\th\n",
		"fd00::7\th.sub.ns.svc.cluster.local\th\n",
		"# Entries added by HostAliases.\n10.1.2.3\ta\tb\n",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("hosts lacks %q:\n%s", line, got)
		}
	}
}

func TestPodHostname(t *testing.T) {
	long := strings.Repeat("a", 62) + "-bc"
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: long}}
	if h, _ := podHostname(pod, "cluster.local"); h != strings.Repeat("a", 62) {
		t.Errorf("long name: %q (want truncated to 63 without the trailing dash)", h)
	}
	pod = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: v1.PodSpec{Hostname: "h", Subdomain: "s", SetHostnameAsFQDN: ptrTo(true)}}
	if h, fqdn := podHostname(pod, "cluster.local"); h != "h.s.ns.svc.cluster.local" || fqdn != h {
		t.Errorf("setHostnameAsFQDN: %q %q", h, fqdn)
	}
}

// TestParseResolvConf checks the kubelet's parseResolvConf rules.
func TestParseResolvConf(t *testing.T) {
	node := parseResolvConf([]byte("# comment\n  # indented comment\nnameserver 10.255.255.53\nnameserver fd00::53 ; trailing\nnameserver\n" +
		"search old.example\nsearch corp.example. lab.example\ndomain ignored.example\noptions rotate\noptions ndots:2 edns0\nbogus\n"))
	want := resolvConf{
		Nameservers: []string{"10.255.255.53", "fd00::53"},
		Searches:    []string{"corp.example", "lab.example"}, // the last line, without trailing dots
		Options:     []string{"ndots:2", "edns0"},            // the last line
	}
	if d := cmp.Diff(want, node); d != "" {
		t.Fatalf("parse (-want +got):\n%s", d)
	}
}

// TestPodDNS: each dnsPolicy and merge rule of the kubelet's GetPodDNS
// (pkg/kubelet/network/dns/dns.go), with the exact file containerd writes.
func TestPodDNS(t *testing.T) {
	node := parseResolvConf([]byte("nameserver 10.255.255.53\nnameserver fd00::53\nsearch corp.example lab.example\noptions ndots:2 edns0\n"))
	const nodeFile = "search corp.example lab.example\nnameserver 10.255.255.53\nnameserver fd00::53\noptions ndots:2 edns0\n"
	clusterDNS := []netip.Addr{netip.MustParseAddr("10.96.0.10")}
	withDNS := dnsSettings{ClusterDNS: clusterDNS, ClusterDomain: "cluster.local", Node: node}
	noDNS := dnsSettings{ClusterDomain: "cluster.local", Node: node}
	two := "2"
	long := strings.Repeat("a", 254)
	var many, wide []string
	for i := range 33 {
		many = append(many, fmt.Sprintf("s%d.example", i))
	}
	for i := range 9 {
		wide = append(wide, fmt.Sprintf("%d%s", i, strings.Repeat("w", 249))) // 250 chars each
	}
	missing := []dnsWarning{
		{OnNode: true, Reason: "MissingClusterDNS", Message: `kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`},
		{Reason: "MissingClusterDNS", Message: `pod: "web_app(uid-1)". kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`},
	}
	for _, tc := range []struct {
		name  string // and the kubelet function the case checks
		spec  v1.PodSpec
		s     dnsSettings
		want  string
		warns []dnsWarning
	}{{
		name: "ClusterFirst: cluster DNS only, cluster searches then the node's, ndots:5 only (GetPodDNS podDNSCluster, generateSearchesForDNSClusterFirst)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst},
		s:    withDNS,
		want: "search app.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n",
	}, {
		name: "ClusterFirst: dual-stack cluster DNS, other domain, node searches deduplicated (generateSearchesForDNSClusterFirst omitDuplicates)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst},
		s: dnsSettings{ClusterDNS: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::a")}, ClusterDomain: "k.test",
			Node: resolvConf{Nameservers: []string{"10.255.255.53"}, Searches: []string{"svc.k.test", "corp.example", "corp.example"}}},
		want: "search app.svc.k.test svc.k.test k.test corp.example\nnameserver 10.96.0.10\nnameserver fd00:96::a\noptions ndots:5\n",
	}, {
		name:  "ClusterFirst without cluster DNS: the node's, MissingClusterDNS on node and pod (GetPodDNS fallthrough)",
		spec:  v1.PodSpec{DNSPolicy: v1.DNSClusterFirst},
		s:     noDNS,
		want:  nodeFile,
		warns: missing,
	}, {
		name: "ClusterFirst with hostNetwork: Default (getPodDNSType)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst, HostNetwork: true},
		s:    withDNS,
		want: nodeFile,
	}, {
		name: "ClusterFirstWithHostNet with hostNetwork: cluster (getPodDNSType)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirstWithHostNet, HostNetwork: true},
		s:    withDNS,
		want: "search app.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n",
	}, {
		name:  "ClusterFirstWithHostNet without cluster DNS: the node's and MissingClusterDNS (GetPodDNS)",
		spec:  v1.PodSpec{DNSPolicy: v1.DNSClusterFirstWithHostNet, HostNetwork: true},
		s:     noDNS,
		want:  nodeFile,
		warns: missing,
	}, {
		name: "Default: the node's even with cluster DNS (GetPodDNS podDNSHost)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSDefault},
		s:    withDNS,
		want: nodeFile,
	}, {
		name: "None: dnsConfig alone (GetPodDNS podDNSNone, appendDNSConfig)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"x.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "rotate"}},
		}},
		s:    withDNS,
		want: "search x.example\nnameserver 1.1.1.1\noptions ndots:2 rotate\n",
	}, {
		name: "ClusterFirst + dnsConfig: appended without duplicates, option replaced by name (appendDNSConfig, mergeDNSOptions)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst, DNSConfig: &v1.PodDNSConfig{
			Nameservers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"cluster.local", "x.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "edns0"}},
		}},
		s:    withDNS,
		want: "search app.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example x.example\nnameserver 10.96.0.10\nnameserver 1.1.1.1\noptions ndots:2 edns0\n",
	}, {
		name: "Default + dnsConfig: node options merged by name, an option without value written bare (mergeDNSOptions)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSDefault, DNSConfig: &v1.PodDNSConfig{
			Options: []v1.PodDNSConfigOption{{Name: "ndots"}, {Name: "timeout", Value: &two}},
		}},
		s:    withDNS,
		want: "search corp.example lab.example\nnameserver 10.255.255.53\nnameserver fd00::53\noptions ndots edns0 timeout:2\n",
	}, {
		name: "more than 3 nameservers: the first 3 and a DNSConfigForming warning (formDNSNameserversFitsLimits)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSDefault, DNSConfig: &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8"}}},
		s:    withDNS,
		want: "search corp.example lab.example\nnameserver 10.255.255.53\nnameserver fd00::53\nnameserver 1.1.1.1\noptions ndots:2 edns0\n",
		warns: []dnsWarning{{Reason: "DNSConfigForming",
			Message: "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 10.255.255.53 fd00::53 1.1.1.1"}},
	}, {
		name: "more than 32 searches: the first 32 (formDNSSearchFitsLimits)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: many}},
		s:    withDNS,
		want: "search " + strings.Join(many[:32], " ") + "\nnameserver 1.1.1.1\n",
		warns: []dnsWarning{{Reason: "DNSConfigForming",
			Message: "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: " + strings.Join(many[:32], " ")}},
	}, {
		name: "a search longer than 253 characters is dropped (formDNSSearchFitsLimits)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{Searches: []string{"a.example", long, "b.example"}}},
		s:    withDNS,
		want: "search a.example b.example\n",
		warns: []dnsWarning{{Reason: "DNSConfigForming",
			Message: "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: a.example b.example"}},
	}, {
		name: "a search line over 2048 characters is cut from its end (formDNSSearchFitsLimits)",
		spec: v1.PodSpec{DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{Searches: wide}}, // 9*251-1 = 2258 chars
		s:    withDNS,
		want: "search " + strings.Join(wide[:8], " ") + "\n", // 2007 chars
		warns: []dnsWarning{{Reason: "DNSConfigForming",
			Message: "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: " + strings.Join(wide[:8], " ")}},
	}, {
		name:  "an invalid dnsPolicy is ClusterFirst, logged (GetPodDNS getPodDNSType error)",
		spec:  v1.PodSpec{DNSPolicy: "Bogus"},
		s:     withDNS,
		want:  "search app.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n",
		warns: []dnsWarning{{LogOnly: true, Reason: "InvalidDNSPolicy", Message: "invalid DNSPolicy=Bogus: falling back to ClusterFirst"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", UID: "uid-1"}, Spec: tc.spec}
			before := resolvConf{slices.Clone(tc.s.Node.Nameservers), slices.Clone(tc.s.Node.Searches), slices.Clone(tc.s.Node.Options)}
			r, warns := podDNS(pod, tc.s)
			if d := cmp.Diff(tc.want, string(r.file())); d != "" {
				t.Errorf("resolv.conf (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.warns, warns); d != "" {
				t.Errorf("warnings (-want +got):\n%s", d)
			}
			if d := cmp.Diff(before, tc.s.Node); d != "" {
				t.Errorf("the node's config was modified (-want +got):\n%s", d)
			}
		})
	}
}

// TestMissingClusterDNSEvents: without --cluster-dns a ClusterFirst pod
// gets the node's resolv.conf (0644) and MissingClusterDNS warning events
// on its Node and on itself, as the kubelet records them.
func TestMissingClusterDNSEvents(t *testing.T) {
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.255.255.53\nsearch example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	rec.IncludeObject = true
	c := &core{
		cfg:      Config{NodeName: "lab-node1", StateDir: t.TempDir(), ClusterDomain: "cluster.local"},
		d:        deps{resolvConf: resolv, hostsFile: filepath.Join(t.TempDir(), "none")},
		log:      klog.Background(),
		recorder: rec,
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", UID: "uid-1"}, Spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst}}
	w := newWorker(c, &podRecord{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}, pod)
	if err := w.writePodFiles(pod); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(w.resolvPath())
	if err != nil {
		t.Fatal(err)
	}
	if want := "search example\nnameserver 10.255.255.53\n"; string(got) != want {
		t.Errorf("resolv.conf %q, want %q", got, want)
	}
	if fi, err := os.Stat(w.resolvPath()); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("resolv.conf mode: %v %v", fi, err)
	}
	close(rec.Events)
	var events []string
	for e := range rec.Events {
		events = append(events, e)
	}
	msg := `kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy.`
	want := []string{
		"Warning MissingClusterDNS " + msg + " involvedObject{kind=Node,apiVersion=}",
		`Warning MissingClusterDNS pod: "web_app(uid-1)". ` + msg + " involvedObject{kind=,apiVersion=}",
	}
	if d := cmp.Diff(want, events); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
}

func FuzzParseResolvConf(f *testing.F) {
	f.Add([]byte("nameserver 1.2.3.4\nsearch a b\noptions ndots:5\n"))
	f.Add([]byte("domain x\n#\n;\nnameserver"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, _ := podDNS(&v1.Pod{Spec: v1.PodSpec{DNSPolicy: v1.DNSDefault}}, dnsSettings{Node: parseResolvConf(b)})
		again := parseResolvConf(r.file())
		if len(again.Nameservers) > maxDNSNameservers || len(again.Searches) > maxDNSSearchPaths {
			t.Fatalf("limits not applied: %q", r.file())
		}
	})
}

func TestNodeHostsFile(t *testing.T) {
	pod := &v1.Pod{Spec: v1.PodSpec{HostNetwork: true, HostAliases: []v1.HostAlias{{IP: "10.1.1.1", Hostnames: []string{"db"}}}}}
	got := string(nodeHostsFile(pod, []byte("127.0.0.1 localhost\n10.0.0.2 vm")))
	want := "127.0.0.1 localhost\n10.0.0.2 vm\n\n# Entries added by HostAliases.\n10.1.1.1\tdb\n"
	if got != want {
		t.Errorf("host-network hosts:\n%q\nwant\n%q", got, want)
	}
}
