package netlinkx

// Added by the portmap task: conntrack deletion dumps the whole table, so
// it can be interrupted like any other dump.

import "github.com/vishvananda/netlink"

// ConntrackDeleteFilters deletes the conntrack entries of family matching
// any of filters and returns how many it deleted.
func ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	return retry("deleting conntrack entries", func() (uint, error) {
		return netlink.ConntrackDeleteFilters(table, family, filters...)
	})
}
