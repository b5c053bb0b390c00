// Package subnet turns the node's pod subnet into the node's CNI network
// configuration, written atomically into the CNI conf dir and only when its
// content changes (runtimes watch the directory). The conflist comes in two
// styles with the same network name, options and on-node state:
//
//   - flatnet (the default): one plugin of type flatnet, doing bridge (with
//     host-local IPAM over the subnet), bandwidth and portmap in one process
//     (internal/cni/allinone);
//   - classic: the chain bridge, bandwidth, portmap, one process each.
//
// Either way the flatnet-policy plugin is chained last when the policy gate
// is on. Because the flatnet type runs the classic plugins' own code, on
// the same host-local files and nftables tables, a pod set up under one
// style is torn down by the other: a node can switch back and forth.
package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
)

// Defaults of the node network.
const (
	// FileName sorts early in a conf dir: runtimes use the first file.
	FileName    = "10-flatnet.conflist"
	NetworkName = "flatnet"
	BridgeName  = "cni0"
	CNIVersion  = "1.0.0"
)

// Conflist styles (the agent's --cni-conflist).
const (
	StyleFlatnet = "flatnet"
	StyleClassic = "classic"
)

// Styles are the conflist styles, the default first.
var Styles = []string{StyleFlatnet, StyleClassic}

// CheckStyle checks a --cni-conflist value.
func CheckStyle(v string) error {
	if !slices.Contains(Styles, v) {
		return fmt.Errorf("--cni-conflist %q: want %s (one plugin doing bridge, host-local, bandwidth and portmap) or %s (the chain bridge, bandwidth, portmap)",
			v, StyleFlatnet, StyleClassic)
	}
	return nil
}

// Plugins are the plugin binaries a conflist of style uses (policy: with
// the flatnet-policy gate), for the agent to check its CNI bin dir.
func Plugins(style string, policy bool) []string {
	p := []string{"bridge", "host-local", "bandwidth", "portmap"}
	if style != StyleClassic {
		p = []string{allinoneType}
	}
	if policy {
		p = append(p, policyType)
	}
	return p
}

// Plugin types the conflists name.
const (
	allinoneType = "flatnet"
	policyType   = "flatnet-policy"
)

// Config describes the node network.
type Config struct {
	// Style is StyleFlatnet ("" too) or StyleClassic.
	Style string
	// PodCIDRs are the node's pod subnets (one per family).
	PodCIDRs []netip.Prefix
	// DataDir is host-local's dataDir ("" for its default,
	// /var/lib/cni/networks).
	DataDir string
	// MTU of the bridge and pod interfaces (0: the plugin's default).
	MTU int
	// PolicySocket, when set, chains the flatnet-policy plugin last: ADD
	// returns once the agent listening there has the pod's network policy
	// in place (internal/cni/policygate).
	PolicySocket string
}

type conflist struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

// bridge is the bridge plugin's options; with type flatnet and the
// capabilities of bandwidth and portmap it is the flatnet plugin's.
type bridge struct {
	Type         string          `json:"type"`
	Bridge       string          `json:"bridge"`
	IsGateway    bool            `json:"isGateway"`
	IPMasq       bool            `json:"ipMasq"`
	HairpinMode  bool            `json:"hairpinMode"`
	MTU          int             `json:"mtu,omitempty"`
	IPAM         ipam            `json:"ipam"`
	Capabilities map[string]bool `json:"capabilities,omitempty"`
}

type ipam struct {
	Type    string                `json:"type"`
	Ranges  [][]map[string]string `json:"ranges"`
	Routes  []map[string]string   `json:"routes"`
	DataDir string                `json:"dataDir,omitempty"`
}

type policyGate struct {
	Type   string `json:"type"`
	Socket string `json:"socket"`
}

type capPlugin struct {
	Type         string          `json:"type"`
	Capabilities map[string]bool `json:"capabilities"`
}

// Render returns the conflist for cfg. ipMasq is off: the agent
// masquerades traffic that leaves the cluster CIDR itself (one rule for the
// node, not one per pod, and pod-to-pod across nodes keeps its source).
func Render(cfg Config) ([]byte, error) {
	if cfg.Style != "" {
		if err := CheckStyle(cfg.Style); err != nil {
			return nil, err
		}
	}
	if len(cfg.PodCIDRs) == 0 {
		return nil, errors.New("no pod CIDR")
	}
	ip := ipam{Type: "host-local", DataDir: cfg.DataDir}
	seen := map[bool]bool{}
	for _, p := range cfg.PodCIDRs {
		if !p.IsValid() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("invalid pod CIDR %s", p)
		}
		if seen[p.Addr().Is4()] {
			return nil, fmt.Errorf("two pod CIDRs of one family: %v", cfg.PodCIDRs)
		}
		seen[p.Addr().Is4()] = true
		ip.Ranges = append(ip.Ranges, []map[string]string{{"subnet": p.Masked().String()}})
		dst := "0.0.0.0/0"
		if p.Addr().Is6() {
			dst = "::/0"
		}
		ip.Routes = append(ip.Routes, map[string]string{"dst": dst})
	}
	br := bridge{Type: "bridge", Bridge: BridgeName, IsGateway: true, IPMasq: false, HairpinMode: true, MTU: cfg.MTU, IPAM: ip}
	c := conflist{CNIVersion: CNIVersion, Name: NetworkName}
	if cfg.Style == StyleClassic {
		c.Plugins = []any{
			br,
			capPlugin{Type: "bandwidth", Capabilities: map[string]bool{"bandwidth": true}},
			capPlugin{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}},
		}
	} else {
		// The same options, and the capabilities the chain declares.
		br.Type = allinoneType
		br.Capabilities = map[string]bool{"bandwidth": true, "portMappings": true}
		c.Plugins = []any{br}
	}
	if cfg.PolicySocket != "" {
		c.Plugins = append(c.Plugins, policyGate{Type: policyType, Socket: cfg.PolicySocket})
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Write puts data into dir/name atomically (temporary file, fsync,
// rename) unless the file already holds exactly data. It reports whether
// it wrote.
func Write(dir, name string, data []byte) (bool, error) {
	path := filepath.Join(dir, name)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating CNI conf dir: %w", err)
	}
	// A leading dot and no .conf/.conflist/.json suffix: runtimes never
	// load the half-written file.
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return false, fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return false, fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return false, fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return false, fmt.Errorf("syncing %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, fmt.Errorf("installing %s: %w", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable; best effort
		d.Close()
	}
	return true, nil
}

// Shadowing lists the network configs in dir that a runtime would load
// instead of name (they sort before it), so the agent can warn.
func Shadowing(dir, name string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		ext := filepath.Ext(n)
		if e.IsDir() || n >= name || !slices.Contains([]string{".conf", ".conflist", ".json"}, ext) {
			continue
		}
		out = append(out, n)
	}
	return out, nil
}
