// Package images builds the container images a lab with real nodes needs
// (issue 11: the kubelet + containerd runtime), without a registry or a
// container engine: each image is one layer made from files of this machine,
// written as a docker-archive tarball that `ctr images import` reads, under
// the upstream name the pods ask for (registry.k8s.io/pause:3.10.2, ...), so
// that with imagePullPolicy IfNotPresent nothing is ever pulled.
//
// Design. An image is plain data (Spec: files, entrypoint, env); Build
// turns it into a go-containerregistry v1.Image and is deterministic: the
// same files give the same layer and image digests (fixed modification
// times, owner root, entries in path order, parent directories made
// explicit), so a caller can cache by digest and skip re-importing an image a
// node already has. Nothing here touches containerd or the network.
package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every file's modification time: a fixed one keeps digests
// stable (SOURCE_DATE_EPOCH's role in reproducible builds).
var epoch = time.Unix(0, 0).UTC()

// File is one file of an image.
type File struct {
	// Path inside the image, absolute (/agnhost).
	Path string
	// Mode bits (0o755 for programs).
	Mode int64
	// Source is a file of this machine to copy; Data is used when Source
	// is empty.
	Source string
	Data   []byte
	// Link, when set, makes Path a symbolic link to it.
	Link string
	// Dir makes Path a directory (with Mode, 0o755 when 0): an empty one,
	// or one whose mode is not the default (/tmp's 0o1777).
	Dir bool
}

// Spec is an image as data.
type Spec struct {
	// Ref is the name pods use, e.g. registry.k8s.io/pause:3.10.2.
	Ref string
	// Base, when set, is a layer file (a tar, or a gzip-compressed one as
	// WriteDirLayer writes) below Files: the Debian root of most images.
	// Images on the same Base share that layer in containerd's store.
	Base       string
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
}

// Build makes the image of s.
func Build(s Spec) (v1.Image, error) {
	if _, err := name.ParseReference(s.Ref, name.StrictValidation); err != nil {
		return nil, fmt.Errorf("image %q: %w", s.Ref, err)
	}
	var layers []v1.Layer
	if s.Base != "" {
		base, err := tarball.LayerFromFile(s.Base)
		if err != nil {
			return nil, fmt.Errorf("image %s: base layer: %w", s.Ref, err)
		}
		layers = append(layers, base)
	}
	if len(s.Files) > 0 || s.Base == "" {
		layerTar, err := layerTar(s.Files)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Ref, err)
		}
		// Compressed once: the digest needs the gzip, and so does Write.
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(layerTar)), nil
		}, tarball.WithCompressedCaching)
		if err != nil {
			return nil, fmt.Errorf("image %s: layer: %w", s.Ref, err)
		}
		layers = append(layers, layer)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.Env = s.Env
	cf.Config.WorkingDir = s.WorkingDir
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", s.Ref, err)
	}
	return img, nil
}

// layerTar is the uncompressed layer of files: entries in path order,
// every parent directory explicit, owner root, fixed times.
func layerTar(files []File) ([]byte, error) {
	byPath := map[string]File{}
	dirs := map[string]bool{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("file path %q: want an absolute path below /", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("file %s given twice", p)
		}
		byPath[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		if f, given := byPath[d]; given && !f.Dir {
			return nil, fmt.Errorf("%s is both a file and a directory", d)
		}
		names = append(names, d+"/")
	}
	for p, f := range byPath {
		if f.Dir {
			if !dirs[p] {
				names = append(names, p+"/")
			}
			continue
		}
		names = append(names, p)
	}
	slices.Sort(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), ModTime: epoch, Format: tar.FormatPAX}
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			if f, given := byPath[strings.TrimSuffix(n, "/")]; given && f.Mode != 0 {
				h.Mode = f.Mode
			}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		f := byPath[n]
		h.Mode = f.Mode
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if f.Link != "" {
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			continue
		}
		data := f.Data
		if f.Source != "" {
			var err error
			if data, err = os.ReadFile(f.Source); err != nil {
				return nil, fmt.Errorf("%s: %w", n, err)
			}
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes images (by their Spec.Ref) as one docker-archive tarball at
// file, which `ctr -n k8s.io images import` reads. The file is written
// beside and renamed into place, so a reader never sees half of it.
func Write(file string, imgs map[string]v1.Image) error {
	if len(imgs) == 0 {
		return errors.New("no image to write")
	}
	refs := map[name.Reference]v1.Image{}
	for r, img := range imgs {
		ref, err := name.ParseReference(r, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image %q: %w", r, err)
		}
		refs[ref] = img
	}
	tmp := file + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing images to %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// PauseRef is the sandbox image containerd runs for every pod, under the
// name Kubernetes 1.37 and its e2e suite use.
const PauseRef = "registry.k8s.io/pause:3.10.2"

// Pause is the pause image: bin is a static build of cmd/flatnet-pause
// (make build writes bin/flatnet-pause).
func Pause(bin string) Spec {
	return Spec{Ref: PauseRef, Files: []File{{Path: "/pause", Mode: 0o755, Source: bin}}, Entrypoint: []string{"/pause"}}
}
