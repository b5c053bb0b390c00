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
	Owned   map[netip.Prefix]Route
	Foreign []netip.Prefix
	// Reachable, when set, is the only on-link network: Replace fails for
	// another gateway (unless the route is onlink), as the kernel does.
	Reachable netip.Prefix
	// Devices, when set, are the only devices a route may name.
	Devices []string
	// Ops counts the changes written.
	Ops int
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{Owned: map[netip.Prefix]Route{}} }

// List implements Kernel.
func (f *Fake) List() ([]Route, []netip.Prefix, error) {
	var out []Route
	for _, r := range f.Owned {
		r.Node = ""
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return out, slices.Clone(f.Foreign), nil
}

// Write implements Kernel, one change after the other.
func (f *Fake) Write(cs []Change) []error {
	errs := make([]error, len(cs))
	for i, c := range cs {
		f.Ops++
		switch c.Op {
		case Delete:
			delete(f.Owned, c.Route.Dst)
		case Add:
			if _, ok := f.Owned[c.Route.Dst]; ok || slices.Contains(f.Foreign, c.Route.Dst) {
				errs[i] = fmt.Errorf("file exists")
				continue
			}
			errs[i] = f.replace(c.Route)
		default:
			errs[i] = f.replace(c.Route)
		}
	}
	return errs
}

func (f *Fake) replace(r Route) error {
	if f.Devices != nil && r.Dev != "" && !slices.Contains(f.Devices, r.Dev) {
		return fmt.Errorf("no such device %s", r.Dev)
	}
	if f.Reachable.IsValid() && !r.OnLink && !f.Reachable.Contains(r.Gw) {
		return fmt.Errorf("network is unreachable")
	}
	// As the kernel's replace, it takes over a route flatnet does not
	// own (MakePlan never asks for that; Add refuses it).
	f.Foreign = slices.DeleteFunc(f.Foreign, func(p netip.Prefix) bool { return p == r.Dst })
	f.Owned[r.Dst] = r
	return nil
}

// DeleteDevice drops the routes through dev, as the kernel does when a
// device goes.
func (f *Fake) DeleteDevice(dev string) {
	for d, r := range f.Owned {
		if r.Dev == dev {
			delete(f.Owned, d)
		}
	}
}

// Dump is the owned routes as `dst via gw [dev d] [onlink]` lines, sorted.
func (f *Fake) Dump() string {
	rs, _, _ := f.List()
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintln(&b, r)
	}
	return b.String()
}
