package process

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/flatnet/flatnet/internal/resolvconf"
	v1 "k8s.io/api/core/v1"
)

// The per-pod /etc/hosts, /etc/resolv.conf and hostname, as the kubelet
// writes them (pkg/kubelet/kubelet_pods.go managedHostsFileContent,
// pkg/kubelet/network/dns) and the CRI runtime renders them (containerd's
// parseDNSOptions: search, then nameservers, then options).
//
// resolv.conf follows the kubelet's GetPodDNS step by step, as plain data:
// the node's file parsed as the kubelet parses it, the dnsPolicy picking a
// base (ClusterFirst: the cluster DNS servers, the cluster search domains
// before the node's, and only ndots:5; Default: the node's; None: empty),
// the pod's dnsConfig appended with duplicates dropped and options merged by
// name, then the kubelet's limits with its truncation. Without cluster DNS
// servers (--cluster-dns unset) ClusterFirst falls back to Default with a
// MissingClusterDNS warning, as a kubelet without --cluster-dns does. The
// warnings are returned as data; the worker records them as events.

// podHostname returns the hostname and, with a subdomain, the FQDN.
func podHostname(pod *v1.Pod, clusterDomain string) (host, fqdn string) {
	host = pod.Name
	if pod.Spec.Hostname != "" {
		host = pod.Spec.Hostname
	}
	if len(host) > 63 {
		host = strings.TrimRight(host[:63], "-.")
	}
	if pod.Spec.Subdomain != "" {
		fqdn = fmt.Sprintf("%s.%s.%s.svc.%s", host, pod.Spec.Subdomain, pod.Namespace, clusterDomain)
		if pod.Spec.SetHostnameAsFQDN != nil && *pod.Spec.SetHostnameAsFQDN && len(fqdn) <= 64 {
			host = fqdn
		}
	}
	return host, fqdn
}

// hostsFile is the pod's /etc/hosts.
func hostsFile(pod *v1.Pod, podIPs []string, clusterDomain string) []byte {
	var b bytes.Buffer
	b.WriteString("# Kubernetes-managed hosts file.\n")
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	b.WriteString("fe00::0\tip6-localnet\n")
	b.WriteString("fe00::0\tip6-mcastprefix\n")
	b.WriteString("fe00::1\tip6-allnodes\n")
	b.WriteString("fe00::2\tip6-allrouters\n")
	host, fqdn := podHostname(pod, clusterDomain)
	for _, ip := range podIPs {
		if fqdn != "" && fqdn != host {
			fmt.Fprintf(&b, "%s\t%s\t%s\n", ip, fqdn, host)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", ip, host)
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes()
}

// nodeHostsFile is a host-network pod's /etc/hosts: the node's, plus the
// pod's hostAliases.
func nodeHostsFile(pod *v1.Pod, node []byte) []byte {
	var b bytes.Buffer
	b.Write(node)
	if len(node) > 0 && node[len(node)-1] != '\n' {
		b.WriteByte('\n')
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes()
}

// The kubelet's limits on a pod's DNS config (pkg/apis/core/validation:
// MaxDNSNameservers, MaxDNSSearchPaths, MaxDNSSearchListChars; a search
// entry longer than a DNS-1123 subdomain is dropped, as some libcs abort on
// it).
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
	maxDNSSearchLen       = 253
)

// resolvConf is a parsed resolv.conf, and the DNS config of a pod.
type resolvConf struct {
	Nameservers, Searches, Options []string
}

// parseResolvConf parses the node's resolv.conf as the kubelet does.
func parseResolvConf(data []byte) resolvConf { return resolvConf(resolvconf.Parse(data)) }

// dnsSettings are the node's inputs to a pod's DNS config: the kubelet's
// --cluster-dns and --cluster-domain, and its --resolv-conf file parsed.
type dnsSettings struct {
	ClusterDNS    []netip.Addr
	ClusterDomain string
	Node          resolvConf
}

// dnsWarning is something the kubelet reports while forming a pod's DNS
// config: an event on the pod (or, with OnNode, on the Node), or with
// LogOnly just a log line.
type dnsWarning struct {
	OnNode, LogOnly bool
	Reason, Message string
}

// podDNS is the kubelet's GetPodDNS: the pod's DNS config and the warnings
// to record.
func podDNS(pod *v1.Pod, s dnsSettings) (resolvConf, []dnsWarning) {
	var warns []dnsWarning
	// Each policy starts from a copy of the node's config, as the kubelet
	// re-reads its file for every pod.
	r := resolvConf{
		Nameservers: slices.Clone(s.Node.Nameservers),
		Searches:    slices.Clone(s.Node.Searches),
		Options:     slices.Clone(s.Node.Options),
	}
	cluster := false // getPodDNSType
	switch pod.Spec.DNSPolicy {
	case v1.DNSNone:
		r = resolvConf{}
	case v1.DNSClusterFirstWithHostNet:
		cluster = true
	case v1.DNSClusterFirst:
		// A host-network pod with ClusterFirst gets the node's config.
		cluster = !pod.Spec.HostNetwork
	case v1.DNSDefault:
	default:
		// The API server rejects this; the kubelet falls back to ClusterFirst.
		warns = append(warns, dnsWarning{LogOnly: true, Reason: "InvalidDNSPolicy",
			Message: fmt.Sprintf("invalid DNSPolicy=%v: falling back to %s", pod.Spec.DNSPolicy, v1.DNSClusterFirst)})
		cluster = true
	}
	if cluster && len(s.ClusterDNS) > 0 {
		// The cluster DNS servers are the only nameservers: they forward
		// what they do not answer themselves. The node's options are dropped.
		r.Nameservers = nil
		for _, ip := range s.ClusterDNS {
			r.Nameservers = append(r.Nameservers, ip.String())
		}
		if d := s.ClusterDomain; d != "" { // generateSearchesForDNSClusterFirst
			r.Searches = omitDuplicates(append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, r.Searches...))
		}
		r.Options = []string{"ndots:5"}
	} else if cluster {
		msg := fmt.Sprintf("kubelet does not have ClusterDNS IP configured and cannot create Pod using %q policy. Falling back to %q policy.", v1.DNSClusterFirst, v1.DNSDefault)
		warns = append(warns,
			dnsWarning{OnNode: true, Reason: "MissingClusterDNS", Message: msg},
			dnsWarning{Reason: "MissingClusterDNS", Message: fmt.Sprintf("pod: %q. %s", fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID), msg)})
	}
	if dc := pod.Spec.DNSConfig; dc != nil { // appendDNSConfig
		r.Nameservers = omitDuplicates(append(r.Nameservers, dc.Nameservers...))
		r.Searches = omitDuplicates(append(r.Searches, dc.Searches...))
		r.Options = mergeDNSOptions(r.Options, dc.Options)
	}
	// formDNSConfigFitsLimits
	if len(r.Nameservers) > maxDNSNameservers {
		r.Nameservers = r.Nameservers[:maxDNSNameservers]
		warns = append(warns, dnsWarning{Reason: "DNSConfigForming", Message: "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: " + strings.Join(r.Nameservers, " ")})
	}
	var cut bool
	if r.Searches, cut = searchFitsLimits(r.Searches); cut {
		warns = append(warns, dnsWarning{Reason: "DNSConfigForming", Message: "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: " + strings.Join(r.Searches, " ")})
	}
	return r, warns
}

// searchFitsLimits is the kubelet's formDNSSearchFitsLimits: at most 32
// entries, none longer than 253 characters, and the line cut from its end
// to at most 2048 characters. cut says whether anything was dropped.
func searchFitsLimits(s []string) (_ []string, cut bool) {
	if len(s) > maxDNSSearchPaths {
		s, cut = s[:maxDNSSearchPaths], true
	}
	kept := s[:0]
	for _, e := range s {
		if len(e) > maxDNSSearchLen {
			cut = true
			continue
		}
		kept = append(kept, e)
	}
	s = kept
	for n := len(strings.Join(s, " ")); n > maxDNSSearchListChars; {
		n -= len(s[len(s)-1]) + 1
		s, cut = s[:len(s)-1], true
	}
	return s, cut
}

// mergeDNSOptions is the kubelet's: options are keyed by name, the pod's
// replacing the base's, "name" or "name:value" when the value is not
// empty. The kubelet's order is a Go map's (random); ours is each name's
// first appearance, so the file is stable.
func mergeDNSOptions(base []string, pod []v1.PodDNSConfigOption) []string {
	var names []string
	vals := map[string]string{}
	set := func(name, val string) {
		if _, ok := vals[name]; !ok {
			names = append(names, name)
		}
		vals[name] = val
	}
	for _, o := range base {
		name, val, _ := strings.Cut(o, ":")
		set(name, val)
	}
	for _, o := range pod {
		set(o.Name, ptrValue(o.Value))
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if v := vals[n]; v != "" {
			n += ":" + v
		}
		out = append(out, n)
	}
	return out
}

func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// file renders the config as the CRI runtime writes it (containerd's
// parseDNSOptions): search, nameservers, options.
func (r resolvConf) file() []byte {
	var b bytes.Buffer
	if len(r.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(r.Searches, " "))
	}
	for _, ns := range r.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(r.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(r.Options, " "))
	}
	return b.Bytes()
}

// omitDuplicates keeps the first of each string, in order.
func omitDuplicates(list []string) []string {
	seen := map[string]bool{}
	out := list[:0:0]
	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// PodResolvConf is the resolv.conf this runtime writes for pod on a node
// whose own file is node, given the agent's --cluster-dns and
// --cluster-domain: the expected file for tests that read a pod's.
func PodResolvConf(pod *v1.Pod, clusterDNS []netip.Addr, clusterDomain string, node []byte) []byte {
	r, _ := podDNS(pod, dnsSettings{ClusterDNS: clusterDNS, ClusterDomain: clusterDomain, Node: parseResolvConf(node)})
	return r.file()
}
