// Package cptest starts a real etcd + kube-apiserver for a root test.
package cptest

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
	"github.com/flatnet/flatnet/internal/testutil"
)

// Start runs etcd and kube-apiserver on 127.0.0.1 (loopback only) until
// the test ends and returns the admin kubeconfig and the binaries'
// directory (kubectl). It needs root, and skips (outside CI) when the
// upstream binaries are not built.
func Start(tb testing.TB, timeout time.Duration) (kubeconfig, binDir string) {
	tb.Helper()
	testutil.RequireRoot(tb)
	binDir, err := controlplane.BinDir()
	if err != nil {
		testutil.Skip(tb, "%v (make k8s builds them)", err)
	}
	state := tb.TempDir()
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := controlplane.Up(ctx, controlplane.Config{StateDir: state, BinDir: binDir, Addr: netip.MustParseAddr("127.0.0.1")}, &log)
	tb.Cleanup(func() {
		if err := controlplane.Down(state); err != nil {
			tb.Errorf("control plane down: %v", err)
		}
	})
	if err != nil {
		tb.Fatalf("control plane up: %v\n%s", err, log.String())
	}
	return info.Kubeconfig, binDir
}
