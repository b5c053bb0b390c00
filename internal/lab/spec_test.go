package lab

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/deploy"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
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
		{1, "flatnet-node1", "fl-flatnet-n1", "fl-flatnet-n1", netip.MustParseAddr("10.250.0.11"), 0},
		{2, "flatnet-node2", "fl-flatnet-n2", "fl-flatnet-n2", netip.MustParseAddr("10.250.0.12"), 0},
		{3, "flatnet-node3", "fl-flatnet-n3", "fl-flatnet-n3", netip.MustParseAddr("10.250.0.13"), 0},
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
		for _, v := range []string{RouterVeth(name), ExternalVeth(name)} {
			if len(v) > 15 || names[v] {
				t.Errorf("%s: veth %q too long or not unique", name, v)
			}
			names[v] = true
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
		{"backend", func(o *Options) { o.Backend = "geneve" }, u, "--backend"},
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
	// Host routes overlapping the default cluster CIDR (another lab's
	// pod routes): the next free /16 is taken; one given with
	// --cluster-cidr is refused, naming the flag, as is one another
	// lab records.
	s, err = resolve(req(3), nil, []netip.Prefix{p("10.244.7.0/24"), p("10.245.0.0/16")}, []netip.Prefix{p("10.246.0.0/16")})
	if err != nil || s.ClusterCIDR != p("10.247.0.0/16") {
		t.Fatalf("default cluster CIDR taken: %v %v", s, err)
	}
	if _, err = chooseClusterCIDR("10.244.0.0/16", []netip.Prefix{p("10.0.0.0/8")}); err == nil || !strings.Contains(err.Error(), "--cluster-cidr") {
		t.Fatalf("no free cluster CIDR: %v", err)
	}
	_, err = resolve(req(3, "cluster-cidr"), nil, []netip.Prefix{p("10.244.7.0/24")}, nil)
	if err == nil || !strings.Contains(err.Error(), "--cluster-cidr") || !strings.Contains(err.Error(), "10.244.7.0/24") {
		t.Fatalf("cluster overlap: %v", err)
	}
	_, err = resolve(req(3, "cluster-cidr"), nil, nil, []netip.Prefix{p("10.244.0.0/16")})
	if err == nil || !strings.Contains(err.Error(), "another lab") {
		t.Fatalf("cluster CIDR of another lab: %v", err)
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
	// The runtime is kept; another one is refused, a bad one named.
	r = req(3, "runtime")
	r.Runtime = RuntimeContainerd
	if _, err = resolve(r, rec, nil, nil); err == nil || !strings.Contains(err.Error(), "runs with --runtime process, not containerd") {
		t.Fatalf("changed runtime: %v", err)
	}
	r.Runtime = "docker"
	if _, err = resolve(r, rec, nil, nil); err == nil || !strings.Contains(err.Error(), `--runtime "docker"`) {
		t.Fatalf("bad runtime: %v", err)
	}
	r = req(3)
	r.Runtime = RuntimeContainerd
	if s, err = resolve(r, nil, nil, nil); err != nil || !s.Containerd() || s.Options().Runtime != RuntimeContainerd {
		t.Fatalf("new containerd lab: %v %v", s, err)
	}
}

func TestPlanContainerd(t *testing.T) {
	o := opts("flatnet", 2)
	o.Runtime = RuntimeContainerd
	s, err := NewSpec(o, DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := func(steps []Step) string {
		var ks []string
		for _, st := range steps {
			k := string(st.Kind)
			if st.Present {
				k = "=" + k
			}
			ks = append(ks, k)
		}
		return strings.Join(ks, ",")
	}
	all := Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true,
		Nodes:    map[string]bool{s.Nodes[0].Name: true, s.Nodes[1].Name: true},
		Agents:   map[string]bool{s.Nodes[0].Name: true, s.Nodes[1].Name: true},
		Gateways: map[string]bool{s.Nodes[0].Name: true, s.Nodes[1].Name: true},
		Kubelets: map[string]bool{s.Nodes[0].Name: true, s.Nodes[1].Name: true}}
	if got := kinds(Plan(s, all)); got != "=state dir,=binaries,=underlay,=node,=node,=control plane,=controller,=agent,=agent,=gateway,=gateway,=images,=kubelet,=kubelet,ready" {
		t.Errorf("running containerd lab: %s", got)
	}
	// One kubelet gone: the images (to import) and that node's kubelet.
	all.Kubelets = map[string]bool{s.Nodes[0].Name: true}
	if got := kinds(Plan(s, all)); got != "=state dir,=binaries,=underlay,=node,=node,=control plane,=controller,=agent,=agent,=gateway,=gateway,images,=kubelet,kubelet,ready" {
		t.Errorf("one kubelet down: %s", got)
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
		Nodes:    map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
		Agents:   map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
		Gateways: map[string]bool{"flatnet-node1": true, "flatnet-node2": true}}
	cases := []struct {
		name string
		obs  Observed
		want string
	}{
		{"new", Observed{}, "+state dir +binaries +underlay +node(flatnet-node1) +node(flatnet-node2) +control plane +controller +agent(flatnet-node1) +agent(flatnet-node2) +gateway(flatnet-node1) +gateway(flatnet-node2) +ready"},
		{"running", all, "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane =controller =agent(flatnet-node1) =agent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"dead agent", func() Observed {
			o := all
			o.Agents = map[string]bool{"flatnet-node1": true}
			return o
		}(), "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane =controller =agent(flatnet-node1) +agent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"node netns gone under its agent", func() Observed {
			o := all
			o.Nodes = map[string]bool{"flatnet-node2": true}
			o.Rewired = map[string]bool{"flatnet-node1": true}
			return o
		}(), "=state dir =binaries =underlay +node(flatnet-node1) =node(flatnet-node2) =control plane =controller ragent(flatnet-node1) =agent(flatnet-node2) rgateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"a route gone from a node: its agent keeps running", func() Observed {
			o := all
			o.Nodes = map[string]bool{"flatnet-node2": true}
			return o
		}(), "=state dir =binaries =underlay +node(flatnet-node1) =node(flatnet-node2) =control plane =controller =agent(flatnet-node1) =agent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"bridge gone (the veths are attached again; the agents keep running)", func() Observed {
			o := all
			o.Underlay = false
			o.Nodes = map[string]bool{}
			return o
		}(), "=state dir =binaries +underlay +node(flatnet-node1) +node(flatnet-node2) =control plane =controller =agent(flatnet-node1) =agent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"running without Services (no --endpointslices, one agent without --proxy)", func() Observed {
			o := all
			o.ControllerOutdated = true
			o.AgentsWithoutProxy = map[string]bool{"flatnet-node2": true}
			return o
		}(), "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane rcontroller =agent(flatnet-node1) ragent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
		{"a new build of flatnet: every flatnet daemon restarts", func() Observed {
			o := all
			o.BinOutdated = true
			return o
		}(), "=state dir +binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane rcontroller ragent(flatnet-node1) ragent(flatnet-node2) rgateway(flatnet-node1) rgateway(flatnet-node2) +ready"},
		{"dead controller started without --endpointslices", func() Observed {
			o := all
			o.Controller = false
			o.ControllerOutdated = true
			return o
		}(), "=state dir =binaries =underlay =node(flatnet-node1) =node(flatnet-node2) =control plane +controller =agent(flatnet-node1) =agent(flatnet-node2) =gateway(flatnet-node1) =gateway(flatnet-node2) +ready"},
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
		" --cni-conf-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/net.d --cni-conflist flatnet --cni-bin-dir /var/lib/flatnet/lab/flatnet/cni-bin" +
		" --cni-data-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/networks --cni-cache-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/cni/cache" +
		" --masquerade=true --lab-runtime --runtime-state-dir /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/runtime" +
		" --netns-prefix fl-flatnet- --pod-path /var/lib/flatnet/lab/flatnet/bin --proxy --proxy-mode auto --profiling --network-policy --policy-socket /var/lib/flatnet/lab/flatnet/nodes/flatnet-node1/policy.sock" +
		" --dns --cluster-dns 10.96.0.10 --dns-addresses 169.254.20.10,10.96.0.10 --dns-upstreams none --dns-reverse-cidrs 10.96.0.0/16,10.244.0.0/16"
	if got != want {
		t.Errorf("agent argv:\n got %s\nwant %s", got, want)
	}
	// Real nodes: the kubelet runs pods; the agent only writes the conflist.
	o := opts("flatnet", 1)
	o.Runtime = RuntimeContainerd
	rs, err := NewSpec(o, DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	if a := strings.Join(agentArgv(rs, rs.Nodes[0]), " "); strings.Contains(a, "--lab-runtime") || strings.Contains(a, "--pod-path") || !strings.Contains(a, "--cni-conf-dir") {
		t.Errorf("agent argv on a containerd node: %s", a)
	}
	got = strings.Join(controllerArgv(s), " ")
	want = "/var/lib/flatnet/lab/flatnet/bin/flatnet controller --kubeconfig /var/lib/flatnet/lab/flatnet/admin.kubeconfig" +
		" --cluster-cidr 10.244.0.0/16 --node-cidr-mask-size 24 --allocate-node-cidrs=true --metrics-bind-address=" + s.HostAddr.String() + ":9081 --profiling --endpointslices"
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

func TestRecordRoundTrip(t *testing.T) {
	s, err := NewSpec(opts("rt", 3), netip.MustParsePrefix("10.250.5.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s.StateDir = filepath.Join(dir, "rt")
	// Learned pod CIDRs are kept.
	s.PodCIDRs = map[string]netip.Prefix{s.Nodes[0].Name: netip.MustParsePrefix("10.244.3.0/24")}
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
	s2, _ := NewSpec(twoSubnetOpts("fz", 3), netip.MustParsePrefix("10.250.5.0/24"), netip.MustParsePrefix("10.250.6.0/24"))
	b2, _ := json.Marshal(record{Spec: *s2})
	f.Add(b2, "fz")
	f.Add([]byte(`{"name":"fz","nodes":[{}]}`), "fz")
	s.PodCIDRs = map[string]netip.Prefix{s.Nodes[0].Name: netip.MustParsePrefix("0.0.0.0/0")}
	b3, _ := json.Marshal(record{Spec: *s})
	f.Add(b3, "fz")
	f.Add([]byte(`{`), "x")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		r, err := parseRecord(b, name)
		if err != nil {
			return
		}
		// Whatever parses names only this lab's objects, and routes only
		// inside its cluster CIDR on its own bridge.
		if r.Bridge != BridgeName(name) || len(r.Bridge) > 15 {
			t.Fatalf("bridge %q for lab %q", r.Bridge, name)
		}
		for _, rt := range r.hostRoutes() {
			if rt.dev != r.Bridge || !(rt.dst == r.Underlay2 || within(rt.dst, r.ClusterCIDR)) {
				t.Fatalf("host route %s of lab %q", rt, name)
			}
		}
		for _, n := range r.Nodes {
			if !nodeNetnsPattern(name).MatchString(n.Netns) || len(n.HostVeth) > 15 || n.Subnet < 0 || n.Subnet >= r.Subnets() {
				t.Fatalf("node %+v of lab %q", n, name)
			}
		}
		if r.Router != nil && (r.Router.Netns != RouterNetns(name) || r.Router.HostVeth != RouterVeth(name) || len(r.Router.HostVeth) > 15) {
			t.Fatalf("router %+v of lab %q", r.Router, name)
		}
		if r.External != nil && (r.External.Netns != ExternalNetns(name) || r.External.HostVeth != ExternalVeth(name) || len(r.External.HostVeth) > 15) {
			t.Fatalf("external %+v of lab %q", r.External, name)
		}
	})
}

func twoSubnetOpts(name string, nodes int) Options {
	o := opts(name, nodes)
	o.Backend, o.Subnets, o.External = "vxlan", 2, true
	return o
}

func TestNewSpecTwoSubnets(t *testing.T) {
	p := netip.MustParsePrefix
	s, err := NewSpec(twoSubnetOpts("flatnet", 4), p("10.250.0.0/24"), p("10.250.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	wantNodes := []Node{
		{1, "flatnet-node1", "fl-flatnet-n1", "fl-flatnet-n1", a("10.250.0.11"), 0},
		{2, "flatnet-node2", "fl-flatnet-n2", "fl-flatnet-n2", a("10.250.1.12"), 1},
		{3, "flatnet-node3", "fl-flatnet-n3", "fl-flatnet-n3", a("10.250.0.13"), 0},
		{4, "flatnet-node4", "fl-flatnet-n4", "fl-flatnet-n4", a("10.250.1.14"), 1},
	}
	cmpAddr := cmp.Comparer(func(a, b netip.Addr) bool { return a == b })
	if d := cmp.Diff(wantNodes, s.Nodes, cmpAddr); d != "" {
		t.Errorf("nodes (-want +got):\n%s", d)
	}
	wantRouter := &Router{Netns: "fl-flatnet-rt", HostVeth: "fr-flatnet", IP: a("10.250.0.254"), Bridge: "underlay2", IP2: a("10.250.1.1")}
	if d := cmp.Diff(wantRouter, s.Router, cmpAddr); d != "" {
		t.Errorf("router (-want +got):\n%s", d)
	}
	wantExt := &External{Netns: "fl-flatnet-ext", HostVeth: "fx-flatnet", IP: a("10.250.0.250")}
	if d := cmp.Diff(wantExt, s.External, cmpAddr); d != "" {
		t.Errorf("external (-want +got):\n%s", d)
	}
	if s.Underlay2 != p("10.250.1.0/24") || s.Subnets() != 2 || len(s.Underlays()) != 2 {
		t.Errorf("underlay2 %s subnets %d", s.Underlay2, s.Subnets())
	}
	// Routes: nodes reach the other subnet via the router, the host and
	// the external host reach the second subnet via it; nobody has a
	// default route.
	routes := func(rs []route) string {
		var ss []string
		for _, r := range rs {
			ss = append(ss, r.String())
		}
		return strings.Join(ss, "; ")
	}
	if got := routes(s.nodeEndpoint(s.Nodes[1]).routes); got != "10.250.0.0/24 via 10.250.1.1 dev eth0; 10.96.0.0/16 dev eth0" {
		t.Errorf("node 2 routes %v", got)
	}
	if got := routes(s.nodeEndpoint(s.Nodes[0]).routes); got != "10.250.1.0/24 via 10.250.0.254 dev eth0; 10.96.0.0/16 dev eth0" {
		t.Errorf("node 1 routes %v", got)
	}
	if got := routes(s.hostRoutes()); got != "10.250.1.0/24 via 10.250.0.254 dev fl-flatnet" {
		t.Errorf("host routes %v", got)
	}
	if got := s.externalEndpoint(); len(got.sysctls) != 0 || len(got.routes) != 1 {
		t.Errorf("external endpoint %+v", got)
	}
	// Options rebuild the same Spec.
	again, err := NewSpec(s.Options(), s.Underlays()...)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(s, again, cmpAddr, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("rebuilt from Options (-want +got):\n%s", d)
	}

	one, err := NewSpec(opts("flatnet", 2), p("10.250.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if one.Router != nil || one.External != nil || one.Underlay2.IsValid() || len(one.hostRoutes()) != 0 || len(one.nodeEndpoint(one.Nodes[1]).routes) != 1 {
		t.Errorf("one subnet: %+v", one)
	}

	// Pod CIDRs, once known, are routed via their node; a node behind the
	// router via the first node of the first underlay; a CIDR outside the
	// cluster CIDR (a stale record) not at all.
	one.PodCIDRs = map[string]netip.Prefix{one.Nodes[0].Name: p("10.244.1.0/24"), one.Nodes[1].Name: p("10.244.0.0/24"), "gone": p("10.244.9.0/24")}
	for _, wide := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.244.0.0/15"} {
		if within(p(wide), one.ClusterCIDR) {
			t.Errorf("%s counts as inside %s", wide, one.ClusterCIDR)
		}
	}
	if got := routes(one.hostRoutes()); got != "10.244.1.0/24 via 10.250.0.11 dev fl-flatnet; 10.244.0.0/24 via 10.250.0.12 dev fl-flatnet" {
		t.Errorf("host routes with pod CIDRs: %v", got)
	}
	s.PodCIDRs = map[string]netip.Prefix{s.Nodes[0].Name: p("10.244.0.0/24"), s.Nodes[1].Name: p("10.244.1.0/24"), s.Nodes[2].Name: p("192.168.0.0/24")}
	if got := routes(s.hostRoutes()); got != "10.250.1.0/24 via 10.250.0.254 dev fl-flatnet; 10.244.0.0/24 via 10.250.0.11 dev fl-flatnet; 10.244.1.0/24 via 10.250.0.11 dev fl-flatnet" {
		t.Errorf("host routes with pod CIDRs, two subnets: %v", got)
	}
}

func TestNewSpecTwoSubnetsErrors(t *testing.T) {
	p := netip.MustParsePrefix
	u, u2 := p("10.250.0.0/24"), p("10.250.1.0/24")
	cases := []struct {
		name      string
		mod       func(*Options)
		underlays []netip.Prefix
		substr    string
	}{
		{"host-gw across subnets", func(o *Options) { o.Backend = "host-gw" }, []netip.Prefix{u, u2}, "use --backend vxlan or vxlan-direct"},
		{"three subnets", func(o *Options) { o.Subnets = 3 }, []netip.Prefix{u, u2}, "--subnets 3"},
		{"one underlay for two", func(o *Options) {}, []netip.Prefix{u}, "1 underlays for 2 subnets"},
		{"same underlay twice", func(o *Options) {}, []netip.Prefix{u, u}, "overlaps"},
		{"second overlaps the pods", func(o *Options) {}, []netip.Prefix{u, p("10.244.0.0/24")}, "overlaps"},
		{"second too small", func(o *Options) {}, []netip.Prefix{u, p("10.250.1.0/25")}, "/24 or larger"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := twoSubnetOpts("flatnet", 3)
			c.mod(&o)
			_, err := NewSpec(o, c.underlays...)
			if err == nil || !strings.Contains(err.Error(), c.substr) {
				t.Fatalf("got %v, want an error containing %q", err, c.substr)
			}
		})
	}
}

func TestChooseSecondUnderlay(t *testing.T) {
	p := netip.MustParsePrefix
	if got, err := ChooseSecondUnderlay(p("10.250.0.0/24"), nil); err != nil || got != p("10.250.1.0/24") {
		t.Errorf("after the default: %s %v", got, err)
	}
	if got, err := ChooseSecondUnderlay(p("10.250.7.0/24"), []netip.Prefix{p("10.250.8.0/24")}); err != nil || got != p("10.250.9.0/24") {
		t.Errorf("skipping a taken one: %s %v", got, err)
	}
	if got, err := ChooseSecondUnderlay(p("10.250.254.0/24"), nil); err != nil || got != p("10.250.1.0/24") {
		t.Errorf("wrapping: %s %v", got, err)
	}
	if _, err := ChooseSecondUnderlay(p("10.250.3.0/24"), []netip.Prefix{p("10.250.0.0/16")}); err == nil || !strings.Contains(err.Error(), "A,B") {
		t.Errorf("all taken: %v", err)
	}
}

func TestResolveTwoSubnetsAndBackends(t *testing.T) {
	p := netip.MustParsePrefix
	req := func(o Options, changed ...string) Request {
		r := Request{Options: o, Changed: map[string]bool{}}
		for _, c := range changed {
			r.Changed[c] = true
		}
		return r
	}
	o := twoSubnetOpts("lab2", 3)
	// New: the second underlay is chosen free, after the first.
	first := DefaultUnderlay("lab2")
	s, err := resolve(req(o), nil, nil, []netip.Prefix{ChooseUnderlayMust(t, first)})
	if err != nil || s.Underlay != first || s.Underlay2 == ChooseUnderlayMust(t, first) || s.Router == nil || s.External == nil {
		t.Fatalf("new: %+v %v", s, err)
	}
	// Both given.
	o.Underlay = "10.250.40.0/24,10.250.41.0/24"
	s, err = resolve(req(o, "underlay-cidr"), nil, nil, nil)
	if err != nil || s.Underlay != p("10.250.40.0/24") || s.Underlay2 != p("10.250.41.0/24") {
		t.Fatalf("given: %+v %v", s, err)
	}
	// The host's networks and other labs' second underlays are refused.
	if _, err := resolve(req(o, "underlay-cidr"), nil, []netip.Prefix{p("10.250.41.128/25")}, nil); err == nil || !strings.Contains(err.Error(), "second underlay") {
		t.Fatalf("host overlap: %v", err)
	}
	if _, err := resolve(req(o, "underlay-cidr"), nil, nil, []netip.Prefix{p("10.250.41.0/24")}); err == nil || !strings.Contains(err.Error(), "another lab's underlay") {
		t.Fatalf("lab overlap: %v", err)
	}
	one := opts("lab2", 3)
	one.Underlay = "10.250.40.0/24,10.250.41.0/24"
	if _, err := resolve(req(one, "underlay-cidr"), nil, nil, nil); err == nil || !strings.Contains(err.Error(), "for --subnets 1") {
		t.Fatalf("two underlays for one subnet: %v", err)
	}
	o.Underlay = "10.250.40.0/24"
	o.Backend = "host-gw"
	if _, err := resolve(req(o, "backend"), nil, nil, nil); err == nil || !strings.Contains(err.Error(), "vxlan") {
		t.Fatalf("host-gw across subnets: %v", err)
	}

	// Running lab: the backend may change (agents restart), but not to
	// host-gw across subnets; the layout may not change; an external host
	// may be added, never removed.
	rec, err := NewSpec(twoSubnetOpts("lab2", 3), p("10.250.40.0/24"), p("10.250.41.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	o = opts("lab2", 3)
	o.Backend = "vxlan-direct"
	s, err = resolve(req(o, "backend"), rec, nil, nil)
	if err != nil || s.Backend != "vxlan-direct" || s.Router == nil || s.External == nil || s.Underlay2 != rec.Underlay2 {
		t.Fatalf("backend change: %+v %v", s, err)
	}
	o.Backend = "host-gw"
	if _, err := resolve(req(o, "backend"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "use --backend vxlan or vxlan-direct") {
		t.Fatalf("host-gw on a two-subnet lab: %v", err)
	}
	o.Subnets = 1
	if _, err := resolve(req(o, "subnets"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "runs with --subnets 2") {
		t.Fatalf("subnets change: %v", err)
	}
	o = opts("lab2", 3)
	o.Underlay = "10.250.40.0/24,10.250.42.0/24"
	if _, err := resolve(req(o, "underlay-cidr"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "runs with --underlay-cidr 10.250.40.0/24,10.250.41.0/24") {
		t.Fatalf("underlay change: %v", err)
	}
	o.Underlay = "10.250.40.0/24"
	if _, err := resolve(req(o, "underlay-cidr"), rec, nil, nil); err != nil {
		t.Fatalf("the first underlay named again: %v", err)
	}
	if _, err := resolve(req(o, "external"), rec, nil, nil); err == nil || !strings.Contains(err.Error(), "never removes") {
		t.Fatalf("external removed: %v", err)
	}
	plain, err := NewSpec(opts("lab2", 3), p("10.250.40.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	o = opts("lab2", 3)
	o.External = true
	if s, err := resolve(req(o, "external"), plain, nil, nil); err != nil || s.External == nil || s.Backend != "host-gw" {
		t.Fatalf("external added: %+v %v", s, err)
	}
	o.Backend = "vxlan"
	if s, err := resolve(req(o, "backend"), plain, nil, nil); err != nil || s.Backend != "vxlan" || s.External != nil {
		t.Fatalf("host-gw to vxlan: %+v %v", s, err)
	}
}

// ChooseUnderlayMust is the second underlay after first, for tests.
func ChooseUnderlayMust(t *testing.T, first netip.Prefix) netip.Prefix {
	t.Helper()
	p, err := ChooseSecondUnderlay(first, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanTwoSubnets(t *testing.T) {
	s, err := NewSpec(twoSubnetOpts("x", 2), netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("10.250.1.0/24"))
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
	all := func() Observed {
		return Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true,
			Router: true, External: true, ExternalServer: true,
			Nodes:         map[string]bool{"x-node1": true, "x-node2": true},
			Agents:        map[string]bool{"x-node1": true, "x-node2": true},
			Gateways:      map[string]bool{"x-node1": true, "x-node2": true},
			AgentBackends: map[string]string{"x-node1": "vxlan", "x-node2": "vxlan"}, AgentProxyModes: map[string]string{"x-node1": "", "x-node2": "auto"}}
	}
	cases := []struct {
		name string
		obs  func() Observed
		want string
	}{
		{"new", func() Observed { return Observed{} }, "+state dir +binaries +underlay +router +node(x-node1) +node(x-node2) +external +control plane +controller +agent(x-node1) +agent(x-node2) +gateway(x-node1) +gateway(x-node2) +ready"},
		{"running", all, "=state dir =binaries =underlay =router =node(x-node1) =node(x-node2) =external =control plane =controller =agent(x-node1) =agent(x-node2) =gateway(x-node1) =gateway(x-node2) +ready"},
		{"router rebuilt under node 2", func() Observed {
			o := all()
			o.Router, o.Nodes["x-node2"] = false, false
			o.Rewired = map[string]bool{"x-node2": true}
			return o
		}, "=state dir =binaries =underlay +router =node(x-node1) +node(x-node2) =external =control plane =controller =agent(x-node1) ragent(x-node2) =gateway(x-node1) rgateway(x-node2) +ready"},
		{"external server died", func() Observed {
			o := all()
			o.ExternalServer = false
			return o
		}, "=state dir =binaries =underlay =router =node(x-node1) =node(x-node2) +external =control plane =controller =agent(x-node1) =agent(x-node2) =gateway(x-node1) =gateway(x-node2) +ready"},
		{"external netns gone under its server", func() Observed {
			o := all()
			o.External, o.ExternalRewired = false, true
			return o
		}, "=state dir =binaries =underlay =router =node(x-node1) =node(x-node2) rexternal =control plane =controller =agent(x-node1) =agent(x-node2) =gateway(x-node1) =gateway(x-node2) +ready"},
		{"agents run another backend", func() Observed {
			o := all()
			o.AgentBackends["x-node1"] = "host-gw"
			return o
		}, "=state dir =binaries =underlay =router =node(x-node1) =node(x-node2) =external =control plane =controller ragent(x-node1) =agent(x-node2) =gateway(x-node1) =gateway(x-node2) +ready"},
		{"agents run another proxy mode", func() Observed {
			o := all()
			o.AgentProxyModes["x-node2"] = "iptables"
			return o
		}, "=state dir =binaries =underlay =router =node(x-node1) =node(x-node2) =external =control plane =controller =agent(x-node1) ragent(x-node2) =gateway(x-node1) =gateway(x-node2) +ready"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := summary(Plan(s, c.obs())); got != c.want {
				t.Errorf("plan:\n got %s\nwant %s", got, c.want)
			}
		})
	}
	for _, st := range Plan(s, func() Observed { o := all(); o.AgentBackends["x-node1"] = "host-gw"; return o }()) {
		if st.Kind == StepAgent && st.Node == "x-node1" && !strings.Contains(st.What, "vxlan; was host-gw") {
			t.Errorf("restart for the backend does not say so: %s", st.What)
		}
	}
	for _, st := range Plan(s, func() Observed { o := all(); o.AgentProxyModes["x-node2"] = "iptables"; return o }()) {
		if st.Kind == StepAgent && st.Node == "x-node2" && !strings.Contains(st.What, "proxy mode auto, was iptables") {
			t.Errorf("restart for the proxy mode does not say so: %s", st.What)
		}
	}
}

func TestExternalArgv(t *testing.T) {
	s, err := NewSpec(twoSubnetOpts("flatnet", 1), netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("10.250.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(externalArgv(s), " "), "/var/lib/flatnet/lab/flatnet/bin/flatnet netexec --http-port 8080 --udp-port 8081 --dns-port 53 --dns-zone external.test --dns-answer 10.250.0.250"; got != want {
		t.Errorf("external argv %q, want %q", got, want)
	}
	if got := strings.Join(agentArgv(s, s.Nodes[0]), " "); !strings.Contains(got, "--backend vxlan ") {
		t.Errorf("agent argv lacks the backend: %s", got)
	}
}

func TestRecordRoundTripTwoSubnets(t *testing.T) {
	s, err := NewSpec(twoSubnetOpts("rt2", 3), netip.MustParsePrefix("10.250.5.0/24"), netip.MustParsePrefix("10.250.6.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s.StateDir = filepath.Join(dir, "rt2")
	if err := saveRecord(&record{Spec: *s}); err != nil {
		t.Fatal(err)
	}
	r, err := loadRecord(dir, "rt2")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(*s, r.Spec, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
	if got := otherRanges(dir, "other"); len(got) != 3 || got[2] != s.ClusterCIDR {
		t.Errorf("other labs' ranges: %v", got)
	}
	// A record whose router names another namespace is refused.
	b, _ := os.ReadFile(s.SpecFile())
	if err := os.WriteFile(s.SpecFile(), []byte(strings.Replace(string(b), `"netns": "fl-rt2-rt"`, `"netns": "fl-other-rt"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadRecord(dir, "rt2"); err == nil || !strings.Contains(err.Error(), "do not follow") {
		t.Errorf("edited record: %v", err)
	}
}

func TestRenderManifest(t *testing.T) {
	o := opts("flatnet", 2)
	o.Runtime, o.Install, o.External = RuntimeContainerd, InstallManifest, true
	s, err := NewSpec(o, DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := renderManifest(deploy.Manifest, manifestSettings(s, "10.250.0.1", "6443"))
	if err != nil {
		t.Fatal(err)
	}
	docs := splitYAML(b)
	orig := splitYAML(deploy.Manifest)
	if len(docs) != len(orig) {
		t.Fatalf("%d documents rendered from %d", len(docs), len(orig))
	}
	var cm corev1.ConfigMap
	for _, d := range docs {
		var c corev1.ConfigMap
		if err := yaml.Unmarshal(d, &c); err == nil && c.Kind == "ConfigMap" && c.Name == "flatnet-config" {
			cm = c
		}
	}
	want := map[string]string{"cluster-cidr": "10.244.0.0/16", "proxy": "true", "dns": "true", "dns-addresses": "169.254.20.10,10.96.0.10",
		"dns-upstreams": s.External.IP.String(), "kube-apiserver-host": "10.250.0.1", "kube-apiserver-port": "6443", "backend": "host-gw",
		"cni-conflist": "flatnet"}
	for k, v := range want {
		if cm.Data[k] != v {
			t.Errorf("flatnet-config %s = %q, want %q", k, cm.Data[k], v)
		}
	}
	// A manifest without the ConfigMap is refused, not applied half set.
	if _, err := renderManifest([]byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n"), manifestSettings(s, "h", "1")); err == nil {
		t.Error("rendered a manifest without flatnet-config")
	}
	// --install manifest needs real kubelets.
	o.Runtime = RuntimeProcess
	if _, err := NewSpec(o, DefaultUnderlay("flatnet")); err == nil || !strings.Contains(err.Error(), "--runtime containerd") {
		t.Errorf("manifest on the process runtime: %v", err)
	}
}

// The agents' conflist style: flatnet for a new lab, classic on request,
// kept by a running lab unless asked, and classic for a lab recorded
// before the flag (its agents wrote the chain).
func TestCNIConflist(t *testing.T) {
	p := netip.MustParsePrefix
	s, err := NewSpec(opts("lab1", 2), p("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if s.CNIConflist != "flatnet" || s.AgentCNIConflist() != "flatnet" || s.Options().CNIConflist != "flatnet" {
		t.Errorf("new lab: %q %q", s.CNIConflist, s.AgentCNIConflist())
	}
	o := opts("lab1", 2)
	o.CNIConflist = "bridge"
	if _, err := NewSpec(o, p("10.250.9.0/24")); err == nil || !strings.Contains(err.Error(), `--cni-conflist "bridge"`) || !strings.Contains(err.Error(), "classic") {
		t.Errorf("bad --cni-conflist: %v", err)
	}
	req := func(style string, changed bool) Request {
		r := Request{Options: opts("lab1", 2), Changed: map[string]bool{"cni-conflist": changed}}
		r.CNIConflist = style
		return r
	}
	classic, err := resolve(req("classic", true), s, nil, nil)
	if err != nil || classic.AgentCNIConflist() != "classic" {
		t.Fatalf("switch to classic: %v %v", classic, err)
	}
	if again, err := resolve(req("flatnet", false), classic, nil, nil); err != nil || again.AgentCNIConflist() != "classic" {
		t.Errorf("up without the flag on a classic lab: %v %v", again, err)
	}
	if back, err := resolve(req("flatnet", true), classic, nil, nil); err != nil || back.AgentCNIConflist() != "flatnet" {
		t.Errorf("back to flatnet: %v %v", back, err)
	}
	if _, err := resolve(req("chain", true), classic, nil, nil); err == nil || !strings.Contains(err.Error(), "--cni-conflist") {
		t.Errorf("bad --cni-conflist on a running lab: %v", err)
	}

	// A record from before the flag loads, and keeps its agents' chain.
	old := *s
	old.CNIConflist = ""
	old.StateDir = filepath.Join(t.TempDir(), "lab1")
	if err := saveRecord(&record{Spec: old}); err != nil {
		t.Fatal(err)
	}
	rec, err := loadRecord(filepath.Dir(old.StateDir), "lab1")
	if err != nil {
		t.Fatalf("a record without cniConflist: %v", err)
	}
	if rec.AgentCNIConflist() != "classic" {
		t.Errorf("old record: agents' conflist %q, want classic", rec.AgentCNIConflist())
	}
	kept, err := resolve(req("flatnet", false), &rec.Spec, nil, nil)
	if err != nil || kept.AgentCNIConflist() != "classic" || kept.CNIConflist != "classic" {
		t.Errorf("up on an old lab: %v %v", kept, err)
	}
	if argv := strings.Join(agentArgv(kept, kept.Nodes[0]), " "); !strings.Contains(argv, " --cni-conflist classic --cni-bin-dir "+kept.CNIBinDir()+" ") {
		t.Errorf("agent argv: %s", argv)
	}
}

// A running agent of the other style is restarted, and the step says
// so; one from before the flag counts as classic.
func TestPlanCNIConflist(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 2), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	obs := func(styles ...string) Observed {
		return Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true,
			Nodes:             map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
			Agents:            map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
			Gateways:          map[string]bool{"flatnet-node1": true, "flatnet-node2": true},
			AgentCNIConflists: map[string]string{"flatnet-node1": styles[0], "flatnet-node2": styles[1]}}
	}
	agents := func(s *Spec, o Observed) string {
		var out []string
		for _, st := range Plan(s, o) {
			if st.Kind == StepAgent {
				mark := "+"
				if st.Present {
					mark = "="
				} else if st.Restart {
					mark = "r"
				}
				out = append(out, mark+st.What)
			}
		}
		return strings.Join(out, "\n")
	}
	for _, c := range []struct {
		style  string
		agents []string
		want   string
	}{
		{"flatnet", []string{"flatnet", "flatnet"}, "=flatnet agent on flatnet-node1 (lab runtime, host-gw)\n=flatnet agent on flatnet-node2 (lab runtime, host-gw)"},
		{"flatnet", []string{"flatnet", "classic"}, "=flatnet agent on flatnet-node1 (lab runtime, host-gw)\nrflatnet agent on flatnet-node2 (lab runtime, host-gw); CNI conflist flatnet, was classic"},
		{"flatnet", []string{"", "flatnet"}, "rflatnet agent on flatnet-node1 (lab runtime, host-gw); CNI conflist flatnet, was classic\n=flatnet agent on flatnet-node2 (lab runtime, host-gw)"},
		{"classic", []string{"flatnet", "flatnet"}, "rflatnet agent on flatnet-node1 (lab runtime, host-gw); CNI conflist classic, was flatnet\nrflatnet agent on flatnet-node2 (lab runtime, host-gw); CNI conflist classic, was flatnet"},
		{"classic", []string{"", "classic"}, "=flatnet agent on flatnet-node1 (lab runtime, host-gw)\n=flatnet agent on flatnet-node2 (lab runtime, host-gw)"},
	} {
		sc := *s
		sc.CNIConflist = c.style
		if got := agents(&sc, obs(c.agents...)); got != c.want {
			t.Errorf("lab %s, agents %q:\n got %s\nwant %s", c.style, c.agents, got, c.want)
		}
	}
}

// The lab's bin dir holds the flatnet command; its CNI bin dir
// flatnet-cni under every plugin name, flatnet included, and that is the
// agents' --cni-bin-dir and real nodes' /opt/cni/bin.
func TestBinDirs(t *testing.T) {
	s, err := NewSpec(Options{Name: "b", StateRoot: t.TempDir(), Nodes: 1, Backend: "host-gw", ClusterCIDR: DefaultClusterCIDR,
		ServiceCIDR: DefaultServiceCIDR, NodeCIDRMaskSize: 24}, DefaultUnderlay("b"))
	if err != nil {
		t.Fatal(err)
	}
	if s.CNIBinDir() == s.BinDir() {
		t.Fatalf("one bin dir for both: %s", s.BinDir())
	}
	src := t.TempDir()
	flatnet, cni := filepath.Join(src, "flatnet"), filepath.Join(src, "flatnet-cni")
	for _, f := range []string{flatnet, cni} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\necho "+filepath.Base(f)+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if binariesPresent(s) {
		t.Fatal("binaries present before install")
	}
	if out, err := binariesOutdated(s, flatnet, cni); out || err != nil {
		t.Fatalf("no copies yet: outdated %v, %v; want false: nothing runs them", out, err)
	}
	if err := installBinaries(s, flatnet, cni); err != nil {
		t.Fatal(err)
	}
	if !binariesPresent(s) {
		t.Fatal("binaries missing after install")
	}
	if err := installBinaries(s, flatnet, cni); err != nil {
		t.Fatalf("second install: %v", err)
	}
	if out, err := binariesOutdated(s, flatnet, cni); out || err != nil {
		t.Fatalf("copies of this build: outdated %v, %v", out, err)
	}
	// A new build of either (same size, other bytes; then longer) makes
	// the copies outdated, and the next install replaces them.
	for _, f := range []string{cni, flatnet} {
		for _, text := range []string{"#!/bin/sh\necho " + filepath.Base(f) + "\n", "#!/bin/sh\necho " + filepath.Base(f) + "-v2\n"} {
			old, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			text = strings.Replace(text, "echo", "ECHO", 1)
			if err := os.WriteFile(f, []byte(text), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := binariesOutdated(s, flatnet, cni); !out || err != nil {
				t.Fatalf("%s changed from %q to %q: outdated %v, %v; want true", filepath.Base(f), old, text, out, err)
			}
			if err := installBinaries(s, flatnet, cni); err != nil {
				t.Fatal(err)
			}
			if out, err := binariesOutdated(s, flatnet, cni); out || err != nil {
				t.Fatalf("after installing the new %s: outdated %v, %v", filepath.Base(f), out, err)
			}
			if err := os.WriteFile(f, old, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := installBinaries(s, flatnet, cni); err != nil {
				t.Fatal(err)
			}
		}
	}
	ls := func(dir string) map[string]string {
		out := map[string]string{}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if l, err := os.Readlink(p); err == nil {
				out[e.Name()] = "-> " + l
			} else if b, err := os.ReadFile(p); err == nil {
				out[e.Name()] = strings.TrimSpace(strings.TrimPrefix(string(b), "#!/bin/sh\necho "))
			}
		}
		return out
	}
	if d := cmp.Diff(map[string]string{"flatnet": "flatnet"}, ls(s.BinDir())); d != "" {
		t.Errorf("bin dir (-want +got):\n%s", d)
	}
	want := map[string]string{"flatnet-cni": "flatnet-cni"}
	for _, n := range []string{"bridge", "host-local", "loopback", "ptp", "macvlan", "bandwidth", "portmap", "flatnet", "flatnet-policy"} {
		want[n] = "-> flatnet-cni"
	}
	if d := cmp.Diff(want, ls(s.CNIBinDir())); d != "" {
		t.Errorf("CNI bin dir (-want +got):\n%s", d)
	}
	// A lab from before the CNI bin dir (plugins linked in the bin dir)
	// is missing it.
	if err := os.RemoveAll(s.CNIBinDir()); err != nil {
		t.Fatal(err)
	}
	if binariesPresent(s) {
		t.Error("binaries present without the CNI bin dir")
	}
	if a := strings.Join(agentArgv(s, s.Nodes[0]), " "); !strings.Contains(a, " --cni-bin-dir "+s.CNIBinDir()+" ") || !strings.Contains(a, " --pod-path "+s.BinDir()+" ") {
		t.Errorf("agent argv: %s", a)
	}
	if n := containerdNode(s, s.Nodes[0], "", "", nil); n.CNIBinDir != s.CNIBinDir() {
		t.Errorf("real node's CNI bin dir %s, want %s", n.CNIBinDir, s.CNIBinDir())
	}
	var plan strings.Builder
	for _, st := range Plan(s, Observed{}) {
		if st.Kind == StepBin {
			plan.WriteString(st.What)
		}
	}
	if !strings.Contains(plan.String(), s.BinDir()+" (flatnet), "+s.CNIBinDir()+" (flatnet-cni as ") || !strings.Contains(plan.String(), ", flatnet, flatnet-policy)") {
		t.Errorf("binaries step: %s", plan.String())
	}
}

// The DaemonSet's agent command takes every $(VAR) from its env, every
// env var from a key flatnet-config has (or one marked optional, which
// no argument uses: an unresolved $(VAR) would reach the agent as it
// is), and its install-cni links every plugin name the lab does.
func TestManifestAgentWiring(t *testing.T) {
	var cm corev1.ConfigMap
	var ds appsv1.DaemonSet
	for _, d := range splitYAML(deploy.Manifest) {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(d, &meta); err != nil {
			t.Fatal(err)
		}
		switch {
		case meta.Kind == "ConfigMap" && meta.Metadata.Name == "flatnet-config":
			if err := yaml.Unmarshal(d, &cm); err != nil {
				t.Fatal(err)
			}
		case meta.Kind == "DaemonSet" && meta.Metadata.Name == "flatnet-agent":
			if err := yaml.Unmarshal(d, &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) == 0 || len(spec.InitContainers) == 0 || cm.Data == nil {
		t.Fatalf("no agent DaemonSet or flatnet-config in deploy/flatnet.yaml")
	}
	agent := spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range agent.Env {
		env[e.Name] = e
		ref := e.ValueFrom
		if ref == nil || ref.ConfigMapKeyRef == nil || ref.ConfigMapKeyRef.Name != "flatnet-config" {
			continue
		}
		if _, ok := cm.Data[ref.ConfigMapKeyRef.Key]; !ok && (ref.ConfigMapKeyRef.Optional == nil || !*ref.ConfigMapKeyRef.Optional) {
			t.Errorf("env %s: flatnet-config has no key %s", e.Name, ref.ConfigMapKeyRef.Key)
		}
	}
	varRE := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, a := range agent.Command {
		for _, m := range varRE.FindAllStringSubmatch(a, -1) {
			e, ok := env[m[1]]
			if !ok {
				t.Errorf("argument %s: no env var %s", a, m[1])
			} else if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil && r.ConfigMapKeyRef.Optional != nil && *r.ConfigMapKeyRef.Optional {
				t.Errorf("argument %s: env var %s is optional", a, m[1])
			}
		}
	}
	if !slices.Contains(agent.Command, "--cni-conflist=$(CNI_CONFLIST)") || cm.Data["cni-conflist"] != "flatnet" {
		t.Errorf("the agent's --cni-conflist is not flatnet-config's cni-conflist (%q): %v", cm.Data["cni-conflist"], agent.Command)
	}
	script := strings.Join(spec.InitContainers[0].Command, " ")
	for _, n := range cniPluginNames {
		if !regexp.MustCompile(`for p in [^;]*\b` + regexp.QuoteMeta(n) + `( |;)`).MatchString(script) {
			t.Errorf("install-cni does not link %s: %s", n, script)
		}
	}
}

// --cni-bin-dir: none for a new lab; a dir is put before the lab's own in
// the agents' --cni-bin-dir, kept by a running lab unless asked, "" goes
// back; a relative path, or one on a containerd lab, is refused.
func TestCNIPluginDir(t *testing.T) {
	p := netip.MustParsePrefix
	s, err := NewSpec(opts("lab1", 2), p("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if s.CNIPluginDir != "" || s.AgentCNIBinDir() != s.CNIBinDir() {
		t.Errorf("new lab: %q %q", s.CNIPluginDir, s.AgentCNIBinDir())
	}
	for dir, want := range map[string]string{"ref": "absolute path", "/a:/b": "absolute path without"} {
		o := opts("lab1", 2)
		o.CNIPluginDir = dir
		if _, err := NewSpec(o, p("10.250.9.0/24")); err == nil || !strings.Contains(err.Error(), "--cni-bin-dir") || !strings.Contains(err.Error(), want) {
			t.Errorf("--cni-bin-dir %q: %v", dir, err)
		}
	}
	o := opts("lab1", 2)
	o.CNIPluginDir, o.Runtime = "/opt/cni/bin", RuntimeContainerd
	if _, err := NewSpec(o, p("10.250.9.0/24")); err == nil || !strings.Contains(err.Error(), "--runtime process") {
		t.Errorf("--cni-bin-dir on containerd: %v", err)
	}

	req := func(dir string, changed bool) Request {
		r := Request{Options: opts("lab1", 2), Changed: map[string]bool{"cni-bin-dir": changed}}
		r.CNIPluginDir = dir
		return r
	}
	ref, err := resolve(req("/opt/ref-cni/", true), s, nil, nil)
	if err != nil || ref.CNIPluginDir != "/opt/ref-cni" || ref.AgentCNIBinDir() != "/opt/ref-cni:"+s.CNIBinDir() {
		t.Fatalf("switch to /opt/ref-cni: %v %v", ref, err)
	}
	if argv := strings.Join(agentArgv(ref, ref.Nodes[0]), " "); !strings.Contains(argv, " --cni-bin-dir /opt/ref-cni:"+s.CNIBinDir()+" ") {
		t.Errorf("agent argv: %s", argv)
	}
	if again, err := resolve(req("", false), ref, nil, nil); err != nil || again.CNIPluginDir != "/opt/ref-cni" {
		t.Errorf("up without the flag: %v %v", again, err)
	}
	if back, err := resolve(req("", true), ref, nil, nil); err != nil || back.AgentCNIBinDir() != s.CNIBinDir() {
		t.Errorf("back to the lab's own: %v %v", back, err)
	}
	// Recorded and read back.
	ref.StateDir = filepath.Join(t.TempDir(), "lab1")
	if err := saveRecord(&record{Spec: *ref}); err != nil {
		t.Fatal(err)
	}
	if rec, err := loadRecord(filepath.Dir(ref.StateDir), "lab1"); err != nil || rec.CNIPluginDir != "/opt/ref-cni" {
		t.Errorf("record: %v %v", rec, err)
	}
}

// up refuses a --cni-bin-dir that is missing, not a directory, or lacks
// (as executables) a plugin of the conflist; flatnet-policy is the lab's.
func TestCheckCNIPluginDir(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"bridge", "host-local", "bandwidth"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "portmap"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := NewSpec(opts("lab1", 1), netip.MustParsePrefix("10.250.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkCNIPluginDir(s); err != nil {
		t.Errorf("no --cni-bin-dir: %v", err)
	}
	for _, c := range []struct{ dir, conflist, want string }{
		{filepath.Join(dir, "none"), "classic", "no such file"},
		{filepath.Join(dir, "bridge"), "classic", "not a directory"},
		{dir, "classic", "has no executable portmap, which the classic conflist runs"},
		{dir, "flatnet", "has no executable flatnet, which the flatnet conflist runs"},
	} {
		s.CNIPluginDir, s.CNIConflist = c.dir, c.conflist
		if err := checkCNIPluginDir(s); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `--cni-bin-dir ""`) {
			t.Errorf("%s (%s): %v, want %q", c.dir, c.conflist, err, c.want)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "portmap"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.CNIPluginDir, s.CNIConflist = dir, "classic"
	if err := checkCNIPluginDir(s); err != nil {
		t.Errorf("a dir with the chain: %v", err)
	}
}

// A running agent with other plugins is restarted, and the step says so.
func TestPlanCNIPluginDir(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 1), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	ref := *s
	ref.CNIPluginDir = "/opt/ref-cni"
	obs := func(binDir string) Observed {
		return Observed{StateDir: true, Bin: true, Underlay: true, ControlPlane: true, Controller: true,
			Nodes: map[string]bool{"flatnet-node1": true}, Agents: map[string]bool{"flatnet-node1": true},
			Gateways: map[string]bool{"flatnet-node1": true}, AgentCNIBinDirs: map[string]string{"flatnet-node1": binDir}}
	}
	for _, c := range []struct {
		s       *Spec
		running string
		want    string
	}{
		{s, s.CNIBinDir(), "present"},
		{&ref, ref.AgentCNIBinDir(), "present"},
		{&ref, s.CNIBinDir(), "restart; CNI plugins from /opt/ref-cni:" + s.CNIBinDir() + ", was " + s.CNIBinDir()},
		{s, ref.AgentCNIBinDir(), "restart; CNI plugins from " + s.CNIBinDir() + ", was /opt/ref-cni:" + s.CNIBinDir()},
	} {
		for _, st := range Plan(c.s, obs(c.running)) {
			if st.Kind != StepAgent {
				continue
			}
			got := "present"
			if st.Restart {
				got = "restart" + strings.TrimPrefix(st.What, "flatnet agent on flatnet-node1 (lab runtime, host-gw)")
			} else if !st.Present {
				got = "start"
			}
			if got != c.want {
				t.Errorf("lab %q, agent with %q: %s, want %s", c.s.AgentCNIBinDir(), c.running, got, c.want)
			}
		}
	}
}
