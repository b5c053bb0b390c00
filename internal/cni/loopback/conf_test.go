package loopback

import (
	"encoding/json"
	"net"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func mustCIDR(t *testing.T, s string) net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return *n
}

func TestParseConfErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stdin string
		code  uint
	}{
		{"not json", `{`, cnierr.DecodingFailure},
		{"bad prevResult", `{"cniVersion":"1.0.0","name":"n","type":"loopback","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}}`, cnierr.DecodingFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConf([]byte(tc.stdin))
			if code, _ := cnierr.Code(err); code != tc.code {
				t.Fatalf("code = %d (%v), want %d", code, err, tc.code)
			}
		})
	}
}

// resultJSON renders r in version v as a generic map, the way a runtime
// reads it.
func resultJSON(t *testing.T, stdin string, v4, v6 []net.IPNet, v string) map[string]any {
	t.Helper()
	conf, err := parseConf([]byte(stdin))
	if err != nil {
		t.Fatal(err)
	}
	r, err := buildResult(conf, "/run/netns/x", v4, v6)
	if err != nil {
		t.Fatal(err)
	}
	vr, err := r.GetAsVersion(v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(vr)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBuildResultVersions(t *testing.T) {
	v4 := []net.IPNet{mustCIDR(t, "127.0.0.1/8")}
	v6 := []net.IPNet{mustCIDR(t, "::1/128")}
	lo := map[string]any{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": "/run/netns/x"}
	for _, tc := range []struct {
		version string
		want    map[string]any
	}{
		{"1.1.0", map[string]any{
			"cniVersion": "1.1.0",
			"interfaces": []any{lo},
			"ips": []any{
				map[string]any{"address": "127.0.0.1/8", "interface": 0.0},
				map[string]any{"address": "::1/128", "interface": 0.0},
			},
		}},
		{"1.0.0", map[string]any{
			"cniVersion": "1.0.0",
			"interfaces": []any{lo},
			"ips": []any{
				map[string]any{"address": "127.0.0.1/8", "interface": 0.0},
				map[string]any{"address": "::1/128", "interface": 0.0},
			},
		}},
		{"0.3.1", map[string]any{
			"cniVersion": "0.3.1",
			"interfaces": []any{lo},
			"ips": []any{
				map[string]any{"version": "4", "address": "127.0.0.1/8", "interface": 0.0},
				map[string]any{"version": "6", "address": "::1/128", "interface": 0.0},
			},
			"dns": map[string]any{},
		}},
		{"0.2.0", map[string]any{
			"cniVersion": "0.2.0",
			"ip4":        map[string]any{"ip": "127.0.0.1/8"},
			"ip6":        map[string]any{"ip": "::1/128"},
			"dns":        map[string]any{},
		}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			stdin := `{"cniVersion":"` + tc.version + `","name":"n","type":"loopback"}`
			got := resultJSON(t, stdin, v4, v6, tc.version)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("result (-want +got):\n%s", d)
			}
		})
	}
}

func TestBuildResultOnlyV4(t *testing.T) {
	got := resultJSON(t, `{"cniVersion":"1.1.0","name":"n","type":"loopback"}`, []net.IPNet{mustCIDR(t, "127.0.0.1/8")}, nil, "1.1.0")
	if ips := got["ips"].([]any); len(ips) != 1 {
		t.Fatalf("ips = %v, want only 127.0.0.1/8", ips)
	}
}

func TestBuildResultPassesPrevResult(t *testing.T) {
	stdin := `{"cniVersion":"1.1.0","name":"n","type":"loopback","prevResult":{"cniVersion":"1.1.0",
	  "interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],
	  "ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1","interface":0}]}}`
	got := resultJSON(t, stdin, []net.IPNet{mustCIDR(t, "127.0.0.1/8")}, nil, "1.1.0")
	want := map[string]any{
		"cniVersion": "1.1.0",
		"interfaces": []any{map[string]any{"name": "eth0", "sandbox": "/run/netns/x"}},
		"ips":        []any{map[string]any{"address": "10.1.2.3/24", "gateway": "10.1.2.1", "interface": 0.0}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("result (-want +got):\n%s", d)
	}
}

func TestBuildResultRejectsNonLoopback(t *testing.T) {
	conf, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"loopback"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = buildResult(conf, "/run/netns/x", []net.IPNet{mustCIDR(t, "127.0.0.1/8"), mustCIDR(t, "10.0.0.1/8")}, nil)
	if err == nil {
		t.Fatal("want an error for 10.0.0.1 on lo")
	}
}

func FuzzParseConf(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"loopback"}`))
	f.Add([]byte(`{"cniVersion":"0.2.0","name":"n","type":"loopback","prevResult":{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"}}}`))
	f.Add([]byte(`{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","interface":5}]}}`))
	f.Add([]byte(`{"prevResult":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		conf, err := parseConf(b)
		if err != nil {
			if code, ok := cnierr.Code(err); !ok || code == cnierr.Internal {
				t.Fatalf("unclassified parse error: %v", err)
			}
			return
		}
		if r, err := buildResult(conf, "/run/netns/x", nil, nil); err == nil && conf.CNIVersion != "" {
			_, _ = r.GetAsVersion(conf.CNIVersion)
		}
	})
}
