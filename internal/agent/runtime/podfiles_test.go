package runtime

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func TestResolvConf(t *testing.T) {
	node := parseResolvConf([]byte("# comment\nnameserver 10.255.255.53\nnameserver fd00::53 ; trailing\nsearch corp.example lab.example\noptions ndots:2 edns0\nbogus\n"))
	want := resolvConf{
		Nameservers: []string{"10.255.255.53", "fd00::53"},
		Searches:    []string{"corp.example", "lab.example"},
		Options:     []string{"ndots:2", "edns0"},
	}
	if d := cmp.Diff(want, node); d != "" {
		t.Fatalf("parse (-want +got):\n%s", d)
	}
	// ClusterFirst without a cluster DNS falls back to the node's config.
	pod := &v1.Pod{Spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst}}
	got := string(podResolvConf(pod, node))
	if got != "nameserver 10.255.255.53\nnameserver fd00::53\nsearch corp.example lab.example\noptions ndots:2 edns0\n" {
		t.Errorf("ClusterFirst:\n%s", got)
	}
	five := "5"
	pod = &v1.Pod{Spec: v1.PodSpec{DNSPolicy: v1.DNSNone, DNSConfig: &v1.PodDNSConfig{
		Nameservers: []string{"1.1.1.1"},
		Searches:    []string{"x.example"},
		Options:     []v1.PodDNSConfigOption{{Name: "ndots", Value: &five}, {Name: "rotate"}},
	}}}
	if got := string(podResolvConf(pod, node)); got != "nameserver 1.1.1.1\nsearch x.example\noptions ndots:5 rotate\n" {
		t.Errorf("None:\n%s", got)
	}
	pod.Spec.DNSPolicy = v1.DNSDefault
	if got := string(podResolvConf(pod, node)); got != "nameserver 10.255.255.53\nnameserver fd00::53\nnameserver 1.1.1.1\nsearch corp.example lab.example x.example\noptions edns0 ndots:5 rotate\n" {
		t.Errorf("Default + dnsConfig:\n%s", got)
	}
}

func FuzzParseResolvConf(f *testing.F) {
	f.Add([]byte("nameserver 1.2.3.4\nsearch a b\noptions ndots:5\n"))
	f.Add([]byte("domain x\n#\n;\nnameserver"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := parseResolvConf(b)
		out := podResolvConf(&v1.Pod{}, r)
		// Reparsing what we wrote gives the same servers (up to 3).
		again := parseResolvConf(out)
		if len(again.Nameservers) > 3 {
			t.Fatalf("more than 3 nameservers written: %q", out)
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
