package netlinkx

// Parking links instead of deleting them.
//
// Deleting a link waits for an RCU barrier (~15 ms here, see
// linkbatch.go); setting it down and giving it an interface group does
// not. A parked link is down (nothing is forwarded to or from it) and in
// ParkedGroup, so that a collector removes every parked link of the
// namespace with one RTM_DELLINK, one wait for all of them, off the path
// of whoever parked it. internal/cni/parking owns the policy (who
// collects, when); this file only speaks netlink.

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ParkedGroup is the interface group of parked links: "flnp" in ASCII,
// outside LinkBatch's 0x40000000|pid and the small numbers people give
// groups by hand.
const ParkedGroup uint32 = 0x666c6e70

// ParkLink sets the link with index down and puts it in ParkedGroup, in
// one request; a missing link is not an error.
func ParkLink(index int) error {
	if err := setGroup(index, ParkedGroup, true); err != nil {
		return fmt.Errorf("parking link %d: %w", index, err)
	}
	return nil
}

// IsParked reports whether a link is parked: down and in ParkedGroup.
func IsParked(l netlink.Link) bool {
	a := l.Attrs()
	return a.Group == ParkedGroup && a.Flags&net.FlagUp == 0
}

// setGroup puts the link with index in group, and sets it down with
// down, in one RTM_NEWLINK; a missing link is not an error.
func setGroup(index int, group uint32, down bool) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	if down {
		msg.Change = unix.IFF_UP // and Flags 0: down
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.ENODEV) {
		return err
	}
	return nil
}

// RenameLink renames the link with index (which must be down).
func RenameLink(index int, name string) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("renaming link %d to %s: %w", index, name, err)
	}
	return nil
}

// DeleteGroup removes every link of group in the caller's namespace in
// one request; found is false when the group had none.
func DeleteGroup(group uint32) (found bool, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return false, nil
		}
		return false, fmt.Errorf("deleting the links of group %#x: %w", group, err)
	}
	return true, nil
}
