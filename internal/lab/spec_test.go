package lab

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func opts(name string, nodes int) Options {
	return Options{Name: name, StateRoot: "/var/lib/flatnet/lab", Nodes: nodes, Backend: "host-gw",
		ClusterCIDR: DefaultClusterCIDR, ServiceCIDR: DefaultServiceCIDR, NodeCIDRMaskSize: 24}
}

func TestNewSpecDefaultLab(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 3), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Underlay.String() != "10.250.0.0/24" || s.HostAddr.String() != "10.250.0.1" || s.Bridge != "fl-flatnet" {
		t.Errorf("underlay %s host %s bridge %s", s.Underlay, s.HostAddr, s.Bridge)
	}
	want := []Node{
		{1, "flatnet-node1", "fl-flatnet-n1", "fl-flatnet-n1", netip.MustParseAddr("10.250.0.11")},
		{2, "flatnet-node2", "fl-flatnet-n2", "fl-flatnet-n2", netip.MustParseAddr("10.250.0.12")},
		{3, "flatnet-node3", "fl-flatnet-n3", "fl-flatnet-n3", netip.MustParseAddr("10.250.0.13")},
	}
	if d := cmp.Diff(want, s.Nodes, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("nodes (-want +got):\n%s", d)
	}
	if s.StateDir != "/var/lib/flatnet/lab/flatnet" || s.CNIConfDir(s.Nodes[0]) != "/var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/net.d" {
		t.Errorf("paths: %s %s", s.StateDir, s.CNIConfDir(s.Nodes[0]))
	}
}

func TestNamesFitInterfaceNames(t *testing.T) {
	long := strings.Repeat("a", 32)
	for _, name := range []string{"a", "flatnet", "e2e-12345678", long, long[:31] + "b"} {
		s, err := NewSpec(opts(name, 12), DefaultUnderlay(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		names := map[string]bool{s.Bridge: true}
		for _, n := range s.Nodes {
			if len(n.HostVeth) > 15 || names[n.HostVeth] {
				t.Errorf("%s: host veth %q too long or not unique", name, n.HostVeth)
			}
			names[n.HostVeth] = true
		}
		if len(s.Bridge) > 15 {
			t.Errorf("%s: bridge %q too long", name, s.Bridge)
		}
	}
	// Long names that share a prefix get different interfaces.
	if BridgeName(long) == BridgeName(long[:31]+"b") {
		t.Error("hashed bridge names collide")
	}
}

func TestNewSpecErrors(t *testing.T) {
	u := netip.MustParsePrefix("10.250.0.0/24")
	cases := []struct {
		name   string
		mod    func(*Options)
		under  netip.Prefix
		substr string
	}{
		{"bad name", func(o *Options) { o.Name = "Bad_Name" }, u, "invalid lab name"},
		{"zero nodes", func(o *Options) { o.Nodes = 0 }, u, "--nodes 0"},
		{"backend", func(o *Options) { o.Backend = "vxlan" }, u, "--backend"},
		{"cluster v6", func(o *Options) { o.ClusterCIDR = "fd00::/64" }, u, "IPv4 only"},
		{"host bits", func(o *Options) { o.ClusterCIDR = "10.244.1.0/16" }, u, "did you mean 10.244.0.0/16"},
		{"overlap", func(o *Options) { o.ServiceCIDR = "10.244.128.0/20" }, u, "overlaps"},
		{"underlay overlap", func(o *Options) {}, netip.MustParsePrefix("10.244.3.0/24"), "overlaps"},
		{"underlay small", func(o *Options) {}, netip.MustParsePrefix("10.250.0.0/25"), "/24 or larger"},
		{"too few subnets", func(o *Options) { o.ClusterCIDR = "10.244.0.0/24"; o.NodeCIDRMaskSize = 25; o.Nodes = 3 }, u, "holds 2 node subnets"},
		{"mask", func(o *Options) { o.NodeCIDRMaskSize = 8 }, u, "--node-cidr-mask-size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := opts("flatnet", 3)
			c.mod(&o)
			_, err := NewSpec(o, c.under)
			if err == nil || !strings.Contains(err.Error(), c.substr) {
				t.Fatalf("got %v, want an error containing %q", err, c.substr)
			}
		})
	}
}

func TestChooseUnderlay(t *testing.T) {
	p := netip.MustParsePrefix
	got, err := ChooseUnderlay("flatnet", nil)
	if err != nil || got != p("10.250.0.0/24") {
		t.Fatalf("default lab: %s %v", got, err)
	}
	if _, err := ChooseUnderlay("flatnet", []netip.Prefix{p("10.250.0.0/16")}); err == nil || !strings.Contains(err.Error(), "--underlay-cidr") {
		t.Fatalf("default lab on a taken range: %v", err)
	}
	first := DefaultUnderlay("other")
	if first.Addr().As4()[2] == 0 {
		t.Fatalf("a non-default lab must not take 10.250.0.0/24: %s", first)
	}
	got, err = ChooseUnderlay("other", []netip.Prefix{first})
	if err != nil || got == first || !underlayBase.Contains(got.Addr()) {
		t.Fatalf("taken first choice: got %s %v", got, err)
	}
	if _, err := ChooseUnderlay("other", []netip.Prefix{p("10.0.0.0/8")}); err == nil {
		t.Fatal("all taken: no error")
	}
}

func TestResolve(t *testing.T) {
	p := netip.MustParsePrefix
	req := func(nodes int, changed ...string) Request {
		r := Request{Options: opts("lab1", nodes), Changed: map[string]bool{}}
		for _, c := range changed {
			r.Changed[c] = true
		}
		return r
	}
	// New lab: underlay skips the host's and other labs' networks.
	first := DefaultUnderlay("lab1")
	s, err := resolve(req(3), nil, []netip.Prefix{p("192.0.2.0/24")}, []netip.Prefix{first})
	if err != nil || s.Underlay == first {
		t.Fatalf("new lab: %v %v", s, err)
	}
	// Host routes overlapping the cluster CIDR: refused, naming the flag.
	_, err = resolve(req(3), nil, []netip.Prefix{p("10.244.7.0/24")}, nil)
	if err == nil || !strings.Contains(err.Error(), "--cluster-cidr") || !strings.Contains(err.Error(), "10.244.7.0/24") {
		t.Fatalf("cluster overlap: %v", err)
	}
	_, err = resolve(req(3), nil, []netip.Prefix{p("10.96.0.0/12")}, nil)
	if err == nil || !strings.Contains(err.Error(), "--service-cidr") {
		t.Fatalf("service overlap: %v", err)
	}
	r := req(3, "underlay-cidr")
	r.Underlay = "192.0.2.0/24"
	if _, err = resolve(r, nil, []netip.Prefix{p("192.0.2.0/24")}, nil); err == nil || !strings.Contains(err.Error(), "--underlay-cidr") {
		t.Fatalf("underlay overlap: %v", err)
	}

	// Running lab: unset flags keep it as it is, more nodes grow it,
	// fewer or changed ranges are refused.
	rec, err := NewSpec(opts("lab1", 3), p("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	s, err = resolve(req(1), rec, nil, nil)
	if err != nil || len(s.Nodes) != 3 || s.Underlay != rec.Underlay {
		t.Fatalf("rerun: %v %v", s, err)
	}
	s, err = resolve(req(5, "nodes"), rec, nil, nil)
	if err != nil || len(s.Nodes) != 5 || s.Nodes[4].IP.String() != "10.250.9.15" {
		t.Fatalf("grow: %v %v", s, err)
	}
	if _, err = resolve(req(2, "nodes"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "never removes") {
		t.Fatalf("shrink: %v", err)
	}
	r = req(3, "cluster-cidr")
	r.ClusterCIDR = "10.100.0.0/16"
	if _, err = resolve(r, rec, nil, nil); err == nil || !strings.Contains(err.Error(), "runs with --cluster-cidr 10.244.0.0/16") {
		t.Fatalf("changed cidr: %v", err)
	}
	r = req(3, "cluster-cidr")
	if _, err = resolve(r, rec, nil, nil); err != nil {
		t.Fatalf("same cidr given explicitly: %v", err)
	}
}

func TestPlan(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 2), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	summary := func(steps []Step) string {
		var b strings.Builder
		for _, st := range steps {
			mark := "+"
			if st.Present {
				mark = "="
			} else if st.Restart {
				mark = "r"
			}
			b.WriteString(mark + string(st.Kind))
			if st.Node != "" {
				b.WriteString("(" + st.Node + ")")
			}
			b.WriteString(" ")
		}
		return strings.TrimSpace(b.String())
	}
	all := Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true,
		Nodes:  map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
		Agents: map[string]bool{"flatnet-node1": true, "flatnet-node2": true}}
	cases := []struct {
		name string
		obs  Observed
		want string
	}{
		{"new", Observed{}, "+state dir +binaries +underlay +node(flatnet-node1) +node(flatnet-node2) +control plane +controller +agent(flatnet-node1) +agent(flatnet-node2) +ready"},
		{"running", all, "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane =controller =agent(flatnet-node1) =agent(flatnet-node2) +ready"},
		{"dead agent", func() Observed {
			o := all
			o.Agents = map[string]bool{"flatnet-node1": true}
			return o
		}(), "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane =controller =agent(flatnet-node1) +agent(flatnet-node2) +ready"},
		{"node netns gone under its agent", func() Observed {
			o := all
			o.Nodes = map[string]bool{"flatnet-node2": true}
			return o
		}(), "=state dir =binaries =underlay +node(flatnet-node1) =node(flatnet-node2) =control plane =controller ragent(flatnet-node1) =agent(flatnet-node2) +ready"},
		{"bridge gone", func() Observed {
			o := all
			o.Underlay = false
			return o
		}(), "=state dir =binaries +underlay +node(flatnet-node1) +node(flatnet-node2) =control plane =controller ragent(flatnet-node1) ragent(flatnet-node2) +ready"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := summary(Plan(s, c.obs)); got != c.want {
				t.Errorf("plan:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestArgv(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 1), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(agentArgv(s, s.Nodes[0]), " ")
	want := "/var/lib/flatnet/lab/flatnet/bin/flatnet agent --kubeconfig /var/lib/flatnet/lab/flatnet/admin.kubeconfig" +
		" --node-name flatnet-node1 --node-ip 10.250.0.11 --cluster-cidr 10.244.0.0/16 --backend host-gw" +
		" --cni-conf-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/net.d --cni-bin-dir /var/lib/flatnet/lab/flatnet/bin" +
		" --cni-data-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/networks --cni-cache-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/cache" +
		" --masquerade=true --lab-runtime --runtime-state-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/runtime" +
		" --netns-prefix fl-flatnet- --pod-path /var/lib/flatnet/lab/flatnet/bin"
	if got != want {
		t.Errorf("agent argv:\n got %s\nwant %s", got, want)
	}
	got = strings.Join(controllerArgv(s), " ")
	want = "/var/lib/flatnet/lab/flatnet/bin/flatnet controller --kubeconfig /var/lib/flatnet/lab/flatnet/admin.kubeconfig" +
		" --cluster-cidr 10.244.0.0/16 --node-cidr-mask-size 24 --allocate-node-cidrs=true --bind-pods"
	if got != want {
		t.Errorf("controller argv:\n got %s\nwant %s", got, want)
	}
}

func TestNetnsPatterns(t *testing.T) {
	pod := podNetnsPattern("a")
	node := nodeNetnsPattern("a")
	for _, c := range []struct {
		ns        string
		pod, node bool
	}{
		{"fl-a-0123abcd", true, false},
		{"fl-a-n1", false, true},
		{"fl-a-n12", false, true},
		{"fl-a-b-0123abcd", false, false}, // lab "a-b"
		{"fl-a-b-n1", false, false},
		{"fl-a-n1-n1", false, false}, // lab "a-n1"
		{"fl-a-0123abcde", false, false},
	} {
		if pod.MatchString(c.ns) != c.pod || node.MatchString(c.ns) != c.node {
			t.Errorf("%s: pod %v node %v, want %v %v", c.ns, pod.MatchString(c.ns), node.MatchString(c.ns), c.pod, c.node)
		}
	}
}

func FuzzUnescapeMount(f *testing.F) {
	f.Add(`/var/lib/a\040b`)
	f.Add(`\`)
	f.Add(`\12`)
	f.Fuzz(func(t *testing.T, s string) {
		_ = unescapeMount(s)
	})
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b\134c`); got != `/a b\c` {
		t.Errorf("got %q", got)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	s, err := NewSpec(opts("rt", 3), netip.MustParsePrefix("10.250.5.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s.StateDir = filepath.Join(dir, "rt")
	if err := saveRecord(&record{Spec: *s, K8sBinDir: "/k8s"}); err != nil {
		t.Fatal(err)
	}
	r, err := loadRecord(dir, "rt")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(*s, r.Spec, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" || r.K8sBinDir != "/k8s" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	if _, err := loadRecord(dir, "other"); !errors.Is(err, ErrNoLab) {
		t.Errorf("missing lab: %v", err)
	}
	// A hand-edited record that names another lab's bridge is refused.
	b, _ := os.ReadFile(s.SpecFile())
	if err := os.WriteFile(s.SpecFile(), []byte(strings.Replace(string(b), `"bridge": "fl-rt"`, `"bridge": "eth0"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadRecord(dir, "rt"); err == nil || !strings.Contains(err.Error(), "do not follow") {
		t.Errorf("edited record: %v", err)
	}
	if got := Labs(dir); len(got) != 1 || got[0] != "rt" {
		t.Errorf("Labs = %v", got)
	}
}

func FuzzParseRecord(f *testing.F) {
	s, _ := NewSpec(opts("fz", 2), netip.MustParsePrefix("10.250.5.0/24"))
	b, _ := json.Marshal(record{Spec: *s})
	f.Add(b, "fz")
	f.Add([]byte(`{"name":"fz","nodes":[{}]}`), "fz")
	f.Add([]byte(`{`), "x")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		r, err := parseRecord(b, name)
		if err != nil {
			return
		}
		// Whatever parses names only this lab's objects.
		if r.Bridge != BridgeName(name) || len(r.Bridge) > 15 {
			t.Fatalf("bridge %q for lab %q", r.Bridge, name)
		}
		for _, n := range r.Nodes {
			if !nodeNetnsPattern(name).MatchString(n.Netns) || len(n.HostVeth) > 15 {
				t.Fatalf("node %+v of lab %q", n, name)
			}
		}
	})
}
