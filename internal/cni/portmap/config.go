package portmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// Backend names, as in the reference plugin's "backend" key.
const (
	backendNFT = "nftables"
	backendIPT = "iptables"
)

// defaultMarkBit is the packet-mark bit that asks for masquerade (as the
// reference: Kubernetes uses 14 and 15, Calico 20-31).
const defaultMarkBit = 13

// netConf is the JSON the reference portmap plugin reads.
type netConf struct {
	types.NetConf

	Backend              *string   `json:"backend,omitempty"`
	SNAT                 *bool     `json:"snat,omitempty"`
	ConditionsV4         *[]string `json:"conditionsV4,omitempty"`
	ConditionsV6         *[]string `json:"conditionsV6,omitempty"`
	MasqAll              bool      `json:"masqAll,omitempty"`
	MarkMasqBit          *int      `json:"markMasqBit,omitempty"`
	ExternalSetMarkChain *string   `json:"externalSetMarkChain,omitempty"`
	RuntimeConfig        struct {
		PortMaps []portMapEntry `json:"portMappings,omitempty"`
	} `json:"runtimeConfig"`
}

// portMapEntry is one element of the portMappings capability
// (CONVENTIONS.md). Ports are json.Number so that 70000 or 8.5 is reported
// as an invalid mapping (7), not as undecodable JSON.
type portMapEntry struct {
	HostPort      json.Number `json:"hostPort"`
	ContainerPort json.Number `json:"containerPort"`
	Protocol      string      `json:"protocol"`
	HostIP        string      `json:"hostIP,omitempty"`
}

// Mapping is one validated port mapping.
type Mapping struct {
	Protocol      string // "tcp", "udp" or "sctp"
	HostPort      uint16
	ContainerPort uint16
	// HostIP restricts the mapping to one host address and its family; the
	// zero Addr means every local address of both families. An unspecified
	// address (0.0.0.0, ::) keeps the family but not the restriction.
	HostIP netip.Addr
}

func (m Mapping) String() string {
	host := strconv.Itoa(int(m.HostPort))
	if m.HostIP.IsValid() {
		host = netip.AddrPortFrom(m.HostIP, m.HostPort).String()
	}
	return fmt.Sprintf("%s %s->%d", m.Protocol, host, m.ContainerPort)
}

// Config is a parsed and validated portmap configuration.
type Config struct {
	Name       string
	CNIVersion string
	// Backend is "nftables", "iptables", or "" for automatic: nftables,
	// falling back to iptables when nft is not installed.
	Backend              string
	SNAT                 bool
	MasqAll              bool
	MarkBit              int
	ExternalSetMarkChain string
	ConditionsV4         []string
	ConditionsV6         []string
	Mappings             []Mapping
	// Prev is the previous plugin's result (nil when there was none).
	Prev *current.Result
}

// parseConfig decodes stdin, and the prevResult when withPrev is set (DEL
// and GC do not need it, so a broken one must not fail them). A decoding
// failure has code 6; an invalid value has code 7 and names the field.
func parseConfig(stdin []byte, withPrev bool) (*Config, error) {
	var nc netConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "portmap: decoding network configuration")
	}
	var prev *current.Result
	if withPrev {
		var err error
		if prev, err = plugin.LoadPrevResult(&nc.NetConf); err != nil {
			return nil, err
		}
	}
	cfg := &Config{
		Name:       nc.Name,
		CNIVersion: nc.CNIVersion,
		SNAT:       nc.SNAT == nil || *nc.SNAT,
		MasqAll:    nc.MasqAll,
		MarkBit:    defaultMarkBit,
		Prev:       prev,
	}
	invalid := func(format string, args ...any) error {
		return cnierr.New(cnierr.InvalidConfig, "portmap: "+format, args...)
	}

	if nc.MarkMasqBit != nil && nc.ExternalSetMarkChain != nil {
		return nil, invalid("markMasqBit and externalSetMarkChain are exclusive: set at most one")
	}
	if nc.MarkMasqBit != nil {
		if *nc.MarkMasqBit < 0 || *nc.MarkMasqBit > 31 {
			return nil, invalid("markMasqBit %d is out of range: it must be between 0 and 31", *nc.MarkMasqBit)
		}
		cfg.MarkBit = *nc.MarkMasqBit
	}
	if nc.ExternalSetMarkChain != nil {
		c := *nc.ExternalSetMarkChain
		if c == "" || len(c) > 28 || strings.ContainsAny(c, " \t\r\n\"\\") {
			return nil, invalid("externalSetMarkChain %q is not a valid iptables chain name (1-28 characters, no blanks or quotes)", c)
		}
		cfg.ExternalSetMarkChain = c
	}

	// Backend: explicit, else implied by backend-specific options, else
	// automatic. Options of the other backend are an error, as in the
	// reference plugin.
	want := map[string][]string{}
	if cfg.ExternalSetMarkChain != "" {
		want[backendIPT] = append(want[backendIPT], "externalSetMarkChain")
	}
	for _, c := range []struct {
		field string
		list  *[]string
		dst   *[]string
	}{{"conditionsV4", nc.ConditionsV4, &cfg.ConditionsV4}, {"conditionsV6", nc.ConditionsV6, &cfg.ConditionsV6}} {
		if c.list == nil || len(*c.list) == 0 {
			continue
		}
		be := conditionsBackend(*c.list)
		if be != "" {
			want[be] = append(want[be], c.field)
		}
		for i, s := range *c.list {
			if strings.ContainsAny(s, "\r\n\x00") || (be == backendNFT && strings.ContainsAny(s, ";#")) {
				return nil, invalid("%s[%d] %q: conditions may not contain line breaks, NUL, ';' or '#'", c.field, i, s)
			}
		}
		*c.dst = *c.list
	}
	if nc.Backend != nil {
		switch *nc.Backend {
		case backendNFT, backendIPT:
			cfg.Backend = *nc.Backend
		default:
			return nil, invalid("unknown backend %q: use \"nftables\" or \"iptables\"", *nc.Backend)
		}
	}
	if len(want[backendNFT]) > 0 && len(want[backendIPT]) > 0 {
		return nil, invalid("configuration mixes nftables options %v with iptables options %v", want[backendNFT], want[backendIPT])
	}
	for be, fields := range want {
		if cfg.Backend == "" {
			cfg.Backend = be
		} else if cfg.Backend != be {
			return nil, invalid("%s backend was requested but the configuration has %s-specific options %v", cfg.Backend, be, fields)
		}
	}

	for i, e := range nc.RuntimeConfig.PortMaps {
		m, err := parseMapping(e)
		if err != nil {
			return nil, cnierr.Wrap(cnierr.InvalidConfig, err, "portmap: runtimeConfig.portMappings[%d] %s", i, describe(e))
		}
		cfg.Mappings = append(cfg.Mappings, m)
	}
	return cfg, nil
}

// conditionsBackend says which backend a conditions list is written for:
// iptables arguments start with '-' or '!', nftables expressions never do.
func conditionsBackend(list []string) string {
	if len(list) == 0 || list[0] == "" {
		return ""
	}
	if list[0][0] == '-' || list[0][0] == '!' {
		return backendIPT
	}
	return backendNFT
}

func describe(e portMapEntry) string {
	b, _ := json.Marshal(e)
	return string(b)
}

func parseMapping(e portMapEntry) (Mapping, error) {
	var m Mapping
	port := func(field string, n json.Number) (uint16, error) {
		v, err := strconv.Atoi(n.String())
		if err != nil || v < 1 || v > 65535 {
			if n == "" {
				return 0, fmt.Errorf("%s is missing", field)
			}
			return 0, fmt.Errorf("%s %s is not a port number (1-65535)", field, n)
		}
		return uint16(v), nil
	}
	var err error
	if m.HostPort, err = port("hostPort", e.HostPort); err != nil {
		return m, err
	}
	if m.ContainerPort, err = port("containerPort", e.ContainerPort); err != nil {
		return m, err
	}
	switch p := strings.ToLower(e.Protocol); p {
	case "tcp", "udp", "sctp":
		m.Protocol = p
	case "":
		m.Protocol = "tcp" // Kubernetes' default protocol
	default:
		return m, fmt.Errorf("protocol %q is not supported (tcp, udp or sctp)", e.Protocol)
	}
	if e.HostIP != "" {
		a, err := netip.ParseAddr(e.HostIP)
		if err != nil || a.Zone() != "" {
			return m, errors.New("hostIP is not an IP address")
		}
		a = a.Unmap()
		if a.IsMulticast() || (a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
			return m, fmt.Errorf("hostIP %s cannot be a destination address of a connection", a)
		}
		m.HostIP = a
	}
	return m, nil
}
