package allocator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// Config is a parsed, validated host-local configuration.
type Config struct {
	// Name is the network name (the top-level "name"); reservations live
	// in DataDir/Name.
	Name       string
	CNIVersion string
	DataDir    string
	ResolvConf string
	Routes     []*types.Route
	// Ranges are the range sets in the reference's order: runtime
	// ipRanges first, then the legacy single range, then ipam.ranges. The
	// index of a set names its last_reserved_ip.N file.
	Ranges []RangeSet
	// Requested are the static addresses asked for through CNI_ARGS IP=,
	// args.cni.ips and the "ips" runtime capability, in that order.
	Requested []netip.Addr
	// where names each range set in error messages ("ipam.ranges[0]").
	where []string
}

// Where names range set i as the config spells it, for messages.
func (c *Config) Where(i int) string {
	if i < len(c.where) {
		return c.where[i]
	}
	return fmt.Sprintf("range set %d", i)
}

// The JSON shapes. Addresses are decoded as strings so that a bad one is
// reported with its field name (code 7) instead of a bare decoding error.
type rawRange struct {
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Subnet     string `json:"subnet"`
	Gateway    string `json:"gateway,omitempty"`
}

type rawIPAM struct {
	rawRange
	Type       string            `json:"type"`
	Routes     []json.RawMessage `json:"routes"`
	DataDir    string            `json:"dataDir"`
	ResolvConf string            `json:"resolvConf"`
	Ranges     [][]rawRange      `json:"ranges"`
}

type rawNet struct {
	Name          string   `json:"name"`
	CNIVersion    string   `json:"cniVersion"`
	IPAM          *rawIPAM `json:"ipam"`
	RuntimeConfig struct {
		IPRanges [][]rawRange `json:"ipRanges,omitempty"`
		IPs      []string     `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	Args *struct {
		CNI *struct {
			IPs []string `json:"ips"`
		} `json:"cni"`
	} `json:"args"`
}

// envArgs is what host-local reads from CNI_ARGS, parsed with the same
// rules as the reference (types.LoadArgs: unknown keys are an error unless
// IgnoreUnknown=1).
type envArgs struct {
	types.CommonArgs
	IP textIP
}

type textIP struct{ netip.Addr }

func (t *textIP) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*t = textIP{}
		return nil
	}
	ip, err := parseIPOrCIDR(string(b))
	if err != nil {
		return err
	}
	t.Addr = ip
	return nil
}

// parseIPOrCIDR accepts "10.0.0.5" or "10.0.0.5/24" (the address part is
// used), like the reference's ip.IP.
func parseIPOrCIDR(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("invalid IP address %q", s)
		}
		return p.Addr().Unmap(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("invalid IP address %q", s)
	}
	return ip.Unmap(), nil
}

// Load parses the full network config a plugin receives on stdin (the
// host-local part of it) and CNI_ARGS. Malformed JSON is code 6; anything
// else wrong is code 7 (4 for CNI_ARGS) and the message names the field.
func Load(stdin []byte, cniArgs string) (*Config, error) {
	var n rawNet
	if err := json.Unmarshal(stdin, &n); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, cnierr.New(cnierr.InvalidConfig, "host-local: field %q: cannot use a JSON %s here (want %s)", te.Field, te.Value, te.Type)
		}
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "host-local: decoding network config")
	}
	if n.IPAM == nil {
		return nil, cnierr.New(cnierr.InvalidConfig, `host-local: network config has no "ipam" block`)
	}
	if n.Name == "" || n.Name == "." || n.Name == ".." || strings.ContainsAny(n.Name, "/\x00") {
		return nil, cnierr.New(cnierr.InvalidConfig, "host-local: network \"name\" %q cannot name a directory under dataDir", n.Name)
	}
	c := &Config{
		Name:       n.Name,
		CNIVersion: n.CNIVersion,
		DataDir:    n.IPAM.DataDir,
		ResolvConf: n.IPAM.ResolvConf,
	}

	if cniArgs != "" {
		var e envArgs
		if err := types.LoadArgs(cniArgs, &e); err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidEnvironment, err, "host-local: CNI_ARGS")
		}
		if e.IP.IsValid() {
			c.Requested = append(c.Requested, e.IP.Addr)
		}
	}
	if n.Args != nil && n.Args.CNI != nil {
		for i, s := range n.Args.CNI.IPs {
			ip, err := parseIPOrCIDR(s)
			if err != nil {
				return nil, cnierr.Wrap(cnierr.InvalidConfig, err, "host-local: args.cni.ips[%d]", i)
			}
			c.Requested = append(c.Requested, ip)
		}
	}
	for i, s := range n.RuntimeConfig.IPs {
		ip, err := parseIPOrCIDR(s)
		if err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidConfig, err, "host-local: runtimeConfig.ips[%d]", i)
		}
		c.Requested = append(c.Requested, ip)
	}

	for i, raw := range n.IPAM.Routes {
		var r types.Route
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidConfig, err, "host-local: ipam.routes[%d]", i)
		}
		c.Routes = append(c.Routes, &r)
	}

	// Range sets in the reference's order (see Config.Ranges).
	type rawSet struct {
		where string
		set   []rawRange
	}
	var sets []rawSet
	for i, s := range n.RuntimeConfig.IPRanges {
		sets = append(sets, rawSet{fmt.Sprintf("runtimeConfig.ipRanges[%d]", i), s})
	}
	if n.IPAM.Subnet != "" {
		sets = append(sets, rawSet{"ipam", []rawRange{n.IPAM.rawRange}})
	}
	for i, s := range n.IPAM.Ranges {
		sets = append(sets, rawSet{fmt.Sprintf("ipam.ranges[%d]", i), s})
	}
	if len(sets) == 0 {
		return nil, cnierr.New(cnierr.InvalidConfig, `host-local: no IP ranges specified: set "ipam.ranges" (or the legacy "ipam.subnet")`)
	}

	numV4, numV6 := 0, 0
	for _, rs := range sets {
		set, err := parseRangeSet(rs.set, rs.where)
		if err != nil {
			return nil, err
		}
		c.Ranges = append(c.Ranges, set)
		c.where = append(c.where, rs.where)
		if set[0].Subnet.Addr().Is4() {
			numV4++
		} else {
			numV6++
		}
	}
	if numV4 > 1 || numV6 > 1 {
		if ok, _ := version.GreaterThanOrEqualTo(n.CNIVersion, "0.3.0"); !ok {
			return nil, cnierr.New(cnierr.InvalidConfig, "host-local: CNI version %q does not support more than one address per family (use cniVersion 0.3.0 or later)", n.CNIVersion)
		}
	}
	for i := range c.Ranges {
		for j := i + 1; j < len(c.Ranges); j++ {
			if a, b, ok := c.Ranges[i].overlap(c.Ranges[j]); ok {
				return nil, cnierr.New(cnierr.InvalidConfig, "host-local: %s (%s) overlaps %s (%s)", c.where[i], a, c.where[j], b)
			}
		}
	}
	return c, nil
}

func parseRangeSet(raw []rawRange, where string) (RangeSet, error) {
	if len(raw) == 0 {
		return nil, cnierr.New(cnierr.InvalidConfig, "host-local: %s: empty range set", where)
	}
	set := make(RangeSet, 0, len(raw))
	for i, rr := range raw {
		w := where
		if where != "ipam" {
			w = fmt.Sprintf("%s[%d]", where, i)
		}
		r, err := parseRange(rr, w)
		if err != nil {
			return nil, err
		}
		if i > 0 && r.Subnet.Addr().Is4() != set[0].Subnet.Addr().Is4() {
			return nil, cnierr.New(cnierr.InvalidConfig, "host-local: %s: mixes IPv4 and IPv6 ranges in one range set", where)
		}
		set = append(set, r)
	}
	for i := range set {
		for j := i + 1; j < len(set); j++ {
			if set[i].Overlaps(set[j]) {
				return nil, cnierr.New(cnierr.InvalidConfig, "host-local: %s: ranges %s and %s overlap", where, set[i], set[j])
			}
		}
	}
	return set, nil
}

// parseRange validates one range and fills in the reference's defaults:
// gateway = first address of the subnet, rangeStart = network+1, rangeEnd
// = last address (IPv4: the one before broadcast).
func parseRange(rr rawRange, where string) (Range, error) {
	bad := func(field, format string, a ...any) error {
		return cnierr.New(cnierr.InvalidConfig, "host-local: %s.%s: %s", where, field, fmt.Sprintf(format, a...))
	}
	var r Range
	if rr.Subnet == "" {
		return r, bad("subnet", "missing")
	}
	p, err := netip.ParsePrefix(rr.Subnet)
	if err != nil {
		return r, bad("subnet", "invalid CIDR %q", rr.Subnet)
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return r, bad("subnet", "%q: write IPv4 subnets in dotted form", rr.Subnet)
	}
	if p.Masked() != p {
		return r, bad("subnet", "%s has host bits set; the network address is %s", rr.Subnet, p.Masked())
	}
	if p.Bits() > p.Addr().BitLen()-2 {
		return r, bad("subnet", "network %s is too small to allocate from (need /%d or larger)", p, p.Addr().BitLen()-2)
	}
	r.Subnet = p
	addr := func(field, s string) (netip.Addr, error) {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return ip, bad(field, "invalid IP address %q", s)
		}
		ip = ip.Unmap()
		if !p.Contains(ip) {
			return ip, bad(field, "%s is not in subnet %s", ip, p)
		}
		return ip, nil
	}
	if rr.Gateway != "" {
		if r.Gateway, err = addr("gateway", rr.Gateway); err != nil {
			return r, err
		}
	} else {
		r.Gateway = p.Addr().Next()
	}
	if rr.RangeStart != "" {
		if r.RangeStart, err = addr("rangeStart", rr.RangeStart); err != nil {
			return r, err
		}
	} else {
		r.RangeStart = p.Addr().Next()
	}
	if rr.RangeEnd != "" {
		if r.RangeEnd, err = addr("rangeEnd", rr.RangeEnd); err != nil {
			return r, err
		}
	} else {
		r.RangeEnd = lastAddr(p)
		if p.Addr().Is4() {
			r.RangeEnd = r.RangeEnd.Prev()
		}
	}
	if r.RangeStart.Compare(r.RangeEnd) > 0 {
		return r, bad("rangeStart", "%s is after rangeEnd %s", r.RangeStart, r.RangeEnd)
	}
	return r, nil
}
