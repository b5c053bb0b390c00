package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/proxy/nftables"
)

// A kubeadm-style file (kubeadm writes the fields with their null or
// zero values, and a DaemonSet passes --hostname-override=$(NODE_NAME)).
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
metricsBindAddress: ""
mode: nftables
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// input is a resolveProxyOnly input with the agent's flag defaults, the
// flags named in changed given, and a fixed environment.
func input(file string, changed ...string) proxyOnlyInput {
	in := proxyOnlyInput{
		Options: Options{
			ClusterCIDR:        "10.244.0.0/16", // the agent's default, unused unless given
			ProxyMinSyncPeriod: time.Second,
			ProxySyncPeriod:    30 * time.Second,
			MetricsBindAddress: DefaultMetricsBindAddress, // --proxy's defaults, unused unless given
			HealthzBindAddress: DefaultHealthzBindAddress,
			ProxyOnlyOptions:   ProxyOnlyOptions{ProxyOnly: true, ProxyConfigFile: "kp.yaml"},
		},
		Changed:  func(f string) bool { return slices.Contains(changed, f) },
		Getenv:   func(k string) string { return map[string]string{"NODE_NAME": "env-node"}[k] },
		Hostname: func() (string, error) { return "Host-Name", nil },
	}
	if file != "" {
		in.File = []byte(file)
	}
	return in
}

func TestResolveProxyOnly(t *testing.T) {
	defaults := proxyOnlySettings{
		Mode:               ProxyModeAuto,
		NodeName:           "env-node",
		MinSyncPeriod:      time.Second,
		SyncPeriod:         30 * time.Second,
		FullSyncPeriod:     time.Hour,
		MasqueradeMark:     0x4000,
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
	}
	with := func(f func(*proxyOnlySettings)) proxyOnlySettings {
		s := defaults
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		in   proxyOnlyInput
		want proxyOnlySettings
	}{{
		name: "no file: kube-proxy's defaults, $NODE_NAME, no cluster CIDR (the agent's default is not used)",
		in:   input(""),
		want: defaults,
	}, {
		name: "hostname when there is no $NODE_NAME, lowercased as kube-proxy does",
		in: func() proxyOnlyInput {
			in := input("")
			in.Getenv = func(string) string { return "" }
			return in
		}(),
		want: with(func(s *proxyOnlySettings) { s.NodeName = "host-name" }),
	}, {
		name: "kubeadm's file",
		in:   input(kubeadmConfig),
		want: with(func(s *proxyOnlySettings) {
			s.Mode = ProxyModeNFTables
			s.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
			s.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
			s.Ignored = []string{"bindAddress"}
		}),
	}, {
		name: "every supported field",
		in: input(header + `
clientConnection: {kubeconfig: /kc, qps: 20, burst: 40, contentType: application/vnd.kubernetes.protobuf, acceptContentTypes: application/json}
hostnameOverride: " Node-7 "
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
detectLocalMode: ClusterCIDR
mode: nftables
nftables: {syncPeriod: 1m, minSyncPeriod: 2s, masqueradeBit: 5}
healthzBindAddress: 10.0.0.1:10256
metricsBindAddress: "[::]:10249"
bindAddressHardFail: true
nodePortAddresses: [all]
`),
		want: proxyOnlySettings{
			Kubeconfig: "/kc", QPS: 20, Burst: 40,
			ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/json",
			Mode:               ProxyModeNFTables,
			NodeName:           "node-7",
			ClusterCIDRs:       []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
			SyncPeriod:         time.Minute,
			MinSyncPeriod:      2 * time.Second,
			FullSyncPeriod:     time.Hour,
			MasqueradeMark:     1 << 5,
			HealthzBindAddress: "10.0.0.1:10256",
			MetricsBindAddress: "[::]:10249",
			BindAddressHard:    true,
		},
	}, {
		name: "nodePortAddresses: CIDRs and primary",
		in:   input(header + "nodePortAddresses: [\" 10.250.0.7/24\", primary, fd00::/64]\n"),
		want: with(func(s *proxyOnlySettings) {
			s.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("fd00::/64")}
			s.NodePortPrimary = true
		}),
	}, {
		name: "mode unset: the iptables section stands in field by field",
		in:   input(header + "iptables: {syncPeriod: 10s, minSyncPeriod: 3s, masqueradeBit: 15}\nnftables: {syncPeriod: 20s}\n"),
		want: with(func(s *proxyOnlySettings) {
			s.SyncPeriod, s.MinSyncPeriod, s.MasqueradeMark = 20*time.Second, 3*time.Second, 1<<15
		}),
	}, {
		name: "mode nftables: the iptables section is not read",
		in:   input(header + "mode: nftables\niptables: {syncPeriod: 10s, minSyncPeriod: 3s, masqueradeBit: 15}\n"),
		want: with(func(s *proxyOnlySettings) { s.Mode = ProxyModeNFTables }),
	}, {
		name: "mode iptables: the iptables section is read",
		in:   input(header + "mode: iptables\niptables: {syncPeriod: 10s, minSyncPeriod: 3s, masqueradeBit: 15}\n"),
		want: with(func(s *proxyOnlySettings) {
			s.Mode, s.SyncPeriod, s.MinSyncPeriod, s.MasqueradeMark = ProxyModeIPTables, 10*time.Second, 3*time.Second, 1<<15
		}),
	}, {
		name: "mode userspace (flatnet's own)",
		in:   input(header + "mode: userspace\n"),
		want: with(func(s *proxyOnlySettings) { s.Mode = ProxyModeUserspace }),
	}, {
		name: "--proxy-mode wins over the file",
		in: func() proxyOnlyInput {
			in := input(header+"mode: nftables\n", "proxy-mode")
			in.ProxyMode = ProxyModeIPTables
			return in
		}(),
		want: with(func(s *proxyOnlySettings) { s.Mode = ProxyModeIPTables }),
	}, {
		name: "flags given win over the file",
		in: func() proxyOnlyInput {
			in := input(header+"clientConnection: {kubeconfig: /file}\nhostnameOverride: file-node\nclusterCIDR: 10.1.0.0/16\nnftables: {syncPeriod: 1m, minSyncPeriod: 5s}\n",
				"kubeconfig", "cluster-cidr", "proxy-sync-period", "proxy-min-sync-period", "proxy-full-sync-period")
			in.Kubeconfig, in.ClusterCIDR, in.HostnameOverride = "/flag", "10.2.0.0/16", "Flag-Node"
			in.ProxySyncPeriod, in.ProxyMinSyncPeriod, in.ProxyFullSyncPeriod = 2*time.Minute, 0, 10*time.Minute
			return in
		}(),
		want: with(func(s *proxyOnlySettings) {
			s.Kubeconfig, s.NodeName = "/flag", "flag-node"
			s.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}
			s.SyncPeriod, s.MinSyncPeriod, s.FullSyncPeriod = 2*time.Minute, 0, 10*time.Minute
		}),
	}, {
		name: "server flags given win over the file; empty turns a server off",
		in: func() proxyOnlyInput {
			in := input(header+"healthzBindAddress: 10.0.0.1:10256\nmetricsBindAddress: 10.0.0.1:10249\n", "healthz-bind-address", "metrics-bind-address")
			in.HealthzBindAddress, in.MetricsBindAddress = "", "0.0.0.0:9999"
			return in
		}(),
		want: with(func(s *proxyOnlySettings) { s.HealthzBindAddress, s.MetricsBindAddress = "", "0.0.0.0:9999" }),
	}, {
		name: "file's hostnameOverride over --node-name's default ($NODE_NAME)",
		in:   input(header + "hostnameOverride: from-file\n"),
		want: with(func(s *proxyOnlySettings) { s.NodeName = "from-file" }),
	}, {
		name: "--node-name given counts as --hostname-override",
		in: func() proxyOnlyInput {
			in := input(header+"hostnameOverride: from-file\n", "node-name")
			in.NodeName = "from-flag"
			return in
		}(),
		want: with(func(s *proxyOnlySettings) { s.NodeName = "from-flag" }),
	}, {
		name: "fields flatnet does not use are listed; enableProfiling is used",
		in: input(header + `
featureGates: {Foo: true}
logging: {verbosity: 4}
enableProfiling: true
oomScoreAdj: -999
conntrack: {maxPerCore: 32768, tcpEstablishedTimeout: 24h}
configSyncPeriod: 15m
ipvs: {scheduler: rr}
`),
		want: with(func(s *proxyOnlySettings) {
			s.Ignored = []string{"featureGates", "logging (use -v and --vmodule)", "oomScoreAdj",
				"conntrack (flatnet leaves the node's conntrack sysctls as they are)", "configSyncPeriod"}
			s.Profiling = true // served on the metrics port, as kube-proxy does
		}),
	}, {
		name: "unknown and repeated fields: decoded leniently, with a warning",
		in:   input(header + "someFutureField: 1\nmode: nftables\nhostnameOverride: a\nhostnameOverride: b\n"),
		want: with(func(s *proxyOnlySettings) {
			s.Mode, s.NodeName = ProxyModeNFTables, "b"
			s.Warnings = []string{"decoded leniently (kube-proxy does the same): <strict>"}
		}),
	}, {
		name: "localhost NodePorts of an iptables-mode file: a warning",
		in:   input(header + "iptables: {localhostNodePorts: true}\n"),
		want: with(func(s *proxyOnlySettings) {
			s.Warnings = []string{"iptables.localhostNodePorts: NodePorts are not served on 127.0.0.1 (nor by kube-proxy's nftables mode)"}
		}),
	}, {
		name: "JSON works too",
		in:   input(`{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "hostnameOverride": "j"}`),
		want: with(func(s *proxyOnlySettings) { s.NodeName = "j" }),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveProxyOnly(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			// The strict decoder's wording is not ours to pin.
			for i, w := range got.Warnings {
				if strings.HasPrefix(w, "decoded leniently") {
					got.Warnings[i] = "decoded leniently (kube-proxy does the same): <strict>"
				}
			}
			if diff := cmp.Diff(tc.want, *got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveProxyOnlyErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   proxyOnlyInput
		want []string // substrings of the error, all required
	}{
		{"ipvs mode", input(header + "mode: ipvs\n"), []string{"mode", `"ipvs" is not supported`, "no IPVS mode", "kube-proxy --cleanup"}},
		{"unknown mode", input(header + "mode: kernelspace\n"), []string{"mode", `"kernelspace"`, "set mode: nftables, iptables or userspace"}},
		{"unknown --proxy-mode", func() proxyOnlyInput {
			in := input("", "proxy-mode")
			in.ProxyMode = "ipvs"
			return in
		}(), []string{"--proxy-mode", `"ipvs" is not a proxy mode`, "want auto, nftables, iptables, userspace"}},
		{"wrong kind", input("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n"), []string{"--config kp.yaml", `kind "KubeletConfiguration"`, "want apiVersion: kubeproxy.config.k8s.io/v1alpha1 and kind: KubeProxyConfiguration"}},
		{"no apiVersion", input("kind: KubeProxyConfiguration\n"), []string{`apiVersion ""`}},
		{"not YAML", input("\t: ["), []string{"--config kp.yaml", "not a YAML or JSON object"}},
		{"bad duration", input(header + "nftables: {syncPeriod: soon}\n"), []string{"--config kp.yaml", "nftables.syncPeriod", `"soon"`, "want a duration such as 30s"}},
		{"bad type", input(header + "clusterCIDR: [10.0.0.0/8]\n"), []string{"--config kp.yaml", "clusterCIDR"}},
		{"bad cluster CIDR", input(header + "clusterCIDR: 10.244.0.1/16\n"), []string{"clusterCIDR", "did you mean 10.244.0.0/16"}},
		{"bad --cluster-cidr", func() proxyOnlyInput {
			in := input("", "cluster-cidr")
			in.ClusterCIDR = "pods"
			return in
		}(), []string{`--cluster-cidr "pods"`, "want comma-separated CIDRs"}},
		{"detectLocalMode", input(header + "detectLocalMode: BridgeInterface\n"), []string{"detectLocalMode", `"BridgeInterface" is not supported`, "set detectLocalMode: ClusterCIDR"}},
		{"masqueradeAll", input(header + "nftables: {masqueradeAll: true}\n"), []string{"nftables.masqueradeAll", "true is not supported", "set it to false"}},
		{"iptables masqueradeAll, mode unset", input(header + "iptables: {masqueradeAll: true}\n"), []string{"iptables.masqueradeAll"}},
		{"masqueradeBit", input(header + "nftables: {masqueradeBit: 32}\n"), []string{"nftables.masqueradeBit", "32: want 0 to 31"}},
		{"nodePortAddresses not a CIDR", input(header + "nodePortAddresses: [eth0]\n"), []string{"nodePortAddresses", `"eth0" is not a CIDR, "primary" or "all"`}},
		{"nodePortAddresses loopback", input(header + "nodePortAddresses: [127.0.0.0/8]\n"), []string{"nodePortAddresses", "not served on loopback"}},
		{"nodePortAddresses all and more", input(header + "nodePortAddresses: [all, 10.0.0.0/8]\n"), []string{"nodePortAddresses", `"all" cannot be combined`}},
		{"periods", input(header + "nftables: {syncPeriod: 1s, minSyncPeriod: 5s}\n"), []string{"--config kp.yaml: nftables.minSyncPeriod 5s is longer than", "nftables.syncPeriod 1s"}},
		{"period flag under the default minimum", func() proxyOnlyInput {
			in := input("", "proxy-sync-period")
			in.ProxySyncPeriod = 500 * time.Millisecond
			return in
		}(), []string{"kube-proxy's default minSyncPeriod 1s is longer than --proxy-sync-period 500ms"}},
		{"negative period flag", func() proxyOnlyInput {
			in := input("", "proxy-sync-period")
			in.ProxySyncPeriod = -time.Second
			return in
		}(), []string{"--proxy-sync-period -1s: must be greater than 0"}},
		{"bad healthz address", input(header + "healthzBindAddress: localhost:10256\n"), []string{"healthzBindAddress", `"localhost" is not an IP address`, "want IP:port"}},
		{"bad metrics address", input(header + "metricsBindAddress: 127.0.0.1\n"), []string{"metricsBindAddress", "missing port", "want IP:port, e.g. 127.0.0.1:10249"}},
		{"a file cannot turn a server off", input(header + "healthzBindAddress: \"0\"\n"), []string{"healthzBindAddress", `"0"`, "missing port"}},
		{"bad --healthz-bind-address", func() proxyOnlyInput {
			in := input("", "healthz-bind-address")
			in.HealthzBindAddress = "10256"
			return in
		}(), []string{`--healthz-bind-address "10256"`, "want IP:port"}},
		{"blank hostnameOverride", input(header + "hostnameOverride: '  '\n"), []string{"hostnameOverride", "blank"}},
		{"names disagree", func() proxyOnlyInput {
			in := input("", "node-name")
			in.NodeName, in.HostnameOverride = "a", "b"
			return in
		}(), []string{`--hostname-override "b" and --node-name "a" disagree`}},
		{"node flags", input("", "backend", "lab-runtime"), []string{"--backend is not used with --proxy-only", "--lab-runtime is not used with --proxy-only"}},
		{"several errors at once", input(header + "mode: ipvs\nnodePortAddresses: [eth0]\n"), []string{"mode", "nodePortAddresses"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolveProxyOnly(tc.in)
			if err == nil {
				t.Fatalf("no error; want one containing %q", tc.want)
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestProxyOnlyFlags(t *testing.T) {
	// The flags reach Options, and a file given without --proxy-only is
	// refused rather than ignored.
	cmd := NewCommand()
	if err := cmd.ParseFlags([]string{"--proxy-only", "--config", "/kp.yaml", "--hostname-override", "n1", "--cluster-cidr", "10.1.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"proxy-only": "true", "config": "/kp.yaml", "hostname-override": "n1", "cluster-cidr": "10.1.0.0/16"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", flag, got, want)
		}
	}

	err := Run(context.Background(), Options{ProxyOnlyOptions: ProxyOnlyOptions{ProxyConfigFile: "/kp.yaml"}})
	if err == nil || !strings.Contains(err.Error(), "add --proxy-only") {
		t.Errorf("--config without --proxy-only: %v; want a refusal saying to add --proxy-only", err)
	}
	err = Run(context.Background(), Options{ProxyOnlyOptions: ProxyOnlyOptions{ProxyOnly: true, ProxyConfigFile: "/nonexistent/kp.yaml"}})
	if err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("missing --config file: %v", err)
	}
}

func TestProxyOnlyRenderConfigs(t *testing.T) {
	s := &proxyOnlySettings{
		NodeName:       "n1",
		ClusterCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/56"), netip.MustParsePrefix("10.96.0.0/16")},
		MasqueradeMark: 0x20,
		// The renderer picks each family's own.
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.250.0.11/32")},
	}
	got := proxyOnlyRenderConfigs(s, []knftables.Family{knftables.IPv4Family, knftables.IPv6Family})
	want := []nftables.Config{
		{Family: knftables.IPv4Family, Table: nftables.DefaultTable, NodeName: "n1", MasqueradeMark: 0x20,
			ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/16")},
			NodePortAddresses: s.NodePortAddresses},
		{Family: knftables.IPv6Family, Table: nftables.DefaultTable, NodeName: "n1", MasqueradeMark: 0x20,
			ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("fd00::/56")},
			NodePortAddresses: s.NodePortAddresses},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("render configs (-want +got):\n%s", diff)
	}
	// No cluster CIDR: both families still get a proxier, with none.
	s.ClusterCIDRs = nil
	got = proxyOnlyRenderConfigs(s, []knftables.Family{knftables.IPv4Family, knftables.IPv6Family})
	if len(got) != 2 || got[0].ClusterCIDRs != nil || got[1].ClusterCIDRs != nil {
		t.Errorf("without a cluster CIDR: %+v", got)
	}
}

// FuzzResolveProxyOnly: any file is an error or settings the proxy can run
// with, never a panic.
func FuzzResolveProxyOnly(f *testing.F) {
	f.Add([]byte(kubeadmConfig))
	f.Add([]byte(header + "mode: ipvs\nnodePortAddresses: [primary, 10.0.0.0/8]\n"))
	f.Add([]byte(header + "nftables: {syncPeriod: soon, masqueradeBit: 40}\nclusterCIDR: 10.0.0.0/8,fd00::/64\n"))
	f.Add([]byte(`{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "x": {"syncPeriod": 1}}`))
	f.Fuzz(func(t *testing.T, file []byte) {
		s, err := resolveProxyOnly(input(string(file)))
		if err != nil {
			return
		}
		if s.NodeName == "" || s.SyncPeriod <= 0 || s.MinSyncPeriod < 0 || s.MinSyncPeriod > s.SyncPeriod || s.MasqueradeMark == 0 {
			t.Errorf("accepted settings the proxy cannot run with: %+v", s)
		}
		for _, a := range []string{s.HealthzBindAddress, s.MetricsBindAddress} {
			if checkBindAddress(a) != nil {
				t.Errorf("accepted bind address %q", a)
			}
		}
	})
}

func TestNodeInternalIPs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeInternalIP, Address: "10.250.0.11"},
		{Type: corev1.NodeExternalIP, Address: "10.251.0.9"},
		{Type: corev1.NodeInternalIP, Address: "fd00::11"},
	}}}
	client := fake.NewClientset(node)
	got, err := nodeInternalIPs(context.Background(), client, "n1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.250.0.11"), netip.MustParseAddr("fd00::11")}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	_, err = nodeInternalIPs(context.Background(), client, "missing", 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "reading Node missing's InternalIPs") || !strings.Contains(err.Error(), "--hostname-override") {
		t.Errorf("missing Node: err = %v, want one naming the Node and the fix", err)
	}
}
