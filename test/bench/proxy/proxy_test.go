package main

import (
	"net/netip"
	"regexp"
	"slices"
	"testing"
)

func TestEndpointRE(t *testing.T) {
	for _, l := range []string{
		// kube-proxy nftables: a dnat map from the service chain.
		`meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.246.0.107 . 8080, 1 : 10.246.0.151 . 8080 }`,
		// endpoint chains named after the endpoint.
		`numgen random mod 2 vmap { 0 : goto ep-ABC-ns/a/tcp/http__10.246.0.107/8080, 1 : goto ep-DEF-ns/a/tcp/http__10.246.0.151/8080 }`,
		// iptables-nft, as nft monitor prints a DNAT.
		`add rule ip nat KUBE-SEP-X meta l4proto tcp   counter packets 0 bytes 0 dnat to 10.246.0.107:8080`,
	} {
		got := map[string]bool{}
		for _, m := range endpointRE.FindAllStringSubmatch(l, -1) {
			got[m[1]] = true
		}
		if !got["10.246.0.107"] || got["10.246.0.15"] || got["10.246.0.10"] {
			t.Errorf("%q: endpoints %v", l, got)
		}
	}
	if endpointRE.MatchString("ip daddr 10.246.0.107 tcp dport 80") {
		t.Error("a service port taken for an endpoint")
	}
}

func TestSvcListingREs(t *testing.T) {
	for _, c := range []struct {
		re   *regexp.Regexp
		line string
		want string
	}{
		{nftSvcRE, `		elements = { 10.96.0.12 . tcp . 80 : goto service-ABC-proxybench/svc-00001/tcp/http,`, "10.96.0.12"},
		{iptSvcRE, `		ip daddr 10.96.0.12  meta l4proto tcp  tcp dport 80 counter packets 0 bytes 0 jump KUBE-SVC-X`, "10.96.0.12"},
		{iptSvcRE, `		ip saddr != 10.244.0.0/14 ip daddr 10.96.0.12 tcp dport 80 counter jump KUBE-MARK-MASQ`, "10.96.0.12"},
		{iptSvcRE, `		ip daddr 10.96.0.12 tcp dport 8080 counter jump KUBE-SVC-X`, ""},
	} {
		got := ""
		if m := c.re.FindStringSubmatch(c.line); m != nil {
			got = m[1]
		}
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.line, got, c.want)
		}
	}
}

func TestScanAddrs(t *testing.T) {
	// nfgenmsg, then an attribute holding 10.96.0.12, one holding
	// 10.246.1.2 (a DNAT's immediate), one with 10.96.0.13 at an
	// unaligned offset (inside a name: not an address).
	data := []byte{2, 0, 0, 0,
		8, 0, 1, 0, 10, 96, 0, 12,
		8, 0, 1, 0, 10, 246, 1, 2,
		12, 0, 2, 0, 'x', 10, 96, 0, 13, 0, 0, 0,
		8, 0, 1, 0, 10, 96, 0, 12}
	got := scanAddrs(data, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix(endpointsRange)})
	want := []netip.Addr{netip.MustParseAddr("10.96.0.12"), netip.MustParseAddr("10.246.1.2")}
	if !slices.Equal(got, want) {
		t.Errorf("scanAddrs = %v, want %v", got, want)
	}
	// NFTA_SET_ELEM_LIST_TABLE "kp", NFTA_SET_ELEM_LIST_SET "service-ips".
	elems := []byte{2, 0, 0, 0, 7, 0, 1, 0, 'k', 'p', 0, 0, 16, 0, 2, 0}
	elems = append(elems, "service-ips\x00"...)
	if got := objectName(elems); got != "service-ips" {
		t.Errorf("objectName = %q, want service-ips", got)
	}
}

func TestPercentile(t *testing.T) {
	v := make([]float64, 50)
	for i := range v {
		v[i] = float64(i + 1)
	}
	if got := percentile(v, 99); got != 50 {
		t.Errorf("p99 of 1..50 = %v, want 50 (nearest rank)", got)
	}
	if got := percentile(v, 50); got != 25 {
		t.Errorf("p50 of 1..50 = %v, want 25", got)
	}
}

func TestParseHistograms(t *testing.T) {
	text := `# HELP kubeproxy_sync_proxy_rules_duration_seconds x
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 1.5
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.25
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3
kubeproxy_network_programming_duration_seconds_sum 2
kubeproxy_network_programming_duration_seconds_count 4
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.5
`
	h := parseHistograms(text, "kubeproxy_", "sync_proxy_rules_duration_seconds", "network_programming_duration_seconds")
	if got := h["sync_proxy_rules_duration_seconds"]; got != (histogram{1.5, 3}) {
		t.Errorf("sync: %+v, want IPv4 only {1.5 3}", got)
	}
	if got := h["network_programming_duration_seconds"]; got != (histogram{2, 4}) {
		t.Errorf("network programming: %+v", got)
	}
	if _, ok := h["sync_full_proxy_rules_duration_seconds"]; ok {
		t.Error("a histogram not asked for was returned")
	}
}
