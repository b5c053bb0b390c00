package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// KubernetesVersion is the k8s.io/kubernetes version hack/k8s/go.mod pins;
// hack/build-k8s.sh puts the binaries under a directory named after it. A
// test keeps the two in step.
const KubernetesVersion = "v1.37.2"

// CacheBinDir is where hack/build-k8s.sh puts kube-apiserver, kubectl and
// etcd: ${FLATNET_CACHE:-$HOME/.cache/flatnet}/k8s-<version>/bin.
func CacheBinDir() (string, error) {
	base := os.Getenv("FLATNET_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the k8s binaries: set FLATNET_CACHE or HOME: %w", err)
		}
		base = filepath.Join(home, ".cache", "flatnet")
	}
	return filepath.Join(base, "k8s-"+KubernetesVersion, "bin"), nil
}

// BinDir returns CacheBinDir after checking that the lab's control plane
// (kube-apiserver, etcd, kube-controller-manager, kube-scheduler) and
// kubectl are there.
func BinDir() (string, error) {
	d, err := CacheBinDir()
	if err != nil {
		return "", err
	}
	if err := checkBins(d, "kube-apiserver", "etcd", ControllerManagerName, SchedulerName, "kubectl"); err != nil {
		return "", err
	}
	return d, nil
}

func checkBins(dir string, names ...string) error {
	var missing []string
	for _, n := range names {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not found in %s: run `make k8s` (hack/build-k8s.sh builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd %s from the Go module proxy; minutes the first time)",
			ErrNoBinaries, strings.Join(missing, ", "), dir, KubernetesVersion)
	}
	return nil
}

// ErrNoBinaries is returned (wrapped) when the upstream binaries are not
// built.
var ErrNoBinaries = errors.New("kubernetes binaries missing")
