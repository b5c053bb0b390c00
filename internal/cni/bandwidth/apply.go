package bandwidth

// The narrow step: apply a Plan to a tc.Kernel, check it, and remove IFBs.
// Everything here talks to the kernel only through tc.Kernel, so the unit
// tests run it against tc.Fake (rollback, error codes, GC selection).

import (
	"errors"
	"fmt"
	"slices"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/tc"
)

// classify gives kernel errors their CNI code: a missing facility is 105.
func classify(err error, format string, args ...any) error {
	var fe *tc.FeatureError
	if errors.As(err, &fe) {
		return cnierr.Wrap(cnierr.KernelFeatureMissing, err, format, args...)
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// apply installs p. It returns the IFB it created (nil without egress
// shaping) and an undo function that removes everything apply installed.
// When apply fails, it has already undone its own steps.
func apply(k tc.Kernel, p *Plan, owner Owner) (ifb *tc.Link, undo func() error, err error) {
	var undos []func() error
	undoAll := func() error {
		var errs []error
		for _, u := range slices.Backward(undos) {
			errs = append(errs, u())
		}
		undos = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			if uerr := undoAll(); uerr != nil {
				err = fmt.Errorf("%w; undoing the partial setup also failed: %v", err, uerr)
			}
			ifb, undo = nil, nil
		}
	}()
	host := p.Host

	if p.Egress != nil {
		l, err := createIFB(k, p, owner)
		if err != nil {
			return nil, nil, err
		}
		ifb = &l
		undos = append(undos, func() error { return k.DeleteLink(l.Index) })
		if err := k.SetRootTBF(l.Index, *p.Egress); err != nil {
			return nil, nil, classify(err, "bandwidth: shaping egress on IFB %s", l.Name)
		}
		err = k.AddIngress(host.Index)
		if errors.Is(err, tc.ErrExist) {
			// Left by an earlier attempt for this attachment: the host
			// veth is the attachment's own, start it afresh.
			if err = k.DeleteIngress(host.Index); err == nil {
				err = k.AddIngress(host.Index)
			}
		}
		if err != nil {
			return nil, nil, classify(err, "bandwidth: adding the ingress qdisc to host interface %s", host.Name)
		}
		undos = append(undos, func() error { return k.DeleteIngress(host.Index) })
		if err := k.AddRedirect(host.Index, l.Index); err != nil {
			return nil, nil, classify(err, "bandwidth: redirecting traffic from the container (host interface %s) to IFB %s", host.Name, l.Name)
		}
	}
	if p.Ingress != nil {
		if err := k.SetRootTBF(host.Index, *p.Ingress); err != nil {
			return nil, nil, classify(err, "bandwidth: shaping ingress on host interface %s", host.Name)
		}
		undos = append(undos, func() error { return k.DeleteRoot(host.Index) })
	}
	return ifb, undoAll, nil
}

// createIFB makes p's IFB. A leftover IFB of the same attachment (a retried
// ADD, or one the reference plugin made: same name, no alias) is replaced;
// one that belongs to another attachment is a conflict (104).
func createIFB(k tc.Kernel, p *Plan, owner Owner) (tc.Link, error) {
	l, err := k.AddIFB(p.IFB, p.Alias, p.Host.MTU)
	if err == nil || !errors.Is(err, tc.ErrExist) {
		if err != nil {
			return tc.Link{}, classify(err, "bandwidth: shaping traffic from the container")
		}
		return l, nil
	}
	old, ok, lerr := k.LinkByName(p.IFB)
	if lerr != nil {
		return tc.Link{}, fmt.Errorf("bandwidth: IFB name %s is taken and looking it up failed: %w", p.IFB, lerr)
	}
	if ok && !(old.Kind == "ifb" && (old.Alias == "" || old.Alias == p.Alias)) {
		who := old.Alias
		if who == "" {
			who = "a " + old.Kind + " link"
		}
		return tc.Link{}, cnierr.New(cnierr.InterfaceExists,
			"bandwidth: cannot create IFB %s for %s: a link of that name already exists (%s)", p.IFB, owner.Alias(), who)
	}
	if ok {
		if err := k.DeleteLink(old.Index); err != nil {
			return tc.Link{}, fmt.Errorf("bandwidth: removing leftover IFB %s: %w", p.IFB, err)
		}
	}
	l, err = k.AddIFB(p.IFB, p.Alias, p.Host.MTU)
	if err != nil {
		return tc.Link{}, classify(err, "bandwidth: shaping traffic from the container")
	}
	return l, nil
}

// check verifies that the kernel holds what p says; differences are 106.
func check(k tc.Kernel, p *Plan) error {
	failed := func(format string, args ...any) error {
		return cnierr.New(cnierr.CheckFailed, "bandwidth: "+format, args...)
	}
	host := p.Host
	if p.Ingress != nil {
		got, ok, err := k.RootTBF(host.Index)
		if err != nil {
			return fmt.Errorf("bandwidth: reading qdiscs of host interface %s: %w", host.Name, err)
		}
		if !ok {
			return failed("host interface %s has no TBF root qdisc (want %v)", host.Name, *p.Ingress)
		}
		if got != *p.Ingress {
			return failed("host interface %s: TBF root qdisc has %v, want %v", host.Name, got, *p.Ingress)
		}
	}
	if p.Egress != nil {
		ifb, ok, err := k.LinkByName(p.IFB)
		if err != nil {
			return fmt.Errorf("bandwidth: looking up IFB %s: %w", p.IFB, err)
		}
		if !ok || ifb.Kind != "ifb" {
			return failed("IFB %s for traffic from the container is missing", p.IFB)
		}
		if ifb.Alias != "" && ifb.Alias != p.Alias {
			return failed("IFB %s belongs to %q, not %q", p.IFB, ifb.Alias, p.Alias)
		}
		if !ifb.Up {
			return failed("IFB %s is down: traffic from the container redirected to it is dropped", p.IFB)
		}
		got, ok, err := k.RootTBF(ifb.Index)
		if err != nil {
			return fmt.Errorf("bandwidth: reading qdiscs of IFB %s: %w", p.IFB, err)
		}
		if !ok {
			return failed("IFB %s has no TBF root qdisc (want %v)", p.IFB, *p.Egress)
		}
		if got != *p.Egress {
			return failed("IFB %s: TBF root qdisc has %v, want %v", p.IFB, got, *p.Egress)
		}
		has, err := k.HasIngress(host.Index)
		if err != nil {
			return fmt.Errorf("bandwidth: reading qdiscs of host interface %s: %w", host.Name, err)
		}
		if !has {
			return failed("host interface %s has no ingress qdisc to redirect traffic from the container to IFB %s", host.Name, p.IFB)
		}
		to, err := k.Redirects(host.Index)
		if err != nil {
			return fmt.Errorf("bandwidth: reading filters of host interface %s: %w", host.Name, err)
		}
		if !slices.Contains(to, ifb.Index) {
			return failed("host interface %s has no filter redirecting traffic from the container to IFB %s", host.Name, p.IFB)
		}
	}
	return nil
}

// teardown removes the IFB of owner's attachment, if any. A missing IFB is
// success. An IFB of that name recorded as another attachment's (a second
// interface of the same container on the same network) is left alone.
func teardown(k tc.Kernel, del netlinkx.LinkDeleter, owner Owner) error {
	name := IFBName(owner.Network, owner.ContainerID)
	l, ok, err := k.LinkByName(name)
	if err != nil {
		return fmt.Errorf("bandwidth: looking up IFB %s: %w", name, err)
	}
	if !ok || l.Kind != "ifb" {
		return nil
	}
	if l.Alias != "" && l.Alias != owner.Alias() {
		return nil
	}
	if err := del.DeleteLink(l.Index); err != nil {
		return fmt.Errorf("bandwidth: deleting IFB %s: %w", name, err)
	}
	return nil
}

// collect removes the IFBs of network whose attachment is not in valid.
// Ours say their owner in their alias. The reference plugin's have no
// alias and a one-way-hashed name; such an IFB is collected only when it
// is not the IFB of a valid attachment of this network and no filter in
// the namespace redirects to it (its host veth, and so its container, is
// gone). Per-IFB failures are collected and the rest still processed.
func collect(k tc.Kernel, network string, valid map[plugin.Attachment]bool) (removed []string, err error) {
	ifbs, err := k.IFBs()
	if err != nil {
		return nil, fmt.Errorf("bandwidth: GC: listing IFBs: %w", err)
	}
	keep := map[string]bool{}
	for a := range valid {
		keep[IFBName(network, a.ContainerID)] = true
	}
	var errs []error
	var orphans []tc.Link
	for _, l := range ifbs {
		if o, ok := parseAlias(l.Alias); ok {
			if o.Network != network || valid[plugin.Attachment{ContainerID: o.ContainerID, IfName: o.IfName}] {
				continue
			}
			if err := k.DeleteLink(l.Index); err != nil {
				errs = append(errs, fmt.Errorf("deleting IFB %s of %s: %w", l.Name, l.Alias, err))
				continue
			}
			removed = append(removed, l.Name)
			continue
		}
		if l.Alias == "" && isReferenceIFBName(l.Name) && !keep[l.Name] {
			orphans = append(orphans, l)
		}
	}
	if len(orphans) > 0 {
		targets, err := k.AllRedirects()
		if err != nil {
			errs = append(errs, fmt.Errorf("listing redirect filters: %w", err))
		} else {
			for _, l := range orphans {
				if len(targets[l.Index]) > 0 {
					continue
				}
				if err := k.DeleteLink(l.Index); err != nil {
					errs = append(errs, fmt.Errorf("deleting unreferenced IFB %s: %w", l.Name, err))
					continue
				}
				removed = append(removed, l.Name)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("bandwidth: GC: %w", err)
	}
	return removed, nil
}
