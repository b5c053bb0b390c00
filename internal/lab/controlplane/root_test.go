package controlplane

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// requireBinaries returns the upstream binaries' directory, or skips when
// they are not built (outside CI: `make test` builds them in CI).
func requireBinaries(t *testing.T) string {
	t.Helper()
	d, err := BinDir()
	if err != nil {
		testutil.Skip(t, "%v (make k8s builds them)", err)
	}
	return d
}

func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && len(b) > i+2 && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// snapshotDir reads the files Up writes (not logs or etcd's data, which
// the running processes change) with their modification times.
func snapshotDir(t *testing.T, state string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, pattern := range []string{"pki/*", "pids/*", "*.json", "*.kubeconfig"} {
		files, _ := filepath.Glob(filepath.Join(state, pattern))
		for _, f := range files {
			st, err := os.Stat(f)
			if err != nil || st.IsDir() {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			m[f] = st.ModTime().String() + "\n" + string(b)
		}
	}
	if len(m) < 10 {
		t.Fatalf("snapshot of %s has only %d files", state, len(m))
	}
	return m
}

func diffDirs(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if b[k] != v {
			d = append(d, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, k)
		}
	}
	return d
}

// TestUpDown runs the real etcd and kube-apiserver on 127.0.0.1 (the
// endpoint reconciler off), lists namespaces through the admin kubeconfig,
// checks that a second Up reuses both processes and changes no file, and
// that Down leaves no process.
func TestUpDown(t *testing.T) {
	testutil.RequireRoot(t)
	bin := requireBinaries(t)
	state := t.TempDir()
	t.Cleanup(func() {
		if err := Down(state); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
	})
	cfg := Config{StateDir: state, BinDir: bin, Addr: netip.MustParseAddr("127.0.0.1")}
	ctx := context.Background()
	var log strings.Builder

	t0 := time.Now()
	info, err := Up(ctx, cfg, &log)
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	t.Logf("cold Up in %v:\n%s", time.Since(t0), log.String())
	if info.Reused || info.APIServerPID == 0 || info.EtcdPID == 0 || !strings.HasPrefix(info.Server, "https://127.0.0.1:") {
		t.Fatalf("info %+v", info)
	}

	cs, err := Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing namespaces: %v", err)
	}
	var names []string
	for _, ns := range nss.Items {
		names = append(names, ns.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "default") || !strings.Contains(strings.Join(names, ","), "kube-system") {
		t.Errorf("namespaces %v lack default and kube-system", names)
	}
	// The admin is a cluster admin (system:masters), and writes persist in etcd.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flatnet-cp-test"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}

	before := snapshotDir(t, state)
	t1 := time.Now()
	log.Reset()
	again, err := Up(ctx, cfg, &log)
	if err != nil {
		t.Fatalf("second Up: %v", err)
	}
	t.Logf("warm Up (reuse) in %v", time.Since(t1))
	if !again.Reused || again.APIServerPID != info.APIServerPID || again.EtcdPID != info.EtcdPID || again.Server != info.Server {
		t.Errorf("second Up did not reuse: %+v vs %+v", again, info)
	}
	if d := diffDirs(before, snapshotDir(t, state)); len(d) != 0 {
		t.Errorf("second Up changed files: %v", d)
	}

	// A killed apiserver is started again with the recorded port; etcd
	// (and the namespace stored there) is kept.
	if err := proc.Stop(state, APIServerName, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	third, err := Up(ctx, cfg, &log)
	if err != nil {
		t.Fatalf("Up after apiserver stop: %v", err)
	}
	if third.Reused || third.EtcdPID != info.EtcdPID || third.APIServerPID == info.APIServerPID || third.Server != info.Server {
		t.Errorf("Up after apiserver stop: %+v (first %+v)", third, info)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "flatnet-cp-test", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace lost across apiserver restart: %v", err)
	}

	// A dead etcd: Up restarts the apiserver (which would hang without it)
	// and etcd on the recorded ports; etcd's data is kept.
	if err := proc.Stop(state, EtcdName, 0); err != nil {
		t.Fatal(err)
	}
	t3 := time.Now()
	log.Reset()
	fourth, err := Up(ctx, cfg, &log)
	if err != nil {
		t.Fatalf("Up after etcd died: %v", err)
	}
	t.Logf("Up after etcd died in %v:\n%s", time.Since(t3), log.String())
	if fourth.Reused || fourth.EtcdPID == third.EtcdPID || fourth.APIServerPID == third.APIServerPID || fourth.Server != info.Server {
		t.Errorf("Up after etcd died: %+v (before %+v)", fourth, third)
	}
	if !gone(third.APIServerPID) {
		t.Errorf("old apiserver %d still running", third.APIServerPID)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "flatnet-cp-test", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace lost across etcd restart: %v", err)
	}
	third = fourth

	t2 := time.Now()
	if err := Down(state); err != nil {
		t.Fatalf("Down: %v", err)
	}
	t.Logf("Down in %v", time.Since(t2))
	for _, pid := range []int{third.APIServerPID, third.EtcdPID} {
		if !gone(pid) {
			t.Errorf("pid %d still running after Down", pid)
		}
	}
	if _, _, ok := Running(state); ok {
		t.Error("Running after Down")
	}
	for _, n := range []string{APIServerName, EtcdName} {
		if _, err := os.Stat(proc.PIDFile(state, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s pid file left: %v", n, err)
		}
	}
	// Down kept the state (the lab removes the directory).
	if _, err := os.Stat(info.Kubeconfig); err != nil {
		t.Errorf("Down removed the kubeconfig: %v", err)
	}
	if err := Down(state); err != nil {
		t.Errorf("second Down: %v", err)
	}
}

// fakeBinDir holds the real etcd and a kube-apiserver script.
func fakeBinDir(t *testing.T, realBin, apiserverScript string) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Symlink(filepath.Join(realBin, "etcd"), filepath.Join(d, "etcd")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "kube-apiserver"), []byte("#!/bin/sh\n"+apiserverScript), 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// An apiserver that exits, or never becomes ready, makes Up fail with the
// tail of its log, and Up stops what it started (etcd too).
func TestUpFailureCleansUp(t *testing.T) {
	testutil.RequireRoot(t)
	realBin := requireBinaries(t)
	cases := map[string]struct{ script, want, logLine string }{
		"exits":     {"echo 'Error: invalid flag --bogus' >&2; sleep 0.3; exit 1\n", "exited while starting", "Error: invalid flag --bogus"},
		"not ready": {"echo 'waiting forever'; while :; do sleep 1; done\n", "not ready after 2s", "waiting forever"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			state := t.TempDir()
			t.Cleanup(func() { _ = Down(state) })
			cfg := Config{StateDir: state, BinDir: fakeBinDir(t, realBin, c.script), Addr: netip.MustParseAddr("127.0.0.1"), ReadyTimeout: 2 * time.Second}
			_, err := Up(context.Background(), cfg, nil)
			if err == nil {
				t.Fatal("Up with a broken apiserver succeeded")
			}
			t.Logf("error: %v", err)
			msg := err.Error()
			if !strings.Contains(msg, "kube-apiserver") || !strings.Contains(msg, c.want) || !strings.Contains(msg, c.logLine) {
				t.Errorf("error lacks %q or the log line %q: %v", c.want, c.logLine, err)
			}
			for _, n := range []string{APIServerName, EtcdName} {
				if pid, ok := proc.Running(state, n); ok {
					t.Errorf("%s (pid %d) left running after a failed Up", n, pid)
				}
			}
		})
	}
}
