package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
)

// Request is what `lab up` was asked for: options plus which flags the
// user set, since an unset flag on a running lab means "as it is".
type Request struct {
	Options
	Changed map[string]bool // flag names without dashes: "nodes", "cluster-cidr", ...
}

// resolve returns the Spec `up` builds: the recorded lab's (grown by more
// nodes if asked), or a new one with an underlay chosen to be free. host
// are the machine's routed and local prefixes (without this lab's own
// bridge), others the underlays other labs recorded. It is pure.
func resolve(req Request, recorded *Spec, host, others []netip.Prefix) (*Spec, error) {
	o := req.Options
	if recorded != nil {
		flagName := func(f string) string { return "--" + f }
		mismatch := func(f, want, have string) error {
			return fmt.Errorf("lab %s runs with %s %s, not %s; changing it needs a new lab: `flatnet lab down --name %s` first", o.Name, flagName(f), have, want, o.Name)
		}
		if req.Changed["backend"] && o.Backend != recorded.Backend {
			return nil, mismatch("backend", o.Backend, recorded.Backend)
		}
		for _, c := range []struct {
			flag string
			want string
			have netip.Prefix
		}{
			{"cluster-cidr", o.ClusterCIDR, recorded.ClusterCIDR},
			{"service-cidr", o.ServiceCIDR, recorded.ServiceCIDR},
			{"underlay-cidr", o.Underlay, recorded.Underlay},
		} {
			if !req.Changed[c.flag] {
				continue
			}
			if p, err := netip.ParsePrefix(c.want); err != nil || p != c.have {
				return nil, mismatch(c.flag, c.want, c.have.String())
			}
		}
		if req.Changed["node-cidr-mask-size"] && o.NodeCIDRMaskSize != recorded.NodeCIDRMaskSize {
			return nil, mismatch("node-cidr-mask-size", strconv.Itoa(o.NodeCIDRMaskSize), strconv.Itoa(recorded.NodeCIDRMaskSize))
		}
		nodes := len(recorded.Nodes)
		if req.Changed["nodes"] {
			if o.Nodes < nodes {
				return nil, fmt.Errorf("lab %s has %d nodes; `up` adds nodes but never removes them (--nodes %d); `flatnet lab down --name %s` first", o.Name, nodes, o.Nodes, o.Name)
			}
			nodes = o.Nodes
		}
		s, err := NewSpec(Options{
			Name:             recorded.Name,
			StateRoot:        filepath.Dir(recorded.StateDir),
			Nodes:            nodes,
			Backend:          recorded.Backend,
			ClusterCIDR:      recorded.ClusterCIDR.String(),
			ServiceCIDR:      recorded.ServiceCIDR.String(),
			NodeCIDRMaskSize: recorded.NodeCIDRMaskSize,
		}, recorded.Underlay)
		if err != nil {
			return nil, err
		}
		return s, checkHost(s, host, others)
	}

	var underlay netip.Prefix
	if o.Underlay != "" {
		p, err := parseV4Prefix("--underlay-cidr", o.Underlay)
		if err != nil {
			return nil, err
		}
		underlay = p
	} else {
		p, err := ChooseUnderlay(o.Name, append(append([]netip.Prefix{}, host...), others...))
		if err != nil {
			return nil, err
		}
		underlay = p
	}
	s, err := NewSpec(o, underlay)
	if err != nil {
		return nil, err
	}
	return s, checkHost(s, host, others)
}

// checkHost refuses ranges that overlap the machine's networks or
// another lab's underlay.
func checkHost(s *Spec, host, others []netip.Prefix) error {
	for _, r := range []struct {
		what, flag string
		p          netip.Prefix
	}{
		{"underlay", "--underlay-cidr", s.Underlay},
		{"cluster CIDR", "--cluster-cidr", s.ClusterCIDR},
		{"service CIDR", "--service-cidr", s.ServiceCIDR},
	} {
		for _, h := range host {
			if r.p.Overlaps(h) {
				return fmt.Errorf("the lab's %s %s overlaps %s, which this machine already uses (see `ip route`); refusing: pick another range with %s", r.what, r.p, h, r.flag)
			}
		}
		if r.what != "underlay" {
			continue
		}
		for _, h := range others {
			if r.p.Overlaps(h) {
				return fmt.Errorf("the lab's underlay %s overlaps %s, another lab's underlay (see `ls %s`); pick another range with --underlay-cidr", r.p, h, filepath.Dir(s.StateDir))
			}
		}
	}
	return nil
}
