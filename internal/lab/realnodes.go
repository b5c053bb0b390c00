package lab

// Real nodes (--runtime containerd): each node runs upstream containerd,
// runc and the kubelet (internal/lab/runtime/containerd) in its network
// namespace, and its agent only writes the conflist, routes and serves
// Services and DNS, as on a node of a real cluster. The kubelet registers
// the Node with a certificate of its own (system:node:<name>); pods use
// images the lab builds offline (internal/lab/images) and imports into
// every node's containerd.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/lab/images"
	"github.com/flatnet/flatnet/internal/lab/runtime/containerd"
	"github.com/flatnet/flatnet/internal/proc"
)

// containerdNode is node n as the containerd runtime sees it. Bin dirs and
// images may be empty where only names and paths matter (Down, status).
func containerdNode(s *Spec, n Node, nodeBin, kubeletBin string, tarballs []string) containerd.Node {
	return containerd.Node{
		Name:           n.Name,
		Lab:            s.Name,
		StateDir:       s.StateDir,
		Dir:            s.ContainerdDir(n),
		Netns:          NetnsPath(n.Netns),
		IP:             n.IP,
		Kubeconfig:     s.KubeletKubeconfig(n),
		ClientCAFile:   controlplane.PKI{Dir: controlplane.PKIDir(s.StateDir)}.CACert(),
		CNIConfDir:     s.CNIConfDir(n),
		CNIBinDir:      s.CNIBinDir(),
		ClusterDNS:     []netip.Addr{s.KubeDNSIP()},
		ClusterDomain:  "cluster.local",
		NodeBinDir:     orDir(nodeBin),
		KubeletBinDir:  orDir(kubeletBin),
		Images:         tarballs,
		HostResolvConf: nodeResolvConf(s, n),
	}
}

// orDir stands in for a bin dir that does not matter to the caller
// (MakePlan wants absolute paths).
func orDir(d string) string {
	if d == "" {
		return "/nonexistent"
	}
	return d
}

// nodeResolvConf is the resolv.conf a real node's kubelet gives pods with
// dnsPolicy Default: the agent's node-local DNS address, which forwards to
// the lab's upstream (never the machine's own resolvers, which the node
// cannot reach).
func nodeResolvConf(s *Spec, n Node) string {
	return filepath.Join(s.NodeDir(n), "host-resolv.conf")
}

// nodeDaemons are the pids of node n's containerd and kubelet (0: not
// running).
func nodeDaemons(s *Spec, n Node) (containerdPID, kubeletPID int) {
	p, err := containerd.MakePlan(containerdNode(s, n, "", "", nil))
	if err != nil {
		return 0, 0
	}
	containerdPID, _ = proc.Running(p.Node.Dir, p.Containerd.Name)
	kubeletPID, _ = proc.Running(p.Node.Dir, p.Kubelet.Name)
	return containerdPID, kubeletPID
}

// containerdRunning reports whether node n's containerd and kubelet run.
func containerdRunning(s *Spec, n Node) bool {
	c, k := nodeDaemons(s, n)
	return c != 0 && k != 0
}

// buildImages builds (or finds cached) the images real nodes import and
// returns their tarballs. The first build makes a Debian root with
// debootstrap (a minute or two); later calls hash their inputs.
func buildImages(ctx context.Context, s *Spec, k8sBin, flatnetBin string) ([]string, error) {
	cache, err := images.DefaultCacheDir()
	if err != nil {
		return nil, err
	}
	// agnhost-cnp (hack/build-agnhost-cnp.sh) is optional: without it
	// agnhost:2.45 is the lab's agnhost as is.
	cnp := filepath.Join(k8sBin, "agnhost-cnp")
	if _, err := os.Stat(cnp); err != nil {
		cnp = ""
	}
	// echo-basic (hack/build-echo-basic.sh) too: without it the lab has
	// no Gateway API conformance backends.
	echo := filepath.Join(k8sBin, "echo-basic")
	if _, err := os.Stat(echo); err != nil {
		echo = ""
	}
	ts, err := images.E2E(ctx, images.Config{
		CacheDir:   cache,
		Agnhost:    filepath.Join(k8sBin, "agnhost"),
		AgnhostCNP: cnp,
		CoreDNS:    filepath.Join(k8sBin, "coredns"),
		EchoBasic:  echo,
		FlatnetBin: filepath.Dir(flatnetBin),
		Log:        io.Discard,
	})
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, t := range ts {
		paths = append(paths, t.Path)
	}
	return paths, nil
}

// upKubelet brings node n's containerd and kubelet up (restart: down
// first, its namespace was rebuilt under them).
func upKubelet(ctx context.Context, s *Spec, n Node, k8sBin string, tarballs []string, restart bool) error {
	nodeBin, err := containerd.BinDir()
	if err != nil {
		return err
	}
	node := containerdNode(s, n, nodeBin, k8sBin, tarballs)
	if restart {
		if err := containerd.Down(ctx, node); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(s.NodeDir(n), 0o755); err != nil {
		return err
	}
	resolv := fmt.Sprintf("# flatnet lab %s, node %s: the agent's node-local DNS\nnameserver %s\n", s.Name, n.Name, NodeLocalDNS)
	if err := os.WriteFile(nodeResolvConf(s, n), []byte(resolv), 0o644); err != nil {
		return err
	}
	if err := controlplane.NodeKubeconfig(s.StateDir, s.Name, n.Name, s.KubeletKubeconfig(n)); err != nil {
		return err
	}
	// The kubelet changes host sysctls; down puts them back.
	if err := containerd.RecordSysctls(s.StateDir); err != nil {
		return err
	}
	_, err = containerd.Up(ctx, node, nil)
	return err
}

// downKubelets takes every real node of s down (those with a runtime dir:
// a lab recorded as another runtime, or half made, too) and then restores
// the host sysctls the kubelets changed.
func downKubelets(ctx context.Context, s *Spec, nodes []Node) (int, error) {
	var errs []error
	count := 0
	// Down removes pods through crictl: the cached binaries, unchecked (a
	// node whose containerd is gone needs none).
	nodeBin, _ := containerd.CacheBinDir()
	for _, n := range nodes {
		if !fileExists(s.ContainerdDir(n)) {
			continue
		}
		count++
		if err := containerd.Down(ctx, containerdNode(s, n, nodeBin, "", nil)); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
		}
	}
	if len(errs) == 0 {
		if err := containerd.RestoreSysctls(s.StateDir); err != nil {
			errs = append(errs, err)
		}
	}
	return count, errors.Join(errs...)
}
