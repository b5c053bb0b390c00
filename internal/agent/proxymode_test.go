package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fakeKits returns kits whose probes fail for the modes in missing and
// that record the cleanups run.
func fakeKits(cleaned *[]string, missing ...string) map[string]modeKit {
	kits := map[string]modeKit{}
	for _, m := range proxyModes {
		kits[m] = modeKit{
			probe: func(context.Context) error {
				for _, x := range missing {
					if x == m {
						return errors.New(m + " missing here")
					}
				}
				return nil
			},
			cleanup: func(context.Context) error { *cleaned = append(*cleaned, m); return nil },
		}
	}
	return kits
}

func TestResolveProxyMode(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		mode    string
		missing []string
		want    string
		passed  int
		err     []string
	}{
		{mode: "auto", want: "nftables"},
		{mode: "auto", missing: []string{"nftables"}, want: "iptables", passed: 1},
		{mode: "auto", missing: []string{"nftables", "iptables"}, want: "userspace", passed: 2},
		{mode: "auto", missing: []string{"nftables", "iptables", "userspace"}, err: []string{"no proxy mode can run", "nftables missing here", "userspace missing here"}},
		{mode: "iptables", want: "iptables"},
		{mode: "iptables", missing: []string{"iptables"}, err: []string{"proxy mode iptables cannot run on this host", "iptables missing here", "choose another --proxy-mode"}},
		{mode: "ipvs", err: []string{`"ipvs" is not a proxy mode`, "want auto, nftables, iptables, userspace"}},
	} {
		var cleaned []string
		got, passed, err := resolveProxyMode(ctx, tc.mode, fakeKits(&cleaned, tc.missing...))
		if len(tc.err) > 0 {
			if err == nil {
				t.Errorf("%s %v: no error, got %s", tc.mode, tc.missing, got)
				continue
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s %v: error %q does not say %q", tc.mode, tc.missing, err, w)
				}
			}
			continue
		}
		if err != nil || got != tc.want || len(passed) != tc.passed {
			t.Errorf("%s %v: got %s %v %v, want %s with %d passed over", tc.mode, tc.missing, got, passed, err, tc.want, tc.passed)
		}
	}
}

func TestPickProxyModeCleansTheOthers(t *testing.T) {
	var cleaned []string
	got, err := pickProxyMode(context.Background(), "auto", fakeKits(&cleaned, "nftables"))
	if err != nil || got != "iptables" {
		t.Fatalf("got %s, %v", got, err)
	}
	if strings.Join(cleaned, ",") != "nftables,userspace" {
		t.Errorf("cleaned %v, want the nftables and userspace modes'", cleaned)
	}
	// A mode that cannot run is refused before anything is removed.
	cleaned = nil
	if _, err := pickProxyMode(context.Background(), "iptables", fakeKits(&cleaned, "iptables")); err == nil || len(cleaned) != 0 {
		t.Errorf("refused mode: err %v, cleaned %v", err, cleaned)
	}
}
