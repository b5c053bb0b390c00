package vxlan

import (
	"errors"
	"fmt"
	"net/netip"
)

// Kernel is the narrow door to the device and its entries. Every method
// acts on the device of the given name; deleting what is already gone is
// success.
type Kernel interface {
	// Link returns the device named name, or nil when there is none.
	Link(name string) (*Link, error)
	CreateLink(d Device) error
	DeleteLink(name string) error
	UpdateLink(name string, u LinkUpdate) error

	// Addrs lists the device's addresses (not IPv6 link-local ones,
	// which the kernel manages).
	Addrs(name string) ([]netip.Prefix, error)
	AddAddr(name string, a netip.Prefix) error
	DelAddr(name string, a netip.Prefix) error

	// Neighs lists the device's permanent neighbour entries.
	Neighs(name string) ([]Neigh, error)
	SetNeigh(name string, n Neigh) error
	DelNeigh(name string, n Neigh) error

	// FDB lists the device's forwarding entries.
	FDB(name string) ([]FDB, error)
	// SetFDB adds the entry for f.MAC or replaces its destination.
	SetFDB(name string, f FDB) error
	DelFDB(name string, f FDB) error
}

// Result says what Sync did.
type Result struct {
	Device  DevicePlan
	Entries EntryPlan
}

// Changed reports whether Sync changed anything.
func (r Result) Changed() bool {
	return r.Device.Create || r.Device.Delete || !r.Device.Update.IsZero() || !r.Entries.Empty()
}

// Sync makes the kernel's device and entries equal want. A device that
// cannot be created or updated stops it (the entries need the device);
// after that every entry change is tried, and all failures come back
// joined.
func Sync(k Kernel, want State) (Result, error) {
	var res Result
	name := want.Device.Name
	have, err := k.Link(name)
	if err != nil {
		return res, fmt.Errorf("reading device %s: %w", name, err)
	}
	res.Device = PlanDevice(want.Device, have)
	if res.Device.Delete {
		if err := k.DeleteLink(name); err != nil {
			return res, fmt.Errorf("deleting device %s (%s): %w", name, res.Device.Reason, err)
		}
	}
	if res.Device.Create {
		if err := k.CreateLink(want.Device); err != nil {
			return res, fmt.Errorf("creating VXLAN device %s (VNI %d, port %d, local %s, dev %s): %w",
				name, want.Device.VNI, want.Device.Port, want.Device.Local, want.Device.Underlay, err)
		}
	}
	if !res.Device.Update.IsZero() {
		if err := k.UpdateLink(name, res.Device.Update); err != nil {
			return res, fmt.Errorf("updating device %s: %w", name, err)
		}
	}

	addrs, err := k.Addrs(name)
	if err != nil {
		return res, fmt.Errorf("reading addresses of %s: %w", name, err)
	}
	neighs, err := k.Neighs(name)
	if err != nil {
		return res, fmt.Errorf("reading neighbour entries of %s: %w", name, err)
	}
	fdb, err := k.FDB(name)
	if err != nil {
		return res, fmt.Errorf("reading FDB entries of %s: %w", name, err)
	}
	p := PlanEntries(want, addrs, neighs, fdb)
	res.Entries = p
	var errs []error
	for _, a := range p.DelAddrs {
		if err := k.DelAddr(name, a); err != nil {
			errs = append(errs, fmt.Errorf("removing address %s from %s: %w", a, name, err))
		}
	}
	for _, a := range p.AddAddrs {
		if err := k.AddAddr(name, a); err != nil {
			errs = append(errs, fmt.Errorf("adding VTEP address %s to %s: %w", a, name, err))
		}
	}
	for _, n := range p.DelNeighs {
		if err := k.DelNeigh(name, n); err != nil {
			errs = append(errs, fmt.Errorf("deleting neighbour %s on %s: %w", n, name, err))
		}
	}
	for _, f := range p.DelFDB {
		if err := k.DelFDB(name, f); err != nil {
			errs = append(errs, fmt.Errorf("deleting FDB entry %s on %s: %w", f, name, err))
		}
	}
	for _, n := range p.SetNeighs {
		if err := k.SetNeigh(name, n); err != nil {
			errs = append(errs, fmt.Errorf("neighbour %s on %s for node %s: %w", n, name, n.Node, err))
		}
	}
	for _, f := range p.SetFDB {
		if err := k.SetFDB(name, f); err != nil {
			errs = append(errs, fmt.Errorf("FDB entry %s on %s for node %s: %w", f, name, f.Node, err))
		}
	}
	return res, errors.Join(errs...)
}

// Remove deletes the device named name, and with it its routes and
// entries; it reports whether there was one.
func Remove(k Kernel, name string) (bool, error) {
	have, err := k.Link(name)
	if err != nil {
		return false, fmt.Errorf("reading device %s: %w", name, err)
	}
	if have == nil {
		return false, nil
	}
	if err := k.DeleteLink(name); err != nil {
		return false, fmt.Errorf("deleting device %s: %w", name, err)
	}
	return true, nil
}
