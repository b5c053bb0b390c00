package lab

// The lab's bin dir holds copies of flatnet and flatnet-cni (under every
// CNI plugin name). Copies, not links: a rebuild of ./bin while the lab
// runs must not change the programs its agents and pods run; a lab picks
// up a new build at its next `down` and `up`.

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/flatnet/flatnet/internal/atomicfile"
)

// sourceBinaries finds flatnet and flatnet-cni to install.
func sourceBinaries(cfg UpConfig) (flatnet, cni string, err error) {
	flatnet = cfg.FlatnetBinary
	if flatnet == "" {
		if flatnet, err = os.Executable(); err != nil {
			return "", "", fmt.Errorf("finding this flatnet binary: %w", err)
		}
	}
	cni = cfg.CNIBinary
	if cni == "" {
		cni = filepath.Join(filepath.Dir(flatnet), "flatnet-cni")
	}
	for _, p := range []string{flatnet, cni} {
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			return "", "", fmt.Errorf("%s not found: the lab installs flatnet-cni from next to flatnet; run `make build` and use bin/flatnet", p)
		}
	}
	return flatnet, cni, nil
}

func binariesPresent(dir string) bool {
	for _, n := range append([]string{"flatnet", "flatnet-cni"}, cniPluginNames...) {
		if st, err := os.Stat(filepath.Join(dir, n)); err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// installBinaries copies flatnet and flatnet-cni into dir and links every
// plugin name to flatnet-cni. Files already there are kept.
func installBinaries(dir, flatnet, cni string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range []struct{ src, name string }{{flatnet, "flatnet"}, {cni, "flatnet-cni"}} {
		if err := copyIfMissing(c.src, filepath.Join(dir, c.name)); err != nil {
			return err
		}
	}
	for _, n := range cniPluginNames {
		p := filepath.Join(dir, n)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink("flatnet-cni", p); err != nil {
			return err
		}
	}
	return nil
}

func copyIfMissing(src, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := atomicfile.Write(dst, in, 0o755); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}
