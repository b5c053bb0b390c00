// Package cni holds flatnet-cni's end-to-end tests: the multi-call binary
// driven through libcni, the library container runtimes use, with the
// conflists users already have for the reference plugins.
package cni

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// Every plugin name answers VERSION with 1.0.0 and 1.1.0 (and the older
// result versions 0.3.x/0.4.0 conflists ask for).
func TestEveryPluginAnswersVersion(t *testing.T) {
	dir := testutil.CNIPath(t)
	for _, name := range testutil.PluginNames {
		t.Run(name, func(t *testing.T) {
			info, err := invoke.GetVersionInfo(context.Background(), filepath.Join(dir, name), nil)
			if err != nil {
				t.Fatalf("VERSION: %v", err)
			}
			got := info.SupportedVersions()
			for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
				if !slices.Contains(got, v) {
					t.Errorf("%s VERSION lacks %s: %v", name, v, got)
				}
			}
		})
	}
}

func TestBinaryNamesAndVersionFlag(t *testing.T) {
	dir := testutil.CNIPath(t)
	out, err := exec.Command(filepath.Join(dir, "flatnet-cni"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("flatnet-cni --version: %v\n%s", err, out)
	}
	for _, n := range testutil.PluginNames {
		if !strings.Contains(string(out), n) {
			t.Errorf("--version output does not list plugin %s:\n%s", n, out)
		}
	}
	// Invoked under a name it does not provide, it says so and fails.
	cmd := exec.Command(filepath.Join(dir, "flatnet-cni"), "no-such-plugin")
	cmd.Args[0] = "whatever"
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a plugin") {
		t.Errorf("unknown name: err=%v out=%s", err, out)
	}
}
