package main

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestConflist(t *testing.T) {
	opts := ConfOptions{NetName: "fnbench", Bridge: "fnb123br", Subnet: netip.MustParsePrefix("10.201.0.7/24"), DataDir: "/tmp/x/ipam"}
	data, err := Conflist(opts)
	if err != nil {
		t.Fatal(err)
	}
	// It must load the way a runtime loads /etc/cni/net.d files.
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni rejects the conflist: %v\n%s", err, data)
	}
	if list.Name != "fnbench" || list.CNIVersion != "1.0.0" {
		t.Errorf("name/version = %q/%q", list.Name, list.CNIVersion)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if got, want := len(types), 3; got != want || types[0] != "bridge" || types[1] != "bandwidth" || types[2] != "portmap" {
		t.Fatalf("plugin chain = %v, want bridge, bandwidth, portmap", types)
	}
	if !list.Plugins[1].Network.Capabilities["bandwidth"] || !list.Plugins[2].Network.Capabilities["portMappings"] {
		t.Errorf("capabilities missing: %v %v", list.Plugins[1].Network.Capabilities, list.Plugins[2].Network.Capabilities)
	}
	var br struct {
		Bridge    string `json:"bridge"`
		IsGateway bool   `json:"isGateway"`
		IPMasq    bool   `json:"ipMasq"`
		IPAM      struct {
			Type    string                `json:"type"`
			DataDir string                `json:"dataDir"`
			Ranges  [][]map[string]string `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &br); err != nil {
		t.Fatal(err)
	}
	if br.Bridge != "fnb123br" || !br.IsGateway || !br.IPMasq || br.IPAM.Type != "host-local" || br.IPAM.DataDir != "/tmp/x/ipam" {
		t.Errorf("bridge config = %+v", br)
	}
	if len(br.IPAM.Ranges) != 1 || br.IPAM.Ranges[0][0]["subnet"] != "10.201.0.0/24" {
		t.Errorf("ranges = %v, want the masked subnet 10.201.0.0/24", br.IPAM.Ranges)
	}

	// The two sets' conflists differ only in dataDir.
	other := opts
	other.DataDir = "/tmp/y/ipam"
	data2, _ := Conflist(other)
	var a, b map[string]any
	_ = json.Unmarshal(data, &a)
	_ = json.Unmarshal(data2, &b)
	a["plugins"].([]any)[0].(map[string]any)["ipam"].(map[string]any)["dataDir"] = "X"
	b["plugins"].([]any)[0].(map[string]any)["ipam"].(map[string]any)["dataDir"] = "X"
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Errorf("conflists differ beyond dataDir:\n%s\n%s", ja, jb)
	}
}

func TestConflistRejects(t *testing.T) {
	good := ConfOptions{NetName: "n", Bridge: "b", Subnet: netip.MustParsePrefix("10.201.0.0/24"), DataDir: "/d"}
	bad := map[string]func(o *ConfOptions){
		"no bridge":   func(o *ConfOptions) { o.Bridge = "" },
		"no dataDir":  func(o *ConfOptions) { o.DataDir = "" },
		"ipv6":        func(o *ConfOptions) { o.Subnet = netip.MustParsePrefix("fd00::/64") },
		"tiny subnet": func(o *ConfOptions) { o.Subnet = netip.MustParsePrefix("10.201.0.0/30") },
		"no subnet":   func(o *ConfOptions) { o.Subnet = netip.Prefix{} },
	}
	for name, mut := range bad {
		o := good
		mut(&o)
		if _, err := Conflist(o); err == nil {
			t.Errorf("%s: Conflist accepted %+v", name, o)
		}
	}
}

func TestCapabilityArgsShape(t *testing.T) {
	// libcni passes these as runtimeConfig; the reference bandwidth plugin
	// requires a burst with every rate.
	data, err := json.Marshal(CapabilityArgs())
	if err != nil {
		t.Fatal(err)
	}
	var rc struct {
		PortMappings []struct {
			HostPort, ContainerPort int
			Protocol                string
		} `json:"portMappings"`
		Bandwidth struct {
			IngressRate, IngressBurst, EgressRate, EgressBurst uint64
		} `json:"bandwidth"`
	}
	if err := json.Unmarshal(data, &rc); err != nil {
		t.Fatal(err)
	}
	if len(rc.PortMappings) != 2 || rc.PortMappings[1].Protocol != "udp" {
		t.Errorf("portMappings = %+v", rc.PortMappings)
	}
	bw := rc.Bandwidth
	if bw.IngressRate == 0 || bw.IngressBurst == 0 || bw.EgressRate == 0 || bw.EgressBurst == 0 {
		t.Errorf("bandwidth = %+v: every rate needs a burst", bw)
	}
}

func TestCountRules(t *testing.T) {
	dump := `table ip nat {
	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.201.0.2 counter jump CNI-abc
	}
	chain CNI-abc {
		ip daddr 10.201.0.0/24 counter accept
		# a comment
		ip daddr != 224.0.0.0/4 counter masquerade
	}
	set s {
		type ipv4_addr
		elements = { 10.0.0.1 }
	}
}
`
	if got := countRules(dump); got != 3 {
		t.Errorf("countRules = %d, want 3", got)
	}
}

// The flatnet set's conflist is one flatnet plugin with every option of
// the classic three and both capabilities.
func TestConflistFlatnet(t *testing.T) {
	opts := ConfOptions{NetName: "fnbench", Bridge: "fnb123br", Subnet: netip.MustParsePrefix("10.201.0.0/24"), DataDir: "/tmp/x/ipam"}
	classic, _ := Conflist(opts)
	opts.Flatnet = true
	data, err := Conflist(opts)
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni rejects the conflist: %v\n%s", err, data)
	}
	if len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "flatnet" {
		t.Fatalf("plugins %+v, want one of type flatnet", list.Plugins)
	}
	if c := list.Plugins[0].Network.Capabilities; !c["bandwidth"] || !c["portMappings"] {
		t.Errorf("capabilities %v, want bandwidth and portMappings", c)
	}
	var one map[string]any
	_ = json.Unmarshal(list.Plugins[0].Bytes, &one)
	var c struct {
		Plugins []map[string]any `json:"plugins"`
	}
	_ = json.Unmarshal(classic, &c)
	for _, p := range c.Plugins {
		for k, v := range p {
			if k == "type" || k == "capabilities" {
				continue
			}
			if got, _ := json.Marshal(one[k]); string(got) != string(must(json.Marshal(v))) {
				t.Errorf("option %s of %s: %s in the flatnet plugin, want %s", k, p["type"], got, must(json.Marshal(v)))
			}
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
