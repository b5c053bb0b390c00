package lab

// --install manifest: flatnet goes onto the lab's real nodes as users put it
// onto theirs, by applying deploy/flatnet.yaml (embedded: the very file in
// the repository) with the lab's settings in its ConfigMaps. Nothing else
// of the manifest changes, so what the lab and the conformance suite run on
// is the DaemonSet, Deployment, RBAC and image users get.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/flatnet/flatnet/deploy"
)

// manifestSettings are the ConfigMap values the lab sets: its networks,
// Services, DNS and NetworkPolicy by the agent (no kube-proxy, no CoreDNS), and the
// apiserver's own address (nothing serves the kubernetes Service's
// ClusterIP before the agents run).
func manifestSettings(s *Spec, apiHost, apiPort string) map[string]map[string]string {
	return map[string]map[string]string{
		"flatnet-config": {
			"cluster-cidr":        s.ClusterCIDR.String(),
			"node-cidr-mask-size": strconv.Itoa(s.NodeCIDRMaskSize),
			"backend":             s.Backend,
			"masquerade":          "true",
			"proxy":               "true",
			"proxy-mode":          s.AgentProxyMode(),
			"cni-conflist":        s.AgentCNIConflist(),
			"dns":                 "true",
			"network-policy":      "true",
			"dns-addresses":       NodeLocalDNS + "," + s.KubeDNSIP().String(),
			"dns-upstreams":       s.dnsUpstreams(),
			"dns-reverse-cidrs":   s.ServiceCIDR.String() + "," + s.ClusterCIDR.String(),
			"kube-apiserver-host": apiHost,
			"kube-apiserver-port": apiPort,
		},
		"flatnet-lb-pool": {"pool": s.LoadBalancerPool()},
	}
}

// renderManifest is manifest with set's values in the data of the
// ConfigMaps it names. Every other object is passed through as it is.
func renderManifest(manifest []byte, set map[string]map[string]string) ([]byte, error) {
	var out bytes.Buffer
	found := map[string]bool{}
	for i, doc := range splitYAML(manifest) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("deploy/flatnet.yaml document %d: %w", i+1, err)
		}
		if obj == nil {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if values, ok := set[name]; ok && obj["kind"] == "ConfigMap" {
			data, _ := obj["data"].(map[string]any)
			if data == nil {
				data = map[string]any{}
			}
			for k, v := range values {
				data[k] = v
			}
			obj["data"] = data
			found[name] = true
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		if out.Len() > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	for name := range set {
		if !found[name] {
			return nil, fmt.Errorf("deploy/flatnet.yaml has no ConfigMap %s", name)
		}
	}
	return out.Bytes(), nil
}

// splitYAML splits a multi-document YAML file at its "---" lines.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if strings.TrimRight(line, "\r\n") == "---" {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
	}
	return append(docs, cur.Bytes())
}

// applyManifest renders deploy/flatnet.yaml for s into <state>/flatnet.yaml
// and applies it with kubectl (server-side: a second apply of the same
// objects changes nothing).
func applyManifest(ctx context.Context, s *Spec, kubeconfig, k8sBin string) error {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return err
	}
	ctxCfg := cfg.Contexts[cfg.CurrentContext]
	if ctxCfg == nil || cfg.Clusters[ctxCfg.Cluster] == nil {
		return fmt.Errorf("%s names no cluster", kubeconfig)
	}
	u, err := url.Parse(cfg.Clusters[ctxCfg.Cluster].Server)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return fmt.Errorf("apiserver %s: %w", u, err)
	}
	b, err := renderManifest(deploy.Manifest, manifestSettings(s, host, port))
	if err != nil {
		return err
	}
	file := filepath.Join(s.StateDir, "flatnet.yaml")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(k8sBin, "kubectl"), "--kubeconfig", kubeconfig,
		"apply", "--server-side", "--force-conflicts", "--field-manager", "flatnet-lab", "-f", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply -f %s: %w: %s", file, err, bytes.TrimSpace(out))
	}
	return nil
}
