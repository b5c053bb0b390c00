package macvlan

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestLoad(t *testing.T) {
	base := `"cniVersion":"1.1.0","name":"mv","type":"macvlan"`
	for _, tc := range []struct {
		name    string
		stdin   string
		args    string
		code    uint   // 0: success
		msg     string // part of the error message
		mode    netlink.MacvlanMode
		mac     string
		layer3  bool
		master  string
		mtu     int
		inCont  bool
		bcqueue uint32
	}{
		{name: "defaults", stdin: `{` + base + `}`, mode: netlink.MACVLAN_MODE_BRIDGE},
		{name: "full", stdin: `{` + base + `,"master":"eth1","mode":"vepa","mtu":1400,"linkInContainer":true,"bcqueuelen":100,"ipam":{"type":"host-local"}}`,
			mode: netlink.MACVLAN_MODE_VEPA, master: "eth1", mtu: 1400, inCont: true, bcqueue: 100, layer3: true},
		{name: "bridge", stdin: `{` + base + `,"mode":"bridge"}`, mode: netlink.MACVLAN_MODE_BRIDGE},
		{name: "private", stdin: `{` + base + `,"mode":"private"}`, mode: netlink.MACVLAN_MODE_PRIVATE},
		{name: "passthru", stdin: `{` + base + `,"mode":"passthru"}`, mode: netlink.MACVLAN_MODE_PASSTHRU},
		{name: "unknown mode", stdin: `{` + base + `,"mode":"source"}`, code: cnierr.InvalidConfig, msg: `unknown mode "source"`},
		{name: "negative mtu", stdin: `{` + base + `,"mtu":-1}`, code: cnierr.InvalidConfig, msg: `"mtu" -1`},
		{name: "long master", stdin: `{` + base + `,"master":"abcdefghijklmnop"}`, code: cnierr.InvalidConfig, msg: `"master"`},
		{name: "not json", stdin: `{"mode":`, code: cnierr.DecodingFailure},
		{name: "mtu wrong type", stdin: `{` + base + `,"mtu":"1500"}`, code: cnierr.DecodingFailure},
		{name: "empty ipam is L2", stdin: `{` + base + `,"ipam":{}}`, mode: netlink.MACVLAN_MODE_BRIDGE},
		{name: "mac from config", stdin: `{` + base + `,"mac":"02:00:00:00:00:01"}`, mac: "02:00:00:00:00:01"},
		{name: "mac from CNI_ARGS wins over config", stdin: `{` + base + `,"mac":"02:00:00:00:00:01"}`,
			args: "IgnoreUnknown=1;K8S_POD_NAME=x;MAC=02:00:00:00:00:02", mac: "02:00:00:00:00:02"},
		{name: "runtimeConfig mac wins", stdin: `{` + base + `,"mac":"02:00:00:00:00:01","runtimeConfig":{"mac":"02:00:00:00:00:03"}}`,
			args: "MAC=02:00:00:00:00:02", mac: "02:00:00:00:00:03"},
		{name: "bad mac", stdin: `{` + base + `,"mac":"zz"}`, code: cnierr.InvalidConfig, msg: `"mac": invalid MAC address "zz"`},
		{name: "multicast mac", stdin: `{` + base + `,"runtimeConfig":{"mac":"01:00:5e:00:00:01"}}`, code: cnierr.InvalidConfig, msg: "multicast"},
		{name: "zero mac", stdin: `{` + base + `,"mac":"00:00:00:00:00:00"}`, code: cnierr.InvalidConfig, msg: "all zeroes"},
		{name: "long mac", stdin: `{` + base + `,"mac":"02:00:00:00:00:00:00:01"}`, code: cnierr.InvalidConfig, msg: "6-byte"},
		{name: "bad CNI_ARGS mac", stdin: `{` + base + `}`, args: "MAC=nope", code: cnierr.InvalidConfig, msg: "CNI_ARGS MAC"},
		{name: "unknown CNI_ARGS key", stdin: `{` + base + `}`, args: "FOO=bar", code: cnierr.InvalidEnvironment, msg: "CNI_ARGS"},
		{name: "unknown CNI_ARGS key ignored", stdin: `{` + base + `}`, args: "IgnoreUnknown=true;FOO=bar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Load([]byte(tc.stdin), tc.args)
			if tc.code != 0 {
				code, _ := cnierr.Code(err)
				if code != tc.code || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("err = %v (code %d), want code %d mentioning %q", err, code, tc.code, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.mode == netlink.MACVLAN_MODE_DEFAULT {
				tc.mode = netlink.MACVLAN_MODE_BRIDGE
			}
			if n.mode != tc.mode {
				t.Errorf("mode = %v, want %v", n.mode, tc.mode)
			}
			if got := n.mac.String(); got != tc.mac {
				t.Errorf("mac = %q, want %q", got, tc.mac)
			}
			if n.Layer3() != tc.layer3 || n.Master != tc.master || n.MTU != tc.mtu || n.LinkInContainer != tc.inCont || n.BCQueueLen != tc.bcqueue {
				t.Errorf("conf = %+v", n)
			}
		})
	}
}

func TestModeNames(t *testing.T) {
	for _, m := range modes {
		got, err := parseMode(modeName(m.mode))
		if err != nil || got != m.mode {
			t.Errorf("round trip of %s: %v %v", m.name, got, err)
		}
	}
	if modeName(netlink.MACVLAN_MODE_SOURCE) == "" {
		t.Error("empty name for an unknown mode")
	}
}

func TestParseMACAcceptsLocalUnicast(t *testing.T) {
	hw, err := parseMAC("0a:58:0a:f4:00:05")
	if err != nil || !strings.EqualFold(hw.String(), "0a:58:0a:f4:00:05") {
		t.Fatalf("%v %v", hw, err)
	}
	_ = net.HardwareAddr(nil)
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"mv","type":"macvlan","master":"eth0","mode":"bridge","mtu":1500,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.1.0.0/16"}]]}}`), "")
	f.Add([]byte(`{"cniVersion":"1.0.0","mac":"02:00:00:00:00:01","runtimeConfig":{"mac":"02:00:00:00:00:02"}}`), "IgnoreUnknown=1;MAC=02:00:00:00:00:03")
	f.Add([]byte(`{"mode":"passthru","linkInContainer":true,"bcqueuelen":4294967295}`), "MAC=")
	f.Add([]byte(`{"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}]}}`), ";;=")
	f.Fuzz(func(t *testing.T, stdin []byte, args string) {
		n, err := Load(stdin, args)
		if err != nil {
			if code, ok := cnierr.Code(err); !ok || code == cnierr.Internal {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if n.mac != nil && len(n.mac) != 6 {
			t.Fatalf("accepted MAC %v", n.mac)
		}
		// The rest of ADD's pure path must not panic on what Load accepts.
		if p, err := planLink(n, master{Name: "m", Index: 2, MTU: 1500}, "eth0", "fmvtest"); err == nil {
			_ = p.link()
		}
		if _, err := decode(stdin); err != nil {
			t.Fatalf("decode failed where Load succeeded: %v", err)
		}
	})
}
