package lbipam

// The allocator is pure data: a pool and the set of addresses in use. The
// controller owns the only instance and fills it from the Services'
// statuses before it hands anything out; the API server (each Service's
// status.loadBalancer.ingress) is the store, this is an index over it.
//
// Addresses in use may lie outside the pool: a Service keeps the address
// it holds when the pool shrinks under it (see controller.go), and such an
// address must still never be given to a second Service.

import (
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

var (
	// ErrExhausted is returned by Allocate when every address of the
	// family is in use (or the pool has none of that family).
	ErrExhausted = errors.New("no free address")
	// ErrInUse is returned by Occupy for an address already in use.
	ErrInUse = errors.New("address already in use")
)

// Allocator hands out the addresses of a pool, lowest free first. It is
// not safe for concurrent use.
type Allocator struct {
	pool Pool
	used map[netip.Addr]bool
}

// NewAllocator returns an allocator over pool with nothing in use.
func NewAllocator(pool Pool) *Allocator {
	return &Allocator{pool: pool, used: map[netip.Addr]bool{}}
}

// Pool is the allocator's pool.
func (a *Allocator) Pool() Pool { return a.pool }

// SetPool replaces the pool. Addresses in use stay in use, inside the new
// pool or not.
func (a *Allocator) SetPool(p Pool) { a.pool = p }

// Allocate returns the lowest free address of family f and marks it used.
func (a *Allocator) Allocate(f corev1.IPFamily) (netip.Addr, error) {
	rs := a.pool.Family(f)
	for _, r := range rs {
		// Every address skipped is one in use: at most len(used) steps.
		for x := r.First; x.IsValid() && !r.Last.Less(x); x = x.Next() {
			if !a.used[x] {
				a.used[x] = true
				return x, nil
			}
		}
	}
	if len(rs) == 0 {
		return netip.Addr{}, fmt.Errorf("%w: the pool %s has no %s addresses", ErrExhausted, a.pool, f)
	}
	return netip.Addr{}, fmt.Errorf("%w: all %d %s addresses of the pool %s are in use", ErrExhausted, a.pool.Size(f), f, a.pool)
}

// Occupy marks x used. It reports whether x is inside the pool (an
// address outside is recorded all the same), and ErrInUse when x is
// already used.
func (a *Allocator) Occupy(x netip.Addr) (inPool bool, err error) {
	if a.used[x] {
		return a.pool.Contains(x), fmt.Errorf("%w: %s", ErrInUse, x)
	}
	a.used[x] = true
	return a.pool.Contains(x), nil
}

// Release frees x; freeing a free address does nothing.
func (a *Allocator) Release(x netip.Addr) { delete(a.used, x) }

// InUse reports whether x is used.
func (a *Allocator) InUse(x netip.Addr) bool { return a.used[x] }

// Used is the number of addresses of family f of the pool in use.
func (a *Allocator) Used(f corev1.IPFamily) int {
	n := 0
	for x := range a.used {
		if familyOf(x) == f && a.pool.Contains(x) {
			n++
		}
	}
	return n
}
