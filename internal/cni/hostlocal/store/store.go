// Package store keeps host-local's reservations: the Store interface the
// allocator works against, the on-disk store (byte-compatible with the
// reference host-local's backend/disk), and an in-memory fake for tests.
package store

import (
	"net/netip"
	"strings"
)

// Store is the allocator's view of the reservations of one network.
// Callers hold the store's lock (if it has one) around every sequence of
// calls that must be atomic; the methods themselves do not lock.
type Store interface {
	// Reserve records ip for (id, ifname) and remembers ip as the last
	// address handed out from range set rangeID. It returns false, nil when
	// ip is already reserved (by anyone).
	Reserve(id, ifname string, ip netip.Addr, rangeID string) (bool, error)
	// LastReservedIP returns the address last reserved from range set
	// rangeID, or ok=false when there is none (or it cannot be read).
	LastReservedIP(rangeID string) (ip netip.Addr, ok bool)
	// GetByID returns the addresses reserved by (id, ifname), including
	// legacy reservations that recorded only the container ID.
	GetByID(id, ifname string) ([]netip.Addr, error)
	// ReleaseByID frees every address reserved by (id, ifname); when there
	// is none, it frees legacy reservations holding only id. Releasing
	// nothing is not an error.
	ReleaseByID(id, ifname string) error
	// List returns every reservation.
	List() ([]Reservation, error)
	// Release frees one address, whoever holds it.
	Release(ip netip.Addr) error
}

// Reservation is one reserved address and its holder.
type Reservation struct {
	IP          netip.Addr
	ContainerID string
	// IfName is empty for legacy reservations, written by host-local
	// versions that recorded only the container ID.
	IfName string
	Legacy bool
}

// LineBreak separates the container ID and the interface name inside a
// reservation file, exactly as the reference plugin writes it.
const LineBreak = "\r\n"

// Key is the content of the reservation file for (id, ifname).
func Key(id, ifname string) string { return strings.TrimSpace(id) + LineBreak + ifname }

// ParseKey splits reservation file content into its holder, the way the
// reference plugin compares it (surrounding white space ignored).
func ParseKey(data string) (id, ifname string, legacy bool) {
	data = strings.TrimSpace(data)
	if i := strings.Index(data, LineBreak); i >= 0 {
		return data[:i], data[i+len(LineBreak):], false
	}
	return data, "", true
}

// Matches reports whether reservation content data belongs to (id, ifname),
// exactly: legacy content holding only the ID is not an exact match.
func Matches(data, id, ifname string) bool { return strings.TrimSpace(data) == Key(id, ifname) }

// MatchesLegacy reports whether data is a legacy reservation of id.
func MatchesLegacy(data, id string) bool { return strings.TrimSpace(data) == strings.TrimSpace(id) }
