package containerd

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testNodeSpec() Node {
	return Node{
		Name: "node1", Lab: "lab", StateDir: "/var/lib/flatnet/lab/lab", Dir: "/var/lib/flatnet/lab/lab/nodes/node1/containerd",
		Netns: "/run/netns/fl-lab-node1", IP: netip.MustParseAddr("10.123.0.2"),
		Kubeconfig: "/var/lib/flatnet/lab/lab/admin.kubeconfig", ClientCAFile: "/var/lib/flatnet/lab/lab/pki/ca.crt",
		CNIConfDir: "/var/lib/flatnet/lab/lab/nodes/node1/cni/net.d", CNIBinDir: "/var/lib/flatnet/lab/lab/bin",
		ClusterDNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, ClusterDomain: "cluster.local.",
		NodeBinDir: "/cache/node-v2.4.2/bin", KubeletBinDir: "/cache/k8s-v1.37.2/bin",
	}
}

const wantContainerdConfig = `# Written by flatnet lab for node node1; changes are overwritten.
version = 3
root = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/containerd'
state = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/run/containerd'

[grpc]
  address = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/run/containerd.sock'

[ttrpc]
  address = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/run/containerd.sock.ttrpc'

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/containerd/opt'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10.2'
  [plugins.'io.containerd.cri.v1.runtime']
    # Pod network namespaces under the state dir, not /var/run/netns
    # where the lab's nodes are.
    netns_mounts_under_state_dir = true
    # Root without CAP_SYS_RESOURCE (this kind of VM) cannot lower
    # oom_score_adj; runc fails unless it is restricted.
    restrict_oom_score_adj = true
    enable_cdi = false
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/cache/node-v2.4.2/bin/runc'
          Root = '/var/lib/flatnet/lab/lab/nodes/node1/containerd/run/runc'
          ShimCgroup = '/flatnet-lab-node1/shims'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/var/lib/flatnet/lab/lab/bin']
      conf_dir = '/var/lib/flatnet/lab/lab/nodes/node1/cni/net.d'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`

const wantKubeletConfig = `{
  "apiVersion": "kubelet.config.k8s.io/v1beta1",
  "kind": "KubeletConfiguration",
  "failCgroupV1": false,
  "cgroupRoot": "/flatnet-lab-node1",
  "cgroupDriver": "cgroupfs",
  "cgroupsPerQOS": true,
  "enforceNodeAllocatable": [
    "pods"
  ],
  "failSwapOn": false,
  "containerRuntimeEndpoint": "unix:///var/lib/flatnet/lab/lab/nodes/node1/containerd/run/containerd.sock",
  "podLogsDir": "/var/lib/flatnet/lab/lab/nodes/node1/containerd/pod-logs",
  "volumePluginDir": "/var/lib/flatnet/lab/lab/nodes/node1/containerd/kubelet/volume-plugins",
  "imageGCHighThresholdPercent": 100,
  "evictionHard": {
    "imagefs.available": "0%",
    "imagefs.inodesFree": "0%",
    "nodefs.available": "0%",
    "nodefs.inodesFree": "0%"
  },
  "clusterDNS": [
    "10.96.0.10"
  ],
  "clusterDomain": "cluster.local",
  "resolvConf": "/var/lib/flatnet/lab/lab/nodes/node1/containerd/resolv.conf",
  "healthzBindAddress": "127.0.0.1",
  "healthzPort": 10248,
  "readOnlyPort": 0,
  "authentication": {
    "anonymous": {
      "enabled": false
    },
    "webhook": {
      "enabled": false
    },
    "x509": {
      "clientCAFile": "/var/lib/flatnet/lab/lab/pki/ca.crt"
    }
  },
  "authorization": {
    "mode": "AlwaysAllow"
  }
}
`

func TestPlan(t *testing.T) {
	p, err := MakePlan(testNodeSpec())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range p.Files {
		files[f.Path] = string(f.Data)
	}
	if got := files[p.ContainerdConfig()]; got != wantContainerdConfig {
		t.Errorf("containerd config:\n%s\nwant:\n%s", got, wantContainerdConfig)
	}
	if got := files[p.KubeletConfig()]; got != wantKubeletConfig {
		t.Errorf("kubelet config:\n%s\nwant:\n%s", got, wantKubeletConfig)
	}
	d := "/var/lib/flatnet/lab/lab/nodes/node1/containerd"
	wantKubelet := "/cache/k8s-v1.37.2/bin/kubelet --config=" + d + "/kubelet.yaml --kubeconfig=/var/lib/flatnet/lab/lab/admin.kubeconfig" +
		" --root-dir=" + d + "/kubelet --cert-dir=" + d + "/kubelet/pki --hostname-override=node1 --node-ip=10.123.0.2"
	if got := strings.Join(p.Kubelet.Argv, " "); got != wantKubelet {
		t.Errorf("kubelet argv\n%s\nwant\n%s", got, wantKubelet)
	}
	if got, want := strings.Join(p.Containerd.Argv, " "), "/cache/node-v2.4.2/bin/containerd --config "+d+"/containerd.toml"; got != want {
		t.Errorf("containerd argv %s, want %s", got, want)
	}
	if got, want := strings.Join(p.Wrapper, " "), "nsenter --mount="+d+"/run/mnt --"; got != want {
		t.Errorf("wrapper %s, want %s", got, want)
	}
	var binds []string
	for _, b := range p.Binds {
		binds = append(binds, b.Source+" -> "+b.Target)
	}
	wantBinds := d + "/var-lib-kubelet -> /var/lib/kubelet, " + d + "/var-log-containers -> /var/log/containers, " +
		d + "/run-containerd -> /run/containerd, " + d + "/var-lib-cni -> /var/lib/cni, " + d + "/run-flatnet -> /run/flatnet, " +
		"/var/lib/flatnet/lab/lab/nodes/node1/cni/net.d -> /etc/cni/net.d, /var/lib/flatnet/lab/lab/bin -> /opt/cni/bin"
	if got := strings.Join(binds, ", "); got != wantBinds {
		t.Errorf("binds %s, want %s", got, wantBinds)
	}

	// Without a client CA the kubelet serves anonymous requests (the lab
	// authorizes everything anyway).
	n := testNodeSpec()
	n.ClientCAFile, n.ClusterDNS = "", nil
	p, err = MakePlan(n)
	if err != nil {
		t.Fatal(err)
	}
	k := string(p.Files[1].Data)
	if !strings.Contains(k, `"anonymous": {
      "enabled": true`) || strings.Contains(k, "clientCAFile") || strings.Contains(k, "clusterDNS") {
		t.Errorf("kubelet config without a CA or DNS:\n%s", k)
	}
}

func TestPlanRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		edit func(*Node)
		want string
	}{
		"relative dir":       {func(n *Node) { n.Dir = "nodes/node1" }, `node dir "nodes/node1" is not an absolute path`},
		"dir outside state":  {func(n *Node) { n.Dir = "/srv/node1" }, "is not under the lab's state dir"},
		"upper-case name":    {func(n *Node) { n.Name = "Node1" }, "lower-case DNS labels"},
		"no IP":              {func(n *Node) { n.IP = netip.Addr{} }, "no node IP"},
		"relative CA":        {func(n *Node) { n.ClientCAFile = "ca.crt" }, `client CA file "ca.crt"`},
		"long socket path":   {func(n *Node) { n.Dir = n.StateDir + "/" + strings.Repeat("x", 60) }, "too long for a unix socket"},
		"no kubelet bin dir": {func(n *Node) { n.KubeletBinDir = "" }, "kubelet bin dir"},
	} {
		t.Run(name, func(t *testing.T) {
			n := testNodeSpec()
			c.edit(&n)
			_, err := MakePlan(n)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// A missing binary names the command that builds it, before anything is
// touched.
func TestUpSaysWhatToBuild(t *testing.T) {
	tmp := t.TempDir()
	n := testNodeSpec()
	n.StateDir, n.Dir = tmp, filepath.Join(tmp, "nodes", "node1")
	n.NodeBinDir, n.KubeletBinDir = filepath.Join(tmp, "node-bin"), filepath.Join(tmp, "k8s-bin")
	_, err := Up(context.Background(), n, nil)
	if err == nil || !strings.Contains(err.Error(), "`make node`") {
		t.Fatalf("Up without containerd: %v", err)
	}
	if err := os.MkdirAll(n.NodeBinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range nodeBins {
		if err := os.WriteFile(filepath.Join(n.NodeBinDir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err = Up(context.Background(), n, nil)
	if err == nil || !strings.Contains(err.Error(), "`hack/build-k8s.sh kubelet`") {
		t.Fatalf("Up without a kubelet: %v", err)
	}
	if _, err := os.Stat(n.Dir); !os.IsNotExist(err) {
		t.Errorf("a refused Up made %s (%v)", n.Dir, err)
	}
}

func TestNodeResolvConf(t *testing.T) {
	host := "# generated\nsearch corp.example.com example.com\ndomain corp.example.com\nnameserver 10.0.0.2\n  nameserver\t10.0.0.3\noptions edns0 trust-ad\n"
	want := "# flatnet lab: the host's nameservers, not its search list\nnameserver 10.0.0.2\nnameserver 10.0.0.3\noptions edns0 trust-ad\n"
	if got := string(NodeResolvConf([]byte(host))); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// The mount table of this kind of machine: cgroup v1 hybrid.
const hybridMountinfo = `27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
33 30 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/systemd rw shared:5 - cgroup cgroup rw,name=systemd
35 30 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
36 27 0:29 /sub /mnt/memory\040sub rw - cgroup cgroup rw,memory
37 27 0:31 / /mnt/space\040dir rw - cgroup2 cgroup2 rw
`

func TestHierarchies(t *testing.T) {
	got := strings.Join(Hierarchies([]byte(hybridMountinfo)), ",")
	want := "/sys/fs/cgroup/cpu,/sys/fs/cgroup/cpuset,/sys/fs/cgroup/memory,/sys/fs/cgroup/systemd,/sys/fs/cgroup/unified,/mnt/space dir"
	if got != want {
		t.Errorf("Hierarchies = %s, want %s", got, want)
	}
}

// The record is written once: a second call keeps the values from before
// the first kubelet.
func TestRecordSysctlsOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(SysctlRecord(dir), []byte(`{"kernel.panic": "7"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := RecordSysctls(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(SysctlRecord(dir)); string(b) != `{"kernel.panic": "7"}` {
		t.Errorf("record rewritten: %s", b)
	}
	other := t.TempDir()
	if err := RecordSysctls(other); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(SysctlRecord(other))
	for _, k := range KubeletSysctls {
		if !strings.Contains(string(b), `"`+k+`"`) {
			t.Errorf("record lacks %s: %s", k, b)
		}
	}
}

// The version the cache directory is named after is the one
// hack/node/containerd/go.mod pins.
func TestContainerdVersionPinned(t *testing.T) {
	b, err := os.ReadFile("../../../../hack/node/containerd/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "github.com/containerd/containerd/v2 "+ContainerdVersion+"\n") {
		t.Errorf("hack/node/containerd/go.mod does not pin containerd %s:\n%s", ContainerdVersion, b)
	}
	d, err := CacheBinDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(d, "/node-"+ContainerdVersion+"/bin") {
		t.Errorf("CacheBinDir %s", d)
	}
}
