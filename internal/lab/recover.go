package lab

// Recovering from state files cut short. lab.json is written atomically,
// but a file can still come back empty or truncated (a crash on a
// filesystem that lost the rename's data, a full disk, a hand edit). Such a
// file must not stop `lab up` or make it build a second lab over the
// first one: the kernel objects and the daemons of the lab still say what
// it was started with. So up reports the file by its path and rebuilds
// the Spec from what runs (runningLab: the bridge's and the router's
// networks, the node namespaces, the external host, the flags of the
// daemons found by their command lines),
// filling only what nothing running tells from this up's options; then it
// carries on as for a recorded lab. Pid files cut short are reported the
// same way; proc.Start adopts a daemon still running with the same command
// line instead of starting a second one.

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/proc"
)

// ErrBadRecord is wrapped when lab.json exists but cannot be used (empty,
// truncated, or not this lab's).
var ErrBadRecord = errors.New("unusable lab record")

// runningLab is what the kernel and the daemons of a lab say about the
// options it runs with; zero fields are unknown.
type runningLab struct {
	underlays   []netip.Prefix // the bridge's network, the router's second
	nodes       int            // the highest node namespace index
	external    bool           // its namespace exists
	backend     string         // an agent's --backend
	cniConflist string         // an agent's --cni-conflist
	cniPlugins  string         // what an agent's --cni-bin-dir puts before the lab's
	clusterCIDR string         // the controller's or an agent's --cluster-cidr
	nodeMask    int            // the controller's --node-cidr-mask-size
	serviceCIDR string         // kube-apiserver's --service-cluster-ip-range
	lbPool      string         // the controller's --load-balancer-ip-pool range
	k8sBinDir   string         // where the running kube-apiserver is
	runtime     string         // RuntimeContainerd: real nodes run
}

func (r runningLab) String() string {
	parts := []string{fmt.Sprintf("%d nodes", r.nodes)}
	for _, u := range r.underlays {
		parts = append(parts, "underlay "+u.String())
	}
	add := func(what, v string) {
		if v != "" {
			parts = append(parts, what+" "+v)
		}
	}
	add("backend", r.backend)
	add("CNI conflist", r.cniConflist)
	add("CNI plugins from", r.cniPlugins)
	add("cluster CIDR", r.clusterCIDR)
	add("service CIDR", r.serviceCIDR)
	add("load-balancer IPs", r.lbPool)
	add("runtime", r.runtime)
	if r.external {
		parts = append(parts, "external host")
	}
	return strings.Join(parts, ", ")
}

// recoverSpec rebuilds the Spec of a lab whose lab.json is unusable from
// r and, for what r does not know, req's options. Nil when nothing of
// the lab runs in the kernel (no bridge): up then makes it as new. It
// is pure.
func recoverSpec(req Request, r runningLab) (*Spec, error) {
	if len(r.underlays) == 0 {
		return nil, nil
	}
	o := req.Options
	var us []string
	for _, u := range r.underlays {
		us = append(us, u.String())
	}
	o.Underlay, o.Subnets = strings.Join(us, ","), len(r.underlays)
	if r.nodes > 0 {
		o.Nodes = r.nodes
	}
	o.External = r.external
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&o.Backend, r.backend)
	set(&o.CNIConflist, r.cniConflist)
	set(&o.CNIPluginDir, r.cniPlugins)
	set(&o.Runtime, r.runtime)
	set(&o.ClusterCIDR, r.clusterCIDR)
	set(&o.ServiceCIDR, r.serviceCIDR)
	if r.nodeMask > 0 {
		o.NodeCIDRMaskSize = r.nodeMask
	}
	if r.lbPool != "" {
		p, err := lbPoolOfRange(r.lbPool)
		if err != nil {
			return nil, err
		}
		o.LBPool = p.String()
	}
	s, err := NewSpec(o, r.underlays...)
	if err != nil {
		return nil, fmt.Errorf("rebuilding lab %s from what runs (%s): %w", o.Name, r, err)
	}
	return s, nil
}

// lbPoolOfRange is the LBPool whose LoadBalancerPool is v ("A-B").
func lbPoolOfRange(v string) (netip.Prefix, error) {
	a, _, _ := strings.Cut(v, "-")
	first, err := netip.ParseAddr(a)
	if err == nil && first.Is4() {
		for bits := 30; bits >= 8; bits-- {
			s := Spec{LBPool: netip.PrefixFrom(first.Prev(), bits)}
			if s.LBPool.Masked() == s.LBPool && s.LoadBalancerPool() == v {
				return s.LBPool, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("load-balancer pool %q is not the lower half of a network", v)
}

// readRunningLab reads what runs of lab name under root.
func readRunningLab(k kernel, root, name string) (runningLab, error) {
	var r runningLab
	rt := NetnsPath(RouterNetns(name))
	qs := map[string]*query{"": {links: []string{BridgeName(name)}}}
	routerUp := fileExists(rt)
	if routerUp {
		qs[rt] = &query{links: []string{router2Bridge}}
	}
	v, err := k.io.read(qs)
	if err != nil {
		return r, err
	}
	network := func(ns, link string) {
		if n := v[ns]; n != nil {
			if l, ok := n.links[link]; ok && len(l.addrs) > 0 {
				r.underlays = append(r.underlays, l.addrs[0].Masked())
			}
		}
	}
	network("", BridgeName(name))
	if len(r.underlays) == 1 && routerUp {
		network(rt, router2Bridge)
	}
	stateDir := filepath.Join(root, name)
	for _, n := range discoverNodes(&Spec{Name: name}) {
		r.nodes = max(r.nodes, n.Index)
		// A real node's runtime dir (as down finds them), even with no
		// agent running to tell.
		if fileExists((&Spec{StateDir: stateDir}).ContainerdDir(n)) {
			r.runtime = RuntimeContainerd
		}
	}
	r.external = fileExists(NetnsPath(ExternalNetns(name)))

	// The daemons are found by their command lines, not their pid files:
	// those may be what was cut short.
	for _, pid := range proc.Scan(func(pid int) bool { return daemonOf(pid, stateDir) != nil }) {
		if argv := daemonOf(pid, stateDir); argv != nil {
			r.addDaemon(stateDir, argv)
		}
	}
	return r, nil
}

// addDaemon notes what the command line of one of the lab's processes
// says about its options.
func (r *runningLab) addDaemon(stateDir string, argv []string) {
	flatnet := filepath.Join(stateDir, "bin", "flatnet")
	switch {
	case len(argv) > 1 && argv[0] == flatnet && argv[1] == "agent":
		r.backend = cmp.Or(r.backend, flagIn(argv, "--backend"))
		r.cniConflist = cmp.Or(r.cniConflist, flagIn(argv, "--cni-conflist"))
		if dirs := filepath.SplitList(flagIn(argv, "--cni-bin-dir")); len(dirs) == 2 && dirs[1] == filepath.Join(stateDir, "cni-bin") {
			r.cniPlugins = cmp.Or(r.cniPlugins, dirs[0])
		}
		// Only the process runtime's agents are their node's kubelet.
		if !slices.Contains(argv, "--lab-runtime") {
			r.runtime = RuntimeContainerd
		}
		r.clusterCIDR = cmp.Or(r.clusterCIDR, flagIn(argv, "--cluster-cidr"))
	case len(argv) > 1 && argv[0] == flatnet && argv[1] == "controller":
		r.clusterCIDR = flagIn(argv, "--cluster-cidr")
		r.nodeMask, _ = strconv.Atoi(flagIn(argv, "--node-cidr-mask-size"))
		r.lbPool = flagIn(argv, "--load-balancer-ip-pool")
	case len(argv) > 0 && filepath.Base(argv[0]) == "kube-apiserver":
		r.serviceCIDR = flagIn(argv, "--service-cluster-ip-range")
		r.k8sBinDir = filepath.Dir(argv[0])
	}
}

// loadOrRecover returns the recorded Spec of req's lab and where its
// upstream binaries are: from lab.json, or, when that is unusable,
// rebuilt by recoverSpec from what readRunning finds (reported on out).
// Nil for a lab that has no record and nothing running.
func loadOrRecover(req Request, readRunning func() (runningLab, error), out io.Writer) (*Spec, string, error) {
	rec, err := loadRecord(req.StateRoot, req.Name)
	switch {
	case err == nil:
		return &rec.Spec, rec.K8sBinDir, nil
	case errors.Is(err, ErrNoLab):
		return nil, "", nil
	case !errors.Is(err, ErrBadRecord):
		return nil, "", err
	}
	r, rerr := readRunning()
	if rerr != nil {
		return nil, "", errors.Join(err, rerr)
	}
	s, rerr := recoverSpec(req, r)
	if rerr != nil {
		return nil, "", errors.Join(err, rerr)
	}
	fmt.Fprintf(out, "warning: %v\n", err)
	if s == nil {
		fmt.Fprintf(out, "lab %s: nothing of it runs; making it from this up's options\n", req.Name)
	} else {
		fmt.Fprintf(out, "lab %s: rebuilding %s from what runs (%s)\n", req.Name, specFile(req.StateRoot, req.Name), r)
	}
	return s, r.k8sBinDir, nil
}

// reportBadPIDFiles says which pid files in the state dir name no
// process (empty or cut short): their daemons count as not running, and
// proc.Start adopts one that still runs.
func reportBadPIDFiles(stateDir string, out io.Writer) {
	for _, name := range pidFiles(stateDir, "") {
		path := proc.PIDFile(stateDir, name)
		if pid, _ := proc.Running(stateDir, name); pid == 0 && fileExists(path) {
			b, _ := os.ReadFile(path)
			fmt.Fprintf(out, "warning: pid file %s is empty or cut short (%d bytes): %s counts as not running; "+
				"a process still running its command line is adopted\n", path, len(b), name)
		}
	}
}
