package routes

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Fake is an in-memory Kernel for unit tests: a main table of owned and
// foreign routes, with the kernel's rule that one destination holds one
// route.
type Fake struct {
	Owned   map[netip.Prefix]netip.Addr
	Foreign []netip.Prefix
	// Reachable, when set, is the only on-link network: Replace fails for
	// another gateway, as the kernel does.
	Reachable netip.Prefix
	// Ops counts Replace and Delete calls.
	Ops int
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{Owned: map[netip.Prefix]netip.Addr{}} }

// List implements Kernel.
func (f *Fake) List() ([]Route, []netip.Prefix, error) {
	var out []Route
	for d, gw := range f.Owned {
		out = append(out, Route{Dst: d, Gw: gw})
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return out, slices.Clone(f.Foreign), nil
}

// Replace implements Kernel.
func (f *Fake) Replace(r Route) error {
	f.Ops++
	if f.Reachable.IsValid() && !f.Reachable.Contains(r.Gw) {
		return fmt.Errorf("network is unreachable")
	}
	if slices.Contains(f.Foreign, r.Dst) {
		return fmt.Errorf("file exists") // replace would take over; the plan never asks
	}
	f.Owned[r.Dst] = r.Gw
	return nil
}

// Delete implements Kernel.
func (f *Fake) Delete(r Route) error {
	f.Ops++
	delete(f.Owned, r.Dst)
	return nil
}

// Dump is the owned routes as `dst via gw` lines, sorted.
func (f *Fake) Dump() string {
	rs, _, _ := f.List()
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintln(&b, r)
	}
	return b.String()
}
