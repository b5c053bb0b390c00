package agent

// The agent's cluster DNS (`--dns` with the rest of the agent, `--dns-only`
// alone): the records index fed by informers (internal/dns/records), the
// server (internal/dns/server) on the node-local address and the kube-dns
// ClusterIP, both taken on this node without conntrack (internal/dns/local),
// and names outside the cluster forwarded upstream (internal/dns/forward).
// Flags resolve into dnsSettings in one pure step (resolveDNS), unit-tested;
// runDNS only builds and runs. docs/dns.md is the design note.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/dns/forward"
	"github.com/flatnet/flatnet/internal/dns/local"
	"github.com/flatnet/flatnet/internal/dns/records"
	"github.com/flatnet/flatnet/internal/dns/server"
	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/resolvconf"
)

// Defaults of the DNS flags.
const (
	// DefaultDNSAddresses: NodeLocal DNSCache's link-local address and
	// the kube-dns ClusterIP kubeadm clusters use (10.96.0.0/12's .10).
	DefaultDNSAddresses          = "169.254.20.10,10.96.0.10"
	DefaultDNSMetricsBindAddress = "127.0.0.1:9153" // CoreDNS's port
)

// DNSOptions are the flags of the cluster DNS.
type DNSOptions struct {
	DNS, DNSOnly          bool
	DNSAddresses          string // taken on the node (lo + notrack)
	DNSPort               uint16
	DNSListen             string // extra IP:port sockets, served as they are
	DNSUpstreams          string // "": from DNSResolvConf; "none": no forwarding
	DNSResolvConf         string
	DNSTTL                uint32
	DNSPods               string
	DNSAutopath           bool
	DNSCacheEntries       int
	DNSQueryLog           bool
	DNSMetricsBindAddress string
	DNSReverseCIDRs       string
}

func addDNSFlags(fs *pflag.FlagSet, o *Options) {
	fs.BoolVar(&o.DNS, "dns", false, "also serve cluster DNS (the Kubernetes DNS spec for --cluster-domain) on --dns-addresses, replacing CoreDNS (docs/dns.md)")
	fs.BoolVar(&o.DNSOnly, "dns-only", false, "serve only cluster DNS, for clusters that keep their own CNI and proxy (docs/dns.md)")
	fs.StringVar(&o.DNSAddresses, "dns-addresses", DefaultDNSAddresses, "DNS: addresses the agent takes on this node (on lo, DNS packets to and from them untracked, so no Service proxy DNATs them) and serves on --dns-port; the kube-dns Service's ClusterIP belongs here. Empty: none")
	fs.Uint16Var(&o.DNSPort, "dns-port", 53, "DNS: port on --dns-addresses")
	fs.StringVar(&o.DNSListen, "dns-listen", "", "DNS: more IP:port sockets to serve (UDP and TCP), comma-separated, used as they are (no address taken, nothing untracked)")
	fs.StringVar(&o.DNSUpstreams, "dns-upstreams", "", "DNS: resolvers for names outside the cluster, IP or IP:port, comma-separated (default: the nameservers of --dns-resolv-conf; \"none\": answer them SERVFAIL)")
	fs.StringVar(&o.DNSResolvConf, "dns-resolv-conf", "/etc/resolv.conf", "DNS: the node's resolv.conf, read for upstreams and search domains (autopath)")
	fs.Uint32Var(&o.DNSTTL, "dns-ttl", records.DefaultTTL, "DNS: TTL of cluster records and negative answers, seconds")
	fs.StringVar(&o.DNSPods, "dns-pods", "verified", "DNS: pod records a-b-c-d.<ns>.pod.<zone>: verified (only existing pods' IPs in that namespace), insecure (any IP), disabled (as CoreDNS's pods option)")
	fs.BoolVar(&o.DNSAutopath, "dns-autopath", false, "DNS: answer a pod's first search-path expansion by following the rest of its search path here (one round trip instead of up to five; CoreDNS's autopath)")
	fs.IntVar(&o.DNSCacheEntries, "dns-cache-entries", forward.DefaultCacheEntries, "DNS: bound of the forwarded-answer cache, and half the bound of the packed-reply cache (CoreDNS's cache holds 9,984 answers and 9,984 denials); negative: no caches")
	fs.BoolVar(&o.DNSQueryLog, "dns-query-log", false, "DNS: log every query to stdout (CoreDNS's log format)")
	fs.StringVar(&o.DNSMetricsBindAddress, "dns-metrics-bind-address", DefaultDNSMetricsBindAddress, "DNS: IP:port of the Prometheus metrics (/metrics, CoreDNS's names as flatnet_dns_*); \"\" or \"0\" disables")
	fs.StringVar(&o.DNSReverseCIDRs, "dns-reverse-cidrs", "", "DNS: CIDRs whose reverse (PTR) names are answered here, NXDOMAIN when unknown: the Service and pod CIDRs (default: --cluster-cidr)")
}

// dnsSettings are what the DNS runs with.
type dnsSettings struct {
	Records      records.Config
	Addresses    []netip.Addr
	Port         uint16
	Listen       []netip.AddrPort // every socket: Addresses x Port, then --dns-listen
	Upstreams    []string         // nil: none
	Search       []string         // the node's search domains, for autopath
	Autopath     bool
	CacheEntries int
	QueryLog     bool
	MetricsAddr  string
	// pods, when set, is an informer of every pod that another part of
	// the agent runs (the network policy's): the pod records read it
	// instead of a watch of their own.
	pods cache.SharedIndexInformer
}

// resolveDNS checks the DNS flags and resolves them; readFile reads
// --dns-resolv-conf.
func resolveDNS(o Options, readFile func(string) ([]byte, error)) (dnsSettings, error) {
	s := dnsSettings{Port: o.DNSPort, Autopath: o.DNSAutopath, CacheEntries: o.DNSCacheEntries, QueryLog: o.DNSQueryLog}
	var errs []error
	pods, err := records.ParsePodMode(o.DNSPods)
	if err != nil {
		errs = append(errs, fmt.Errorf("--dns-pods: %w", err))
	}
	s.Records = records.Config{Zone: o.ClusterDomain, TTL: o.DNSTTL, Pods: pods}
	if _, err := records.New(s.Records); err != nil {
		errs = append(errs, fmt.Errorf("--cluster-domain: %w", err))
	}
	if o.DNSTTL == 0 || o.DNSTTL > 3600 {
		errs = append(errs, fmt.Errorf("--dns-ttl %d: want 1 to 3600 seconds", o.DNSTTL))
	}
	reverse := o.DNSReverseCIDRs
	if reverse == "" {
		reverse = o.ClusterCIDR
	}
	if reverse != "" {
		if s.Records.ReverseCIDRs, err = parseCIDRs(reverse); err != nil {
			errs = append(errs, fmt.Errorf("--dns-reverse-cidrs %q: %w", reverse, err))
		}
	}
	if s.Addresses, err = parseIPs(o.DNSAddresses); err != nil {
		errs = append(errs, fmt.Errorf("--dns-addresses %q: %w (want comma-separated IPs, or empty)", o.DNSAddresses, err))
	}
	for _, a := range s.Addresses {
		if a.IsUnspecified() || a.IsMulticast() {
			errs = append(errs, fmt.Errorf("--dns-addresses: %s cannot be taken as a DNS address", a))
		}
	}
	if o.DNSPort == 0 {
		errs = append(errs, errors.New("--dns-port must not be 0"))
	}
	for _, a := range s.Addresses {
		s.Listen = append(s.Listen, netip.AddrPortFrom(a, o.DNSPort))
	}
	for _, f := range splitList(o.DNSListen) {
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("--dns-listen %q: %w (want IP:port)", f, err))
			continue
		}
		s.Listen = append(s.Listen, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	if len(s.Listen) == 0 {
		errs = append(errs, errors.New("the DNS server has nowhere to listen: give --dns-addresses or --dns-listen"))
	}
	own := make([]netip.Addr, 0, len(s.Listen))
	for _, ap := range s.Listen {
		own = append(own, ap.Addr())
	}
	conf, confErr := readFile(o.DNSResolvConf)
	switch {
	case o.DNSUpstreams == "none":
	case o.DNSUpstreams != "":
		if s.Upstreams, err = forward.ParseUpstreams(splitList(o.DNSUpstreams)); err != nil {
			errs = append(errs, fmt.Errorf("--dns-upstreams: %w", err))
		}
	case confErr != nil:
		errs = append(errs, fmt.Errorf("--dns-resolv-conf: %w (give --dns-upstreams, or none)", confErr))
	default:
		s.Upstreams, err = forward.ParseResolvConf(bytes.NewReader(conf), own...)
		if err != nil {
			errs = append(errs, fmt.Errorf("--dns-resolv-conf %s: %w (give --dns-upstreams, or none)", o.DNSResolvConf, err))
		}
	}
	if confErr == nil {
		s.Search = resolvconf.Parse(conf).Searches
	}
	switch o.DNSMetricsBindAddress {
	case "", "0":
	default:
		if _, err := netip.ParseAddrPort(o.DNSMetricsBindAddress); err != nil {
			errs = append(errs, fmt.Errorf("--dns-metrics-bind-address %q: %w (want IP:port)", o.DNSMetricsBindAddress, err))
		}
		s.MetricsAddr = o.DNSMetricsBindAddress
	}
	return s, errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// runDNS serves cluster DNS until ctx ends, then releases the addresses.
func runDNS(ctx context.Context, client kubernetes.Interface, s dnsSettings) error {
	logger := klog.FromContext(ctx)
	ix, err := records.New(s.Records)
	if err != nil {
		return err
	}
	var fwd *forward.Forwarder
	if len(s.Upstreams) > 0 {
		if fwd, err = forward.New(forward.Config{Upstreams: s.Upstreams, CacheEntries: s.CacheEntries}); err != nil {
			return err
		}
	}
	cfg := server.Config{Index: ix, Autopath: s.Autopath, Search: s.Search, Metrics: server.NewMetrics(fwd)}
	if fwd != nil {
		cfg.Forwarder = fwd
	}
	if s.CacheEntries < 0 {
		cfg.CacheEntries = -1
	} else if s.CacheEntries > 0 {
		cfg.CacheEntries = 2 * s.CacheEntries
	}
	if s.QueryLog {
		cfg.QueryLog = os.Stdout
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}

	// /ready says 503 until the Service records are synced and the sockets
	// open (the pods may still be coming: AwaitPods).
	var ready atomic.Bool
	if s.MetricsAddr != "" {
		go func() {
			if err := cfg.Metrics.Serve(ctx, s.MetricsAddr, ready.Load); err != nil && ctx.Err() == nil {
				logger.Error(err, "DNS metrics server stopped", "address", s.MetricsAddr)
			}
		}()
	}

	// Names first: answering before the Services and their slices are
	// listed would say NXDOMAIN for names that exist. The pods (verified
	// pod names, autopath) are not waited for: at a restart in a large
	// cluster their list takes far longer (20-80 s at 100,000 pods), and
	// the agent's shared pod informer starts only after the proxy's first
	// sync. Until they are in, pod names get SERVFAIL (AwaitPods) and
	// autopath answers each query as asked.
	needPods := s.Records.Pods == records.PodsVerified || s.Autopath
	synced := ix.Watch(ctx, client, needPods && s.pods == nil)
	var podsSynced cache.InformerSynced
	switch {
	case needPods && s.pods == nil:
		// Watch returns the pods' HasSynced last.
		podsSynced, synced = synced[len(synced)-1], synced[:len(synced)-1]
	case needPods:
		if podsSynced, err = ix.WatchPods(s.pods); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if podsSynced != nil {
		ix.AwaitPods()
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), podsSynced) {
				ix.PodsSynced()
				logger.Info("DNS pod records synced", "took", time.Since(t0).Round(time.Millisecond))
			}
		}()
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return nil // ctx ended
	}
	logger.Info("DNS Service records synced", "zone", ix.Zone(), "took", time.Since(t0).Round(time.Millisecond))

	if len(s.Addresses) > 0 {
		l, err := local.NewDefault()
		if err != nil {
			return err
		}
		if err := l.Sync(ctx, s.Addresses, s.Port); err != nil {
			return fmt.Errorf("taking the DNS addresses: %w", err)
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := l.Remove(rctx); err != nil {
				logger.Error(err, "Releasing the DNS addresses")
			}
		}()
	}
	pcs, lns, err := listenDNS(s.Listen)
	if err != nil {
		return err
	}
	ready.Store(true)
	logger.Info("Serving cluster DNS", "zone", ix.Zone(), "listen", s.Listen, "upstreams", s.Upstreams, "autopath", s.Autopath, "pods", s.Records.Pods)
	return srv.Serve(ctx, pcs, lns)
}

// listenDNS opens UDP and TCP sockets on every address, or none.
func listenDNS(addrs []netip.AddrPort) ([]net.PacketConn, []net.Listener, error) {
	var pcs []net.PacketConn
	var lns []net.Listener
	fail := func(err error) ([]net.PacketConn, []net.Listener, error) {
		for _, c := range pcs {
			c.Close()
		}
		for _, l := range lns {
			l.Close()
		}
		return nil, nil, err
	}
	for _, ap := range addrs {
		pc, err := net.ListenPacket("udp", ap.String())
		if err != nil {
			return fail(fmt.Errorf("DNS on %s/udp: %w (another DNS server on this port: systemd-resolved, dnsmasq, NodeLocal DNSCache?)", ap, err))
		}
		pcs = append(pcs, pc)
		ln, err := net.Listen("tcp", ap.String())
		if err != nil {
			return fail(fmt.Errorf("DNS on %s/tcp: %w", ap, err))
		}
		lns = append(lns, ln)
	}
	return pcs, lns, nil
}

// runDNSOnly is `flatnet agent --dns-only`.
func runDNSOnly(ctx context.Context, o Options) error {
	if o.Proxy || o.ProxyOnly || o.LabRuntime {
		return errors.New("--dns-only runs the DNS server alone: drop --proxy, --proxy-only and --lab-runtime (or use --dns with the full agent)")
	}
	s, err := resolveDNS(o, os.ReadFile)
	if err != nil {
		return err
	}
	name := o.NodeName
	if name == "" {
		name, _ = os.Hostname()
	}
	client, err := kube.Client(o.Kubeconfig, "flatnet-agent-dns/"+name)
	if err != nil {
		return err
	}
	return runDNS(ctx, client, s)
}
