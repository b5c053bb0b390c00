package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/internal/testutil"
)

// hostSnapshot is what a lab may leave on the machine: the root
// namespace's links, addresses, routes and nft tables (compared whole:
// nothing else should change them while the tests run, except other test
// labs, whose interfaces are left out by name), and the lab's namespaces,
// mounts and processes (picked out by its name and state dir), and the
// host sysctls a kubelet changes.
type hostSnapshot map[string][]string

// labIf matches the names of lab interfaces in the root namespace: every
// lab's bridge and node veths start with fl-, router and external host
// veths with fr- and fx-.
var labIf = regexp.MustCompile(`\bf[lrx]-[a-z0-9][a-z0-9-]*`)

// otherLab reports whether line names a lab interface that is not lab
// name's: another lab on the same machine (a test or benchmark run at the
// same time), which comes and goes on its own.
func otherLab(line, name string) bool {
	ours := regexp.MustCompile(`^f[lrx]-` + regexp.QuoteMeta(name) + `(-|$)`)
	for _, m := range labIf.FindAllString(line, -1) {
		if !ours.MatchString(m) {
			return true
		}
	}
	return false
}

func TestOtherLab(t *testing.T) {
	for _, c := range []struct {
		line string
		want bool
	}{
		{"10.250.58.0/24 via 10.250.57.254 dev fl-e2eca0702 proto static", true},
		{"fl-e2eca0702-n1@if2", true},
		{"fr-e2eca0702 fe80::1/64", true},
		{"fl-e2e047609 10.250.57.1/24", false}, // this lab's own: must show
		{"fx-e2e047609", false},
		{"fl-e2e047609-n3@if2", false},
		{"fl-ov9826-hg-n1@if2", true},
		{"route6: fe80::/64 dev fl-ov9826-vx proto kernel", true},
		{"fl-e2e047609-rt", false}, // this lab's name: a leftover must show
		{"fl-e2e047609a", true},
		{"eth0 192.0.2.10/24", false},
	} {
		if got := otherLab(c.line, "e2e047609"); got != c.want {
			t.Errorf("otherLab(%q) = %v, want %v", c.line, got, c.want)
		}
	}
}

func snapshotHost(t *testing.T, name, root string) hostSnapshot {
	t.Helper()
	lines := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" && !otherLab(l, name) {
				out = append(out, l)
			}
		}
		sort.Strings(out)
		return out
	}
	s := hostSnapshot{}
	var links []string
	for _, l := range lines(testutil.Run(t, "ip", "-o", "link", "show")) {
		// "3: name@peer: <FLAGS> ..." -> name (flags and counters change).
		if f := strings.Fields(l); len(f) > 1 {
			links = append(links, strings.TrimSuffix(f[1], ":"))
		}
	}
	sort.Strings(links)
	s["link"] = links
	var addrs []string
	for _, l := range lines(testutil.Run(t, "ip", "-o", "addr", "show")) {
		if f := strings.Fields(l); len(f) > 3 {
			addrs = append(addrs, f[1]+" "+f[3])
		}
	}
	s["addr"] = addrs
	s["route4"] = lines(testutil.Run(t, "ip", "-4", "route", "show", "table", "all"))
	s["route6"] = lines(testutil.Run(t, "ip", "-6", "route", "show", "table", "all"))
	s["nft"] = lines(testutil.Run(t, "nft", "list", "tables"))
	s["sysctl"] = sysctlValues()
	ents, _ := os.ReadDir(netns.RunDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "fl-"+name+"-") {
			s["netns"] = append(s["netns"], e.Name())
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, root) || strings.Contains(l, "/run/netns/fl-"+name+"-") {
			s["mount"] = append(s["mount"], l)
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		exe, _ := os.Readlink("/proc/" + e.Name() + "/exe")
		if strings.Contains(string(cmd), root) || strings.HasPrefix(exe, root) {
			s["process"] = append(s["process"], e.Name()+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return s
}

// diff lists what after has that s has not.
func (s hostSnapshot) diff(after hostSnapshot) string {
	var b strings.Builder
	keys := make([]string, 0, len(after))
	for k := range after {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		had := map[string]bool{}
		for _, v := range s[k] {
			had[v] = true
		}
		for _, v := range after[k] {
			if !had[v] {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
	}
	return b.String()
}

func stopAgent(s *lab.Spec, n lab.Node) error {
	return proc.Stop(s.StateDir, lab.AgentProc(n.Name), 10*time.Second)
}

// cniCheck runs CNI CHECK for pod ns/name on node n with the conflist the
// agent wrote, the attachment libcni cached at ADD, and the plugins the
// lab installed: from inside the node's namespace, as the runtime runs
// CNI.
func cniCheck(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string) error {
	return cniRun(t, s, n, ns, pod, (*libcni.CNIConfig).CheckNetworkList)
}

// cniDel runs CNI DEL for pod ns/name as cniCheck runs CHECK: with the
// conflist the agent writes now, whatever the pod was set up with.
func cniDel(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string) error {
	return cniRun(t, s, n, ns, pod, (*libcni.CNIConfig).DelNetworkList)
}

func cniRun(t *testing.T, s *lab.Spec, n lab.Node, ns, pod string,
	verb func(*libcni.CNIConfig, context.Context, *libcni.NetworkConfigList, *libcni.RuntimeConf) error) error {
	sb := podSandbox(t, s, n, ns, pod)
	// containerd's CNI library caches in its default /var/lib/cni, which
	// the node's mount namespace covers with a directory of the node.
	cache := s.CNICacheDir(n)
	if s.Containerd() {
		cache = filepath.Join(s.ContainerdDir(n), "var-lib-cni")
	}
	files, err := libcni.ConfFiles(s.CNIConfDir(n), []string{".conflist"})
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no conflist in %s (%v)", s.CNIConfDir(n), err)
	}
	sort.Strings(files)
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		return err
	}
	var ex invoke.Exec
	if s.Containerd() {
		// containerd's pod netns files are mounts of the node's mount
		// namespace: the plugins run there, on the path it recorded.
		ex = mountNSExec{RawExec: &invoke.RawExec{}, PluginDecoder: &version.PluginDecoder{}, mnt: filepath.Join(s.ContainerdDir(n), "run", "mnt")}
	}
	cfg := libcni.NewCNIConfigWithCacheDir([]string{s.CNIBinDir()}, cache, ex)
	atts, err := cfg.GetCachedAttachments(sb.ID)
	if err != nil {
		return err
	}
	var rt *libcni.RuntimeConf
	for _, a := range atts {
		if a.Network == list.Name {
			netnsPath := sb.Netns
			if s.Containerd() {
				netnsPath = a.NetNS
			}
			rt = &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: netnsPath, IfName: a.IfName,
				Args: a.CniArgs, CapabilityArgs: a.CapabilityArgs}
		}
	}
	if rt == nil {
		return fmt.Errorf("no cached attachment of network %q for sandbox %s in %s", list.Name, sb.ID, cache)
	}
	return netns.Do(lab.NetnsPath(n.Netns), func() error {
		return verb(cfg, context.Background(), list, rt)
	})
}

// mountNSExec runs CNI plugins in the mount namespace at mnt (nsenter).
type mountNSExec struct {
	*invoke.RawExec
	*version.PluginDecoder
	mnt string
}

func (e mountNSExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--mount="+e.mnt, "--", pluginPath)
	cmd.Env, cmd.Stdin = environ, bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s in mount namespace %s: %w: %s %s", pluginPath, e.mnt, err, bytes.TrimSpace(out), bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
