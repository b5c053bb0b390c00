package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flatnet/flatnet/internal/dns/records"
)

func dnsOpts(mod func(*Options)) Options {
	o := Options{ClusterDomain: "cluster.local", ClusterCIDR: "10.244.0.0/16", DNSOptions: DNSOptions{
		DNS: true, DNSAddresses: DefaultDNSAddresses, DNSPort: 53, DNSResolvConf: "/etc/resolv.conf",
		DNSTTL: 5, DNSPods: "verified", DNSMetricsBindAddress: DefaultDNSMetricsBindAddress}}
	if mod != nil {
		mod(&o)
	}
	return o
}

func TestResolveDNS(t *testing.T) {
	conf := func(content string) func(string) ([]byte, error) {
		return func(string) ([]byte, error) { return []byte(content), nil }
	}
	missing := func(string) ([]byte, error) { return nil, fs.ErrNotExist }
	for _, c := range []struct {
		name    string
		mod     func(*Options)
		read    func(string) ([]byte, error)
		want    string // fmt of selected settings
		wantErr string
	}{
		{name: "defaults", read: conf("nameserver 10.0.0.2\nsearch corp.example lab.example\n"),
			want: "listen [169.254.20.10:53 10.96.0.10:53] up [10.0.0.2:53] search [corp.example lab.example] reverse [10.244.0.0/16] metrics 127.0.0.1:9153"},
		{name: "own addresses are not upstreams", read: conf("nameserver 10.96.0.10\nnameserver 10.0.0.3\n"),
			want: "listen [169.254.20.10:53 10.96.0.10:53] up [10.0.0.3:53] search [] reverse [10.244.0.0/16] metrics 127.0.0.1:9153"},
		{name: "bench: loopback only, explicit upstream, no metrics", read: missing, mod: func(o *Options) {
			o.DNSAddresses, o.DNSListen, o.DNSUpstreams, o.DNSMetricsBindAddress = "", "127.0.0.1:1053", "127.0.0.1:1054", "0"
			o.DNSReverseCIDRs = "10.96.0.0/16,10.244.0.0/16"
		}, want: "listen [127.0.0.1:1053] up [127.0.0.1:1054] search [] reverse [10.96.0.0/16 10.244.0.0/16] metrics "},
		{name: "no forwarding", read: missing, mod: func(o *Options) { o.DNSUpstreams = "none" },
			want: "listen [169.254.20.10:53 10.96.0.10:53] up [] search [] reverse [10.244.0.0/16] metrics 127.0.0.1:9153"},
		{name: "resolv.conf missing", read: missing, wantErr: "--dns-resolv-conf: file does not exist (give --dns-upstreams, or none)"},
		{name: "nowhere to listen", read: missing, mod: func(o *Options) { o.DNSAddresses, o.DNSUpstreams = "", "none" },
			wantErr: "nowhere to listen"},
		{name: "bad flags", read: missing, mod: func(o *Options) {
			o.DNSAddresses, o.DNSUpstreams, o.DNSPods, o.DNSTTL, o.DNSListen = "10.96.0.300", "nope", "maybe", 0, "1.2.3.4"
		}, wantErr: `--dns-pods: pod records mode "maybe": want disabled, insecure or verified
--dns-ttl 0: want 1 to 3600 seconds
--dns-addresses "10.96.0.300"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := resolveDNS(dnsOpts(c.mod), c.read)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("listen %v up %v search %v reverse %v metrics %s", s.Listen, s.Upstreams, s.Search, s.Records.ReverseCIDRs, s.MetricsAddr)
			if got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
			if s.Records.Pods != records.PodsVerified {
				t.Errorf("pods mode %v", s.Records.Pods)
			}
		})
	}
	if _, err := resolveDNS(dnsOpts(nil), func(string) ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Error("unreadable resolv.conf without --dns-upstreams: no error")
	}
}

// TestRunDNSServesServicesBeforePods: with a pod informer that never
// syncs (at a restart in a large cluster the pod list takes a minute, and
// the policy's informer starts after the proxy's first sync), the DNS
// server still answers Service names, and a verified pod name SERVFAILs
// rather than NXDOMAIN.
func TestRunDNSServesServicesBeforePods(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}}}
	cs := fake.NewClientset(svc)
	// Never run: its HasSynced stays false.
	pods := informers.NewSharedInformerFactory(cs, 0).Core().V1().Pods().Informer()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(pc.LocalAddr().String())
	pc.Close() // runDNS opens it again
	s := dnsSettings{Records: records.Config{Pods: records.PodsVerified}, Listen: []netip.AddrPort{addr}, pods: pods}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runDNS(ctx, cs, s) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runDNS: %v", err)
		}
	}()
	ask := func(name string) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr.String())
		return r, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := ask("web.ns1.svc.cluster.local.")
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer for the Service while the pods are not synced: %v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, err := ask("10-244-1-7.ns1.pod.cluster.local.")
	if err != nil || r.Rcode != dns.RcodeServerFailure {
		t.Errorf("a verified pod name before the pods synced: %v %v, want SERVFAIL", r, err)
	}
}
