// Package netlinkx wraps vishvananda/netlink dump calls with retries.
//
// A netlink dump can be interrupted when the kernel's table changes while
// it is being read (NLM_F_DUMP_INTR); netlink then returns
// ErrDumpInterrupted with partial data. The fix is to retry the dump, which
// we do here, in one place (as containernetworking/plugins' netlinksafe and
// kube-router's nlretry do). Use these instead of netlink.*List.
//
// It is also the one package that speaks ctnetlink (conntrack) itself:
// kernel-filtered dumps and batched deletes (conntrack_ports.go).
package netlinkx

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

const maxAttempts = 10

func retry[T any](what string, fn func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range maxAttempts {
		v, err = fn()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, fmt.Errorf("%s: dump interrupted %d times: %w", what, maxAttempts, err)
}

// LinkList lists all links.
func LinkList() ([]netlink.Link, error) {
	return retry("listing links", netlink.LinkList)
}

// AddrList lists addresses of link (nil: all) in family.
func AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	return retry("listing addresses", func() ([]netlink.Addr, error) { return netlink.AddrList(link, family) })
}

// RouteList lists main-table routes of link (nil: all) in family.
func RouteList(link netlink.Link, family int) ([]netlink.Route, error) {
	return retry("listing routes", func() ([]netlink.Route, error) { return netlink.RouteList(link, family) })
}

// RouteListFiltered lists routes matching filter and mask.
func RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return retry("listing routes", func() ([]netlink.Route, error) { return netlink.RouteListFiltered(family, filter, mask) })
}

// NeighList lists neighbour entries of link index (0: all).
func NeighList(linkIndex, family int) ([]netlink.Neigh, error) {
	return retry("listing neighbours", func() ([]netlink.Neigh, error) { return netlink.NeighList(linkIndex, family) })
}

// QdiscList lists qdiscs of link (nil: all).
func QdiscList(link netlink.Link) ([]netlink.Qdisc, error) {
	return retry("listing qdiscs", func() ([]netlink.Qdisc, error) { return netlink.QdiscList(link) })
}

// FilterList lists tc filters of link under parent.
func FilterList(link netlink.Link, parent uint32) ([]netlink.Filter, error) {
	return retry("listing filters", func() ([]netlink.Filter, error) { return netlink.FilterList(link, parent) })
}

// LinkByName finds a link by name; a missing link gives an error for which
// IsNotFound is true.
func LinkByName(name string) (netlink.Link, error) {
	return netlink.LinkByName(name)
}

// IsNotFound reports whether err means a link (or other object) is absent.
func IsNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
