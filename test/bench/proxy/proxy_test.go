package main

import "testing"

func TestHasEndpoint(t *testing.T) {
	kubeProxy := `meta l4proto tcp dnat ip to numgen random mod 3 map { 0 : 10.245.0.107 . 8080, 1 : 10.245.0.151 . 8080 }`
	chains := `numgen random mod 2 vmap { 0 : goto ep-ABC-ns/a/tcp/http__10.245.0.107/8080, 1 : goto ep-DEF-ns/a/tcp/http__10.245.0.151/8080 }`
	for _, l := range []string{kubeProxy, chains} {
		for ip, want := range map[string]bool{"10.245.0.107": true, "10.245.0.151": true, "10.245.0.15": false, "10.245.0.10": false} {
			if got := hasEndpoint(l, ip, 8080); got != want {
				t.Errorf("hasEndpoint(%q, %s) = %v, want %v", l, ip, got, want)
			}
		}
		if hasEndpoint(l, "10.245.0.107", 80) {
			t.Errorf("hasEndpoint(%q, port 80) = true", l)
		}
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
