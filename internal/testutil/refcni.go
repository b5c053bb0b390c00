package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RefCNIVersion is the containernetworking/plugins release the
// compatibility tests and hack/bench-cni.sh compare against.
const RefCNIVersion = "v1.10.0"

// RefCNI returns the directory holding the reference CNI plugins named by
// their paths under containernetworking/plugins/plugins ("main/bridge",
// "ipam/host-local"), building the missing ones once through the Go
// module proxy into a cache outside git (REF_CNI_DIR, default
// ~/.cache/flatnet/ref-cni-v1.10.0, shared with hack/bench-cni.sh). It
// skips t (fails it in CI), saying why, when they cannot be built.
func RefCNI(t testing.TB, plugins ...string) string {
	t.Helper()
	dir := os.Getenv("REF_CNI_DIR")
	if dir == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				Skip(t, "reference CNI plugins: no cache directory: %v", err)
			}
			base = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(base, "flatnet", "ref-cni-"+RefCNIVersion)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	for _, p := range plugins {
		name := filepath.Base(p)
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Mode()&0o111 != 0 {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			Skip(t, "reference CNI plugins: cannot create cache %s: %v", dir, err)
		}
		// Built in a private directory and renamed, so a concurrent
		// builder (another test process, the benchmark) never sees half
		// a binary.
		tmp, err := os.MkdirTemp(dir, ".build-")
		if err != nil {
			Skip(t, "reference CNI plugins: %v", err)
		}
		cmd := exec.Command(goBin, "install", "github.com/containernetworking/plugins/plugins/"+p+"@"+RefCNIVersion)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err == nil {
			err = os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name))
		}
		os.RemoveAll(tmp)
		if err != nil {
			Skip(t, "reference %s %s unavailable (go install through the module proxy failed): %v\n%s", name, RefCNIVersion, err, out)
		}
	}
	return dir
}
