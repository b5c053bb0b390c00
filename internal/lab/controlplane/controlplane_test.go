package controlplane

import (
	"bufio"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func TestKubernetesVersionMatchesBuildScript(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "..", "hack", "k8s", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "k8s.io/kubernetes" && fs[1] != "=>" {
			if fs[1] != KubernetesVersion {
				t.Fatalf("hack/k8s/go.mod has k8s.io/kubernetes %s, KubernetesVersion is %s", fs[1], KubernetesVersion)
			}
			return
		}
	}
	t.Fatal("k8s.io/kubernetes not found in hack/k8s/go.mod")
}

func TestBinDir(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("FLATNET_CACHE", cache)
	want := filepath.Join(cache, "k8s-"+KubernetesVersion, "bin")
	if d, err := CacheBinDir(); err != nil || d != want {
		t.Fatalf("CacheBinDir = %q, %v; want %q", d, err, want)
	}
	_, err := BinDir()
	if err == nil || !strings.Contains(err.Error(), "make k8s") || !strings.Contains(err.Error(), "kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubectl") {
		t.Fatalf("BinDir with nothing built: %v", err)
	}
	if err := os.MkdirAll(want, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler"} {
		if err := os.WriteFile(filepath.Join(want, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := BinDir(); err == nil || !strings.Contains(err.Error(), "kubectl not found") {
		t.Fatalf("BinDir without kubectl: %v", err)
	}
	if err := os.WriteFile(filepath.Join(want, "kubectl"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d, err := BinDir(); err != nil || d != want {
		t.Fatalf("BinDir = %q, %v", d, err)
	}
}

func TestArgs(t *testing.T) {
	p := PKI{Dir: "/s/pki"}
	r := record{Addr: "10.250.0.1", ServiceCIDR: "10.96.0.0/16", APIServerPort: 6443, EtcdClientPort: 40001, EtcdPeerPort: 40002}
	api := apiserverArgs("/bin", "/s", p, r)
	for _, want := range []string{
		"/bin/kube-apiserver",
		"--etcd-servers=https://127.0.0.1:40001",
		"--etcd-cafile=/s/pki/etcd-ca.crt",
		"--etcd-certfile=/s/pki/apiserver-etcd-client.crt",
		"--etcd-keyfile=/s/pki/apiserver-etcd-client.key",
		"--bind-address=10.250.0.1",
		"--advertise-address=10.250.0.1",
		"--secure-port=6443",
		"--client-ca-file=/s/pki/ca.crt",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--endpoint-reconciler-type=lease",
		"--service-account-signing-key-file=/s/pki/sa.key",
		"--service-account-key-file=/s/pki/sa.pub",
	} {
		if !slices.Contains(api, want) {
			t.Errorf("apiserver args lack %s: %v", want, api)
		}
	}
	r.Addr = "127.0.0.1"
	if api := apiserverArgs("/bin", "/s", p, r); !slices.Contains(api, "--endpoint-reconciler-type=none") {
		t.Errorf("loopback apiserver args lack --endpoint-reconciler-type=none: %v", api)
	}
	etcd := etcdArgs("/bin", "/s", p, r)
	for _, want := range []string{"/bin/etcd", "--data-dir=/s/etcd", "--listen-client-urls=https://127.0.0.1:40001",
		"--advertise-client-urls=https://127.0.0.1:40001",
		"--listen-peer-urls=https://127.0.0.1:40002", "--initial-cluster=lab=https://127.0.0.1:40002",
		"--cert-file=/s/pki/etcd-server.crt", "--key-file=/s/pki/etcd-server.key",
		"--trusted-ca-file=/s/pki/etcd-ca.crt", "--client-cert-auth",
		"--peer-cert-file=/s/pki/etcd-server.crt", "--peer-key-file=/s/pki/etcd-server.key",
		"--peer-trusted-ca-file=/s/pki/etcd-ca.crt", "--peer-client-cert-auth"} {
		if !slices.Contains(etcd, want) {
			t.Errorf("etcd args lack %s: %v", want, etcd)
		}
	}
	// With the controllers, ServiceAccount admission is on, and the
	// controller manager leaves out what it is told to.
	r.Controllers, r.DisabledControllers, r.ControllerManagerPort, r.SchedulerPort = true, []string{"endpointslice-controller"}, 40003, 40004
	if api := apiserverArgs("/bin", "/s", p, r); slices.ContainsFunc(api, func(a string) bool { return strings.HasPrefix(a, "--disable-admission-plugins") }) {
		t.Errorf("apiserver with controllers disables admission plugins: %v", api)
	}
	kcm := controllerManagerArgs("/bin", "/s", p, r)
	for _, want := range []string{"/bin/kube-controller-manager", "--kubeconfig=/s/kube-controller-manager.kubeconfig",
		"--bind-address=127.0.0.1", "--secure-port=40003", "--controllers=*,-endpointslice-controller",
		"--service-account-private-key-file=/s/pki/sa.key", "--root-ca-file=/s/pki/ca.crt",
		"--use-service-account-credentials=true", "--leader-elect=false"} {
		if !slices.Contains(kcm, want) {
			t.Errorf("kube-controller-manager args lack %s: %v", want, kcm)
		}
	}
	sched := schedulerArgs("/bin", "/s", p, r)
	for _, want := range []string{"/bin/kube-scheduler", "--kubeconfig=/s/kube-scheduler.kubeconfig",
		"--bind-address=127.0.0.1", "--secure-port=40004", "--leader-elect=false"} {
		if !slices.Contains(sched, want) {
			t.Errorf("kube-scheduler args lack %s: %v", want, sched)
		}
	}

	r.Addr = "fd00::1"
	r.APIServerPort = 7443
	if s := r.server(); s != "https://[fd00::1]:7443" {
		t.Errorf("server() = %s", s)
	}
}

func TestFirstServiceIP(t *testing.T) {
	for cidr, want := range map[string]string{"10.96.0.0/16": "10.96.0.1", "10.100.0.0/24": "10.100.0.1", "fd00:96::/112": "fd00:96::1"} {
		if ip, err := firstServiceIP(cidr); err != nil || ip.String() != want {
			t.Errorf("firstServiceIP(%s) = %s, %v; want %s", cidr, ip, err, want)
		}
	}
	if _, err := firstServiceIP("10.0.0.1/32"); err == nil {
		t.Error("a /32 service range accepted")
	}
}

func TestConfigValidation(t *testing.T) {
	bin := t.TempDir()
	for _, n := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler"} {
		os.WriteFile(filepath.Join(bin, n), []byte("#!/bin/sh\n"), 0o755)
	}
	ok := Config{StateDir: "/var/lib/flatnet/lab/x", BinDir: bin, Addr: netip.MustParseAddr("10.250.0.1")}
	c, err := withDefaults(ok)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServiceCIDR != DefaultServiceCIDR || c.Name != "x" || c.ReadyTimeout != DefaultReadyTimeout {
		t.Errorf("defaults: %+v", c)
	}
	bad := map[string]func(*Config){
		"relative state dir": func(c *Config) { c.StateDir = "lab" },
		"no address":         func(c *Config) { c.Addr = netip.Addr{} },
		"unspecified":        func(c *Config) { c.Addr = netip.MustParseAddr("0.0.0.0") },
		"bad service CIDR":   func(c *Config) { c.ServiceCIDR = "10.96.0.0" },
		"bad port":           func(c *Config) { c.Port = 70000 },
		"no binaries":        func(c *Config) { c.BinDir = t.TempDir() },
	}
	for name, mut := range bad {
		c := ok
		mut(&c)
		if _, err := withDefaults(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestChoosePorts(t *testing.T) {
	loop := netip.MustParseAddr("127.0.0.1")
	cfg := Config{Addr: loop, ServiceCIDR: DefaultServiceCIDR}
	r, err := choosePorts(cfg, nil, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.EtcdClientPort == 0 || r.EtcdPeerPort == 0 || r.EtcdClientPort == r.EtcdPeerPort || r.APIServerPort == 0 {
		t.Fatalf("ports %+v", r)
	}
	// Recorded ports that are free are kept.
	r2, err := choosePorts(cfg, &r, false, false, nil)
	if err != nil || !reflect.DeepEqual(r2, r) {
		t.Errorf("recorded free ports not kept: %+v -> %+v (%v)", r, r2, err)
	}
	// A recorded port now taken by someone else is replaced... (the
	// kernel picks the port to hold, so holding it cannot fail)
	l, err := net.Listen("tcp", netip.AddrPortFrom(loop, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r.APIServerPort = l.Addr().(*net.TCPAddr).Port
	var log strings.Builder
	r3, err := choosePorts(cfg, &r, false, false, &log)
	if err != nil || r3.APIServerPort == r.APIServerPort || !strings.Contains(log.String(), "taken") {
		t.Errorf("taken apiserver port kept: %+v (%v) %q", r3, err, log.String())
	}
	// ...but a running process keeps its port.
	if r4, err := choosePorts(cfg, &r, true, true, nil); err != nil || !reflect.DeepEqual(r4, r) {
		t.Errorf("running: ports changed %+v -> %+v (%v)", r, r4, err)
	}
	// An explicit port that is taken is an error.
	cfg.Port = r.APIServerPort
	if _, err := choosePorts(cfg, nil, false, false, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("explicit taken port: %v", err)
	}
}

func TestKubeconfigDeterministic(t *testing.T) {
	p := PKI{Dir: filepath.Join(t.TempDir(), "pki")}
	if _, err := ensurePKI(p, testNames, time.Now()); err != nil {
		t.Fatal(err)
	}
	a, err := kubeconfig("lab", "https://10.250.0.1:6443", p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := kubeconfig("lab", "https://10.250.0.1:6443", p)
	if string(a) != string(b) {
		t.Error("kubeconfig not deterministic")
	}
	cfg, err := clientcmd.Load(a)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://10.250.0.1:6443" || len(rc.TLSClientConfig.CAData) == 0 || len(rc.TLSClientConfig.CertData) == 0 || len(rc.TLSClientConfig.KeyData) == 0 {
		t.Errorf("rest config %+v", rc)
	}
}

func TestNodeKubeconfig(t *testing.T) {
	state := t.TempDir()
	path := filepath.Join(state, "nodes", "n1", "kubelet.kubeconfig")
	if err := NodeKubeconfig(state, "lab", "n1", path); err == nil || !strings.Contains(err.Error(), "control plane up first") {
		t.Fatalf("without a control plane: %v", err)
	}
	p := PKI{Dir: PKIDir(state)}
	if _, err := ensurePKI(p, testNames, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(recordPath(state), record{Addr: "10.250.0.1", ServiceCIDR: DefaultServiceCIDR, APIServerPort: 6443, EtcdClientPort: 1, EtcdPeerPort: 2}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := NodeKubeconfig(state, "lab", "n1", path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ai := cfg.AuthInfos["system:node:n1"]
	if ai == nil || cfg.Clusters["lab"] == nil || cfg.Clusters["lab"].Server != "https://10.250.0.1:6443" {
		t.Fatalf("kubeconfig %+v", cfg)
	}
	block, _ := pem.Decode(ai.ClientCertificateData)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, p.CACert()))
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil ||
		c.Subject.CommonName != "system:node:n1" || strings.Join(c.Subject.Organization, ",") != "system:nodes" {
		t.Errorf("node cert %s: %v", c.Subject, err)
	}
	// A second call keeps the certificate.
	before, _ := os.ReadFile(path)
	if err := NodeKubeconfig(state, "lab", "n1", path); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("second call re-issued the node certificate")
	}
}

// With ManyNodes the apiserver's in-flight limits and etcd's quota are
// raised, and the controller manager waits NodeMonitorGracePeriod (and
// has a higher API rate); the
// record carries both, so a running control plane started without them is
// stale.
func TestArgsManyNodes(t *testing.T) {
	p := PKI{Dir: "/s/pki"}
	base := record{Addr: "10.250.0.1", ServiceCIDR: "10.96.0.0/16", APIServerPort: 6443, EtcdClientPort: 40001, EtcdPeerPort: 40002,
		Controllers: true, ControllerManagerPort: 40003, SchedulerPort: 40004}
	r := base.want(Config{Controllers: true, ManyNodes: true, NodeMonitorGracePeriod: 2 * time.Hour})
	for _, c := range []struct {
		args []string
		want string
	}{
		{apiserverArgs("/bin", "/s", p, *r), "--max-requests-inflight=1600"},
		{apiserverArgs("/bin", "/s", p, *r), "--max-mutating-requests-inflight=800"},
		{etcdArgs("/bin", "/s", p, *r), "--quota-backend-bytes=8589934592"},
		{controllerManagerArgs("/bin", "/s", p, *r), "--node-monitor-grace-period=2h0m0s"},
		{controllerManagerArgs("/bin", "/s", p, *r), "--kube-api-qps=100"},
		{controllerManagerArgs("/bin", "/s", p, *r), "--kube-api-burst=200"},
	} {
		if !slices.Contains(c.args, c.want) {
			t.Errorf("args lack %s: %v", c.want, c.args)
		}
	}
	plain := base.want(Config{Controllers: true})
	for _, args := range [][]string{apiserverArgs("/bin", "/s", p, *plain), etcdArgs("/bin", "/s", p, *plain), controllerManagerArgs("/bin", "/s", p, *plain)} {
		if slices.ContainsFunc(args, func(a string) bool {
			return strings.Contains(a, "inflight") || strings.Contains(a, "quota") || strings.Contains(a, "grace-period") || strings.Contains(a, "kube-api-")
		}) {
			t.Errorf("args without ManyNodes: %v", args)
		}
	}
}
