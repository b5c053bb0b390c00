package bandwidth

import (
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestParseConfig(t *testing.T) {
	for _, tt := range []struct {
		name            string
		conf            string
		ingress, egress Limit
		wantCode        uint
		wantMsg         string
		lenientSucceeds bool
	}{
		{name: "no limits", conf: `{"cniVersion":"1.0.0","name":"n","type":"bandwidth"}`},
		{name: "static", conf: `{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":1000,"ingressBurst":2000,"egressRate":3000,"egressBurst":4000}`,
			ingress: Limit{1000, 2000}, egress: Limit{3000, 4000}},
		{name: "runtimeConfig only (kubelet annotations)", conf: `{"cniVersion":"1.1.0","name":"n","type":"bandwidth","runtimeConfig":{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295}}}`,
			ingress: Limit{10_000_000, 4294967295}},
		{name: "runtimeConfig overrides per direction", conf: `{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":1000,"ingressBurst":2000,"egressRate":3000,"egressBurst":4000,
			"runtimeConfig":{"bandwidth":{"egressRate":5000,"egressBurst":6000}}}`,
			ingress: Limit{1000, 2000}, egress: Limit{5000, 6000}},
		{name: "null runtime entry", conf: `{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":1000,"ingressBurst":2000,"runtimeConfig":{"bandwidth":null}}`,
			ingress: Limit{1000, 2000}},
		{name: "subnets accepted and ignored as in v1.10.0", conf: `{"cniVersion":"1.0.0","name":"n","type":"bandwidth","unshapedSubnets":["10.0.0.0/8"],"egressRate":3000,"egressBurst":4000}`,
			egress: Limit{3000, 4000}},
		{name: "rate without burst", conf: `{"cniVersion":"1.0.0","name":"n","ingressRate":1000}`, wantCode: 7, wantMsg: "ingressBurst is not set", lenientSucceeds: true},
		{name: "burst without rate", conf: `{"cniVersion":"1.0.0","name":"n","egressBurst":1000}`, wantCode: 7, wantMsg: "egressBurst is 1000 but egressRate is not set", lenientSucceeds: true},
		{name: "runtime burst without rate", conf: `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"bandwidth":{"egressBurst":1000}}}`,
			wantCode: 7, wantMsg: "runtimeConfig.bandwidth.egressBurst", lenientSucceeds: true},
		{name: "rate below a byte", conf: `{"cniVersion":"1.0.0","name":"n","ingressRate":7,"ingressBurst":100000}`, wantCode: 7, wantMsg: "ingressRate is 7", lenientSucceeds: true},
		{name: "burst below a byte", conf: `{"cniVersion":"1.0.0","name":"n","ingressRate":700,"ingressBurst":7}`, wantCode: 7, wantMsg: "ingressBurst is 7", lenientSucceeds: true},
		{name: "burst of 4GB", conf: `{"cniVersion":"1.0.0","name":"n","egressRate":700,"egressBurst":34359738360}`, wantCode: 7, wantMsg: "egressBurst is 34359738360 bits: it cannot be more than 4GB", lenientSucceeds: true},
		{name: "largest burst", conf: `{"cniVersion":"1.0.0","name":"n","egressRate":700,"egressBurst":34359738359}`, egress: Limit{700, 34359738359}},
		{name: "negative rate", conf: `{"cniVersion":"1.0.0","name":"n","ingressRate":-1,"ingressBurst":100}`, wantCode: 7, wantMsg: `"ingressRate"`},
		{name: "string rate", conf: `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"bandwidth":{"egressRate":"10M"}}}`, wantCode: 7, wantMsg: `runtimeConfig.bandwidth.egressRate`},
		{name: "fractional burst", conf: `{"cniVersion":"1.0.0","name":"n","ingressRate":1000,"ingressBurst":1.5}`, wantCode: 7, wantMsg: `ingressBurst`},
		{name: "broken JSON", conf: `{"cniVersion":"1.0.0",`, wantCode: 6},
		{name: "bad prevResult", conf: `{"cniVersion":"1.0.0","name":"n","prevResult":{"interfaces":"x"}}`, wantCode: 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseConfig([]byte(tt.conf), true)
			if tt.wantCode != 0 {
				code, _ := cnierr.Code(err)
				if code != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("got %v (code %d), want code %d mentioning %q", err, code, tt.wantCode, tt.wantMsg)
				}
				if _, err := parseConfig([]byte(tt.conf), false); (err == nil) != tt.lenientSucceeds {
					t.Errorf("lenient parse (DEL, GC): err %v, want success %v", err, tt.lenientSucceeds)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Ingress != tt.ingress || cfg.Egress != tt.egress {
				t.Errorf("limits: ingress %v egress %v, want %v %v", cfg.Ingress, cfg.Egress, tt.ingress, tt.egress)
			}
			if cfg.Name != "n" {
				t.Errorf("name %q", cfg.Name)
			}
		})
	}
}

func TestParseConfigPrevResult(t *testing.T) {
	conf := `{"cniVersion":"0.4.0","name":"n","type":"bandwidth","ingressRate":100000,"ingressBurst":20000,
	  "prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"br0"},{"name":"veth1"},{"name":"eth0","sandbox":"/run/netns/x"}],
	    "ips":[{"version":"4","address":"10.1.2.3/24","interface":2}]}}`
	cfg, err := parseConfig([]byte(conf), true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PrevResult == nil {
		t.Fatal("prevResult not parsed")
	}
}

func TestParseConfigNamesGenericField(t *testing.T) {
	_, err := parseConfig([]byte(`{"cniVersion":"1.0.0","name":5}`), true)
	if code, _ := cnierr.Code(err); code != 7 || !strings.Contains(err.Error(), `field "name"`) {
		t.Errorf("got %v (code %d), want code 7 naming field \"name\"", err, code)
	}
}
