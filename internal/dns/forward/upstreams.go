package forward

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// DefaultResolvConf is where the node's upstream resolvers are read from.
const DefaultResolvConf = "/etc/resolv.conf"

// UpstreamsFromResolvConf reads the nameserver lines of the resolv.conf at
// path and returns them as "addr:53" upstreams, in file order.
//
// Loopback nameservers (systemd-resolved's 127.0.0.53, a local dnsmasq) are
// kept: the agent runs in the node's network namespace, where they are the
// node's real resolver. CoreDNS's forwarding loops with 127.0.0.53 come from
// CoreDNS running in a pod, where that address is the pod itself; that does
// not apply here. The loop that can apply is the node's resolv.conf naming the
// cluster DNS address itself (a NodeLocal DNSCache style setup), so every
// address in exclude (the server's own listen addresses) is dropped, and an
// error is returned when nothing is left.
func UpstreamsFromResolvConf(path string, exclude ...netip.Addr) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading upstream resolvers: %w (pass the upstreams explicitly)", err)
	}
	defer f.Close()
	ups, err := parseResolvConf(f, exclude)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ups, nil
}

// ParseResolvConf is UpstreamsFromResolvConf on a resolv.conf's content.
func ParseResolvConf(r io.Reader, exclude ...netip.Addr) ([]string, error) {
	return parseResolvConf(r, exclude)
}

func parseResolvConf(r io.Reader, exclude []netip.Addr) ([]string, error) {
	var ups []string
	var dropped []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		addr, err := netip.ParseAddr(fields[1])
		if err != nil {
			// glibc ignores a bad nameserver line too; do not fail the node on it.
			continue
		}
		if excluded(addr, exclude) {
			dropped = append(dropped, addr.String())
			continue
		}
		ups = append(ups, netip.AddrPortFrom(addr, 53).String())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading nameserver lines: %w", err)
	}
	if len(ups) == 0 {
		if len(dropped) > 0 {
			return nil, fmt.Errorf("only nameservers %s, which are this DNS server's own addresses (forwarding there would loop): pass the upstreams explicitly", strings.Join(dropped, ", "))
		}
		return nil, fmt.Errorf("no nameserver line: pass the upstreams explicitly")
	}
	return ups, nil
}

func excluded(a netip.Addr, exclude []netip.Addr) bool {
	for _, e := range exclude {
		if a.WithZone("").Unmap() == e.WithZone("").Unmap() {
			return true
		}
	}
	return false
}

// ParseUpstreams validates an explicit upstream list ("addr" or "addr:port",
// IPv6 as "[addr]:port"), the form a flag will pass.
func ParseUpstreams(list []string) ([]string, error) {
	var ups []string
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(s); err == nil {
			ups = append(ups, ap.String())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("upstream %q: want an IP address or address:port", s)
		}
		ups = append(ups, netip.AddrPortFrom(a, 53).String())
	}
	if len(ups) == 0 {
		return nil, fmt.Errorf("no upstream resolver given")
	}
	return ups, nil
}
