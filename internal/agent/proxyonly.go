package agent

// `flatnet agent --proxy-only`: a drop-in for kube-proxy on a cluster that
// keeps its own CNI.
//
// Design. With --proxy-only the agent runs the Service proxy (in the
// file's mode, or --proxy-mode; proxymode.go) and nothing else: no CNI conflist, no routes or VXLAN, no masquerade of pod
// traffic, no lab runtime, no Node annotations, and no sysctl at all. The
// proxy needs none: ip_forward is the CNI's (the node already forwards pod
// traffic), route_localnet would only serve NodePorts on 127.0.0.1, which
// kube-proxy's nftables mode does not do either, and the conntrack tuning
// kube-proxy does (nf_conntrack_max, TCP timeouts) is left to the node.
//
// It reads kube-proxy's own configuration, so an existing DaemonSet can
// swap its image and command: `--config FILE` with a KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1, decoded with the types of
// k8s.io/kube-proxy), plus kube-proxy's --kubeconfig, --hostname-override
// and --cluster-cidr. Resolving is pure (resolveProxyOnly: flags, file,
// environment in; settings, ignored fields and warnings out), so every
// mapping and every refusal is unit-tested; runProxyOnly only builds the
// client and the proxiers from the result.
//
// Precedence, per setting: a flag given on the command line, then the file,
// then kube-proxy's default. (kube-proxy itself ignores most flags once
// --config is given; here an explicit flag always wins, which is a superset.)
// Fields the file may carry that change what the proxy does and that
// flatnet cannot honour (mode ipvs, masqueradeAll,
// nodePortAddresses other than "all", detectLocalMode other than
// ClusterCIDR) are refused with the field named and the fix; fields that
// only tune kube-proxy's process (conntrack, oomScoreAdj, featureGates,
// logging, ...) are logged as ignored. Unknown fields are tolerated with a
// warning, as kube-proxy's lenient decoding does.
//
// Servers: /metrics, /healthz and /livez are --proxy's (proxy.go:
// newProxyServers), on kube-proxy's addresses by default (health on
// 0.0.0.0:10256, where load balancers probe kube-proxy; --proxy keeps it on
// loopback).
//
// Families: one proxier per IP family the kernel has (IPv4, and IPv6 unless
// the kernel lacks it), each on its own table, as kube-proxy runs
// dual-stack whenever it can. The cluster CIDR is optional: the renderer
// uses it only to send pod traffic to an externalTrafficPolicy: Local
// address (NodePort, load-balancer IP, external IP) to any endpoint of
// the service instead of only the node's own. Without it that pod traffic
// is treated like traffic from outside: only this node's endpoints serve
// it, and it is dropped when there are none.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/proxier"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// ProxyOnlyOptions are the flags of --proxy-only (kube-proxy's names where
// kube-proxy has one).
type ProxyOnlyOptions struct {
	// ProxyOnly runs the Service proxy alone, replacing kube-proxy.
	ProxyOnly bool
	// ProxyConfigFile is --config, a KubeProxyConfiguration.
	ProxyConfigFile string
	// HostnameOverride is kube-proxy's --hostname-override: the Node name.
	HostnameOverride string

	flags *pflag.FlagSet // tells a flag given from its default
}

// kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go).
const (
	kubeProxyHealthzBindAddress = "0.0.0.0:10256"
	kubeProxyMetricsBindAddress = "127.0.0.1:10249"
	kubeProxySyncPeriod         = 30 * time.Second
	kubeProxyFullSyncPeriod     = time.Hour
	kubeProxyMinSyncPeriod      = time.Second
	kubeProxyMasqueradeBit      = 14
)

// addProxyOnlyFlags registers --proxy-only and the kube-proxy flags the
// agent does not already have (--kubeconfig and --cluster-cidr are shared).
func addProxyOnlyFlags(fs *pflag.FlagSet, o *Options) {
	o.flags = fs
	fs.BoolVar(&o.ProxyOnly, "proxy-only", false, "run only the nftables Service proxy, as a drop-in for kube-proxy on a cluster with another CNI: no CNI config, routes, overlay or masquerade (docs/proxy-only.md)")
	fs.StringVar(&o.ProxyConfigFile, "config", "", "--proxy-only: kube-proxy's configuration file (a KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1); flags given on the command line win over it")
	fs.StringVar(&o.HostnameOverride, "hostname-override", "", "--proxy-only: this node's name, as kube-proxy's flag (default: the file's hostnameOverride, then --node-name or $NODE_NAME, then the hostname)")
}

// usesProxyOnlyFlags reports whether a flag that only --proxy-only reads was
// given, so that Run refuses it without --proxy-only instead of ignoring it.
func (o *Options) usesProxyOnlyFlags() bool {
	return o.ProxyConfigFile != "" || o.HostnameOverride != ""
}

// nodeOnlyFlags are the agent's flags that --proxy-only does not use.
var nodeOnlyFlags = []string{
	"node-ip", "backend", "vxlan-vni", "vxlan-port", "vxlan-tx-checksum-offload", "mtu",
	"cni-conf-dir", "cni-conflist", "cni-bin-dir", "cni-data-dir", "cni-cache-dir", "masquerade", "resync",
	"lab-runtime", "runtime-state-dir", "netns-prefix", "pod-path",
	// Cluster DNS runs beside the proxy as a second agent, --dns-only.
	"dns", "dns-addresses", "dns-port", "dns-listen", "dns-upstreams", "dns-resolv-conf", "dns-ttl",
	"dns-pods", "dns-autopath", "dns-cache-entries", "dns-query-log", "dns-metrics-bind-address", "dns-reverse-cidrs",
}

// proxyOnlyInput is everything resolveProxyOnly reads.
type proxyOnlyInput struct {
	Options
	// Changed reports whether a flag was given on the command line.
	Changed func(flag string) bool
	// File is the --config file's content (nil without --config).
	File []byte
	// Getenv and Hostname stand in for the process's.
	Getenv   func(string) string
	Hostname func() (string, error)
}

// proxyOnlySettings are what --proxy-only runs with.
type proxyOnlySettings struct {
	Kubeconfig string
	// Client tuning from clientConnection (zero: flatnet's defaults).
	QPS                float32
	Burst              int32
	ContentType        string
	AcceptContentTypes string

	// Mode is the proxy mode: --proxy-mode when given, else the file's
	// mode (kube-proxy's unset mode, iptables there, runs auto here).
	Mode           string
	NodeName       string
	ClusterCIDRs   []netip.Prefix
	MinSyncPeriod  time.Duration
	SyncPeriod     time.Duration
	FullSyncPeriod time.Duration // --proxy-full-sync-period (the file has no such field)
	ModulusHold    time.Duration // --proxy-modulus-hold (nor this)
	MasqueradeMark uint32
	// NodePortAddresses (nodePortAddresses CIDRs) and NodePortPrimary
	// ("primary": the Node's InternalIPs, added at start) restrict
	// NodePorts; neither: every local address.
	NodePortAddresses  []netip.Prefix
	NodePortPrimary    bool
	HealthzBindAddress string
	MetricsBindAddress string
	BindAddressHard    bool
	Profiling          bool // enableProfiling, or --profiling

	// Ignored names the file's fields that are set but that flatnet does
	// not use; Warnings are the rest worth a log line (unknown fields).
	Ignored  []string
	Warnings []string
}

// decodeKubeProxyConfig decodes a KubeProxyConfiguration the way kube-proxy
// does: strictly, and if only strictness fails (an unknown or repeated
// field), leniently with a warning.
func decodeKubeProxyConfig(data []byte) (cfg *kubeproxy.KubeProxyConfiguration, warning error, err error) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, nil, fmt.Errorf("not a YAML or JSON object: %w", err)
	}
	want := kubeproxy.SchemeGroupVersion.String()
	if tm.APIVersion != want || tm.Kind != "KubeProxyConfiguration" {
		return nil, nil, fmt.Errorf("apiVersion %q, kind %q: want apiVersion: %s and kind: KubeProxyConfiguration (kube-proxy's configuration file)",
			tm.APIVersion, tm.Kind, want)
	}
	cfg = &kubeproxy.KubeProxyConfiguration{}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		if field := badDuration(data); field != "" {
			return nil, nil, fmt.Errorf("%s: %w (want a duration such as 30s or 1m)", field, errors.Unwrap(errors.Unwrap(err)))
		}
		return nil, nil, err
	}
	if err := yaml.UnmarshalStrict(data, &kubeproxy.KubeProxyConfiguration{}); err != nil {
		warning = fmt.Errorf("decoded leniently (kube-proxy does the same): %w", err)
	}
	return cfg, warning, nil
}

// badDuration names the first field of data that holds a string which is
// not a duration although its name says it is one, for an error that
// names the field (metav1.Duration's own error does not).
func badDuration(data []byte) string {
	var m map[string]any
	if yaml.Unmarshal(data, &m) != nil {
		return ""
	}
	var walk func(prefix string, m map[string]any) string
	walk = func(prefix string, m map[string]any) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			switch v := m[k].(type) {
			case map[string]any:
				if f := walk(prefix+k+".", v); f != "" {
					return f
				}
			case string:
				if strings.HasSuffix(k, "Period") || strings.HasSuffix(k, "Timeout") {
					if _, err := time.ParseDuration(v); err != nil {
						return prefix + k
					}
				}
			}
		}
		return ""
	}
	return walk("", m)
}

// resolveProxyOnly maps flags, the file and the environment to settings.
// Errors name the flag or field and say what to do.
func resolveProxyOnly(in proxyOnlyInput) (*proxyOnlySettings, error) {
	var errs []error
	s := &proxyOnlySettings{}
	changed := in.Changed
	if changed == nil {
		changed = func(string) bool { return false }
	}
	for _, f := range nodeOnlyFlags {
		if changed(f) {
			errs = append(errs, fmt.Errorf("--%s is not used with --proxy-only (it runs the Service proxy alone): remove it", f))
		}
	}

	cfg := &kubeproxy.KubeProxyConfiguration{}
	if in.File != nil {
		c, warning, err := decodeKubeProxyConfig(in.File)
		if err != nil {
			return nil, fmt.Errorf("--config %s: %w", in.ProxyConfigFile, err)
		}
		if warning != nil {
			s.Warnings = append(s.Warnings, warning.Error())
		}
		cfg = c
	}
	field := func(name string, err error) error {
		return fmt.Errorf("--config %s: %s: %w", in.ProxyConfigFile, name, err)
	}

	// mode.
	s.Mode = ProxyModeAuto
	switch m := string(cfg.Mode); m {
	case "":
	case ProxyModeNFTables, ProxyModeIPTables, ProxyModeUserspace:
		s.Mode = m
	case "ipvs":
		errs = append(errs, field("mode", fmt.Errorf("%q is not supported: flatnet has no IPVS mode; set mode: nftables, iptables or userspace (or remove the field for auto), and remove the old kube-proxy's rules once with kube-proxy --cleanup", cfg.Mode)))
	default:
		errs = append(errs, field("mode", fmt.Errorf("%q is not a proxy mode flatnet knows: set mode: nftables, iptables or userspace (or remove the field for auto)", cfg.Mode)))
	}
	if changed("proxy-mode") {
		s.Mode = in.ProxyMode
	}
	if err := checkProxyMode(s.Mode); err != nil {
		errs = append(errs, fmt.Errorf("--proxy-mode: %w", err))
	}

	// Client.
	s.Kubeconfig = cfg.ClientConnection.Kubeconfig
	if changed("kubeconfig") || s.Kubeconfig == "" {
		s.Kubeconfig = in.Kubeconfig
	}
	s.QPS, s.Burst = cfg.ClientConnection.QPS, cfg.ClientConnection.Burst
	s.ContentType, s.AcceptContentTypes = cfg.ClientConnection.ContentType, cfg.ClientConnection.AcceptContentTypes
	if s.QPS < 0 || s.Burst < 0 {
		errs = append(errs, field("clientConnection", fmt.Errorf("qps %v and burst %d must not be negative", s.QPS, s.Burst)))
	}

	// Node name: --hostname-override, --node-name, the file, $NODE_NAME,
	// the hostname. kube-proxy lowercases it.
	name, err := nodeName(in, cfg)
	if err != nil {
		errs = append(errs, err)
	}
	s.NodeName = name

	// Cluster CIDR(s) and how local traffic is told apart.
	cidrs := cfg.ClusterCIDR
	cidrsFrom := "--config " + in.ProxyConfigFile + ": clusterCIDR"
	if changed("cluster-cidr") {
		cidrs, cidrsFrom = in.ClusterCIDR, "--cluster-cidr"
	}
	if strings.TrimSpace(cidrs) != "" {
		if s.ClusterCIDRs, err = parseCIDRs(cidrs); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w (want comma-separated CIDRs, e.g. 10.244.0.0/16,fd00:10:244::/56)", cidrsFrom, cidrs, err))
		}
	}
	switch cfg.DetectLocalMode {
	case "", "ClusterCIDR":
	default:
		errs = append(errs, field("detectLocalMode", fmt.Errorf("%q is not supported: flatnet tells pod traffic apart by its source address in clusterCIDR; set detectLocalMode: ClusterCIDR (or remove it) and set clusterCIDR to the pods' CIDR(s)", cfg.DetectLocalMode)))
	}

	// nftables, or for a file written for kube-proxy's default mode
	// (mode unset, i.e. iptables there) or for iptables mode the iptables
	// section field by field.
	nftc, iptc := cfg.NFTables, cfg.IPTables
	// A file for iptables mode, or for kube-proxy's default (iptables).
	readsIPT := cfg.Mode == "" || cfg.Mode == ProxyModeIPTables
	// period picks one period and names where it came from.
	period := func(name string, nf, ipt, def time.Duration) (time.Duration, string) {
		switch {
		case nf != 0:
			return nf, "--config " + in.ProxyConfigFile + ": nftables." + name
		case readsIPT && ipt != 0:
			return ipt, "--config " + in.ProxyConfigFile + ": iptables." + name
		}
		return def, "kube-proxy's default " + name
	}
	var syncFrom, minFrom string
	s.SyncPeriod, syncFrom = period("syncPeriod", nftc.SyncPeriod.Duration, iptc.SyncPeriod.Duration, kubeProxySyncPeriod)
	s.MinSyncPeriod, minFrom = period("minSyncPeriod", nftc.MinSyncPeriod.Duration, iptc.MinSyncPeriod.Duration, kubeProxyMinSyncPeriod)
	if changed("proxy-sync-period") {
		s.SyncPeriod, syncFrom = in.ProxySyncPeriod, "--proxy-sync-period"
	}
	if changed("proxy-min-sync-period") {
		s.MinSyncPeriod, minFrom = in.ProxyMinSyncPeriod, "--proxy-min-sync-period"
	}
	s.ModulusHold = in.ProxyModulusHold
	// kube-proxy has no field for it: an hour, fixed (FullSyncPeriod).
	s.FullSyncPeriod = kubeProxyFullSyncPeriod
	if changed("proxy-full-sync-period") {
		s.FullSyncPeriod = in.ProxyFullSyncPeriod
	}
	if s.SyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("%s %s: must be greater than 0", syncFrom, s.SyncPeriod))
	}
	if s.MinSyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("%s %s: must not be negative", minFrom, s.MinSyncPeriod))
	}
	if s.SyncPeriod > 0 && s.MinSyncPeriod > s.SyncPeriod {
		errs = append(errs, fmt.Errorf("%s %s is longer than %s %s: the minimum must not exceed the period", minFrom, s.MinSyncPeriod, syncFrom, s.SyncPeriod))
	}

	bit, bitFrom := nftc.MasqueradeBit, "nftables.masqueradeBit"
	if bit == nil && readsIPT && iptc.MasqueradeBit != nil {
		bit, bitFrom = iptc.MasqueradeBit, "iptables.masqueradeBit"
	}
	b := int32(kubeProxyMasqueradeBit)
	if bit != nil {
		b = *bit
	}
	if b < 0 || b > 31 {
		errs = append(errs, field(bitFrom, fmt.Errorf("%d: want 0 to 31 (kube-proxy's default is 14)", b)))
	} else {
		s.MasqueradeMark = 1 << uint(b)
	}
	masqAll, masqFrom := nftc.MasqueradeAll, "nftables.masqueradeAll"
	if !masqAll && readsIPT && iptc.MasqueradeAll {
		masqAll, masqFrom = true, "iptables.masqueradeAll"
	}
	if masqAll {
		errs = append(errs, field(masqFrom, errors.New("true is not supported: flatnet masquerades only what needs it (hairpin traffic, and NodePort, load-balancer and external IP traffic with externalTrafficPolicy: Cluster); set it to false, and give every node a route back to the pod CIDRs (which is the CNI's job)")))
	}
	if readsIPT && iptc.LocalhostNodePorts != nil && *iptc.LocalhostNodePorts {
		s.Warnings = append(s.Warnings, "iptables.localhostNodePorts: NodePorts are not served on 127.0.0.1 (nor by kube-proxy's nftables mode)")
	}

	// NodePort addresses, as kube-proxy reads them: "all" (or nothing)
	// for every local address but loopback, "primary" for the Node's
	// InternalIPs (resolved at start), CIDRs for the node's addresses in
	// them. Loopback is never served (nor by kube-proxy's nftables mode).
	all := false
	for _, a := range cfg.NodePortAddresses {
		switch a = strings.TrimSpace(a); a {
		case "all":
			all = true
		case "primary":
			s.NodePortPrimary = true
		default:
			p, err := netip.ParsePrefix(a)
			switch {
			case err != nil:
				errs = append(errs, field("nodePortAddresses", fmt.Errorf("%q is not a CIDR, \"primary\" or \"all\"", a)))
			case p.Addr().IsLoopback():
				errs = append(errs, field("nodePortAddresses", fmt.Errorf("%q: NodePorts are not served on loopback addresses (nor by kube-proxy's nftables mode); remove it", a)))
			default:
				s.NodePortAddresses = append(s.NodePortAddresses, p.Masked())
			}
		}
	}
	if all && len(cfg.NodePortAddresses) > 1 {
		errs = append(errs, field("nodePortAddresses", errors.New(`"all" cannot be combined with other values: use [all] alone, or list CIDRs / "primary"`)))
	}

	// Servers: a flag given wins ("" or "0" turns its server off); else
	// the file's address, or kube-proxy's default when the file has none
	// (as kube-proxy's defaulting, a file cannot turn a server off).
	for _, a := range []struct {
		flag, field, flagValue, fileValue, def string
		to                                     *string
	}{
		{"healthz-bind-address", "healthzBindAddress", in.HealthzBindAddress, cfg.HealthzBindAddress, kubeProxyHealthzBindAddress, &s.HealthzBindAddress},
		{"metrics-bind-address", "metricsBindAddress", in.MetricsBindAddress, cfg.MetricsBindAddress, kubeProxyMetricsBindAddress, &s.MetricsBindAddress},
	} {
		if changed(a.flag) {
			*a.to = a.flagValue
			if err := checkBindAddress(a.flagValue); err != nil {
				errs = append(errs, fmt.Errorf("--%s %q: %w", a.flag, a.flagValue, err))
			}
			continue
		}
		*a.to = a.fileValue
		if *a.to == "" {
			*a.to = a.def
		}
		if err := checkHostPort(*a.to); err != nil {
			errs = append(errs, field(a.field, fmt.Errorf("%q: %w (want IP:port, e.g. %s)", *a.to, err, a.def)))
		}
	}
	s.BindAddressHard = cfg.BindAddressHardFail
	s.Profiling = cfg.EnableProfiling || in.ProxyProfiling

	s.Ignored = ignoredFields(cfg)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}

// nodeName picks the Node name (see resolveProxyOnly).
func nodeName(in proxyOnlyInput, cfg *kubeproxy.KubeProxyConfiguration) (string, error) {
	clean := func(s string) string { return strings.ToLower(strings.TrimSpace(s)) }
	flag := clean(in.HostnameOverride)
	if in.HostnameOverride != "" && flag == "" {
		return "", errors.New("--hostname-override is blank: give the Node's name")
	}
	if changed := in.Changed; changed != nil && changed("node-name") {
		n := clean(in.NodeName)
		if n == "" {
			return "", errors.New("--node-name is blank: give the Node's name")
		}
		if flag != "" && flag != n {
			return "", fmt.Errorf("--hostname-override %q and --node-name %q disagree: give one", flag, n)
		}
		flag = n
	}
	if flag != "" {
		return flag, nil
	}
	if cfg.HostnameOverride != "" {
		if n := clean(cfg.HostnameOverride); n != "" {
			return n, nil
		}
		return "", fmt.Errorf("--config: hostnameOverride %q is blank: give the Node's name or remove the field", cfg.HostnameOverride)
	}
	if in.Getenv != nil {
		if n := clean(in.Getenv("NODE_NAME")); n != "" {
			return n, nil
		}
	}
	if in.Hostname != nil {
		h, err := in.Hostname()
		if err == nil && clean(h) != "" {
			return clean(h), nil
		}
		if err != nil {
			return "", fmt.Errorf("no node name (--hostname-override, hostnameOverride, $NODE_NAME) and no hostname: %w", err)
		}
	}
	return "", errors.New("no node name: give --hostname-override (or hostnameOverride in --config, or $NODE_NAME)")
}

// checkHostPort accepts IP:port (a file's address; checkBindAddress is
// the flags', which also take "" and "0" for off).
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return fmt.Errorf("%q is not an IP address", host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// ignoredFields names the file's fields that are set and that flatnet
// reads but does not act on (everything it refuses is an error instead).
func ignoredFields(c *kubeproxy.KubeProxyConfiguration) []string {
	var out []string
	add := func(set bool, name string) {
		if set {
			out = append(out, name)
		}
	}
	ct := c.Conntrack
	add(len(c.FeatureGates) > 0, "featureGates")
	add(c.Logging.Format != "" || c.Logging.Verbosity != 0 || len(c.Logging.VModule) > 0, "logging (use -v and --vmodule)")
	add(c.BindAddress != "", "bindAddress")
	add(c.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion")
	add(c.OOMScoreAdj != nil, "oomScoreAdj")
	add(ct.MaxPerCore != nil || ct.Min != nil || ct.TCPEstablishedTimeout != nil || ct.TCPCloseWaitTimeout != nil ||
		ct.TCPBeLiberal || ct.UDPTimeout.Duration != 0 || ct.UDPStreamTimeout.Duration != 0, "conntrack (flatnet leaves the node's conntrack sysctls as they are)")
	add(c.ConfigSyncPeriod.Duration != 0, "configSyncPeriod")
	add(c.DetectLocal.BridgeInterface != "" || c.DetectLocal.InterfaceNamePrefix != "", "detectLocal")
	add(c.PortRange != "", "portRange")
	return out
}

// runProxyOnly is Run with --proxy-only.
func runProxyOnly(ctx context.Context, o Options) error {
	if !o.ProxyOnly {
		return errors.New("--config and --hostname-override are kube-proxy's flags, read only with --proxy-only: add --proxy-only, or remove them")
	}
	in := proxyOnlyInput{Options: o, Getenv: os.Getenv, Hostname: os.Hostname}
	if o.flags != nil {
		in.Changed = func(name string) bool { return o.flags.Changed(name) }
	}
	if o.ProxyConfigFile != "" {
		b, err := os.ReadFile(o.ProxyConfigFile)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		in.File = b
	}
	s, err := resolveProxyOnly(in)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	for _, w := range s.Warnings {
		logger.Info("WARNING: "+w, "config", o.ProxyConfigFile)
	}
	if len(s.Ignored) > 0 {
		logger.Info("Ignoring KubeProxyConfiguration fields flatnet does not use", "config", o.ProxyConfigFile, "fields", s.Ignored)
	}

	cfg, err := kube.Config(s.Kubeconfig, "flatnet-agent/"+s.NodeName)
	if err != nil {
		return err
	}
	if s.QPS > 0 {
		cfg.QPS = s.QPS
	}
	if s.Burst > 0 {
		cfg.Burst = int(s.Burst)
	}
	if s.ContentType != "" {
		cfg.ContentType = s.ContentType
	}
	if s.AcceptContentTypes != "" {
		cfg.AcceptContentTypes = s.AcceptContentTypes
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building the API client: %w", err)
	}
	if s.NodePortPrimary {
		ips, err := nodeInternalIPs(ctx, client, s.NodeName, 30*time.Second)
		if err != nil {
			return fmt.Errorf("nodePortAddresses [primary]: %w", err)
		}
		for _, ip := range ips {
			s.NodePortAddresses = append(s.NodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
		}
		logger.Info("NodePorts on the Node's primary addresses", "node", s.NodeName, "addresses", ips)
	}
	proxiers, err := proxyOnlyProxiers(ctx, client, s, proxyOnlyRenderConfigs(s, kernelFamilies()))
	if err != nil {
		return err
	}
	logger.Info("Starting the Service proxy alone (--proxy-only)", "node", s.NodeName, "clusterCIDRs", s.ClusterCIDRs,
		"families", len(proxiers), "minSyncPeriod", s.MinSyncPeriod, "syncPeriod", s.SyncPeriod, "fullSyncPeriod", s.FullSyncPeriod,
		"healthz", s.HealthzBindAddress, "metrics", s.MetricsBindAddress)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, p := range proxiers {
		wg.Go(func() {
			if err := runProxier(klog.NewContext(ctx, logger.WithName("proxy")), p); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("proxy: %w", err))
			}
		})
	}
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// kernelFamilies are the IP families this node's kernel has: IPv4, and
// IPv6 unless the kernel was built or booted without it.
func kernelFamilies() []knftables.Family {
	fams := []knftables.Family{knftables.IPv4Family}
	if _, err := sysctl.Get("net.ipv6.conf.all.disable_ipv6"); err == nil {
		fams = append(fams, knftables.IPv6Family)
	}
	return fams
}

// nodeInternalIPs returns the InternalIP addresses of Node name, waiting up
// to wait for the Node to be registered (kube-proxy waits for its Node too).
func nodeInternalIPs(ctx context.Context, client kubernetes.Interface, name string, wait time.Duration) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var last error
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			var ips []netip.Addr
			for _, a := range node.Status.Addresses {
				if ip, perr := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && perr == nil {
					ips = append(ips, ip.Unmap())
				}
			}
			if len(ips) > 0 {
				return ips, nil
			}
			err = errors.New("it has no InternalIP address")
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("reading Node %s's InternalIPs: %w (is --hostname-override the Node's name? or list CIDRs instead)", name, last)
		case <-time.After(time.Second):
		}
	}
}

// proxyOnlyRenderConfigs returns one renderer config per family, each
// with the cluster CIDRs of its family (possibly none).
func proxyOnlyRenderConfigs(s *proxyOnlySettings, fams []knftables.Family) []nftables.Config {
	var out []nftables.Config
	for _, fam := range fams {
		var cidrs []netip.Prefix
		for _, c := range s.ClusterCIDRs {
			if c.Addr().Is6() == (fam == knftables.IPv6Family) {
				cidrs = append(cidrs, c)
			}
		}
		out = append(out, nftables.Config{Family: fam, Table: nftables.DefaultTable, NodeName: s.NodeName, ClusterCIDRs: cidrs,
			MasqueradeMark: s.MasqueradeMark, NodePortAddresses: s.NodePortAddresses, ModulusHold: s.ModulusHold})
	}
	return out
}

// proxyOnlyProxiers returns one proxier per render config; the first also
// runs the metrics and health servers (shared with --proxy: proxy.go).
func proxyOnlyProxiers(ctx context.Context, client kubernetes.Interface, s *proxyOnlySettings, renders []nftables.Config) ([]*proxier.Proxier, error) {
	return buildProxiers(ctx, client, s.Mode, proxyServersConfig{
		NodeName:           s.NodeName,
		SyncPeriod:         s.SyncPeriod,
		MetricsBindAddress: s.MetricsBindAddress,
		HealthzBindAddress: s.HealthzBindAddress,
		HardFail:           s.BindAddressHard,
		Profiling:          s.Profiling,
	}, renders, syncPeriods{s.MinSyncPeriod, s.SyncPeriod, s.FullSyncPeriod}, "--proxy-only")
}
