package portmap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// lockPath serializes portmap invocations on a node: each one reads the
// ruleset and then writes changes computed from it, and two interleaved
// iptables writers could both declare (and so flush) a shared chain.
const lockPath = "/run/flatnet-portmap.lock"

const lockTimeout = 60 * time.Second

// lockFile takes an exclusive flock on path, waiting up to lockTimeout
// (then code 11: try again later).
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file %s: %w", path, err)
	}
	deadline := time.Now().Add(lockTimeout)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, cnierr.New(cnierr.TryAgainLater, "portmap: another portmap invocation held %s for %s", path, lockTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// enableRouteLocalnet sets route_localnet on the host interface that routes
// to the container, so that connections from 127.0.0.1 that we DNAT to the
// container may leave through it (they are masqueraded on the way out). An
// address with no route is skipped, as by the reference plugin.
func enableRouteLocalnet(containerIP netip.Addr) error {
	routes, err := netlink.RouteGet(net.IP(containerIP.AsSlice()))
	if err != nil || len(routes) == 0 {
		return nil
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return nil
	}
	name := link.Attrs().Name
	if err := sysctl.SetPath("1", "net", "ipv4", "conf", name, "route_localnet"); err != nil {
		return fmt.Errorf("enabling route_localnet on %s (for connections from 127.0.0.1 to mapped ports): %w", name, err)
	}
	return nil
}

// flushUDPConntrack deletes the conntrack entries of UDP flows to the
// given host ports (IPv4 and IPv6), so that a new or removed mapping
// applies to datagrams at once instead of after the old entries time out.
//
// It reads no table when the namespace has no conntrack entry, and
// otherwise asks the kernel for the UDP entries to those ports only
// (netlinkx.ConntrackDeletePorts says how): every dump walks the kernel's
// whole conntrack hash, but the namespace's other entries are no longer
// copied out and parsed, which at 100,000 entries took over a second.
func flushUDPConntrack(ports4, ports6 []uint16) error {
	if len(ports4)+len(ports6) == 0 {
		return nil
	}
	sel := netlinkx.ConntrackPorts{Proto: unix.IPPROTO_UDP, Ports4: ports4, Ports6: ports6}
	if _, err := netlinkx.ConntrackDeletePorts(context.Background(), sel); err != nil {
		return fmt.Errorf("deleting UDP conntrack entries for ports %v %v: %w", ports4, ports6, err)
	}
	return nil
}
