package portmap

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
)

// The plan: what rules one attachment needs, as plain data. Both backends
// render the same plan; nothing here touches the kernel.

// ID names an attachment's rules in both backends. Net is derived from the
// network name only, so GC for one network finds (and touches) only its own
// attachments' rules; Att from (network, containerID, ifname).
type ID struct {
	Net string // 6 base32 characters
	Att string // 10 base32 characters
}

func (id ID) String() string { return id.Net + "-" + id.Att }

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func hash(n int, parts ...string) string {
	s := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return strings.ToLower(b32.EncodeToString(s[:]))[:n]
}

func netToken(network string) string { return hash(6, "flatnet-portmap-net", network) }

// attachmentID returns the ID of (network, containerID, ifName).
func attachmentID(network, containerID, ifName string) ID {
	return ID{Net: netToken(network), Att: hash(10, "flatnet-portmap-att", network, containerID, ifName)}
}

// Attachment is one (containerID, ifname) of a network.
type Attachment struct {
	Network     string
	ContainerID string
	IfName      string
}

// ID returns the attachment's rule ID.
func (a Attachment) ID() ID { return attachmentID(a.Network, a.ContainerID, a.IfName) }

// Family is what one address family of an attachment needs.
type Family struct {
	IPv6        bool
	ContainerIP netip.Addr
	// PodNet is the container's network (its address masked by the prefix
	// length in prevResult): a connection from it to a host port is
	// hairpin. On a bridge the DNATed reply would cross the bridge straight
	// to the caller, bypassing the node's conntrack unless br_netfilter is
	// on, so with snat it is masqueraded, as by the reference's iptables
	// backend.
	PodNet netip.Prefix
	// Conditions are the configured extra match conditions for this family
	// (conditionsV4/V6), in the backend's own syntax.
	Conditions []string
	// Mappings are the mappings that apply to this family (those with no
	// hostIP or a hostIP of this family), in configuration order.
	Mappings []Mapping
}

// Plan is every rule an attachment needs.
type Plan struct {
	Attachment Attachment
	ID         ID
	// SNAT marks hairpin (a container of the same pod network, itself
	// included, through a host port) and, for IPv4, localhost-originated
	// connections for masquerade.
	SNAT bool
	// MasqAll marks every mapped connection, not just hairpin/localhost.
	MasqAll bool
	// MarkBit is the masquerade mark bit; SetMarkChain, if set, is an
	// external iptables chain that marks instead of ours.
	MarkBit      int
	SetMarkChain string
	// Families holds IPv4 then IPv6, each only when the container has an
	// address of that family and some mapping applies to it.
	Families []Family
}

// Mark returns the masquerade mark value.
func (p *Plan) Mark() uint32 { return 1 << uint(p.MarkBit) }

// HasIPv4 reports whether the plan has IPv4 rules.
func (p *Plan) HasIPv4() bool { return len(p.Families) > 0 && !p.Families[0].IPv6 }

// UDPPorts returns the host ports of UDP mappings of the given family.
func (p *Plan) UDPPorts(ipv6 bool) []uint16 {
	var out []uint16
	for _, f := range p.Families {
		if f.IPv6 != ipv6 {
			continue
		}
		for _, m := range f.Mappings {
			if m.Protocol == "udp" {
				out = append(out, m.HostPort)
			}
		}
	}
	return out
}

// containerIPs returns the first IPv4 and first IPv6 address of the
// container interface ifName in a result, with their prefix lengths.
// Addresses of other interfaces (host-side interfaces have no sandbox) are
// skipped; addresses that name no interface are taken, as by the reference
// plugin.
func containerIPs(r *current.Result, ifName string) (v4, v6 netip.Prefix) {
	if r == nil {
		return
	}
	for _, ip := range r.IPs {
		if ip.Interface != nil {
			i := *ip.Interface
			if i >= 0 && i < len(r.Interfaces) && (r.Interfaces[i].Name != ifName || r.Interfaces[i].Sandbox == "") {
				continue
			}
		}
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		bits := a.BitLen() // no usable mask: the address alone
		if ones, size := ip.Address.Mask.Size(); size == bits {
			bits = ones
		}
		switch {
		case a.Is4() && !v4.IsValid():
			v4 = netip.PrefixFrom(a, bits)
		case a.Is6() && !v6.IsValid():
			v6 = netip.PrefixFrom(a, bits)
		}
	}
	return
}

// buildPlan computes the rules of attachment a with container addresses
// v4 and v6, "ip/len" (either may be invalid).
func buildPlan(cfg *Config, a Attachment, v4, v6 netip.Prefix) *Plan {
	p := &Plan{
		Attachment:   a,
		ID:           a.ID(),
		SNAT:         cfg.SNAT,
		MasqAll:      cfg.MasqAll,
		MarkBit:      cfg.MarkBit,
		SetMarkChain: cfg.ExternalSetMarkChain,
	}
	for _, fam := range []struct {
		ipv6 bool
		ip   netip.Prefix
		cond []string
	}{{false, v4, cfg.ConditionsV4}, {true, v6, cfg.ConditionsV6}} {
		if !fam.ip.IsValid() {
			continue
		}
		f := Family{IPv6: fam.ipv6, ContainerIP: fam.ip.Addr(), PodNet: fam.ip.Masked(), Conditions: fam.cond}
		for _, m := range cfg.Mappings {
			if m.HostIP.IsValid() && m.HostIP.Is6() != fam.ipv6 {
				continue // a hostIP of the other family
			}
			f.Mappings = append(f.Mappings, m)
		}
		if len(f.Mappings) > 0 {
			p.Families = append(p.Families, f)
		}
	}
	return p
}

// restricts reports whether m is limited to one host address (an
// unspecified hostIP only selects the family).
func restricts(m Mapping) bool { return m.HostIP.IsValid() && !m.HostIP.IsUnspecified() }
