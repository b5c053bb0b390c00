package testutil

import (
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// RequireConntrack skips t (fails it in CI) when the kernel has no
// conntrack or no ctnetlink, trying both in the namespace at ns.
func RequireConntrack(t testing.TB, ns string) {
	t.Helper()
	err := netns.Do(ns, func() error {
		if _, err := sysctl.Get("net.netfilter.nf_conntrack_count"); err != nil {
			return err
		}
		_, err := netlinkx.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	})
	if err != nil {
		Skip(t, "no conntrack in this kernel (%v): modprobe nf_conntrack nf_conntrack_netlink", err)
	}
}
