package containerd

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
)

// PauseImage is the sandbox image every pod runs, pinned in containerd so
// that the kubelet's image GC never removes it.
const PauseImage = "registry.k8s.io/pause:3.10.2"

// KubeletHealthz is where the kubelet answers /healthz, inside the node's
// network namespace.
const KubeletHealthz = "127.0.0.1:10248"

// Node is what the lab knows about one node: the inputs of Plan.
type Node struct {
	// Name is the node's name (the kubelet's --hostname-override).
	Name string
	// Lab is the lab's name; with Name it makes the node's cgroup root.
	Lab string
	// StateDir is the lab's state dir. Dir must be under it, so that the
	// lab's stragglers sweep (proc.OwnedBy StateDir) finds every process
	// this node runs.
	StateDir string
	// Dir is this runtime's directory for the node (the lab passes
	// <state>/nodes/<node>/containerd): configs, containerd's root and
	// state, the kubelet's root, logs and pid files. Down removes it.
	Dir string
	// Netns is the node's network namespace (/run/netns/<prefix>-<node>).
	Netns string
	// IP is the node's address (--node-ip: lab nodes have no default
	// route for the kubelet to guess from).
	IP netip.Addr
	// Kubeconfig is the kubelet's kubeconfig.
	Kubeconfig string
	// ClientCAFile, when set, is the CA whose client certificates the
	// kubelet accepts (the apiserver's); else the kubelet is anonymous.
	ClientCAFile string
	// CNIConfDir is where the flatnet agent writes the node's conflist;
	// CNIBinDir holds flatnet-cni under every plugin name.
	CNIConfDir, CNIBinDir string
	// ClusterDNS and ClusterDomain go to the kubelet (pods' resolv.conf).
	ClusterDNS    []netip.Addr
	ClusterDomain string
	// NodeBinDir holds containerd, containerd-shim-runc-v2, ctr, runc and
	// crictl (hack/build-node.sh --bin-dir); KubeletBinDir holds kubelet
	// (hack/build-k8s.sh --bin-dir).
	NodeBinDir, KubeletBinDir string
	// Images are image tarballs imported into containerd's k8s.io
	// namespace (internal/lab/images writes them).
	Images []string
	// PauseImage is the sandbox image; empty means PauseImage.
	PauseImage string
	// HostResolvConf is the file whose nameservers the node's resolv.conf
	// copies (search and domain lines are dropped); empty means
	// /etc/resolv.conf.
	HostResolvConf string
}

// Plan is everything Up does for a node, as data.
type Plan struct {
	Node Node
	// CgroupRoot is the kubelet's cgroupRoot, made in every cgroup
	// hierarchy; ShimCgroup under it holds containerd's shims.
	CgroupRoot, ShimCgroup string
	// Dirs are created (0755), Files written.
	Dirs  []string
	Files []File
	// RunDir is bind-mounted onto itself with private propagation: it
	// holds MountNS, the node's persistent mount namespace.
	RunDir, MountNS string
	// MountPoints are the host directories the binds cover; they must
	// exist on the host (made once, never removed, like /run/netns).
	MountPoints []string
	// Binds are made inside the node's mount namespace.
	Binds []Bind
	// Socket is containerd's CRI and API socket.
	Socket string
	// Containerd and Kubelet are the daemons, started through Wrapper in
	// the node's network namespace.
	Containerd, Kubelet Daemon
	// Wrapper enters the mount namespace, then execs the daemon.
	Wrapper []string
}

// File is a file Up writes.
type File struct {
	Path string
	Mode uint32
	Data []byte
}

// Bind is a bind mount inside the node's mount namespace.
type Bind struct{ Source, Target string }

// Daemon is a process Up starts through internal/proc.
type Daemon struct {
	Name string // proc name: pid and log file
	Argv []string
	// Config is the file whose change means a restart.
	Config string
}

// Paths inside Dir.
func (p *Plan) path(elem ...string) string {
	return filepath.Join(append([]string{p.Node.Dir}, elem...)...)
}

// ContainerdConfig and the others name Plan's files.
func (p *Plan) ContainerdConfig() string { return p.path("containerd.toml") }
func (p *Plan) KubeletConfig() string    { return p.path("kubelet.yaml") }
func (p *Plan) ResolvConf() string       { return p.path("resolv.conf") }
func (p *Plan) ContainerdRoot() string   { return p.path("containerd") }
func (p *Plan) ContainerdState() string  { return filepath.Join(p.RunDir, "containerd") }
func (p *Plan) KubeletRoot() string      { return p.path("kubelet") }
func (p *Plan) PodLogs() string          { return p.path("pod-logs") }
func (p *Plan) ImageStamps() string      { return p.path("imported") }

// hostPaths are the directories outside --root-dir and containerd's
// root/state that the kubelet, containerd and the CNI library hard-code,
// each covered by a directory of the node inside its mount namespace:
//
//	/var/lib/kubelet     device-plugins/kubelet.sock: every kubelet wipes the
//	                     directory, and one whose socket is gone fails /healthz
//	/var/log/containers  the kubelet's symlinks to container logs
//	/run/containerd      the shims' sockets (s/<hash>)
//	/var/lib/cni         libcni's result cache (and host-local's default store)
//	/run/flatnet         the agent's policy gate socket, when the agent runs
//	                     as a DaemonSet pod (deploy/flatnet.yaml)
var hostPaths = []struct{ target, dir string }{
	{"/var/lib/kubelet", "var-lib-kubelet"},
	{"/var/log/containers", "var-log-containers"},
	{"/run/containerd", "run-containerd"},
	{"/var/lib/cni", "var-lib-cni"},
	{"/run/flatnet", "run-flatnet"},
}

// maxSocket is the longest unix socket path (sun_path is 108 bytes with
// the terminating NUL). With the lab's default state root the node's and
// lab's names may take 36 bytes together (the kubelet's pod-resources
// socket is the longest).
const maxSocket = 107

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

// MakePlan computes a node's plan. It reads nothing: the same Node gives
// the same Plan.
func MakePlan(n Node) (*Plan, error) {
	if !nameRE.MatchString(n.Name) || !nameRE.MatchString(n.Lab) {
		return nil, fmt.Errorf("node %q of lab %q: names must be lower-case DNS labels", n.Name, n.Lab)
	}
	for what, p := range map[string]string{"state dir": n.StateDir, "node dir": n.Dir, "netns": n.Netns, "kubeconfig": n.Kubeconfig,
		"CNI conf dir": n.CNIConfDir, "CNI bin dir": n.CNIBinDir, "node bin dir": n.NodeBinDir, "kubelet bin dir": n.KubeletBinDir} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("node %s: %s %q is not an absolute path", n.Name, what, p)
		}
	}
	n.StateDir, n.Dir = filepath.Clean(n.StateDir), filepath.Clean(n.Dir)
	if !strings.HasPrefix(n.Dir, n.StateDir+"/") {
		return nil, fmt.Errorf("node %s: dir %s is not under the lab's state dir %s (lab down would not find its processes)", n.Name, n.Dir, n.StateDir)
	}
	if !n.IP.IsValid() {
		return nil, fmt.Errorf("node %s: no node IP", n.Name)
	}
	if n.PauseImage == "" {
		n.PauseImage = PauseImage
	}
	if n.HostResolvConf == "" {
		n.HostResolvConf = "/etc/resolv.conf"
	}
	if n.ClusterDomain == "" {
		n.ClusterDomain = "cluster.local"
	}
	p := &Plan{Node: n}
	p.CgroupRoot = "/flatnet-" + n.Lab + "-" + n.Name
	p.ShimCgroup = p.CgroupRoot + "/shims"
	p.RunDir = p.path("run")
	p.MountNS = filepath.Join(p.RunDir, "mnt")
	p.Socket = filepath.Join(p.RunDir, "containerd.sock")
	// The longest sockets: containerd's ttrpc one, and the kubelet's
	// pod-resources listener (<root-dir>/pod-resources/<9 digits>, a
	// temporary name it binds before renaming), which otherwise dies with
	// "bind: invalid argument".
	for _, sock := range []string{p.Socket + ".ttrpc", filepath.Join(p.KubeletRoot(), "pod-resources", "123456789")} {
		if len(sock) > maxSocket {
			return nil, fmt.Errorf("node %s: %s would be %d bytes, too long for a unix socket (%d at most): use a shorter state dir or shorter lab and node names", n.Name, sock, len(sock), maxSocket)
		}
	}
	p.Wrapper = []string{"nsenter", "--mount=" + p.MountNS, "--"}
	for _, h := range hostPaths {
		p.MountPoints = append(p.MountPoints, h.target)
		p.Binds = append(p.Binds, Bind{Source: p.path(h.dir), Target: h.target})
		p.Dirs = append(p.Dirs, p.path(h.dir))
	}
	// The node's CNI dirs also sit where CNI installers write, so that a
	// DaemonSet installing a network (deploy/flatnet.yaml's hostPaths)
	// fills this node's, not the machine's.
	for _, b := range []Bind{{Source: n.CNIConfDir, Target: "/etc/cni/net.d"}, {Source: n.CNIBinDir, Target: "/opt/cni/bin"}} {
		p.MountPoints = append(p.MountPoints, b.Target)
		p.Binds = append(p.Binds, b)
	}
	p.Dirs = append(p.Dirs, p.RunDir, p.ContainerdRoot(), p.KubeletRoot(), p.PodLogs(), p.ImageStamps(), n.CNIConfDir, n.CNIBinDir)

	kubelet, err := kubeletConfig(p)
	if err != nil {
		return nil, err
	}
	p.Files = []File{
		{Path: p.ContainerdConfig(), Mode: 0o644, Data: []byte(containerdConfig(p))},
		{Path: p.KubeletConfig(), Mode: 0o644, Data: kubelet},
	}
	p.Containerd = Daemon{
		Name:   "containerd",
		Argv:   []string{filepath.Join(n.NodeBinDir, "containerd"), "--config", p.ContainerdConfig()},
		Config: p.ContainerdConfig(),
	}
	p.Kubelet = Daemon{
		Name: "kubelet",
		Argv: []string{filepath.Join(n.KubeletBinDir, "kubelet"),
			"--config=" + p.KubeletConfig(),
			"--kubeconfig=" + n.Kubeconfig,
			"--root-dir=" + p.KubeletRoot(),
			"--cert-dir=" + filepath.Join(p.KubeletRoot(), "pki"),
			"--hostname-override=" + n.Name,
			"--node-ip=" + n.IP.String(),
		},
		Config: p.KubeletConfig(),
	}
	return p, nil
}

// toml quotes s as a TOML literal string.
func toml(s string) string {
	if strings.ContainsAny(s, "'\n") {
		b, _ := json.Marshal(s) // a JSON string is a TOML basic string
		return string(b)
	}
	return "'" + s + "'"
}

// containerdConfig is containerd's config (version 3, which 2.4 migrates
// on load): its own root, state, sockets and runc root; the CNI dirs; the
// sandbox image pinned; nothing at the shared defaults (NRI's socket, CDI's
// directories, /opt/containerd).
func containerdConfig(p *Plan) string {
	n := p.Node
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# Written by flatnet lab for node %s; changes are overwritten.", n.Name)
	w("version = 3")
	w("root = %s", toml(p.ContainerdRoot()))
	w("state = %s", toml(p.ContainerdState()))
	w("")
	w("[grpc]")
	w("  address = %s", toml(p.Socket))
	w("")
	w("[ttrpc]")
	w("  address = %s", toml(p.Socket+".ttrpc"))
	w("")
	w("[plugins]")
	w("  [plugins.'io.containerd.internal.v1.opt']")
	w("    path = %s", toml(filepath.Join(p.ContainerdRoot(), "opt")))
	w("  [plugins.'io.containerd.nri.v1.nri']")
	w("    disable = true")
	w("  [plugins.'io.containerd.cri.v1.images']")
	w("    snapshotter = 'overlayfs'")
	w("    [plugins.'io.containerd.cri.v1.images'.pinned_images]")
	w("      sandbox = %s", toml(n.PauseImage))
	w("  [plugins.'io.containerd.cri.v1.runtime']")
	w("    # Pod network namespaces under the state dir, not /var/run/netns")
	w("    # where the lab's nodes are.")
	w("    netns_mounts_under_state_dir = true")
	w("    # Root without CAP_SYS_RESOURCE (this kind of VM) cannot lower")
	w("    # oom_score_adj; runc fails unless it is restricted.")
	w("    restrict_oom_score_adj = true")
	w("    enable_cdi = false")
	w("    cdi_spec_dirs = []")
	w("    [plugins.'io.containerd.cri.v1.runtime'.containerd]")
	w("      default_runtime_name = 'runc'")
	w("      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]")
	w("        runtime_type = 'io.containerd.runc.v2'")
	w("        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]")
	w("          BinaryName = %s", toml(filepath.Join(n.NodeBinDir, "runc")))
	w("          Root = %s", toml(filepath.Join(p.RunDir, "runc")))
	w("          ShimCgroup = %s", toml(p.ShimCgroup))
	w("          SystemdCgroup = false")
	w("    [plugins.'io.containerd.cri.v1.runtime'.cni]")
	w("      bin_dirs = [%s]", toml(n.CNIBinDir))
	w("      conf_dir = %s", toml(n.CNIConfDir))
	w("  [plugins.'io.containerd.grpc.v1.cri']")
	w("    stream_server_address = '127.0.0.1'")
	w("    stream_server_port = '0'")
	return b.String()
}

// kubeletConfiguration is the part of the kubelet's v1beta1
// KubeletConfiguration the lab sets (JSON is YAML).
type kubeletConfiguration struct {
	APIVersion                  string            `json:"apiVersion"`
	Kind                        string            `json:"kind"`
	FailCgroupV1                bool              `json:"failCgroupV1"`
	CgroupRoot                  string            `json:"cgroupRoot"`
	CgroupDriver                string            `json:"cgroupDriver"`
	CgroupsPerQOS               bool              `json:"cgroupsPerQOS"`
	EnforceNodeAllocatable      []string          `json:"enforceNodeAllocatable"`
	FailSwapOn                  bool              `json:"failSwapOn"`
	ContainerRuntimeEndpoint    string            `json:"containerRuntimeEndpoint"`
	PodLogsDir                  string            `json:"podLogsDir"`
	VolumePluginDir             string            `json:"volumePluginDir"`
	ImageGCHighThresholdPercent int               `json:"imageGCHighThresholdPercent"`
	EvictionHard                map[string]string `json:"evictionHard"`
	ClusterDNS                  []string          `json:"clusterDNS,omitempty"`
	ClusterDomain               string            `json:"clusterDomain"`
	ResolvConf                  string            `json:"resolvConf"`
	HealthzBindAddress          string            `json:"healthzBindAddress"`
	HealthzPort                 int               `json:"healthzPort"`
	ReadOnlyPort                int               `json:"readOnlyPort"`
	Authentication              kubeletAuthn      `json:"authentication"`
	Authorization               kubeletAuthz      `json:"authorization"`
}

type kubeletAuthn struct {
	Anonymous struct {
		Enabled bool `json:"enabled"`
	} `json:"anonymous"`
	Webhook struct {
		Enabled bool `json:"enabled"`
	} `json:"webhook"`
	X509 struct {
		ClientCAFile string `json:"clientCAFile,omitempty"`
	} `json:"x509"`
}

type kubeletAuthz struct {
	Mode string `json:"mode"`
}

// kubeletConfig renders the kubelet's config: cgroup v1 allowed (this
// machine is v1 hybrid), its own cgroup root, log and volume-plugin dirs
// (the defaults are shared by every kubelet of the host), no image GC or
// disk eviction (the lab's images are imported, never pulled), and the
// lab's authorization (AlwaysAllow: whoever the kubelet authenticates).
func kubeletConfig(p *Plan) ([]byte, error) {
	n := p.Node
	c := kubeletConfiguration{
		APIVersion:                  "kubelet.config.k8s.io/v1beta1",
		Kind:                        "KubeletConfiguration",
		FailCgroupV1:                false,
		CgroupRoot:                  p.CgroupRoot,
		CgroupDriver:                "cgroupfs",
		CgroupsPerQOS:               true,
		EnforceNodeAllocatable:      []string{"pods"},
		FailSwapOn:                  false,
		ContainerRuntimeEndpoint:    "unix://" + p.Socket,
		PodLogsDir:                  p.PodLogs(),
		VolumePluginDir:             filepath.Join(p.KubeletRoot(), "volume-plugins"),
		ImageGCHighThresholdPercent: 100,
		EvictionHard: map[string]string{
			"nodefs.available": "0%", "nodefs.inodesFree": "0%",
			"imagefs.available": "0%", "imagefs.inodesFree": "0%",
		},
		ClusterDomain:      strings.TrimSuffix(n.ClusterDomain, "."),
		ResolvConf:         p.ResolvConf(),
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        10248,
		ReadOnlyPort:       0,
		Authorization:      kubeletAuthz{Mode: "AlwaysAllow"},
	}
	for _, a := range n.ClusterDNS {
		c.ClusterDNS = append(c.ClusterDNS, a.String())
	}
	if n.ClientCAFile != "" {
		if !filepath.IsAbs(n.ClientCAFile) {
			return nil, fmt.Errorf("node %s: client CA file %q is not an absolute path", n.Name, n.ClientCAFile)
		}
		c.Authentication.X509.ClientCAFile = n.ClientCAFile
	} else {
		c.Authentication.Anonymous.Enabled = true
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// NodeResolvConf is the node's resolv.conf (the kubelet's resolvConf, the
// base of every pod's): the host's nameserver and options lines, without
// its search and domain lines, which would leak the host's search list into
// every pod.
func NodeResolvConf(host []byte) []byte {
	var b strings.Builder
	b.WriteString("# flatnet lab: the host's nameservers, not its search list\n")
	for _, line := range strings.Split(string(host), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && (f[0] == "nameserver" || f[0] == "options") {
			b.WriteString(strings.Join(f, " ") + "\n")
		}
	}
	return []byte(b.String())
}
