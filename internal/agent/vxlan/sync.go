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
	// FDB lists the device's forwarding entries.
	FDB(name string) ([]FDB, error)
	// WriteEntries applies cs in order, in as few kernel calls as it
	// can, and returns one error per change (nil: done). A set neighbour
	// entry replaces the one of its IP; a set FDB entry adds the entry
	// for its MAC or replaces its destination.
	WriteEntries(name string, cs []EntryChange) []error
}

// EntryChange is one neighbour or FDB change: exactly one of Neigh and
// FDB is set.
type EntryChange struct {
	Del   bool
	Neigh *Neigh
	FDB   *FDB
}

func (c EntryChange) String() string {
	verb := "set"
	if c.Del {
		verb = "del"
	}
	if c.Neigh != nil {
		return fmt.Sprintf("%s neigh %s", verb, c.Neigh)
	}
	return fmt.Sprintf("%s fdb %s", verb, c.FDB)
}

// Changes are p's neighbour and FDB changes in the order Sync applies
// them: deletions first.
func (p EntryPlan) Changes() []EntryChange {
	cs := make([]EntryChange, 0, len(p.DelNeighs)+len(p.DelFDB)+len(p.SetNeighs)+len(p.SetFDB))
	for i := range p.DelNeighs {
		cs = append(cs, EntryChange{Del: true, Neigh: &p.DelNeighs[i]})
	}
	for i := range p.DelFDB {
		cs = append(cs, EntryChange{Del: true, FDB: &p.DelFDB[i]})
	}
	for i := range p.SetNeighs {
		cs = append(cs, EntryChange{Neigh: &p.SetNeighs[i]})
	}
	for i := range p.SetFDB {
		cs = append(cs, EntryChange{FDB: &p.SetFDB[i]})
	}
	return cs
}

// WriteEntries applies cs to the device name through k and returns every
// failure, joined, each naming its entry and peer.
func WriteEntries(k Kernel, name string, cs []EntryChange) error {
	if len(cs) == 0 {
		return nil
	}
	var errs []error
	for i, err := range k.WriteEntries(name, cs) {
		if err == nil {
			continue
		}
		switch c := cs[i]; {
		case c.Del && c.Neigh != nil:
			errs = append(errs, fmt.Errorf("deleting neighbour %s on %s: %w", c.Neigh, name, err))
		case c.Del:
			errs = append(errs, fmt.Errorf("deleting FDB entry %s on %s: %w", c.FDB, name, err))
		case c.Neigh != nil:
			errs = append(errs, fmt.Errorf("neighbour %s on %s for node %s: %w", c.Neigh, name, c.Neigh.Node, err))
		default:
			errs = append(errs, fmt.Errorf("FDB entry %s on %s for node %s: %w", c.FDB, name, c.FDB.Node, err))
		}
	}
	return errors.Join(errs...)
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
	if err := WriteEntries(k, name, p.Changes()); err != nil {
		errs = append(errs, err)
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
