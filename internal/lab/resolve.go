package lab

import (
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Request is what `lab up` was asked for: options plus which flags the
// user set, since an unset flag on a running lab means "as it is".
type Request struct {
	Options
	Changed map[string]bool // flag names without dashes: "nodes", "cluster-cidr", ...
}

// resolve returns the Spec `up` builds: the recorded lab's (grown by more
// nodes or an external host, or with another backend, if asked), or a new
// one with underlays chosen to be free. host are the machine's routed and
// local prefixes (without this lab's own bridge), others the underlays
// other labs recorded. It is pure.
func resolve(req Request, recorded *Spec, host, others []netip.Prefix) (*Spec, error) {
	o := req.Options
	if o.Subnets == 0 {
		o.Subnets = 1
	}
	if recorded != nil {
		mismatch := func(f, want, have string) error {
			return fmt.Errorf("lab %s runs with --%s %s, not %s; changing it needs a new lab: `flatnet lab down --name %s` first", o.Name, f, have, want, o.Name)
		}
		for _, c := range []struct {
			flag string
			want string
			have netip.Prefix
		}{
			{"cluster-cidr", o.ClusterCIDR, recorded.ClusterCIDR},
			{"service-cidr", o.ServiceCIDR, recorded.ServiceCIDR},
		} {
			if !req.Changed[c.flag] {
				continue
			}
			if p, err := netip.ParsePrefix(c.want); err != nil || p != c.have {
				return nil, mismatch(c.flag, c.want, c.have.String())
			}
		}
		if req.Changed["underlay-cidr"] {
			have := recorded.Underlays()
			given, err := parseUnderlays(o.Underlay)
			if err != nil || len(given) > len(have) {
				return nil, mismatch("underlay-cidr", o.Underlay, joinPrefixes(have))
			}
			for i, g := range given {
				if g != have[i] {
					return nil, mismatch("underlay-cidr", o.Underlay, joinPrefixes(have))
				}
			}
		}
		if req.Changed["runtime"] {
			want, err := specRuntime(o.Runtime)
			if err != nil {
				return nil, err
			}
			if want != recorded.Runtime {
				return nil, mismatch("runtime", o.Runtime, recorded.RuntimeName())
			}
		}
		if req.Changed["install"] {
			want, err := specInstall(o.Install, recorded.Runtime)
			if err != nil {
				return nil, err
			}
			if want != recorded.Install {
				return nil, mismatch("install", o.Install, recorded.InstallName())
			}
		}
		if req.Changed["subnets"] && o.Subnets != recorded.Subnets() {
			return nil, mismatch("subnets", strconv.Itoa(o.Subnets), strconv.Itoa(recorded.Subnets()))
		}
		if req.Changed["node-cidr-mask-size"] && o.NodeCIDRMaskSize != recorded.NodeCIDRMaskSize {
			return nil, mismatch("node-cidr-mask-size", strconv.Itoa(o.NodeCIDRMaskSize), strconv.Itoa(recorded.NodeCIDRMaskSize))
		}
		if req.Changed["lb-pool"] && recorded.LBPool.IsValid() {
			if p, err := netip.ParsePrefix(o.LBPool); err != nil || p != recorded.LBPool {
				return nil, mismatch("lb-pool", o.LBPool, recorded.LBPool.String())
			}
		}
		opts := recorded.Options()
		if !recorded.LBPool.IsValid() {
			// A lab recorded before --lb-pool gets the requested (or
			// default) one: up restarts its controller with it.
			opts.LBPool = o.LBPool
		}
		if req.Changed["nodes"] {
			if o.Nodes < len(recorded.Nodes) {
				return nil, fmt.Errorf("lab %s has %d nodes; `up` adds nodes but never removes them (--nodes %d); `flatnet lab down --name %s` first", o.Name, len(recorded.Nodes), o.Nodes, o.Name)
			}
			opts.Nodes = o.Nodes
		}
		if req.Changed["external"] {
			if !o.External && recorded.External != nil {
				return nil, fmt.Errorf("lab %s has an external host; `up` adds one but never removes it (--external=false); `flatnet lab down --name %s` first", o.Name, o.Name)
			}
			opts.External = opts.External || o.External
		}
		// Another backend is fine: up restarts the agents with it, and
		// each agent removes the old backend's routes and devices.
		if req.Changed["backend"] {
			opts.Backend = o.Backend
		}
		// The same for the proxy mode and the conflist style (pods made
		// under one style are torn down under the other).
		if req.Changed["proxy-mode"] {
			opts.ProxyMode = o.ProxyMode
		}
		if req.Changed["cni-conflist"] {
			opts.CNIConflist = o.CNIConflist
		}
		// And for where the plugins come from ("" is the lab's own).
		if req.Changed["cni-bin-dir"] {
			opts.CNIPluginDir = o.CNIPluginDir
		}
		// Simulated nodes grow and shrink freely (up creates and deletes
		// them); their range stays while any exist.
		if req.Changed["simulated-nodes"] {
			opts.SimulatedNodes = o.SimulatedNodes
		}
		if req.Changed["simulated-node-range"] {
			if recorded.SimulatedNodeRange.IsValid() {
				if p, err := netip.ParsePrefix(o.SimulatedNodeRange); err != nil || p != recorded.SimulatedNodeRange {
					return nil, fmt.Errorf("lab %s has simulated nodes in --simulated-node-range %s, not %s; `flatnet lab up --name %s --simulated-nodes 0` first",
						o.Name, recorded.SimulatedNodeRange, o.SimulatedNodeRange, o.Name)
				}
			}
			opts.SimulatedNodeRange = o.SimulatedNodeRange
		}
		s, err := NewSpec(opts, recorded.Underlays()...)
		if err != nil {
			return nil, fmt.Errorf("lab %s: %w", o.Name, err)
		}
		s.PodCIDRs = maps.Clone(recorded.PodCIDRs)
		return s, checkHost(s, host, others)
	}

	given, err := parseUnderlays(o.Underlay)
	if err != nil {
		return nil, err
	}
	if len(given) > o.Subnets {
		return nil, fmt.Errorf("--underlay-cidr %s names %d networks for --subnets %d", o.Underlay, len(given), o.Subnets)
	}
	taken := append(append([]netip.Prefix{}, host...), others...)
	if !req.Changed["cluster-cidr"] {
		c, err := chooseClusterCIDR(o.ClusterCIDR, taken)
		if err != nil {
			return nil, err
		}
		o.ClusterCIDR = c
	}
	underlays := given
	if len(underlays) == 0 {
		p, err := ChooseUnderlay(o.Name, taken)
		if err != nil {
			return nil, err
		}
		underlays = append(underlays, p)
	}
	if o.Subnets == 2 && len(underlays) == 1 {
		p, err := ChooseSecondUnderlay(underlays[0], taken)
		if err != nil {
			return nil, err
		}
		underlays = append(underlays, p)
	}
	s, err := NewSpec(o, underlays...)
	if err != nil {
		return nil, err
	}
	return s, checkHost(s, host, others)
}

// chooseClusterCIDR returns def if nothing in taken overlaps it, else the
// first free range of its size after it (up to 10.249.255.255: the
// underlays start at 10.250.0.0). Each lab's pod CIDRs are routed from the
// root namespace, so two labs cannot share one; a second lab started
// without --cluster-cidr moves on by itself.
func chooseClusterCIDR(def string, taken []netip.Prefix) (string, error) {
	p, err := parseV4Prefix("--cluster-cidr", def)
	if err != nil {
		return "", err
	}
	limit := netip.MustParseAddr("10.250.0.0")
	for c := p; c.IsValid(); {
		if !slices.ContainsFunc(taken, c.Overlaps) {
			return c.String(), nil
		}
		next := nextPrefix(c)
		if !next.IsValid() || next.Addr().Compare(limit) >= 0 || !p.Addr().Is4() {
			break
		}
		c = next
	}
	return "", fmt.Errorf("no free cluster CIDR of size /%d from %s on (this machine's routes and other labs take them all): pick one with --cluster-cidr", p.Bits(), p)
}

// nextPrefix is the prefix of p's size right after p (invalid past the
// end of the address space).
func nextPrefix(p netip.Prefix) netip.Prefix {
	a := p.Masked().Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	step := uint32(1) << (32 - p.Bits())
	if n+step < n {
		return netip.Prefix{}
	}
	n += step
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), p.Bits())
}

// parseUnderlays reads --underlay-cidr: "", "A" or "A,B".
func parseUnderlays(v string) ([]netip.Prefix, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	fields := strings.Split(v, ",")
	if len(fields) > 2 {
		return nil, fmt.Errorf("--underlay-cidr %q: want one network, or two for --subnets 2", v)
	}
	var out []netip.Prefix
	for _, f := range fields {
		p, err := parseV4Prefix("--underlay-cidr", strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func joinPrefixes(ps []netip.Prefix) string {
	var ss []string
	for _, p := range ps {
		ss = append(ss, p.String())
	}
	return strings.Join(ss, ",")
}

// checkHost refuses ranges that overlap the machine's networks or
// another lab's underlay.
func checkHost(s *Spec, host, others []netip.Prefix) error {
	type rng struct {
		what, flag string
		p          netip.Prefix
		routed     bool // the root namespace routes it: no other lab may
	}
	rs := []rng{
		{"underlay", "--underlay-cidr", s.Underlay, true},
		// Routed from the root namespace to the nodes (Spec.hostRoutes).
		{"cluster CIDR", "--cluster-cidr", s.ClusterCIDR, true},
		{"service CIDR", "--service-cidr", s.ServiceCIDR, false},
	}
	if s.Router != nil {
		rs = append(rs, rng{"second underlay", "--underlay-cidr A,B", s.Underlay2, true})
	}
	if s.LBPool.IsValid() {
		rs = append(rs, rng{"load-balancer pool", "--lb-pool", s.LBPool, false})
	}
	if s.SimulatedNodeRange.IsValid() {
		// Routed only inside the lab's node namespaces (on-link on their
		// eth0): other labs may use it too, this machine must not.
		rs = append(rs, rng{"simulated node range", "--simulated-node-range", s.SimulatedNodeRange, false})
	}
	for _, r := range rs {
		for _, h := range host {
			if r.p.Overlaps(h) {
				return fmt.Errorf("the lab's %s %s overlaps %s, which this machine already uses (see `ip route`); refusing: pick another range with %s", r.what, r.p, h, r.flag)
			}
		}
		if !r.routed {
			continue
		}
		for _, h := range others {
			if r.p.Overlaps(h) {
				return fmt.Errorf("the lab's %s %s overlaps %s, another lab's underlay or cluster CIDR (see `ls %s`); pick another range with %s", r.what, r.p, h, filepath.Dir(s.StateDir), r.flag)
			}
		}
	}
	return nil
}
