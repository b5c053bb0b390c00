package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// ConfOptions are the knobs of the benchmark's network. Both plugin sets get
// the same conflist; only DataDir (host-local's state) differs per set.
type ConfOptions struct {
	CNIVersion string
	NetName    string
	Bridge     string
	Subnet     netip.Prefix
	DataDir    string
	// Flatnet: one plugin of the flatnet type (bridge, host-local,
	// bandwidth and portmap in one process) with the same options.
	Flatnet bool
}

// Conflist returns the classic bridge+host-local network with ipMasq, then
// bandwidth and portmap driven by runtime capabilities, as a runtime such
// as containerd would load it from /etc/cni/net.d.
func Conflist(o ConfOptions) ([]byte, error) {
	if o.NetName == "" || o.Bridge == "" || o.DataDir == "" {
		return nil, fmt.Errorf("conflist: network name, bridge and dataDir are required")
	}
	if !o.Subnet.IsValid() || !o.Subnet.Addr().Is4() || o.Subnet.Bits() > 28 {
		return nil, fmt.Errorf("conflist: subnet %v must be an IPv4 prefix of /28 or larger", o.Subnet)
	}
	if o.CNIVersion == "" {
		o.CNIVersion = "1.0.0"
	}
	type m = map[string]any
	conf := m{
		"cniVersion": o.CNIVersion,
		"name":       o.NetName,
		"plugins": []m{
			{
				"type":      "bridge",
				"bridge":    o.Bridge,
				"isGateway": true,
				"ipMasq":    true,
				"ipam": m{
					"type":    "host-local",
					"ranges":  [][]m{{{"subnet": o.Subnet.Masked().String()}}},
					"routes":  []m{{"dst": "0.0.0.0/0"}},
					"dataDir": o.DataDir,
				},
			},
			{
				"type":         "bandwidth",
				"capabilities": m{"bandwidth": true},
			},
			{
				"type":         "portmap",
				"capabilities": m{"portMappings": true},
				"snat":         true,
			},
		},
	}
	if o.Flatnet {
		one := m{"type": "flatnet", "capabilities": m{"bandwidth": true, "portMappings": true}}
		for _, p := range conf["plugins"].([]m) {
			for k, v := range p {
				if k != "type" && k != "capabilities" {
					one[k] = v
				}
			}
		}
		conf["plugins"] = []m{one}
	}
	return json.MarshalIndent(conf, "", "  ")
}

// Port mappings and bandwidth every pod asks for, the way the kubelet
// passes hostPort and the kubernetes.io/{ingress,egress}-bandwidth
// annotations through CRI to libcni.
const (
	benchRate  = 100_000_000 // bits/s
	benchBurst = 1_000_000   // bits
)

// CapabilityArgs returns the runtimeConfig each pod gets.
func CapabilityArgs() map[string]any {
	return map[string]any{
		"portMappings": []map[string]any{
			{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
			{"hostPort": 18053, "containerPort": 53, "protocol": "udp"},
		},
		"bandwidth": map[string]any{
			"ingressRate":  benchRate,
			"ingressBurst": benchBurst,
			"egressRate":   benchRate,
			"egressBurst":  benchBurst,
		},
	}
}
