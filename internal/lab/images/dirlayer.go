package images

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/flatnet/flatnet/internal/atomicfile"
)

// DirTar writes the tree under root as one layer tar to w, reproducibly:
// entries in walk order (lexical within a directory), fixed times, no
// user or group names, owners and permission bits (setuid, setgid,
// sticky included) as on disk, hard links as links to the first name
// seen. Devices, fifos and sockets are left out: the runtime mounts /dev.
// skip, when not nil, leaves out the entries it returns true for (paths
// relative to root, without a leading slash); a skipped directory is left
// out with everything below it. Extended attributes are not copied (no
// package of the e2e roots installs file capabilities).
func DirTar(w io.Writer, root string, skip func(rel string) bool) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner information", p)
		}
		h := &tar.Header{
			Name:    rel,
			Mode:    tarMode(fi.Mode()),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
		case m&fs.ModeSymlink != 0:
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			h.Typeflag = tar.TypeSymlink
		case m.IsRegular():
			if st.Nlink > 1 {
				id := inode{uint64(st.Dev), st.Ino}
				if first, ok := seen[id]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, first
					return tw.WriteHeader(h)
				}
				seen[id] = rel
			}
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			return writeFileEntry(tw, h, p)
		default:
			return nil
		}
		return tw.WriteHeader(h)
	})
	if err != nil {
		return fmt.Errorf("packing %s: %w", root, err)
	}
	return tw.Close()
}

func writeFileEntry(tw *tar.Writer, h *tar.Header, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// A file that changed size while read fails here (tar checks the
	// count) rather than giving a layer that differs from its digest.
	if _, err := io.CopyN(tw, f, h.Size); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// tarMode is the tar mode of m: permission bits plus setuid, setgid and
// sticky, in their Unix places.
func tarMode(m fs.FileMode) int64 {
	t := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		t |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		t |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		t |= 0o1000
	}
	return t
}

// WriteDirLayer writes DirTar of root, gzip-compressed, to file (replaced
// atomically): a layer file for Spec.Base.
func WriteDirLayer(file, root string, skip func(rel string) bool) error {
	pr, pw := io.Pipe()
	go func() {
		zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		err := DirTar(zw, root, skip)
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	err := atomicfile.Write(file, pr, 0o644)
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer if Write failed first
	if err != nil {
		return fmt.Errorf("writing layer %s: %w", file, err)
	}
	return nil
}

// underAny reports whether rel is one of dirs' contents (not the directory
// itself): "dev/null" is under "dev", "dev" is not.
func underAny(rel string, dirs ...string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}
