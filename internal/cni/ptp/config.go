package ptp

import (
	"encoding/json"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// NetConf is the reference ptp plugin's configuration.
type NetConf struct {
	types.NetConf
	IPMasq        bool    `json:"ipMasq"`
	IPMasqBackend *string `json:"ipMasqBackend,omitempty"`
	MTU           int     `json:"mtu"`
}

// Load decodes and validates a ptp config (code 6 for decoding, 7 for
// invalid values).
func Load(stdin []byte) (*NetConf, error) {
	n := &NetConf{}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "ptp: decoding network config")
	}
	if n.IPAM.Type == "" {
		return nil, cnierr.New(cnierr.InvalidConfig, `ptp: config has no "ipam" block with a "type" (ptp needs IPAM)`)
	}
	if n.MTU < 0 || (n.MTU > 0 && n.MTU < 68) || n.MTU > 65535 {
		return nil, cnierr.New(cnierr.InvalidConfig, `ptp: "mtu": %d is not a valid MTU (68-65535, or 0 for the default)`, n.MTU)
	}
	if b := n.IPMasqBackend; b != nil && *b != "" && *b != "nftables" && *b != "iptables" {
		return nil, cnierr.New(cnierr.InvalidConfig, `ptp: "ipMasqBackend": unknown backend %q (want "nftables" or "iptables")`, *b)
	}
	return n, nil
}
