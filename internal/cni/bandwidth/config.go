package bandwidth

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// Limit is one direction's shaping: a rate in bits per second and a burst
// (bucket size) in bits. The zero Limit means "not limited".
type Limit struct {
	Rate  uint64
	Burst uint64
}

// IsSet reports whether l asks for shaping.
func (l Limit) IsSet() bool { return l.Rate != 0 || l.Burst != 0 }

// entry is the reference's BandwidthEntry, used both at the top level of
// the config and as runtimeConfig.bandwidth (the `bandwidth` capability,
// which carries the kubernetes.io/ingress-bandwidth and egress-bandwidth
// pod annotations from the kubelet through the runtime).
type entry struct {
	IngressRate  uint64 `json:"ingressRate"`  // bits/s toward the container; 0: no limit
	IngressBurst uint64 `json:"ingressBurst"` // bits
	EgressRate   uint64 `json:"egressRate"`   // bits/s from the container; 0: no limit
	EgressBurst  uint64 `json:"egressBurst"`  // bits
}

type rawConf struct {
	types.NetConf
	entry
	RuntimeConfig struct {
		Bandwidth *entry `json:"bandwidth,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	// shapedSubnets/unshapedSubnets (plugins v1.5.0, removed again before
	// v1.10.0) are accepted and ignored, as v1.10.0 does.
}

// Config is the bandwidth plugin's parsed configuration.
type Config struct {
	types.NetConf
	// Ingress and Egress are the effective limits: for each direction,
	// runtimeConfig.bandwidth's values when it sets that direction, else the
	// static ones. (The reference lets any static value hide the whole
	// runtimeConfig entry; a pod's own annotation is the more specific
	// request, so here it wins, direction by direction.)
	Ingress, Egress Limit
}

// parseConfig decodes stdin. With strict, limits are validated (ADD,
// CHECK, STATUS); DEL and GC only need the network name, so that a config
// whose limits ADD rejected can still be torn down.
func parseConfig(stdin []byte, strict bool) (*Config, error) {
	var raw rawConf
	if err := json.Unmarshal(stdin, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// Field paths name embedded structs ("entry.ingressRate").
			field := strings.TrimPrefix(strings.TrimPrefix(te.Field, "entry."), "NetConf.")
			return nil, cnierr.New(cnierr.InvalidConfig, "bandwidth: field %q: %s is not valid here (want %s)", field, te.Value, describeType(te))
		}
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "bandwidth: decoding network config")
	}
	cfg := &Config{NetConf: raw.NetConf}
	cfg.Ingress = Limit{raw.IngressRate, raw.IngressBurst}
	cfg.Egress = Limit{raw.EgressRate, raw.EgressBurst}
	if strict {
		if err := validate("", raw.entry); err != nil {
			return nil, err
		}
	}
	if rt := raw.RuntimeConfig.Bandwidth; rt != nil {
		if strict {
			if err := validate("runtimeConfig.bandwidth.", *rt); err != nil {
				return nil, err
			}
		}
		if in := (Limit{rt.IngressRate, rt.IngressBurst}); in.IsSet() {
			cfg.Ingress = in
		}
		if eg := (Limit{rt.EgressRate, rt.EgressBurst}); eg.IsSet() {
			cfg.Egress = eg
		}
	}
	if cfg.RawPrevResult != nil {
		if _, err := plugin.LoadPrevResult(&cfg.NetConf); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

func describeType(te *json.UnmarshalTypeError) string {
	if te.Type != nil && te.Type.Kind().String() == "uint64" {
		return "a whole number >= 0"
	}
	if te.Type != nil {
		return "a JSON value for Go type " + te.Type.String()
	}
	return "another type"
}

// maxBurst is the largest burst the reference accepts: burst/8 must fit
// below 4 GiB.
const maxBurst = uint64(math.MaxUint32)*8 - 1

func validate(prefix string, e entry) error {
	for _, d := range []struct {
		dir         string
		rate, burst uint64
	}{{"ingress", e.IngressRate, e.IngressBurst}, {"egress", e.EgressRate, e.EgressBurst}} {
		rateF, burstF := prefix+d.dir+"Rate", prefix+d.dir+"Burst"
		bad := func(format string, args ...any) error {
			return cnierr.New(cnierr.InvalidConfig, "bandwidth: "+format, args...)
		}
		switch {
		case d.rate == 0 && d.burst == 0:
		case d.burst == 0:
			return bad("%s is %d but %s is not set: a rate needs a burst (bucket size in bits, e.g. %d for 100 ms at that rate)",
				rateF, d.rate, burstF, max(d.rate/10, 12000))
		case d.rate == 0:
			return bad("%s is %d but %s is not set: a burst needs a rate in bits per second", burstF, d.burst, rateF)
		case d.rate < 8:
			return bad("%s is %d bit/s: the kernel counts in bytes, so the least rate is 8 bit/s", rateF, d.rate)
		case d.burst < 8:
			return bad("%s is %d bits: the kernel counts in bytes, so the least burst is 8 bits", burstF, d.burst)
		case d.burst > maxBurst:
			return bad("%s is %d bits: it cannot be more than 4GB (%d bits)", burstF, d.burst, maxBurst)
		}
	}
	return nil
}

// String describes the limits for messages.
func (l Limit) String() string {
	if !l.IsSet() {
		return "unlimited"
	}
	return fmt.Sprintf("rate %d bit/s burst %d bits", l.Rate, l.Burst)
}
