// Package conntrack deletes the conntrack entries a Service change left
// stale, as kube-proxy does for UDP (and here SCTP too).
//
// Design. A UDP "connection" is a conntrack entry that lives as long as
// packets keep coming, and the DNAT it recorded is never looked at again.
// So a client that keeps one socket keeps sending to an endpoint that went
// away, and a client that started before its Service had endpoints keeps
// bypassing DNAT altogether. TCP has neither problem: the connection ends
// with a reset. What to delete is computed as plain data (Filters, in
// cleanup.go) from the Service model before and after a change; the only
// kernel call is Interface.Delete (and List, once at start), which Netlink
// implements over internal/netlinkx and Fake records for tests.
package conntrack

import (
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/proxy"
)

// Entry is the part of a conntrack entry the cleanup looks at.
type Entry struct {
	Protocol proxy.Protocol
	// OrigDst is the destination the client sent to (a service address
	// and port, or a node address and NodePort).
	OrigDst netip.AddrPort
	// ReplySrc is where replies come from: the endpoint when the entry
	// was DNATed, OrigDst when it was not.
	ReplySrc netip.AddrPort
}

func (e Entry) String() string {
	return fmt.Sprintf("%s orig-dst %s reply-src %s", e.Protocol, e.OrigDst, e.ReplySrc)
}

// Filter selects entries to delete. Zero-valued address fields match
// anything; Protocol and OrigDstPort must always match.
type Filter struct {
	Protocol    proxy.Protocol
	OrigDst     netip.Addr // invalid: any (a NodePort, on whichever node address)
	OrigDstPort uint16
	ReplySrc    netip.AddrPort // invalid: any (also entries never DNATed)
}

// Matches reports whether e is selected by f.
func (f Filter) Matches(e Entry) bool {
	return e.Protocol == f.Protocol && e.OrigDst.Port() == f.OrigDstPort &&
		(!f.OrigDst.IsValid() || e.OrigDst.Addr() == f.OrigDst) &&
		(!f.ReplySrc.IsValid() || e.ReplySrc == f.ReplySrc)
}

func (f Filter) String() string {
	dst := "*"
	if f.OrigDst.IsValid() {
		dst = f.OrigDst.String()
	}
	src := "*"
	if f.ReplySrc.IsValid() {
		src = f.ReplySrc.String()
	}
	return fmt.Sprintf("%s orig-dst %s:%d reply-src %s", f.Protocol, dst, f.OrigDstPort, src)
}

// Interface is what the proxier needs from conntrack, for one address
// family each call.
type Interface interface {
	// List returns the TCP, UDP and SCTP entries of the family.
	List(ipv6 bool) ([]Entry, error)
	// Delete deletes the family's entries that match any of filters and
	// returns how many it deleted.
	Delete(ipv6 bool, filters []Filter) (int, error)
}

// Netlink is the kernel's conntrack table in the caller's network
// namespace.
type Netlink struct{}

var _ Interface = Netlink{}

func inetFamily(ipv6 bool) netlink.InetFamily {
	if ipv6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// List implements Interface.
func (Netlink) List(ipv6 bool) ([]Entry, error) {
	flows, err := netlinkx.ConntrackTableList(netlink.ConntrackTable, inetFamily(ipv6))
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(flows))
	for _, f := range flows {
		if e, ok := entryOf(f); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// Delete implements Interface. The kernel has no delete-by-filter: the
// table is dumped once and each matching entry deleted, so the filters are
// indexed by protocol and port to keep the cost linear in the table.
func (Netlink) Delete(ipv6 bool, filters []Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	n, err := netlinkx.ConntrackDeleteFilters(netlink.ConntrackTable, inetFamily(ipv6), newMatcher(filters))
	return int(n), err
}

// matcher implements netlink.CustomConntrackFilter over a set of filters.
type matcher map[protoPort][]Filter

type protoPort struct {
	proto proxy.Protocol
	port  uint16
}

func newMatcher(filters []Filter) matcher {
	m := matcher{}
	for _, f := range filters {
		k := protoPort{f.Protocol, f.OrigDstPort}
		m[k] = append(m[k], f)
	}
	return m
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (m matcher) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	e, ok := entryOf(flow)
	if !ok {
		return false
	}
	return m.matches(e)
}

func (m matcher) matches(e Entry) bool {
	for _, f := range m[protoPort{e.Protocol, e.OrigDst.Port()}] {
		if f.Matches(e) {
			return true
		}
	}
	return false
}

var protocols = map[uint8]proxy.Protocol{
	unix.IPPROTO_TCP:  proxy.TCP,
	unix.IPPROTO_UDP:  proxy.UDP,
	unix.IPPROTO_SCTP: proxy.SCTP,
}

// entryOf converts a kernel flow; false for protocols a Service cannot use.
func entryOf(f *netlink.ConntrackFlow) (Entry, bool) {
	proto, ok := protocols[f.Forward.Protocol]
	if !ok {
		return Entry{}, false
	}
	dst, ok1 := netip.AddrFromSlice(f.Forward.DstIP)
	src, ok2 := netip.AddrFromSlice(f.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return Entry{}, false
	}
	return Entry{
		Protocol: proto,
		OrigDst:  netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort),
		ReplySrc: netip.AddrPortFrom(src.Unmap(), f.Reverse.SrcPort),
	}, true
}

// Fake is an in-memory conntrack table for tests: Delete removes the
// matching Entries and records its filters.
type Fake struct {
	mu      sync.Mutex // protects the fields below
	Entries map[bool][]Entry
	// Deleted holds every Delete call's filters, in order.
	Deleted [][]Filter
	// Err, when set, is returned by the next calls.
	Err error
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty fake table.
func NewFake() *Fake { return &Fake{Entries: map[bool][]Entry{}} }

// Add adds entries to the family's table.
func (f *Fake) Add(ipv6 bool, entries ...Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Entries[ipv6] = append(f.Entries[ipv6], entries...)
}

// List implements Interface.
func (f *Fake) List(ipv6 bool) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return nil, f.Err
	}
	return append([]Entry(nil), f.Entries[ipv6]...), nil
}

// Delete implements Interface.
func (f *Fake) Delete(ipv6 bool, filters []Filter) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return 0, f.Err
	}
	f.Deleted = append(f.Deleted, append([]Filter(nil), filters...))
	m := newMatcher(filters)
	kept := f.Entries[ipv6][:0]
	n := 0
	for _, e := range f.Entries[ipv6] {
		if m.matches(e) {
			n++
			continue
		}
		kept = append(kept, e)
	}
	f.Entries[ipv6] = kept
	return n, nil
}

// Filters returns every filter passed to Delete so far, as strings, sorted.
func (f *Fake) Filters() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, call := range f.Deleted {
		for _, fl := range call {
			out = append(out, fl.String())
		}
	}
	sort.Strings(out)
	return out
}
