package macvlan

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// NetConf is the reference macvlan plugin's configuration (v1.10.0).
type NetConf struct {
	types.NetConf
	// Master is the parent interface; empty means the interface of the
	// default route (in the runtime's netns, or in the container's netns
	// when LinkInContainer is set).
	Master string `json:"master"`
	// Mode is bridge (default), private, vepa or passthru.
	Mode string `json:"mode"`
	// MTU of the macvlan; 0 inherits the master's. At most the master's.
	MTU int `json:"mtu"`
	// Mac is the container interface's MAC address (CNI_ARGS MAC= and the
	// "mac" runtime capability override it).
	Mac string `json:"mac,omitempty"`
	// LinkInContainer says the master lives in the container's netns.
	LinkInContainer bool `json:"linkInContainer,omitempty"`
	// BCQueueLen is the macvlan broadcast queue length (0: kernel default).
	BCQueueLen uint32 `json:"bcqueuelen,omitempty"`

	RuntimeConfig struct {
		Mac string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	// Derived by Load.
	mode netlink.MacvlanMode
	mac  net.HardwareAddr // nil: the kernel picks one
}

// macArgs is the MAC= key of CNI_ARGS, as the reference reads it.
type macArgs struct {
	types.CommonArgs
	MAC types.UnmarshallableString `json:"mac,omitempty"`
}

// Layer3 reports whether the config has an IPAM. Without one (no "ipam"
// block, or one without a type) the macvlan is an L2-only interface that
// is only set up, as in the reference.
func (n *NetConf) Layer3() bool { return n.IPAM.Type != "" }

// modes maps the config's mode names to the kernel's.
var modes = []struct {
	name string
	mode netlink.MacvlanMode
}{
	{"bridge", netlink.MACVLAN_MODE_BRIDGE},
	{"private", netlink.MACVLAN_MODE_PRIVATE},
	{"vepa", netlink.MACVLAN_MODE_VEPA},
	{"passthru", netlink.MACVLAN_MODE_PASSTHRU},
}

func parseMode(s string) (netlink.MacvlanMode, error) {
	if s == "" {
		return netlink.MACVLAN_MODE_BRIDGE, nil
	}
	for _, m := range modes {
		if m.name == s {
			return m.mode, nil
		}
	}
	return 0, fmt.Errorf("unknown mode %q: use bridge, private, vepa or passthru", s)
}

func modeName(m netlink.MacvlanMode) string {
	for _, e := range modes {
		if e.mode == m {
			return e.name
		}
	}
	return fmt.Sprintf("mode(%d)", m)
}

// Load decodes and validates a macvlan config; envArgs is CNI_ARGS.
// Decoding failures have code 6, invalid values code 7, a malformed
// CNI_ARGS code 4. Load is pure: the master's existence and MTU are checked
// by ADD (planLink), where the kernel is at hand.
func Load(stdin []byte, envArgs string) (*NetConf, error) {
	n, err := decode(stdin)
	if err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) error {
		return cnierr.New(cnierr.InvalidConfig, "macvlan: "+format, a...)
	}
	if n.mode, err = parseMode(n.Mode); err != nil {
		return nil, bad(`"mode": %w`, err)
	}
	if n.MTU < 0 {
		return nil, bad(`"mtu" %d is negative: use 0 (the master's MTU) or a value up to the master's`, n.MTU)
	}
	if len(n.Master) > 15 {
		return nil, bad(`"master" %q is longer than an interface name can be (15 bytes)`, n.Master)
	}
	mac, from := n.Mac, `"mac"`
	if envArgs != "" {
		e := macArgs{}
		if err := types.LoadArgs(envArgs, &e); err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidEnvironment, err, "macvlan: parsing CNI_ARGS")
		}
		if e.MAC != "" {
			mac, from = string(e.MAC), "CNI_ARGS MAC"
		}
	}
	if n.RuntimeConfig.Mac != "" {
		mac, from = n.RuntimeConfig.Mac, `runtimeConfig "mac"`
	}
	if mac != "" {
		if n.mac, err = parseMAC(mac); err != nil {
			return nil, bad("%s: %w", from, err)
		}
	}
	return n, nil
}

// decode only decodes the config, for DEL and GC: they must still clean up
// after an ADD that failed on an invalid value (a runtime repeats DEL until
// it succeeds), and they need nothing but the ipam block.
func decode(stdin []byte) (*NetConf, error) {
	n := &NetConf{}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "macvlan: decoding network config")
	}
	return n, nil
}

// parseMAC accepts a unicast Ethernet address (the kernel refuses others
// for a macvlan with EADDRNOTAVAIL; we say so before creating anything).
func parseMAC(s string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return nil, fmt.Errorf("invalid MAC address %q: %w", s, err)
	}
	if len(hw) != 6 {
		return nil, fmt.Errorf("MAC address %q is not a 6-byte Ethernet address", s)
	}
	if hw[0]&1 == 1 {
		return nil, fmt.Errorf("MAC address %q is a multicast address", s)
	}
	if string(hw) == string(make([]byte, 6)) {
		return nil, fmt.Errorf("MAC address %q is all zeroes", s)
	}
	return hw, nil
}
