package netlinkx

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Nexthop is a nexthop object as the kernel lists it. Group and blackhole
// nexthops have no gateway.
type Nexthop struct {
	ID        uint32
	Gw        netip.Addr
	LinkIndex int
	OnLink    bool
	Protocol  uint8
}

// NexthopList lists the nexthop objects of the caller's network namespace.
// A kernel without them (before 5.3) answers with ErrNotSupported.
func NexthopList() ([]Nexthop, error) {
	return retry("listing nexthops", func() ([]Nexthop, error) {
		req := nl.NewNetlinkRequest(unix.RTM_GETNEXTHOP, unix.NLM_F_DUMP)
		req.AddData(&nhmsg{})
		msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEXTHOP)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("nexthop objects: %w (%w)", ErrNotSupported, err)
		}
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		out := make([]Nexthop, 0, len(msgs))
		for _, m := range msgs {
			if len(m) < 8 {
				continue
			}
			nh := Nexthop{Protocol: m[2], OnLink: nl.NativeEndian().Uint32(m[4:8])&unix.RTNH_F_ONLINK != 0}
			attrs, perr := nl.ParseRouteAttr(m[8:])
			if perr != nil {
				return nil, fmt.Errorf("parsing a nexthop: %w", perr)
			}
			for _, a := range attrs {
				switch a.Attr.Type {
				case unix.NHA_ID:
					nh.ID = nl.NativeEndian().Uint32(a.Value)
				case unix.NHA_OIF:
					nh.LinkIndex = int(nl.NativeEndian().Uint32(a.Value))
				case unix.NHA_GATEWAY:
					if g, ok := netip.AddrFromSlice(a.Value); ok {
						nh.Gw = g.Unmap()
					}
				}
			}
			out = append(out, nh)
		}
		return out, err
	})
}
