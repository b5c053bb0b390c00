package netlinkx

// Added by the portmap task: conntrack listing and deletion dump the whole
// table, so they can be interrupted like any other dump.

import "github.com/vishvananda/netlink"

// ConntrackDeleteFilters deletes the conntrack entries of family matching
// any of filters and returns how many it deleted.
func ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	return retry("deleting conntrack entries", func() (uint, error) {
		return netlink.ConntrackDeleteFilters(table, family, filters...)
	})
}

// ConntrackTableList lists the conntrack entries of family (AF_UNSPEC: all).
func ConntrackTableList(table netlink.ConntrackTableType, family netlink.InetFamily) ([]*netlink.ConntrackFlow, error) {
	return retry("listing conntrack entries", func() ([]*netlink.ConntrackFlow, error) {
		return netlink.ConntrackTableList(table, family)
	})
}
