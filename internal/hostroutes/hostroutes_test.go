package hostroutes

import (
	"net/netip"
	"testing"
)

func TestCheckFree(t *testing.T) {
	host := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	cases := []struct {
		want []string
		ok   bool
	}{
		{[]string{"10.10.0.0/16"}, true},
		{[]string{"192.0.2.128/25"}, false},
		{[]string{"192.0.0.0/16"}, false},
		{[]string{"10.1.0.0/24", "fd00:1::/48"}, false},
		{[]string{"fd00:2::/64"}, true},
	}
	for _, c := range cases {
		var want []netip.Prefix
		for _, s := range c.want {
			want = append(want, netip.MustParsePrefix(s))
		}
		err := CheckFree(want, host)
		if (err == nil) != c.ok {
			t.Errorf("CheckFree(%v) = %v, want ok=%v", c.want, err, c.ok)
		}
	}
}
