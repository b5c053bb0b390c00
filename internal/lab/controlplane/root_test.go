package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
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

// upForTest brings a control plane up on 127.0.0.1 in a fresh state dir
// and takes it down at cleanup.
func upForTest(t *testing.T) (state string, info *Info) {
	t.Helper()
	testutil.RequireRoot(t)
	bin := requireBinaries(t)
	state = t.TempDir()
	t.Cleanup(func() {
		if err := Down(state); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
	})
	var log strings.Builder
	info, err := Up(context.Background(), Config{StateDir: state, BinDir: bin, Addr: netip.MustParseAddr("127.0.0.1")}, &log)
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	return state, info
}

// refused fails t unless a GET of url with client is refused: no
// connection, no TLS handshake, or an answer other than 200.
func refused(t *testing.T, what, url string, client *http.Client) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Logf("%s: refused: %v", what, err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode == http.StatusOK {
		t.Errorf("%s: %s answered %s: %s", what, url, resp.Status, body)
		return
	}
	t.Logf("%s: refused with %s", what, resp.Status)
}

// TestEtcdRefusesUnauthenticated: the lab runs pods as root, so whoever
// can write to etcd is root on the machine. etcd must refuse a client
// without the lab's etcd client certificate (plain HTTP, TLS without a
// certificate) on its client and its peer port, while the apiserver,
// which has that certificate, works.
func TestEtcdRefusesUnauthenticated(t *testing.T) {
	state, info := upForTest(t)
	rec, err := loadRecord(state)
	if err != nil || rec == nil {
		t.Fatalf("record: %v", err)
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec G402: any server, no client cert
	for _, port := range []int{rec.EtcdClientPort, rec.EtcdPeerPort} {
		for _, scheme := range []string{"http", "https"} {
			base := scheme + "://127.0.0.1:" + strconv.Itoa(port)
			c := plain
			if scheme == "https" {
				c = noCert
			}
			refused(t, fmt.Sprintf("%s without a client certificate, port %d", scheme, port), base+"/health", c)
			refused(t, fmt.Sprintf("%s without a client certificate, port %d", scheme, port), base+"/version", c)
		}
	}

	// The admin's certificate (the lab CA, which the apiserver trusts) does
	// not open etcd either.
	pki := PKI{Dir: PKIDir(state)}
	admin, err := tls.LoadX509KeyPair(pki.AdminCert(), pki.AdminKey())
	if err != nil {
		t.Fatal(err)
	}
	adminClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{admin}}}} // #nosec G402
	refused(t, "the admin certificate", rec.etcdClientURL()+"/health", adminClient)

	// The apiserver's etcd client certificate does (so etcd was up).
	tc, err := clientTLS(pki.EtcdCACert(), pki.EtcdClientCert(), pki.EtcdClientKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdHealthy(context.Background(), *rec, tc); err != nil {
		t.Errorf("etcd with the apiserver's client certificate: %v", err)
	}
	checkPrivate(t, state)

	// The apiserver: anonymous requests may read /version, nothing else.
	refused(t, "an anonymous request to the apiserver", info.Server+"/api/v1/namespaces/default/pods", noCert)

	cs, err := Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flatnet-tls-test"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the apiserver cannot write to etcd: %v", err)
	}
}

// checkPrivate fails t unless the state dir and pki are 0700 and every key
// and the kubeconfig 0600.
func checkPrivate(t *testing.T, state string) {
	t.Helper()
	keys, _ := filepath.Glob(filepath.Join(PKIDir(state), "*.key"))
	if len(keys) != 10 {
		t.Errorf("keys %v, want 10", keys)
	}
	want := map[string]os.FileMode{state: 0o700, PKIDir(state): 0o700, KubeconfigPath(state): 0o600}
	for _, k := range keys {
		want[k] = 0o600
	}
	for f, mode := range want {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", f, st.Mode().Perm(), err, mode)
		}
	}
}

// oldFlags turns today's command lines into those of a lab made before
// etcd required client certificates: plain HTTP, no etcd TLS flags.
func oldFlags(argv []string) []string {
	var out []string
	for _, a := range argv {
		switch k, _, _ := strings.Cut(a, "="); k {
		case "--cert-file", "--key-file", "--trusted-ca-file", "--client-cert-auth", "--peer-cert-file", "--peer-key-file",
			"--peer-trusted-ca-file", "--peer-client-cert-auth", "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile":
			continue
		}
		out = append(out, strings.ReplaceAll(a, "https://127.0.0.1", "http://127.0.0.1"))
	}
	return out
}

// TestUpgradesPlainHTTPEtcd: a lab brought up before etcd required client
// certificates (etcd on plain HTTP, state 0755, no etcd certificates) is
// not Current, and Up restarts it with TLS, keeping etcd's data.
func TestUpgradesPlainHTTPEtcd(t *testing.T) {
	state, info := upForTest(t)
	ctx := context.Background()
	cs, err := Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flatnet-upgrade-test"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !Current(Config{StateDir: state}) {
		t.Fatal("a control plane just brought up is not Current")
	}

	// Rebuild the old lab from the same state.
	if err := Down(state); err != nil {
		t.Fatal(err)
	}
	rec, err := loadRecord(state)
	if err != nil || rec == nil {
		t.Fatalf("record: %v", err)
	}
	pki := PKI{Dir: PKIDir(state)}
	for _, f := range []string{pki.EtcdCACert(), pki.EtcdCAKey(), pki.EtcdServerCert(), pki.EtcdServerKey(), pki.EtcdClientCert(), pki.EtcdClientKey()} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{state, pki.Dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := requireBinaries(t)
	oldEtcd, err := proc.Start(EtcdName, oldFlags(etcdArgs(bin, state, pki, *rec)), nil, state, "")
	if err != nil {
		t.Fatal(err)
	}
	plainURL := "http://127.0.0.1:" + strconv.Itoa(rec.EtcdClientPort) + "/health"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(plainURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("old-style etcd not healthy on %s: %v\n%s", plainURL, err, proc.Tail(proc.LogFile(state, EtcdName), 20))
		}
	}
	oldAPI, err := proc.Start(APIServerName, oldFlags(apiserverArgs(bin, state, pki, *rec)), nil, state, "")
	if err != nil {
		t.Fatal(err)
	}
	if Current(Config{StateDir: state}) {
		t.Fatal("a plain-HTTP etcd counts as Current: `lab up` would leave it open")
	}
	if why := Outdated(Config{StateDir: state}); !strings.Contains(why, "plain HTTP") {
		t.Errorf("Outdated = %q, want it to name plain HTTP", why)
	}

	var log strings.Builder
	t0 := time.Now()
	again, err := Up(ctx, Config{StateDir: state, BinDir: bin, Addr: netip.MustParseAddr("127.0.0.1")}, &log)
	if err != nil {
		t.Fatalf("Up on the old lab: %v\n%s", err, log.String())
	}
	t.Logf("Up on the old lab in %v:\n%s", time.Since(t0), log.String())
	if !strings.Contains(log.String(), "restarting etcd") || !strings.Contains(log.String(), "plain HTTP") {
		t.Errorf("Up did not say it restarts etcd for plain HTTP:\n%s", log.String())
	}
	if again.Reused || again.EtcdPID == oldEtcd || again.APIServerPID == oldAPI || !gone(oldEtcd) || !gone(oldAPI) {
		t.Errorf("old processes kept: %+v (old etcd %d, apiserver %d)", again, oldEtcd, oldAPI)
	}
	refused(t, "plain HTTP after the upgrade", plainURL, &http.Client{Timeout: 5 * time.Second})
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "flatnet-upgrade-test", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace lost across the upgrade: %v", err)
	}
	checkPrivate(t, state)
	if !Current(Config{StateDir: state}) || Outdated(Config{StateDir: state}) != "" {
		t.Errorf("not Current after the upgrade: %q", Outdated(Config{StateDir: state}))
	}
}

// TestControllers runs the whole control plane: kube-controller-manager
// makes the default service account (ServiceAccount admission is on, so a
// pod needs it) and a Deployment's ReplicaSet and pod, kube-scheduler
// reports the pod unschedulable (there is no node), a second Up reuses
// everything, Up without Controllers stops both, and Down leaves nothing.
func TestControllers(t *testing.T) {
	testutil.RequireRoot(t)
	bin := requireBinaries(t)
	if err := checkBins(bin, ControllerManagerName, SchedulerName); err != nil {
		testutil.Skip(t, "%v", err)
	}
	state := t.TempDir()
	t.Cleanup(func() {
		if err := Down(state); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
	})
	cfg := Config{StateDir: state, BinDir: bin, Addr: netip.MustParseAddr("127.0.0.1"), Controllers: true,
		DisabledControllers: []string{"endpointslice-controller"}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log strings.Builder
	t0 := time.Now()
	info, err := Up(ctx, cfg, &log)
	if err != nil {
		t.Fatalf("Up: %v\n%s", err, log.String())
	}
	t.Logf("cold Up in %v:\n%s", time.Since(t0), log.String())
	pids := map[string]int{}
	for _, c := range components {
		pid, ok := proc.Running(state, c.name)
		if !ok {
			t.Fatalf("%s not running after Up", c.name)
		}
		pids[c.name] = pid
	}
	if !Current(cfg) {
		t.Errorf("not Current after Up: %q", Outdated(cfg))
	}
	if Current(Config{StateDir: state}) {
		t.Error("Current without Controllers while they run")
	}
	cs, err := Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	poll := func(what string, f func() (bool, error)) {
		t.Helper()
		var last error
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			ok, err := f()
			if ok {
				return
			}
			last = err
		}
		t.Fatalf("%s: not within 60s (last error %v)\nkube-controller-manager log:\n%s", what, last, proc.Tail(proc.LogFile(state, ControllerManagerName), 20))
	}
	poll("default service account", func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	one := int32(1)
	labels := map[string]string{"app": "cp-test"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "cp-test", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.2"}}}}},
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the Deployment's pod, reported unschedulable by the scheduler", func() (bool, error) {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=cp-test"})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("pods: %v (%d)", err, len(pods.Items))
		}
		for _, c := range pods.Items[0].Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, fmt.Errorf("pod conditions %v", pods.Items[0].Status.Conditions)
	})
	poll("the service-account token volume on the pod", func() (bool, error) {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=cp-test"})
		if err != nil || len(pods.Items) != 1 {
			return false, err
		}
		return pods.Items[0].Spec.ServiceAccountName == "default" && len(pods.Items[0].Spec.Volumes) == 1, fmt.Errorf("volumes %v", pods.Items[0].Spec.Volumes)
	})

	log.Reset()
	again, err := Up(ctx, cfg, &log)
	if err != nil || !again.Reused {
		t.Fatalf("second Up: %+v %v\n%s", again, err, log.String())
	}
	for _, c := range components {
		if pid, _ := proc.Running(state, c.name); pid != pids[c.name] {
			t.Errorf("second Up restarted %s: pid %d -> %d", c.name, pids[c.name], pid)
		}
	}

	// The apiserver stopped (an outage): Up starts it again and restarts
	// the controllers that ran on without it (their node monitor's times
	// are as old as the outage).
	if err := proc.Stop(state, APIServerName, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	log.Reset()
	if _, err := Up(ctx, cfg, &log); err != nil {
		t.Fatalf("Up after the apiserver stopped: %v\n%s", err, log.String())
	}
	for _, c := range components {
		pid, ok := proc.Running(state, c.name)
		if !ok || pid == pids[c.name] || !gone(pids[c.name]) {
			t.Errorf("Up after the apiserver stopped kept %s: pid %d -> %d (running %v)\n%s", c.name, pids[c.name], pid, ok, log.String())
		}
		if !strings.Contains(log.String(), "stopping "+c.name) {
			t.Errorf("Up after the apiserver stopped does not say it restarts %s:\n%s", c.name, log.String())
		}
		pids[c.name] = pid
	}

	// Without Controllers, Up stops them and turns ServiceAccount
	// admission off again (the apiserver restarts).
	noCtl := cfg
	noCtl.Controllers, noCtl.DisabledControllers = false, nil
	if why := Outdated(noCtl); !strings.Contains(why, "flags changed") {
		t.Errorf("Outdated without Controllers = %q", why)
	}
	if _, err := Up(ctx, noCtl, &log); err != nil {
		t.Fatalf("Up without Controllers: %v", err)
	}
	for _, c := range components {
		if _, ok := proc.Running(state, c.name); ok || !gone(pids[c.name]) {
			t.Errorf("%s still runs after Up without Controllers", c.name)
		}
	}
	if !Current(noCtl) {
		t.Errorf("not Current without Controllers: %q", Outdated(noCtl))
	}
	// And back: Down stops all four.
	if _, err := Up(ctx, cfg, &log); err != nil {
		t.Fatalf("Up with Controllers again: %v", err)
	}
	for _, c := range components {
		pids[c.name], _ = proc.Running(state, c.name)
	}
	if err := Down(state); err != nil {
		t.Fatal(err)
	}
	for name, pid := range pids {
		if !gone(pid) {
			t.Errorf("%s (pid %d) still running after Down", name, pid)
		}
	}
}
