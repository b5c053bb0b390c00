package forward

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestUpstreamsFromResolvConf(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("169.254.20.10"), netip.MustParseAddr("10.96.0.10")}
	for _, tc := range []struct {
		name, conf string
		want       []string
		wantErr    string
	}{
		{name: "order kept, comments and options ignored", conf: `
# generated
search example.com
nameserver 10.0.0.2 ; inline comment
nameserver 2001:db8::53
options ndots:2
nameserver   10.0.0.3`, want: []string{"10.0.0.2:53", "[2001:db8::53]:53", "10.0.0.3:53"}},
		{name: "systemd-resolved stub kept", conf: "nameserver 127.0.0.53\noptions edns0 trust-ad\n", want: []string{"127.0.0.53:53"}},
		{name: "link-local with zone", conf: "nameserver fe80::1%eth0\n", want: []string{"[fe80::1%eth0]:53"}},
		{name: "bad line skipped like glibc", conf: "nameserver not-an-ip\nnameserver\nnameserver 10.0.0.2\n", want: []string{"10.0.0.2:53"}},
		{name: "own addresses dropped", conf: "nameserver 169.254.20.10\nnameserver 10.0.0.2\n", want: []string{"10.0.0.2:53"}},
		{name: "only own addresses", conf: "nameserver 169.254.20.10\nnameserver 10.96.0.10\n", wantErr: "would loop"},
		{name: "no nameserver", conf: "search example.com\n", wantErr: "no nameserver line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "resolv.conf")
			if err := os.WriteFile(p, []byte(tc.conf), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := UpstreamsFromResolvConf(p, own...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), p) {
					t.Fatalf("err = %v, want %q naming the file", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := UpstreamsFromResolvConf(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "explicitly") {
		t.Errorf("missing file: err = %v, want a hint to pass upstreams explicitly", err)
	}
}

func TestParseUpstreams(t *testing.T) {
	got, err := ParseUpstreams([]string{"10.0.0.2", " 10.0.0.3:5353", "2001:db8::53", "[2001:db8::54]:54", ""})
	want := []string{"10.0.0.2:53", "10.0.0.3:5353", "[2001:db8::53]:53", "[2001:db8::54]:54"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	for _, bad := range [][]string{nil, {""}, {"dns.example.com"}, {"10.0.0.1:port"}} {
		if _, err := ParseUpstreams(bad); err == nil {
			t.Errorf("ParseUpstreams(%q) accepted", bad)
		}
	}
}
