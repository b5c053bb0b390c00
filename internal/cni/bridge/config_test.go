package bridge

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name, conf, args string
		code             uint   // 0: success
		msg              string // substring of the error
		check            func(t *testing.T, n *NetConf)
	}{
		{
			name: "reference example",
			conf: `{"cniVersion":"1.0.0","name":"mynet","type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,
				"ipam":{"type":"host-local","subnet":"10.10.0.0/16","routes":[{"dst":"0.0.0.0/0"}]}}`,
			check: func(t *testing.T, n *NetConf) {
				if n.BrName != "cni0" || !n.IsGW || !n.IPMasq || n.IPAM.Type != "host-local" || !n.Layer3() {
					t.Errorf("got %+v", n)
				}
			},
		},
		{
			name: "defaults",
			conf: `{"cniVersion":"1.0.0","name":"n","type":"bridge"}`,
			check: func(t *testing.T, n *NetConf) {
				if n.BrName != DefaultBridge || n.IsGW || n.Layer3() || n.mac != nil || n.vlans != nil {
					t.Errorf("got %+v", n)
				}
			},
		},
		{
			name: "isDefaultGateway implies isGateway",
			conf: `{"name":"n","isDefaultGateway":true}`,
			check: func(t *testing.T, n *NetConf) {
				if !n.IsGW {
					t.Error("IsGW not set")
				}
			},
		},
		{
			name: "MAC precedence: runtimeConfig over args over CNI_ARGS",
			conf: `{"name":"n","args":{"cni":{"mac":"02:00:00:00:00:02"}},"runtimeConfig":{"mac":"02:00:00:00:00:03"}}`,
			args: "IgnoreUnknown=1;MAC=02:00:00:00:00:01",
			check: func(t *testing.T, n *NetConf) {
				if n.mac.String() != "02:00:00:00:00:03" {
					t.Errorf("mac = %s", n.mac)
				}
			},
		},
		{
			name: "MAC from CNI_ARGS",
			conf: `{"name":"n"}`,
			args: "MAC=02:00:00:00:00:01",
			check: func(t *testing.T, n *NetConf) {
				if n.mac.String() != "02:00:00:00:00:01" {
					t.Errorf("mac = %s", n.mac)
				}
			},
		},
		{
			name: "vlan trunk",
			conf: `{"name":"n","vlanTrunk":[{"minID":10,"maxID":12},{"id":5},{"id":11}]}`,
			check: func(t *testing.T, n *NetConf) {
				if d := cmp.Diff([]int{5, 10, 11, 12}, n.vlans); d != "" {
					t.Errorf("vlans (-want +got):\n%s", d)
				}
			},
		},
		{name: "not JSON", conf: `{"name":`, code: cnierr.DecodingFailure},
		{name: "wrong type", conf: `{"name":"n","mtu":"big"}`, code: cnierr.DecodingFailure},
		{name: "vlan too big", conf: `{"name":"n","vlan":4095}`, code: cnierr.InvalidConfig, msg: `"vlan"`},
		{name: "vlan negative", conf: `{"name":"n","vlan":-1}`, code: cnierr.InvalidConfig, msg: `"vlan"`},
		{name: "trunk min>max", conf: `{"name":"n","vlanTrunk":[{"minID":12,"maxID":10}]}`, code: cnierr.InvalidConfig, msg: "greater"},
		{name: "trunk min only", conf: `{"name":"n","vlanTrunk":[{"minID":12}]}`, code: cnierr.InvalidConfig, msg: "maxID is missing"},
		{name: "trunk bad id", conf: `{"name":"n","vlanTrunk":[{"id":0}]}`, code: cnierr.InvalidConfig, msg: "trunk id"},
		{name: "hairpin and promisc", conf: `{"name":"n","hairpinMode":true,"promiscMode":true}`, code: cnierr.InvalidConfig, msg: "hairpinMode"},
		{name: "ipam with disableContainerInterface", conf: `{"name":"n","disableContainerInterface":true,"ipam":{"type":"host-local"}}`, code: cnierr.InvalidConfig, msg: "disableContainerInterface"},
		{name: "bridge name too long", conf: `{"name":"n","bridge":"abcdefghijklmnop"}`, code: cnierr.InvalidConfig, msg: "longer than 15"},
		{name: "bridge name with slash", conf: `{"name":"n","bridge":"a/b"}`, code: cnierr.InvalidConfig, msg: `"bridge"`},
		{name: "vlan gateway name too long", conf: `{"name":"n","bridge":"abcdefghijklm","vlan":100,"isGateway":true}`, code: cnierr.InvalidConfig, msg: "gateway interface name"},
		{name: "bad mtu", conf: `{"name":"n","mtu":20}`, code: cnierr.InvalidConfig, msg: `"mtu"`},
		{name: "bad mac", conf: `{"name":"n","runtimeConfig":{"mac":"zz"}}`, code: cnierr.InvalidConfig, msg: "MAC"},
		{name: "multicast mac", conf: `{"name":"n","runtimeConfig":{"mac":"01:00:5e:00:00:01"}}`, code: cnierr.InvalidConfig, msg: "multicast"},
		{name: "bad CNI_ARGS", conf: `{"name":"n"}`, args: "MAC", code: cnierr.InvalidEnvironment},
		{name: "unknown masq backend", conf: `{"name":"n","ipMasqBackend":"pf"}`, code: cnierr.InvalidConfig, msg: "ipMasqBackend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Load([]byte(tc.conf), tc.args)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				tc.check(t, n)
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded, want code %d", tc.code)
			}
			if code, _ := cnierr.Code(err); code != tc.code {
				t.Errorf("code %d, want %d: %v", code, tc.code, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"mynet","type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","subnet":"10.10.0.0/16"}}`,
		`{"name":"n","vlanTrunk":[{"minID":1,"maxID":4094},{"id":5}],"vlan":3}`,
		`{"name":"n","runtimeConfig":{"mac":"02:00:00:00:00:03"},"args":{"cni":{"mac":"x"}}}`,
		`{"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"a"}]}}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s), "MAC=02:00:00:00:00:01")
	}
	f.Fuzz(func(t *testing.T, conf []byte, args string) {
		n, err := Load(conf, args)
		if err != nil {
			if _, ok := cnierr.Code(err); !ok {
				t.Errorf("error without a code: %v", err)
			}
			return
		}
		if n.BrName == "" || n.Vlan < 0 || n.Vlan > 4094 || (n.HairpinMode && n.PromiscMode) {
			t.Errorf("Load accepted %+v", n)
		}
		for _, v := range n.vlans {
			if v < 1 || v > 4094 {
				t.Errorf("trunk VLAN %d accepted", v)
			}
		}
	})
}
