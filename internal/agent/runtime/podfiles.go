package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// The per-pod /etc/hosts, /etc/resolv.conf and hostname, as the kubelet
// writes them (pkg/kubelet/kubelet_pods.go managedHostsFileContent,
// pkg/kubelet/network/dns). There is no cluster DNS in this runtime's
// configuration, so dnsPolicy ClusterFirst falls back to the node's
// resolver configuration, as a kubelet without --cluster-dns does.

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

// resolvConf is a parsed resolv.conf.
type resolvConf struct {
	Nameservers, Searches, Options []string
}

func parseResolvConf(data []byte) resolvConf {
	var r resolvConf
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			r.Nameservers = append(r.Nameservers, f[1])
		case "search", "domain":
			r.Searches = f[1:] // the last one wins, as in libc
		case "options":
			r.Options = append(r.Options, f[1:]...)
		}
	}
	return r
}

// podResolvConf builds the pod's /etc/resolv.conf from the node's and the
// pod's dnsPolicy and dnsConfig.
func podResolvConf(pod *v1.Pod, node resolvConf) []byte {
	var r resolvConf
	if pod.Spec.DNSPolicy != v1.DNSNone {
		r = resolvConf{
			Nameservers: slices.Clone(node.Nameservers),
			Searches:    slices.Clone(node.Searches),
			Options:     slices.Clone(node.Options),
		}
	}
	if dc := pod.Spec.DNSConfig; dc != nil {
		r.Nameservers = appendNew(r.Nameservers, dc.Nameservers...)
		r.Searches = appendNew(r.Searches, dc.Searches...)
		for _, o := range dc.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			// A pod option replaces a node option of the same name.
			r.Options = slices.DeleteFunc(r.Options, func(s string) bool {
				n, _, _ := strings.Cut(s, ":")
				return n == o.Name
			})
			r.Options = append(r.Options, opt)
		}
	}
	if len(r.Nameservers) > 3 {
		r.Nameservers = r.Nameservers[:3]
	}
	if len(r.Searches) > 32 {
		r.Searches = r.Searches[:32]
	}
	var b bytes.Buffer
	for _, ns := range r.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(r.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(r.Searches, " "))
	}
	if len(r.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(r.Options, " "))
	}
	return b.Bytes()
}

func appendNew(list []string, add ...string) []string {
	for _, a := range add {
		if !slices.Contains(list, a) {
			list = append(list, a)
		}
	}
	return list
}
