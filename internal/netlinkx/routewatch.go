package netlinkx

// RouteSet keeps, from the kernel's route notifications, the set of a
// namespace's main-table routes that match a filter. It exists for
// measuring: counting thousands of routes by dumping the table every few
// milliseconds costs a CPU of its own, which on a small machine is taken
// from the very process being timed; a notification per change costs
// next to nothing. If the notifications overflow the socket's buffer
// (ENOBUFS: the kernel dropped some), it subscribes again with a fresh
// dump of the table, so the set is never silently wrong.

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netns"
)

// RouteSet is the set of routes a RouteWatch keeps. Its methods are safe
// for concurrent use.
type RouteSet struct {
	mu     sync.Mutex
	dsts   map[netip.Prefix]struct{}
	resubs int
	err    error
}

// Len is the number of matching routes in the table now.
func (s *RouteSet) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.dsts)
}

// Resubscribed is how often the notifications overflowed and the table
// was read again.
func (s *RouteSet) Resubscribed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resubs
}

// Err is the error that stopped the watch, if one did.
func (s *RouteSet) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// receiveBuffer holds ~40,000 route notifications between reads.
const receiveBuffer = 8 << 20

// RouteWatch starts keeping the set of IPv4 and IPv6 main-table routes
// with a destination for which keep is true, in the network namespace at
// nsPath, until done is closed. The set is complete when RouteWatch
// returns.
func RouteWatch(nsPath string, keep func(dst netip.Prefix) bool, done <-chan struct{}) (*RouteSet, error) {
	s := &RouteSet{}
	w, err := s.subscribe(nsPath, keep, done)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			for u := range w.ch {
				s.apply(u, keep)
			}
			select {
			case <-done:
				return
			default:
			}
			// The socket failed (most likely it overflowed, and the
			// kernel dropped notifications): start again from the table.
			cause := w.failure()
			s.mu.Lock()
			s.resubs++
			s.mu.Unlock()
			next, err := s.subscribe(nsPath, keep, done)
			if err != nil {
				s.mu.Lock()
				s.err = fmt.Errorf("route watch in %s stopped (%v), and subscribing again failed: %w", nsPath, cause, err)
				s.mu.Unlock()
				return
			}
			w = next
		}
	}()
	return s, nil
}

type subscription struct {
	ch  chan netlink.RouteUpdate
	mu  sync.Mutex
	err error
}

func (w *subscription) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// subscribe opens a notification socket in the namespace, then replaces
// the set with a dump of the table. Notifications queued meanwhile are
// applied after the dump, in order; each sets one destination's presence
// to what it was at that notification, so the set ends as the table is.
func (s *RouteSet) subscribe(nsPath string, keep func(netip.Prefix) bool, done <-chan struct{}) (*subscription, error) {
	w := &subscription{ch: make(chan netlink.RouteUpdate, 1024)}
	var table []netlink.Route
	err := netns.Do(nsPath, func() error {
		// A netlink socket belongs to the namespace it was opened in,
		// whichever thread reads it later.
		if err := netlink.RouteSubscribeWithOptions(w.ch, done, netlink.RouteSubscribeOptions{
			ReceiveBufferSize:      receiveBuffer,
			ReceiveBufferForceSize: true,
			ErrorCallback: func(err error) {
				w.mu.Lock()
				if w.err == nil {
					w.err = err
				}
				w.mu.Unlock()
			},
		}); err != nil {
			return fmt.Errorf("subscribing to routes: %w", err)
		}
		var err error
		table, err = RouteListFiltered(unix.AF_UNSPEC, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("watching routes in %s: %w", nsPath, err)
	}
	fresh := map[netip.Prefix]struct{}{}
	for _, r := range table {
		if d, ok := routeDst(r, keep); ok {
			fresh[d] = struct{}{}
		}
	}
	s.mu.Lock()
	s.dsts = fresh
	s.mu.Unlock()
	return w, nil
}

func (s *RouteSet) apply(u netlink.RouteUpdate, keep func(netip.Prefix) bool) {
	d, ok := routeDst(u.Route, keep)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if u.Type == unix.RTM_DELROUTE {
		delete(s.dsts, d)
	} else {
		s.dsts[d] = struct{}{}
	}
}

func routeDst(r netlink.Route, keep func(netip.Prefix) bool) (netip.Prefix, bool) {
	if r.Dst == nil || (r.Table != unix.RT_TABLE_MAIN && r.Table != 0) {
		return netip.Prefix{}, false
	}
	d, ok := PrefixOf(r.Dst)
	return d, ok && keep(d)
}

// PrefixOf is n as a netip.Prefix, an IPv4-mapped address as IPv4.
func PrefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	if a.Is4In6() && ones >= 96 {
		ones -= 96
	}
	return netip.PrefixFrom(a.Unmap(), ones), true
}
