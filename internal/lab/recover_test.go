package lab

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/proc"
)

// upRequest is `flatnet lab up --name name` with every flag at its
// default, as the command builds it.
func upRequest(root, name string) Request {
	return Request{Options: Options{Name: name, StateRoot: root, Nodes: DefaultNodes, Backend: DefaultBackend,
		ClusterCIDR: DefaultClusterCIDR, ServiceCIDR: DefaultServiceCIDR, NodeCIDRMaskSize: DefaultNodeMask, LBPool: DefaultLBPool},
		Changed: map[string]bool{}}
}

// TestUpRecoversLabRecord: lab.json empty, cut short or not this lab's
// is no reason to refuse up: the Spec is rebuilt from what runs (here as
// readRunningLab would find it), equal to the one the lab was made with,
// even though up is run without the flags that made it; the file is
// named in a warning. With nothing running, up makes the lab from its
// options.
func TestUpRecoversLabRecord(t *testing.T) {
	for _, rt := range Runtimes {
		t.Run(rt, func(t *testing.T) { testUpRecoversLabRecord(t, rt) })
	}
}

// testUpRecoversLabRecord is TestUpRecoversLabRecord for a lab of runtime
// rt: the agents' command lines tell it (up is run without --runtime).
func testUpRecoversLabRecord(t *testing.T, rt string) {
	root := t.TempDir()
	o := Options{Name: "rec", StateRoot: root, Nodes: 3, Backend: "vxlan", ClusterCIDR: "10.248.0.0/16",
		ServiceCIDR: "10.97.0.0/16", NodeCIDRMaskSize: 25, Subnets: 2, External: true, LBPool: "10.251.8.0/23", Runtime: rt}
	if rt == RuntimeProcess {
		// Plugins from another dir: the agents' --cni-bin-dir tells it.
		o.CNIPluginDir = "/opt/ref-cni"
	}
	made, err := NewSpec(o, netip.MustParsePrefix("10.250.40.0/24"), netip.MustParsePrefix("10.250.41.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := saveRecord(&record{Spec: *made, K8sBinDir: "/k8s"}); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(made.SpecFile())
	if err != nil {
		t.Fatal(err)
	}
	// What readRunningLab finds: the kernel's objects, and the daemons'
	// command lines (up's own argv builders; kube-apiserver's flags).
	running := runningLab{underlays: made.Underlays(), nodes: 3, external: true}
	for _, n := range made.Nodes {
		running.addDaemon(made.StateDir, agentArgv(made, n))
	}
	running.addDaemon(made.StateDir, controllerArgv(made))
	running.addDaemon(made.StateDir, []string{"/k8s/kube-apiserver", "--etcd-servers=https://127.0.0.1:2379",
		"--service-cluster-ip-range=10.97.0.0/16", "--client-ca-file=" + made.StateDir + "/pki/ca.crt"})
	running.addDaemon(made.StateDir, externalArgv(made))
	req := upRequest(root, "rec")
	for name, content := range map[string][]byte{
		"empty":         nil,
		"cut short":     good[:len(good)/2],
		"another lab's": bytes.Replace(good, []byte(`"name": "rec"`), []byte(`"name": "other"`), 1),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(made.SpecFile(), content, 0o644); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			got, bin, err := loadOrRecover(req, func() (runningLab, error) { return running, nil }, &out)
			if err != nil {
				t.Fatalf("up refused: %v", err)
			}
			if d := cmp.Diff(made, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" || bin != "/k8s" {
				t.Errorf("recovered (-made +got):\n%s\nbin %q", d, bin)
			}
			if !strings.Contains(out.String(), made.SpecFile()) {
				t.Errorf("the warning does not name %s:\n%s", made.SpecFile(), out.String())
			}
			// What up then builds: the running lab, unchanged.
			s, err := resolve(req, got, nil, nil)
			if err != nil || s.Underlay != made.Underlay || len(s.Nodes) != 3 || s.Backend != "vxlan" {
				t.Errorf("resolve: %v %+v", err, s)
			}
			// Other commands say how to recover.
			if _, err := LoadSpec(root, "rec"); !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "flatnet lab up --name rec") {
				t.Errorf("LoadSpec: %v", err)
			}
		})
	}

	// Nothing of it runs: up makes it from its options.
	var out bytes.Buffer
	got, _, err := loadOrRecover(req, func() (runningLab, error) { return runningLab{}, nil }, &out)
	if err != nil || got != nil || !strings.Contains(out.String(), "making it from this up's options") {
		t.Errorf("nothing running: %v %v %q", got, err, out.String())
	}
	// A good record is read, not rebuilt; a missing one means a new lab.
	if err := os.WriteFile(made.SpecFile(), good, 0o644); err != nil {
		t.Fatal(err)
	}
	never := func() (runningLab, error) { t.Fatal("read what runs for a good record"); return runningLab{}, nil }
	if got, bin, err := loadOrRecover(req, never, &out); err != nil || got == nil || bin != "/k8s" {
		t.Errorf("good record: %v %v", got, err)
	}
	if got, _, err := loadOrRecover(upRequest(root, "none"), never, &out); err != nil || got != nil {
		t.Errorf("no record: %v %v", got, err)
	}
}

func TestLBPoolOfRange(t *testing.T) {
	for _, p := range []string{"10.251.0.0/24", "10.251.8.0/23", "10.251.0.16/28", "192.168.0.0/16"} {
		s := Spec{LBPool: netip.MustParsePrefix(p)}
		if got, err := lbPoolOfRange(s.LoadBalancerPool()); err != nil || got != s.LBPool {
			t.Errorf("%s: %s -> %s, %v", p, s.LoadBalancerPool(), got, err)
		}
	}
	if _, err := lbPoolOfRange("10.251.0.5-10.251.0.9"); err == nil {
		t.Error("a range that is no lower half accepted")
	}
}

// TestReportBadPIDFiles: an empty or cut-short pid file is named at up;
// a good or stale one is not.
func TestReportBadPIDFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/pids", 0o755); err != nil {
		t.Fatal(err)
	}
	stale := "99999999\n{\"startTime\":5,\"argv\":[\"flatnet\",\"agent\"]}\n"
	for name, content := range map[string]string{"agent-x-node1": "", "controller": "1234\n{\"start", "external": "99999999\n{}\n", "agent-x-node2": stale} {
		if err := os.WriteFile(proc.PIDFile(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	reportBadPIDFiles(dir, &out)
	got := out.String()
	for _, name := range []string{"agent-x-node1", "controller", "external"} {
		if !strings.Contains(got, proc.PIDFile(dir, name)) {
			t.Errorf("%s not reported:\n%s", name, got)
		}
	}
	if strings.Contains(got, "node2") {
		t.Errorf("a stale (readable) pid file reported:\n%s", got)
	}
}
