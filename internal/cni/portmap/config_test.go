package portmap

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestParseConfig(t *testing.T) {
	full := `{"cniVersion":"1.1.0","name":"net1","type":"portmap","backend":"iptables","snat":false,
		"markMasqBit":5,"masqAll":true,"conditionsV4":["-s","1.2.3.4"],"conditionsV6":["!","-s","12::34"],
		"runtimeConfig":{"portMappings":[
			{"hostPort":8080,"containerPort":80,"protocol":"tcp"},
			{"hostPort":53,"containerPort":5353,"protocol":"UDP","hostIP":"10.0.0.1"},
			{"hostPort":9,"containerPort":9,"protocol":"sctp","hostIP":"::ffff:10.0.0.2"},
			{"hostPort":7,"containerPort":7}]}}`
	cfg, err := parseConfig([]byte(full), true)
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Name: "net1", CNIVersion: "1.1.0", Backend: "iptables", SNAT: false, MasqAll: true, MarkBit: 5,
		ConditionsV4: []string{"-s", "1.2.3.4"}, ConditionsV6: []string{"!", "-s", "12::34"},
		Mappings: []Mapping{
			{Protocol: "tcp", HostPort: 8080, ContainerPort: 80},
			{Protocol: "udp", HostPort: 53, ContainerPort: 5353, HostIP: netip.MustParseAddr("10.0.0.1")},
			{Protocol: "sctp", HostPort: 9, ContainerPort: 9, HostIP: netip.MustParseAddr("10.0.0.2")},
			{Protocol: "tcp", HostPort: 7, ContainerPort: 7},
		},
	}
	if d := cmp.Diff(want, cfg, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}

	// Defaults: snat on, bit 13, automatic backend; nft conditions imply
	// nftables, externalSetMarkChain implies iptables.
	cfg, err = parseConfig([]byte(`{"name":"n","conditionsV4":["ip saddr 10.0.0.0/8"]}`), true)
	if err != nil || !cfg.SNAT || cfg.MarkBit != 13 || cfg.Backend != backendNFT {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	cfg, err = parseConfig([]byte(`{"name":"n","externalSetMarkChain":"KUBE-MARK-MASQ"}`), true)
	if err != nil || cfg.Backend != backendIPT || cfg.ExternalSetMarkChain != "KUBE-MARK-MASQ" {
		t.Fatalf("externalSetMarkChain: %+v, %v", cfg, err)
	}
	cfg, err = parseConfig([]byte(`{"name":"n"}`), true)
	if err != nil || cfg.Backend != "" || cfg.Prev != nil {
		t.Fatalf("automatic backend: %+v, %v", cfg, err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	pm := func(m string) string { return `{"name":"n","runtimeConfig":{"portMappings":[` + m + `]}}` }
	for _, c := range []struct {
		name, conf string
		code       uint
		msg        string
	}{
		{"not json", `{`, cnierr.DecodingFailure, "decoding"},
		{"wrong type", `{"name":"n","snat":"yes"}`, cnierr.DecodingFailure, "decoding"},
		{"bad prevResult", `{"name":"n","cniVersion":"1.0.0","prevResult":{"ips":[{"address":"nope"}]}}`, cnierr.DecodingFailure, "prevResult"},
		{"host port 0", pm(`{"hostPort":0,"containerPort":80,"protocol":"tcp"}`), cnierr.InvalidConfig, "portMappings[0]"},
		{"host port big", pm(`{"hostPort":1,"containerPort":1},{"hostPort":65536,"containerPort":80}`), cnierr.InvalidConfig, "portMappings[1]"},
		{"container port negative", pm(`{"hostPort":80,"containerPort":-1}`), cnierr.InvalidConfig, "containerPort -1"},
		{"fraction", pm(`{"hostPort":80.5,"containerPort":80}`), cnierr.InvalidConfig, "hostPort 80.5"},
		{"missing port", pm(`{"containerPort":80}`), cnierr.InvalidConfig, "hostPort is missing"},
		{"protocol", pm(`{"hostPort":80,"containerPort":80,"protocol":"icmp"}`), cnierr.InvalidConfig, `protocol "icmp"`},
		{"host ip", pm(`{"hostPort":80,"containerPort":80,"hostIP":"10.0.0.300"}`), cnierr.InvalidConfig, "hostIP"},
		{"host ip zone", pm(`{"hostPort":80,"containerPort":80,"hostIP":"fe80::1%eth0"}`), cnierr.InvalidConfig, "hostIP"},
		{"host ip multicast", pm(`{"hostPort":80,"containerPort":80,"hostIP":"224.0.0.1"}`), cnierr.InvalidConfig, "hostIP"},
		{"backend", `{"name":"n","backend":"ebpf"}`, cnierr.InvalidConfig, `unknown backend "ebpf"`},
		{"mark bit", `{"name":"n","markMasqBit":32}`, cnierr.InvalidConfig, "markMasqBit 32"},
		{"mark and chain", `{"name":"n","markMasqBit":3,"externalSetMarkChain":"X"}`, cnierr.InvalidConfig, "exclusive"},
		{"chain name", `{"name":"n","externalSetMarkChain":"A-VERY-LONG-CHAIN-NAME-OVER-28"}`, cnierr.InvalidConfig, "externalSetMarkChain"},
		{"nft with iptables options", `{"name":"n","backend":"nftables","externalSetMarkChain":"X"}`, cnierr.InvalidConfig, "externalSetMarkChain"},
		{"iptables with nft conditions", `{"name":"n","backend":"iptables","conditionsV6":["ip6 saddr ::1"]}`, cnierr.InvalidConfig, "conditionsV6"},
		{"mixed conditions", `{"name":"n","conditionsV4":["-s","1.2.3.4"],"conditionsV6":["ip6 saddr ::1"]}`, cnierr.InvalidConfig, "mixes"},
		{"nft condition injection", `{"name":"n","conditionsV4":["ip saddr 1.2.3.4; flush ruleset"]}`, cnierr.InvalidConfig, "conditionsV4[0]"},
		{"condition newline", `{"name":"n","conditionsV4":["-s","1.2.3.4\n-A X"]}`, cnierr.InvalidConfig, "conditionsV4[1]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseConfig([]byte(c.conf), true)
			if err == nil {
				t.Fatal("accepted")
			}
			if code, _ := cnierr.Code(err); code != c.code || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got code %d %q, want code %d mentioning %q", code, err, c.code, c.msg)
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":"tcp","hostIP":"::"}]}}`,
		`{"name":"n","backend":"iptables","conditionsV4":["-s","1.2.3.4"],"externalSetMarkChain":"K"}`,
		`{"name":"n","markMasqBit":31,"snat":false,"masqAll":true,"conditionsV6":["ip6 saddr ::1"]}`,
		`{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.1.0.2/24","interface":0}]}}`,
		`{"runtimeConfig":{"portMappings":[{"hostPort":"80","containerPort":1e3}]}}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseConfig(data, true)
		if err != nil {
			if _, ok := cnierr.Code(err); !ok {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		// Whatever parses must plan and render without panicking.
		p := buildPlan(cfg, Attachment{cfg.Name, "c", "eth0"}, netip.MustParsePrefix("10.1.0.2/24"), netip.MustParsePrefix("fd00::2/64"))
		renderNFT(p)
		renderIPT(p)
		for _, m := range cfg.Mappings {
			if m.HostPort == 0 || m.ContainerPort == 0 {
				t.Fatalf("port 0 accepted: %+v", m)
			}
		}
	})
}
