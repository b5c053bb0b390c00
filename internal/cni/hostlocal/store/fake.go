package store

import (
	"net/netip"
	"sort"
	"sync"
)

// Fake is an in-memory Store for tests. It keeps the same key format as
// the disk store, so legacy (ID-only) reservations can be planted with
// Set.
type Fake struct {
	mu     sync.Mutex // protects the maps (tests may share a Fake)
	ips    map[netip.Addr]string
	lastIP map[string]netip.Addr
	// FailReserve, when set, is returned by Reserve (error injection).
	FailReserve error
}

var _ Store = (*Fake)(nil)

// NewFake returns an empty fake store.
func NewFake() *Fake {
	return &Fake{ips: map[netip.Addr]string{}, lastIP: map[string]netip.Addr{}}
}

// Set plants a reservation with raw file content (e.g. Key(id, ifname),
// or a bare container ID for a legacy one).
func (f *Fake) Set(ip netip.Addr, content string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ips[ip.Unmap()] = content
}

// SetLast plants last_reserved_ip.rangeID.
func (f *Fake) SetLast(rangeID string, ip netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastIP[rangeID] = ip
}

// Content returns the raw content stored for ip.
func (f *Fake) Content(ip netip.Addr) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ips[ip]
	return c, ok
}

// Reserved returns every reserved address, sorted.
func (f *Fake) Reserved() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]netip.Addr, 0, len(f.ips))
	for ip := range f.ips {
		out = append(out, ip)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

func (f *Fake) Reserve(id, ifname string, ip netip.Addr, rangeID string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.FailReserve != nil {
		return false, f.FailReserve
	}
	ip = ip.Unmap()
	if _, ok := f.ips[ip]; ok {
		return false, nil
	}
	f.ips[ip] = Key(id, ifname)
	f.lastIP[rangeID] = ip
	return true, nil
}

func (f *Fake) LastReservedIP(rangeID string) (netip.Addr, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ip, ok := f.lastIP[rangeID]
	return ip, ok
}

func (f *Fake) List() ([]Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Reservation, 0, len(f.ips))
	for ip, c := range f.ips {
		id, ifname, legacy := ParseKey(c)
		out = append(out, Reservation{IP: ip, ContainerID: id, IfName: ifname, Legacy: legacy})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out, nil
}

func (f *Fake) GetByID(id, ifname string) ([]netip.Addr, error) {
	all, _ := f.List()
	return byID(all, id, ifname, true), nil
}

func (f *Fake) ReleaseByID(id, ifname string) error {
	all, _ := f.List()
	ips := byID(all, id, ifname, false)
	if len(ips) == 0 {
		ips = legacyByID(all, id)
	}
	for _, ip := range ips {
		f.Release(ip)
	}
	return nil
}

func (f *Fake) Release(ip netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ips, ip.Unmap())
	return nil
}
