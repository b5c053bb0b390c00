// Package resolvconf reads a node's resolv.conf the way the kubelet does,
// for the lab's process runtime (pods' DNS config) and the agent's cluster
// DNS (the node's search path, for autopath) alike.
package resolvconf

import (
	"slices"
	"strings"
)

// File is a parsed resolv.conf.
type File struct {
	Nameservers, Searches, Options []string
}

// Parse parses data as the kubelet does (parseResolvConf in
// pkg/kubelet/network/dns): lines starting with '#' are comments;
// nameservers accumulate; the last search line wins, each entry without
// its trailing dot; the last options line wins. "domain" and ';' mean
// nothing to the kubelet, so nothing here either.
func Parse(data []byte) File {
	var r File
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) >= 2 {
				r.Nameservers = append(r.Nameservers, f[1])
			}
		case "search":
			r.Searches = nil
			for _, s := range f[1:] {
				r.Searches = append(r.Searches, strings.TrimSuffix(s, "."))
			}
		case "options":
			r.Options = slices.Clone(f[1:])
		}
	}
	return r
}
