package bandwidth

import (
	"crypto/sha512"
	"encoding/hex"
	"strings"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/tc"
)

// Plan is what ADD installs for one attachment, and what CHECK expects.
//
//	toward the pod:  host veth root qdisc = TBF(Ingress)
//	from the pod:    host veth ingress qdisc + u32 match-all filter
//	                 -> mirred egress redirect -> IFB, IFB root = TBF(Egress)
type Plan struct {
	Host    tc.Link // host-side end of the container's veth pair
	Ingress *tc.TBF // nil: traffic toward the pod is not shaped
	Egress  *tc.TBF // nil: traffic from the pod is not shaped, no IFB
	IFB     string  // IFB name (set when Egress is)
	Alias   string  // IFB alias recording the owner (set when Egress is)
}

const (
	ifbPrefix    = "bwp"
	maxIfNameLen = 15 // IFNAMSIZ - 1
	aliasPrefix  = "flatnet-bw:"
	maxAliasLen  = 255 // IFALIASZ - 1
)

// IFBName is the IFB device of an attachment: "bwp" and the start of the
// hex SHA-512 of network name + container ID, exactly as the reference
// plugin names it, so DEL and CHECK find IFBs either plugin made.
func IFBName(network, containerID string) string {
	sum := sha512.Sum512([]byte(network + containerID))
	return (ifbPrefix + hex.EncodeToString(sum[:]))[:maxIfNameLen]
}

// isReferenceIFBName reports whether name has the shape IFBName gives.
func isReferenceIFBName(name string) bool {
	if len(name) != maxIfNameLen || !strings.HasPrefix(name, ifbPrefix) {
		return false
	}
	for _, c := range name[len(ifbPrefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Owner identifies the attachment an IFB belongs to. The IFB's name is a
// one-way hash, so ADD records the owner in the link's alias for GC.
type Owner struct {
	Network     string
	ContainerID string
	IfName      string
}

// Alias is the IFB alias for o: "flatnet-bw:NETWORK:CONTAINERID:IFNAME".
// Network names and container IDs cannot contain ':' (libcni validates
// both), and the interface name comes last, so the alias parses back.
func (o Owner) Alias() string {
	return aliasPrefix + o.Network + ":" + o.ContainerID + ":" + o.IfName
}

// parseAlias is the inverse of Owner.Alias; ok is false for any alias
// flatnet did not write.
func parseAlias(alias string) (o Owner, ok bool) {
	rest, found := strings.CutPrefix(alias, aliasPrefix)
	if !found {
		return Owner{}, false
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Owner{}, false
	}
	return Owner{parts[0], parts[1], parts[2]}, true
}

// NewPlan computes the plan for cfg's limits on the host veth host.
// Errors are CNI errors (7: a limit that cannot work on this link).
func NewPlan(cfg *Config, owner Owner, host tc.Link, clock tc.Clock) (*Plan, error) {
	p := &Plan{Host: host}
	for _, d := range []struct {
		name  string
		limit Limit
		out   **tc.TBF
	}{{"ingress", cfg.Ingress, &p.Ingress}, {"egress", cfg.Egress, &p.Egress}} {
		if !d.limit.IsSet() {
			continue
		}
		t, err := clock.TBFFor(d.limit.Rate, d.limit.Burst)
		if err != nil {
			if err == tc.ErrNoClock {
				return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, err, "bandwidth")
			}
			return nil, cnierr.Wrap(cnierr.InvalidConfig, err, "bandwidth: %s limit", d.name)
		}
		// A TBF drops every packet bigger than its bucket: a burst below
		// the MTU would black-hole full-size packets (the kernel only
		// logs a warning).
		if b := clock.BurstBytes(t); host.MTU > 0 && b < uint64(host.MTU) {
			return nil, cnierr.New(cnierr.InvalidConfig,
				"bandwidth: %sBurst %d bits at %sRate %d bit/s makes a %d-byte bucket, smaller than the %d-byte MTU of %s: full-size packets could never pass; raise %sBurst to at least %d bits",
				d.name, d.limit.Burst, d.name, d.limit.Rate, b, host.MTU, host.Name, d.name, uint64(host.MTU)*8)
		}
		*d.out = &t
	}
	if p.Egress != nil {
		p.IFB = IFBName(owner.Network, owner.ContainerID)
		p.Alias = owner.Alias()
		if len(p.Alias) > maxAliasLen {
			return nil, cnierr.New(cnierr.InvalidConfig,
				"bandwidth: network name %q, container ID and interface name %q are too long together (%d bytes) to record as the IFB's owner (at most %d)",
				owner.Network, owner.IfName, len(p.Alias), maxAliasLen)
		}
	}
	return p, nil
}
