// Package atomicfile replaces files so that a crash or a power cut leaves
// either the old content or the new one, never an empty or half-written
// file: the data goes to a temporary file in the same directory, which is
// synced, renamed over the target, and the directory synced so the rename
// itself is durable. Every state file flatnet writes (the lab record, pid
// files, the runtime's pod records, the lab PKI) goes through here.
package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, created with perm (the mode is set
// explicitly, whatever the umask).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, bytes.NewReader(data), perm)
}

// Write replaces path with everything read from r.
func Write(path string, r io.Reader, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	werr := func() error {
		if err := f.Chmod(perm); err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			return err
		}
		return f.Sync()
	}()
	if err := errors.Join(werr, f.Close()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("writing %s: syncing its directory: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
