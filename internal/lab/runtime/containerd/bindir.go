package containerd

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
)

// ContainerdVersion is the containerd version hack/node/containerd/go.mod
// pins; hack/build-node.sh puts the node binaries under a directory named
// after it. A test keeps the two in step.
const ContainerdVersion = "v2.4.2"

// CacheBinDir is where hack/build-node.sh puts containerd, its shim, ctr,
// runc and crictl: ${FLATNET_CACHE:-$HOME/.cache/flatnet}/node-<version>/bin,
// beside the k8s binaries.
func CacheBinDir() (string, error) {
	k8sBin, err := controlplane.CacheBinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(filepath.Dir(k8sBin)), "node-"+ContainerdVersion, "bin"), nil
}

// BinDir returns CacheBinDir after checking that every node binary is
// there; the error says what to run.
func BinDir() (string, error) {
	d, err := CacheBinDir()
	if err != nil {
		return "", err
	}
	var missing []string
	for _, b := range nodeBins {
		if !executable(filepath.Join(d, b)) {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%w: %s not in %s: run `make node` (hack/build-node.sh builds containerd %s, its shim, ctr, runc and crictl from the Go module proxy; minutes the first time)",
			controlplane.ErrNoBinaries, strings.Join(missing, ", "), d, ContainerdVersion)
	}
	return d, nil
}

// KubeletBinDir returns the k8s cache's bin dir after checking that the
// kubelet is there.
func KubeletBinDir() (string, error) {
	d, err := controlplane.CacheBinDir()
	if err != nil {
		return "", err
	}
	if !executable(filepath.Join(d, "kubelet")) {
		return "", fmt.Errorf("%w: no kubelet in %s: run `hack/build-k8s.sh kubelet`", controlplane.ErrNoBinaries, d)
	}
	return d, nil
}
