package agent

import (
	"net/netip"
	"os"
	"testing"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestRootBridgeNetfilter: --network-policy turns bridged traffic onto the
// IP hooks in the agent's own namespace, for the cluster's families only.
func TestRootBridgeNetfilter(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		testutil.Skip(t, "br_netfilter is not loaded (modprobe br_netfilter): %v", err)
	}
	ns := testutil.NewNetNS(t)
	err := netns.Do(ns, func() error {
		for _, name := range bridgeSysctls {
			if err := sysctl.Set(name, "0"); err != nil {
				return err
			}
		}
		if err := ensureBridgeNetfilter([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}); err != nil {
			return err
		}
		v4, _ := sysctl.Get(bridgeSysctls[false])
		v6, _ := sysctl.Get(bridgeSysctls[true])
		if v4 != "1" || v6 != "0" {
			t.Errorf("IPv4 cluster: bridge-nf-call-iptables=%s (want 1), -ip6tables=%s (want 0, untouched)", v4, v6)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
