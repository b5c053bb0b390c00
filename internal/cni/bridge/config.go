package bridge

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// DefaultBridge is the bridge name when the config gives none.
const DefaultBridge = "cni0"

// NetConf is the reference bridge plugin's configuration (v1.10.0).
type NetConf struct {
	types.NetConf
	BrName                    string       `json:"bridge"`
	IsGW                      bool         `json:"isGateway"`
	IsDefaultGW               bool         `json:"isDefaultGateway"`
	ForceAddress              bool         `json:"forceAddress"`
	IPMasq                    bool         `json:"ipMasq"`
	IPMasqBackend             *string      `json:"ipMasqBackend,omitempty"`
	MTU                       int          `json:"mtu"`
	HairpinMode               bool         `json:"hairpinMode"`
	PromiscMode               bool         `json:"promiscMode"`
	Vlan                      int          `json:"vlan"`
	VlanTrunk                 []*VlanTrunk `json:"vlanTrunk,omitempty"`
	PreserveDefaultVlan       bool         `json:"preserveDefaultVlan"`
	MacSpoofChk               bool         `json:"macspoofchk,omitempty"`
	EnableDad                 bool         `json:"enabledad,omitempty"`
	DisableContainerInterface bool         `json:"disableContainerInterface,omitempty"`
	PortIsolation             bool         `json:"portIsolation,omitempty"`

	Args struct {
		Cni struct {
			Mac string `json:"mac,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`
	RuntimeConfig struct {
		Mac string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// Derived by Load.
	mac   net.HardwareAddr // requested container MAC, or nil
	vlans []int            // trunk VLAN IDs, sorted
}

// VlanTrunk is one vlanTrunk entry: a range (minID..maxID) and/or an id.
type VlanTrunk struct {
	MinID *int `json:"minID,omitempty"`
	MaxID *int `json:"maxID,omitempty"`
	ID    *int `json:"id,omitempty"`
}

// macArgs is the MAC= key of CNI_ARGS.
type macArgs struct {
	types.CommonArgs
	MAC types.UnmarshallableString `json:"mac,omitempty"`
}

// Layer3 reports whether the config has an IPAM.
func (n *NetConf) Layer3() bool { return n.IPAM.Type != "" }

// Load decodes and validates a bridge config; envArgs is CNI_ARGS. Decode
// failures have code 6, invalid values code 7.
func Load(stdin []byte, envArgs string) (*NetConf, error) {
	n := &NetConf{BrName: DefaultBridge}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "bridge: decoding network config")
	}
	bad := func(format string, a ...any) error {
		return cnierr.New(cnierr.InvalidConfig, "bridge: "+format, a...)
	}
	if n.BrName == "" {
		n.BrName = DefaultBridge
	}
	if err := validIfName(n.BrName); err != nil {
		return nil, bad(`"bridge": %w`, err)
	}
	if n.Vlan < 0 || n.Vlan > 4094 {
		return nil, bad(`"vlan": invalid VLAN ID %d (must be between 0 and 4094)`, n.Vlan)
	}
	if n.Vlan != 0 && n.IsGW {
		// The gateway then lives on a "<bridge>.<vlan>" interface.
		if err := validIfName(fmt.Sprintf("%s.%d", n.BrName, n.Vlan)); err != nil {
			return nil, bad(`"bridge" with "vlan" and "isGateway": gateway interface name: %w`, err)
		}
	}
	var err error
	if n.vlans, err = collectVlanTrunk(n.VlanTrunk); err != nil {
		return nil, bad(`"vlanTrunk": %w`, err)
	}
	if n.MTU < 0 || (n.MTU > 0 && n.MTU < 68) || n.MTU > 65535 {
		return nil, bad(`"mtu": %d is not a valid MTU (68-65535, or 0 for the default)`, n.MTU)
	}
	if n.IsDefaultGW {
		n.IsGW = true
	}
	if n.HairpinMode && n.PromiscMode {
		return nil, bad(`cannot set "hairpinMode" and "promiscMode" at the same time`)
	}
	if n.Layer3() && n.DisableContainerInterface {
		return nil, bad(`cannot use "ipam" when "disableContainerInterface" is set`)
	}
	if b := n.IPMasqBackend; b != nil && *b != "" && *b != "nftables" && *b != "iptables" {
		return nil, bad(`"ipMasqBackend": unknown backend %q (want "nftables" or "iptables")`, *b)
	}
	// The MAC, by increasing precedence: CNI_ARGS, args, runtimeConfig.
	mac := ""
	if envArgs != "" {
		e := macArgs{}
		if err := types.LoadArgs(envArgs, &e); err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidEnvironment, err, "bridge: CNI_ARGS")
		}
		mac = string(e.MAC)
	}
	if m := n.Args.Cni.Mac; m != "" {
		mac = m
	}
	if m := n.RuntimeConfig.Mac; m != "" {
		mac = m
	}
	if mac != "" {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return nil, bad("invalid container MAC %q", mac)
		}
		if hw[0]&1 != 0 {
			return nil, bad("container MAC %q is a multicast address", mac)
		}
		n.mac = hw
	}
	return n, nil
}

// validIfName checks a Linux interface name.
func validIfName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("invalid interface name %q", name)
	case len(name) > 15:
		return fmt.Errorf("interface name %q is longer than 15 characters", name)
	case strings.ContainsAny(name, "/: \t\n\x00"):
		return fmt.Errorf("interface name %q contains '/', ':' or whitespace", name)
	}
	return nil
}

// collectVlanTrunk expands vlanTrunk into sorted unique IDs, with the
// reference plugin's validation.
func collectVlanTrunk(trunk []*VlanTrunk) ([]int, error) {
	if trunk == nil {
		return nil, nil
	}
	ids := map[int]bool{}
	valid := func(v int) bool { return v > 0 && v <= 4094 }
	for _, t := range trunk {
		if t == nil {
			continue
		}
		switch {
		case t.MinID != nil && t.MaxID != nil:
			lo, hi := *t.MinID, *t.MaxID
			if !valid(lo) {
				return nil, fmt.Errorf("incorrect trunk minID %d", lo)
			}
			if !valid(hi) {
				return nil, fmt.Errorf("incorrect trunk maxID %d", hi)
			}
			if hi < lo {
				return nil, fmt.Errorf("minID %d is greater than maxID %d", lo, hi)
			}
			for v := lo; v <= hi; v++ {
				ids[v] = true
			}
		case t.MinID == nil && t.MaxID != nil:
			return nil, fmt.Errorf("minID and maxID must be set together; minID is missing")
		case t.MinID != nil && t.MaxID == nil:
			return nil, fmt.Errorf("minID and maxID must be set together; maxID is missing")
		}
		if t.ID != nil {
			if !valid(*t.ID) {
				return nil, fmt.Errorf("incorrect trunk id %d", *t.ID)
			}
			ids[*t.ID] = true
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	out := make([]int, 0, len(ids))
	for v := range ids {
		out = append(out, v)
	}
	sort.Ints(out)
	return out, nil
}
