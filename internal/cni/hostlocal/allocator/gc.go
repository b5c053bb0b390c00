package allocator

import (
	"math/big"
	"net/netip"
	"strings"

	"github.com/flatnet/flatnet/internal/cni/hostlocal/store"
)

// Attachment is a (container ID, ifname) pair a GC request keeps.
type Attachment struct{ ContainerID, IfName string }

// Stale selects the reservations GC frees: those whose attachment is not
// in valid. A legacy reservation (container ID only) is kept when its
// container has any valid attachment, as the reference does, so the first
// GC after an upgrade does not free pre-upgrade addresses. An empty valid
// set means every reservation is stale.
func Stale(all []store.Reservation, valid []Attachment) []netip.Addr {
	keep := make(map[Attachment]bool, len(valid))
	keepID := make(map[string]bool, len(valid))
	for _, a := range valid {
		id := strings.TrimSpace(a.ContainerID)
		keep[Attachment{id, a.IfName}] = true
		keepID[id] = true
	}
	var out []netip.Addr
	for _, r := range all {
		if r.Legacy {
			if !keepID[r.ContainerID] {
				out = append(out, r.IP)
			}
			continue
		}
		if !keep[Attachment{r.ContainerID, r.IfName}] {
			out = append(out, r.IP)
		}
	}
	return out
}

// Free counts the addresses of set that could still be handed out, given
// every reserved address (of any set). The count is exact (IPv6 ranges
// can be huge, hence big.Int).
func Free(set RangeSet, reserved []netip.Addr) *big.Int {
	total := new(big.Int)
	taken := map[netip.Addr]bool{}
	for _, r := range set {
		size := new(big.Int).Sub(addrInt(r.RangeEnd), addrInt(r.RangeStart))
		total.Add(total, size.Add(size, big.NewInt(1)))
		// Addresses inside the range that are never handed out.
		skip := []netip.Addr{r.Gateway, r.Subnet.Addr()}
		if r.Subnet.Addr().Is4() {
			skip = append(skip, lastAddr(r.Subnet))
		}
		for _, ip := range skip {
			if r.Contains(ip) {
				taken[ip] = true
			}
		}
	}
	for _, ip := range reserved {
		ip = ip.Unmap()
		if set.Contains(ip) {
			taken[ip] = true
		}
	}
	return total.Sub(total, big.NewInt(int64(len(taken))))
}

func addrInt(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }
