package vxlan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Fake is an in-memory Kernel for unit tests. Deleting a device drops its
// addresses and entries, as the kernel does.
type Fake struct {
	Links map[string]*FakeLink
	// Ops records every change, in order ("create flatnet.1", "set fdb
	// ...").
	Ops []string
	// OnDelete, when set, runs after a device is deleted (a test hooks
	// routes.Fake.DeleteDevice here).
	OnDelete func(name string)
	// nextIndex numbers created devices.
	nextIndex int
}

// FakeLink is one device of a Fake.
type FakeLink struct {
	Link
	Addrs  []netip.Prefix
	Neighs []Neigh
	FDB    []FDB
}

// NewFake returns a Fake with no devices.
func NewFake() *Fake { return &Fake{Links: map[string]*FakeLink{}, nextIndex: 100} }

func (f *Fake) op(format string, args ...any) { f.Ops = append(f.Ops, fmt.Sprintf(format, args...)) }

func (f *Fake) get(name string) (*FakeLink, error) {
	l, ok := f.Links[name]
	if !ok {
		return nil, fmt.Errorf("device %s: no such device", name)
	}
	return l, nil
}

// Link implements Kernel.
func (f *Fake) Link(name string) (*Link, error) {
	l, ok := f.Links[name]
	if !ok {
		return nil, nil
	}
	c := l.Link
	return &c, nil
}

// CreateLink implements Kernel.
func (f *Fake) CreateLink(d Device) error {
	if _, ok := f.Links[d.Name]; ok {
		return fmt.Errorf("device %s: file exists", d.Name)
	}
	f.op("create %s vni %d port %d local %s dev %s mac %s mtu %d", d.Name, d.VNI, d.Port, d.Local, d.Underlay, d.MAC, d.MTU)
	f.nextIndex++
	f.Links[d.Name] = &FakeLink{Link: Link{
		Name: d.Name, Index: f.nextIndex, IsVXLAN: true, VNI: d.VNI, Port: d.Port, Local: d.Local,
		UnderlayIndex: d.UnderlayIndex, UDPCSum: true, MAC: d.MAC, MTU: d.MTU, TxChecksumOffload: true,
	}}
	return nil
}

// DeleteLink implements Kernel.
func (f *Fake) DeleteLink(name string) error {
	if _, ok := f.Links[name]; !ok {
		return nil
	}
	f.op("delete %s", name)
	delete(f.Links, name)
	if f.OnDelete != nil {
		f.OnDelete(name)
	}
	return nil
}

// UpdateLink implements Kernel.
func (f *Fake) UpdateLink(name string, u LinkUpdate) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	if u.MTU != nil {
		f.op("set %s mtu %d", name, *u.MTU)
		l.MTU = *u.MTU
	}
	if u.MAC != nil {
		f.op("set %s mac %s", name, *u.MAC)
		l.MAC = *u.MAC
	}
	if u.Up {
		f.op("set %s up", name)
		l.Up = true
	}
	if u.TxChecksumOffload != nil {
		f.op("set %s tx-checksum %v", name, *u.TxChecksumOffload)
		l.TxChecksumOffload = *u.TxChecksumOffload
	}
	return nil
}

// Addrs implements Kernel.
func (f *Fake) Addrs(name string) ([]netip.Prefix, error) {
	l, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(l.Addrs), nil
}

// AddAddr implements Kernel.
func (f *Fake) AddAddr(name string, a netip.Prefix) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	if slices.Contains(l.Addrs, a) {
		return fmt.Errorf("address %s: file exists", a)
	}
	f.op("add addr %s", a)
	l.Addrs = append(l.Addrs, a)
	return nil
}

// DelAddr implements Kernel.
func (f *Fake) DelAddr(name string, a netip.Prefix) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	f.op("del addr %s", a)
	l.Addrs = slices.DeleteFunc(l.Addrs, func(x netip.Prefix) bool { return x == a })
	return nil
}

// Neighs implements Kernel.
func (f *Fake) Neighs(name string) ([]Neigh, error) {
	l, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(l.Neighs), nil
}

// WriteEntries implements Kernel, one change after the other.
func (f *Fake) WriteEntries(name string, cs []EntryChange) []error {
	errs := make([]error, len(cs))
	for i, c := range cs {
		switch {
		case c.Del && c.Neigh != nil:
			errs[i] = f.DelNeigh(name, *c.Neigh)
		case c.Del:
			errs[i] = f.DelFDB(name, *c.FDB)
		case c.Neigh != nil:
			errs[i] = f.SetNeigh(name, *c.Neigh)
		default:
			errs[i] = f.SetFDB(name, *c.FDB)
		}
	}
	return errs
}

// SetNeigh sets a neighbour entry.
func (f *Fake) SetNeigh(name string, n Neigh) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	n.Node = ""
	f.op("set neigh %s", n)
	l.Neighs = slices.DeleteFunc(l.Neighs, func(x Neigh) bool { return x.IP == n.IP })
	l.Neighs = append(l.Neighs, n)
	return nil
}

// DelNeigh deletes a neighbour entry.
func (f *Fake) DelNeigh(name string, n Neigh) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	f.op("del neigh %s", n.IP)
	l.Neighs = slices.DeleteFunc(l.Neighs, func(x Neigh) bool { return x.IP == n.IP })
	return nil
}

// FDB implements Kernel.
func (f *Fake) FDB(name string) ([]FDB, error) {
	l, err := f.get(name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(l.FDB), nil
}

// SetFDB sets an FDB entry: like the kernel's NLM_F_REPLACE, it replaces
// the first destination of the MAC.
func (f *Fake) SetFDB(name string, e FDB) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	e.Node = ""
	f.op("set fdb %s", e)
	if i := slices.IndexFunc(l.FDB, func(x FDB) bool { return x.MAC == e.MAC }); i >= 0 {
		l.FDB[i] = e
		return nil
	}
	l.FDB = append(l.FDB, e)
	return nil
}

// DelFDB deletes an FDB entry.
func (f *Fake) DelFDB(name string, e FDB) error {
	l, err := f.get(name)
	if err != nil {
		return err
	}
	f.op("del fdb %s", e)
	l.FDB = slices.DeleteFunc(l.FDB, func(x FDB) bool { return x.MAC == e.MAC && x.Dst == e.Dst })
	return nil
}

// Dump is the device and its entries in the shape of `ip -d link`, `ip
// addr`, `ip neigh` and `bridge fdb` output, sorted; "" without a device.
func (f *Fake) Dump(name string) string {
	l, ok := f.Links[name]
	if !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "link %s vxlan=%v vni %d port %d local %s dev#%d mac %s mtu %d up=%v txcsum=%v\n",
		l.Name, l.IsVXLAN, l.VNI, l.Port, l.Local, l.UnderlayIndex, l.MAC, l.MTU, l.Up, l.TxChecksumOffload)
	addrs := slices.Clone(l.Addrs)
	slices.SortFunc(addrs, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for _, a := range addrs {
		fmt.Fprintf(&b, "addr %s\n", a)
	}
	ns := slices.Clone(l.Neighs)
	slices.SortFunc(ns, func(a, b Neigh) int { return a.IP.Compare(b.IP) })
	for _, n := range ns {
		fmt.Fprintf(&b, "neigh %s\n", n)
	}
	fs := slices.Clone(l.FDB)
	slices.SortFunc(fs, func(a, b FDB) int {
		return cmp.Or(strings.Compare(a.MAC.String(), b.MAC.String()), a.Dst.Compare(b.Dst))
	})
	for _, e := range fs {
		fmt.Fprintf(&b, "fdb %s\n", e)
	}
	return b.String()
}
