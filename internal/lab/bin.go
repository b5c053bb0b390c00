package lab

// The lab's bin dir holds a copy of flatnet (the daemons' program, on
// pods' PATH); its CNI bin dir a copy of flatnet-cni, linked under every
// CNI plugin name. Two dirs, since the CNI plugin type flatnet would
// otherwise take the flatnet command's place. Copies, not links to ./bin:
// a rebuild of ./bin while the lab runs must not change the programs its
// agents and pods run. A lab picks up a new build at its next `up`,
// which replaces the copies (each by a rename: running programs keep
// theirs) and restarts every flatnet daemon of the lab, so that no
// daemon runs an older program than the flags that up gives it
// (binariesOutdated, Plan).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
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

// binary is one program of the lab's bin dirs.
type binary struct {
	dir, name string
	copyOf    string // a source file to copy, or
	linkTo    string // the name of the file in dir to link to
}

// binaries are the programs of s's bin dirs, flatnet and cni the files
// to copy.
func binaries(s *Spec, flatnet, cni string) []binary {
	bs := []binary{{dir: s.BinDir(), name: "flatnet", copyOf: flatnet}, {dir: s.CNIBinDir(), name: "flatnet-cni", copyOf: cni}}
	for _, n := range cniPluginNames {
		bs = append(bs, binary{dir: s.CNIBinDir(), name: n, linkTo: "flatnet-cni"})
	}
	return bs
}

func binariesPresent(s *Spec) bool {
	for _, b := range binaries(s, "", "") {
		if st, err := os.Stat(filepath.Join(b.dir, b.name)); err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// installBinaries copies flatnet into the bin dir and flatnet-cni into
// the CNI bin dir, and links every plugin name to flatnet-cni there.
// Files already there are kept.
func installBinaries(s *Spec, flatnet, cni string) error {
	for _, b := range binaries(s, flatnet, cni) {
		if err := os.MkdirAll(b.dir, 0o755); err != nil {
			return err
		}
		p := filepath.Join(b.dir, b.name)
		if b.copyOf != "" {
			if err := copyIfChanged(b.copyOf, p); err != nil {
				return err
			}
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(b.linkTo, p); err != nil {
			return err
		}
	}
	return nil
}

// binariesOutdated reports whether the copies in s's bin dirs are not
// flatnet and cni (a lab with no copies yet is not outdated: it has
// nothing to restart).
func binariesOutdated(s *Spec, flatnet, cni string) (bool, error) {
	for _, b := range binaries(s, flatnet, cni) {
		if b.copyOf == "" {
			continue
		}
		same, err := sameContent(b.copyOf, filepath.Join(b.dir, b.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("comparing the lab's %s with %s: %w", b.name, b.copyOf, err)
		}
		if !same {
			return true, nil
		}
	}
	return false, nil
}

// sameContent reports whether files a and b hold the same bytes.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if sa.Size() != sb.Size() {
		return false, nil
	}
	// Equal sizes: b has as many bytes as a gives.
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for {
		n, errA := io.ReadFull(fa, bufA)
		if _, err := io.ReadFull(fb, bufB[:n]); err != nil {
			return false, err
		}
		if !bytes.Equal(bufA[:n], bufB[:n]) {
			return false, nil
		}
		switch errA {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return true, nil
		default:
			return false, errA
		}
	}
}

// copyIfChanged copies src to dst unless dst already holds the same.
func copyIfChanged(src, dst string) error {
	if same, err := sameContent(src, dst); err == nil && same {
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
