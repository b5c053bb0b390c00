package allocator

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestLoadDefaultsAndOrder(t *testing.T) {
	c := load(t, `{"cniVersion":"1.0.0","name":"mynet",
		"runtimeConfig":{"ipRanges":[[{"subnet":"10.20.0.0/24"}]]},
		"ipam":{"type":"host-local","dataDir":"/run/x","resolvConf":"/etc/r",
			"subnet":"10.10.0.0/16","rangeStart":"10.10.1.0","gateway":"10.10.0.254",
			"ranges":[[{"subnet":"10.30.0.0/24","rangeEnd":"10.30.0.100"},{"subnet":"10.31.0.0/24"}],
			          [{"subnet":"fd00:1::/64"}]],
			"routes":[{"dst":"0.0.0.0/0"}]}}`, "")
	var got []string
	for i, set := range c.Ranges {
		for _, r := range set {
			got = append(got, fmt.Sprintf("%s %s %s-%s gw %s", c.Where(i), r.Subnet, r.RangeStart, r.RangeEnd, r.Gateway))
		}
	}
	want := []string{
		"runtimeConfig.ipRanges[0] 10.20.0.0/24 10.20.0.1-10.20.0.254 gw 10.20.0.1",
		"ipam 10.10.0.0/16 10.10.1.0-10.10.255.254 gw 10.10.0.254",
		"ipam.ranges[0] 10.30.0.0/24 10.30.0.1-10.30.0.100 gw 10.30.0.1",
		"ipam.ranges[0] 10.31.0.0/24 10.31.0.1-10.31.0.254 gw 10.31.0.1",
		"ipam.ranges[1] fd00:1::/64 fd00:1::1-fd00:1::ffff:ffff:ffff:ffff gw fd00:1::1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ranges (-want +got):\n%s", diff)
	}
	if c.Name != "mynet" || c.DataDir != "/run/x" || c.ResolvConf != "/etc/r" || len(c.Routes) != 1 || c.CNIVersion != "1.0.0" {
		t.Errorf("config %+v", c)
	}
}

func TestLoadRequestedIPs(t *testing.T) {
	c := load(t, `{"cniVersion":"1.0.0","name":"n","args":{"cni":{"ips":["10.0.0.7","fd00::7/64"]}},
		"runtimeConfig":{"ips":["10.0.0.8/24"]},"ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "IP=10.0.0.6")
	want := []netip.Addr{ip("10.0.0.6"), ip("10.0.0.7"), ip("fd00::7"), ip("10.0.0.8")}
	if diff := cmp.Diff(want, c.Requested, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("requested (-want +got):\n%s", diff)
	}
	// IPv4-mapped requests are canonicalised to IPv4.
	c = load(t, `{"name":"n","cniVersion":"1.0.0","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "IP=::ffff:10.0.0.9")
	if len(c.Requested) != 1 || c.Requested[0] != ip("10.0.0.9") {
		t.Errorf("got %v", c.Requested)
	}
}

func TestLoadErrors(t *testing.T) {
	const pre = `{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local",`
	tests := []struct {
		name, conf, args string
		code             uint
		mention          string
	}{
		{"bad json", `{"name":`, "", cnierr.DecodingFailure, "decoding"},
		{"no ipam", `{"cniVersion":"1.0.0","name":"n"}`, "", cnierr.InvalidConfig, `"ipam"`},
		{"no name", `{"cniVersion":"1.0.0","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", cnierr.InvalidConfig, `"name"`},
		{"path name", `{"cniVersion":"1.0.0","name":"../etc","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", cnierr.InvalidConfig, `"name"`},
		{"no ranges", pre + `"dataDir":"/x"}}`, "", cnierr.InvalidConfig, "no IP ranges"},
		{"empty range set", pre + `"ranges":[[]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0]: empty"},
		{"bad CIDR", pre + `"ranges":[[{"subnet":"10.0.0.0/33"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].subnet"},
		{"not a CIDR", pre + `"ranges":[[{"subnet":"banana"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].subnet"},
		{"missing subnet", pre + `"ranges":[[{"rangeStart":"10.0.0.5"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].subnet: missing"},
		{"legacy bad CIDR", pre + `"subnet":"10.0.0/24"}}`, "", cnierr.InvalidConfig, "ipam.subnet"},
		{"host bits", pre + `"ranges":[[{"subnet":"10.0.0.1/24"}]]}}`, "", cnierr.InvalidConfig, "host bits"},
		{"too small", pre + `"ranges":[[{"subnet":"10.0.0.0/31"}]]}}`, "", cnierr.InvalidConfig, "too small"},
		{"too small v6", pre + `"ranges":[[{"subnet":"fd00::/127"}]]}}`, "", cnierr.InvalidConfig, "too small"},
		{"rangeStart outside", pre + `"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.5"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].rangeStart: 10.0.1.5 is not in subnet"},
		{"rangeEnd outside", pre + `"ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.1.5"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].rangeEnd"},
		{"bad rangeStart", pre + `"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.300"}]]}}`, "", cnierr.InvalidConfig, "rangeStart: invalid IP"},
		{"start after end", pre + `"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","rangeEnd":"10.0.0.40"}]]}}`, "", cnierr.InvalidConfig, "is after rangeEnd"},
		{"gateway outside", pre + `"ranges":[[{"subnet":"10.0.0.0/24","gateway":"10.0.5.1"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0][0].gateway"},
		{"gateway other family", pre + `"ranges":[[{"subnet":"10.0.0.0/24","gateway":"fd00::1"}]]}}`, "", cnierr.InvalidConfig, "gateway"},
		{"mixed families", pre + `"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]}}`, "", cnierr.InvalidConfig, "mixes IPv4 and IPv6"},
		{"overlap inside set", pre + `"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/25"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0]: ranges"},
		{"overlap across sets", pre + `"ranges":[[{"subnet":"10.0.0.0/16"}],[{"subnet":"10.0.5.0/24"}]]}}`, "", cnierr.InvalidConfig, "ipam.ranges[0] (10.0.0.1-10.0.255.254) overlaps ipam.ranges[1]"},
		{"overlap legacy and ranges", pre + `"subnet":"10.0.0.0/24","ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", cnierr.InvalidConfig, "ipam (10.0.0.1-10.0.0.254) overlaps ipam.ranges[0]"},
		{"overlap runtime", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ipRanges":[[{"subnet":"10.0.0.0/24"}]]},"ipam":{"ranges":[[{"subnet":"10.0.0.0/16"}]]}}`, "", cnierr.InvalidConfig, "runtimeConfig.ipRanges[0]"},
		{"bad runtime range", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ipRanges":[[{"subnet":"x"}]]},"ipam":{}}`, "", cnierr.InvalidConfig, "runtimeConfig.ipRanges[0][0].subnet"},
		{"subnet not a string", pre + `"ranges":[[{"subnet":5}]]}}`, "", cnierr.InvalidConfig, "subnet"},
		{"ranges not a list", pre + `"ranges":{"subnet":"10.0.0.0/24"}}}`, "", cnierr.InvalidConfig, "ranges"},
		{"bad route", pre + `"ranges":[[{"subnet":"10.0.0.0/24"}]],"routes":[{"dst":"nope"}]}}`, "", cnierr.InvalidConfig, "ipam.routes[0]"},
		{"bad runtime ip", `{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["1.2.3"]},"ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", cnierr.InvalidConfig, "runtimeConfig.ips[0]"},
		{"bad args ip", `{"cniVersion":"1.0.0","name":"n","args":{"cni":{"ips":["x"]}},"ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "", cnierr.InvalidConfig, "args.cni.ips[0]"},
		{"bad CNI_ARGS IP", pre + `"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "IP=10.0.0.999", cnierr.InvalidEnvironment, "CNI_ARGS"},
		{"unknown CNI_ARGS", pre + `"ranges":[[{"subnet":"10.0.0.0/24"}]]}}`, "K8S_POD_NAME=x", cnierr.InvalidEnvironment, "unknown args"},
		{"two v4 sets on 0.2.0", `{"cniVersion":"0.2.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/24"}]]}}`, "", cnierr.InvalidConfig, "more than one address per family"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]byte(tc.conf), tc.args)
			wantCode(t, err, tc.code)
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

func TestLoadAccepts(t *testing.T) {
	for _, conf := range []string{
		// Adjacent ranges in one set do not overlap.
		`{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.99"},{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100"}]]}}`,
		// One v4 and one v6 set on 0.2.0 is fine.
		`{"cniVersion":"0.2.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]}}`,
		// Empty optional strings mean "unset", as in the reference.
		`{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"","gateway":""}]]}}`,
		// CNI_ARGS with IgnoreUnknown.
		`{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24"}}`,
		// /30 and /126 are the smallest usable.
		`{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/30"}],[{"subnet":"fd00::/126"}]]}}`,
	} {
		if _, err := Load([]byte(conf), "IgnoreUnknown=1;K8S_POD_NAMESPACE=default"); err != nil {
			t.Errorf("%s: %v", conf, err)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(dualConf), "")
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["10.0.0.5"],"ipRanges":[[{"subnet":"10.9.0.0/16","rangeStart":"10.9.0.9"}]]},"args":{"cni":{"ips":["fd00::1"]}},"ipam":{"subnet":"10.0.0.0/24","gateway":"10.0.0.1","routes":[{"dst":"0.0.0.0/0"}]}}`), "IgnoreUnknown=1;IP=10.0.0.3")
	f.Add([]byte(`{"name":"x","ipam":{"ranges":[[{"subnet":"fd00::/120","rangeStart":"fd00::ff","rangeEnd":"fd00::ff"}]]}}`), "IP=fd00::3/64")
	f.Fuzz(func(t *testing.T, data []byte, args string) {
		c, err := Load(data, args)
		if err != nil {
			if code, ok := cnierr.Code(err); !ok || code == cnierr.Internal {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		// Invariants of a config that loaded.
		if len(c.Ranges) == 0 {
			t.Fatal("loaded with no range sets")
		}
		for _, set := range c.Ranges {
			for _, r := range set {
				if !r.Subnet.Contains(r.RangeStart) || !r.Subnet.Contains(r.RangeEnd) || !r.Subnet.Contains(r.Gateway) ||
					r.RangeStart.Compare(r.RangeEnd) > 0 {
					t.Fatalf("invalid range accepted: %+v", r)
				}
			}
		}
		// Allocation never panics either, and either succeeds or fails
		// with a code.
		if len(c.Requested) < 4 {
			_, err := Allocate(c, newFuzzStore(), "id", "eth0")
			if err != nil {
				if code, ok := cnierr.Code(err); !ok || code == cnierr.Internal {
					t.Fatalf("unclassified allocation error %v", err)
				}
			}
		}
	})
}
