package tc

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory Kernel for tests: links, root TBFs, ingress qdiscs
// and redirect filters, with injectable failures.
type Fake struct {
	mu    sync.Mutex // protects everything below
	links map[int]*fakeLink
	next  int
	// Fail, if set, is consulted before every mutating call with the
	// method's name ("AddIFB", "SetRootTBF", ...) and the link name (or
	// the new IFB's name); a non-nil error makes the call fail with it.
	Fail func(op, link string) error
	// Ops records every successful mutating call, e.g. "AddIFB bwp1".
	Ops []string
}

type fakeLink struct {
	Link
	root      *TBF
	otherRoot string // a non-TBF root qdisc kind, if any
	ingress   bool
	redirects []int
}

var _ Kernel = (*Fake)(nil)

// NewFake returns an empty fake namespace.
func NewFake() *Fake { return &Fake{links: map[int]*fakeLink{}, next: 1} }

// AddLink adds a pre-existing link (a veth, say) and returns its index.
func (f *Fake) AddLink(l Link) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	l.Index = f.next
	f.next++
	f.links[l.Index] = &fakeLink{Link: l}
	return l.Index
}

// SetDown sets link administratively down.
func (f *Fake) SetDown(link int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.links[link]; l != nil {
		l.Up = false
	}
}

// SetOtherRoot gives link a root qdisc of some other kind.
func (f *Fake) SetOtherRoot(link int, kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.links[link]; l != nil {
		l.root, l.otherRoot = nil, kind
	}
}

// Dump describes the namespace, one line per link in index order, e.g.
// "2 bwpabc ifb alias=x root=tbf(...) ingress redirect=[3]".
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var idx []int
	for i := range f.links {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	for _, i := range idx {
		l := f.links[i]
		fmt.Fprintf(&b, "%d %s %s", l.Index, l.Name, l.Kind)
		if l.Alias != "" {
			fmt.Fprintf(&b, " alias=%s", l.Alias)
		}
		if l.root != nil {
			fmt.Fprintf(&b, " root=tbf(%v)", *l.root)
		}
		if l.otherRoot != "" {
			fmt.Fprintf(&b, " root=%s", l.otherRoot)
		}
		if l.ingress {
			b.WriteString(" ingress")
		}
		if len(l.redirects) > 0 {
			fmt.Fprintf(&b, " redirect=%v", l.redirects)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (f *Fake) fail(op, link string) error {
	if f.Fail == nil {
		return nil
	}
	return f.Fail(op, link)
}

func (f *Fake) name(i int) string {
	if l := f.links[i]; l != nil {
		return l.Name
	}
	return fmt.Sprint(i)
}

func (f *Fake) get(i int) (*fakeLink, error) {
	l := f.links[i]
	if l == nil {
		return nil, fmt.Errorf("fake: no link with index %d", i)
	}
	return l, nil
}

// AddIFB implements Kernel.
func (f *Fake) AddIFB(name, alias string, mtu int) (Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("AddIFB", name); err != nil {
		return Link{}, err
	}
	for _, l := range f.links {
		if l.Name == name {
			return Link{}, fmt.Errorf("creating IFB %s: %w", name, ErrExist)
		}
	}
	l := Link{Index: f.next, Name: name, Kind: "ifb", Alias: alias, MTU: mtu, Up: true, MAC: fmt.Sprintf("02:00:00:00:00:%02x", f.next%256)}
	f.next++
	f.links[l.Index] = &fakeLink{Link: l}
	f.Ops = append(f.Ops, "AddIFB "+name)
	return l, nil
}

// LinkByName implements Kernel.
func (f *Fake) LinkByName(name string) (Link, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.links {
		if l.Name == name {
			return l.Link, true, nil
		}
	}
	return Link{}, false, nil
}

// LinkByIndex implements Kernel.
func (f *Fake) LinkByIndex(index int) (Link, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.links[index]; l != nil {
		return l.Link, true, nil
	}
	return Link{}, false, nil
}

// IFBs implements Kernel.
func (f *Fake) IFBs() ([]Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Link
	for _, l := range f.links {
		if l.Kind == "ifb" {
			out = append(out, l.Link)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// DeleteLink implements Kernel. Redirects to the link stay, dangling, as
// in the kernel.
func (f *Fake) DeleteLink(index int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("DeleteLink", f.name(index)); err != nil {
		return err
	}
	if l := f.links[index]; l != nil {
		f.Ops = append(f.Ops, "DeleteLink "+l.Name)
		delete(f.links, index)
	}
	return nil
}

// SetRootTBF implements Kernel.
func (f *Fake) SetRootTBF(link int, t TBF) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("SetRootTBF", f.name(link)); err != nil {
		return err
	}
	l, err := f.get(link)
	if err != nil {
		return err
	}
	l.root, l.otherRoot = &t, ""
	f.Ops = append(f.Ops, "SetRootTBF "+l.Name)
	return nil
}

// RootTBF implements Kernel.
func (f *Fake) RootTBF(link int) (TBF, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.get(link)
	if err != nil {
		return TBF{}, false, err
	}
	if l.root == nil {
		return TBF{}, false, nil
	}
	return *l.root, true, nil
}

// DeleteRoot implements Kernel.
func (f *Fake) DeleteRoot(link int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("DeleteRoot", f.name(link)); err != nil {
		return err
	}
	if l := f.links[link]; l != nil && l.root != nil {
		l.root = nil
		f.Ops = append(f.Ops, "DeleteRoot "+l.Name)
	}
	return nil
}

// AddIngress implements Kernel.
func (f *Fake) AddIngress(link int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("AddIngress", f.name(link)); err != nil {
		return err
	}
	l, err := f.get(link)
	if err != nil {
		return err
	}
	if l.ingress {
		return fmt.Errorf("adding ingress qdisc to %s: %w", l.Name, ErrExist)
	}
	l.ingress = true
	f.Ops = append(f.Ops, "AddIngress "+l.Name)
	return nil
}

// HasIngress implements Kernel.
func (f *Fake) HasIngress(link int) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.get(link)
	if err != nil {
		return false, err
	}
	return l.ingress, nil
}

// DeleteIngress implements Kernel.
func (f *Fake) DeleteIngress(link int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("DeleteIngress", f.name(link)); err != nil {
		return err
	}
	if l := f.links[link]; l != nil && l.ingress {
		l.ingress, l.redirects = false, nil
		f.Ops = append(f.Ops, "DeleteIngress "+l.Name)
	}
	return nil
}

// AddRedirect implements Kernel.
func (f *Fake) AddRedirect(link, to int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("AddRedirect", f.name(link)); err != nil {
		return err
	}
	l, err := f.get(link)
	if err != nil {
		return err
	}
	if !l.ingress {
		return fmt.Errorf("fake: adding a filter to %s, which has no ingress qdisc", l.Name)
	}
	l.redirects = append(l.redirects, to)
	f.Ops = append(f.Ops, fmt.Sprintf("AddRedirect %s %s", l.Name, f.name(to)))
	return nil
}

// Redirects implements Kernel.
func (f *Fake) Redirects(link int) ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.get(link)
	if err != nil {
		return nil, err
	}
	return slices.Clone(l.redirects), nil
}

// AllRedirects implements Kernel.
func (f *Fake) AllRedirects() (map[int][]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int][]int{}
	for _, l := range f.links {
		for _, t := range l.redirects {
			out[t] = append(out[t], l.Index)
		}
	}
	return out, nil
}
