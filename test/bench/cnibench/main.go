// Command cnibench times the CNI plugin chain bridge(+host-local, ipMasq)
// -> bandwidth -> portmap through libcni, for the reference plugins and
// for flatnet-cni, alternating the two sets pod by pod in one run.
//
// Isolation: everything "host-side" happens in a bench host netns that
// cnibench creates and deletes; plugins are exec'd by libcni from a thread
// locked into that netns (netns.Do), so they inherit it. Each pod gets a
// fresh container netns, removed after its DEL. Each set has its own
// host-local dataDir and libcni cache dir. The machine's root namespace is
// only read (route check for the subnet, before/after snapshot).
//
// Run it through `make bench-cni` (hack/bench-cni.sh), which builds both
// plugin sets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/hostroutes"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
)

const netName = "fnbench"

type options struct {
	refDir, oursDir       string
	refVersion, oursVer   string
	pods, warmup, tracing int
	hostRules             int
	subnet                string
	cniVersion            string
	jsonOut               string
	updateDoc             string
	prefix                string
	workdir               string
	only                  string
	verify, verbose       bool
	floors                bool
	opTimeout             time.Duration
}

// Failure is one failed step of one pod.
type Failure struct {
	Pod     int    `json:"pod"`
	Verb    string `json:"verb"` // ADD, DEL, VERIFY, SETUP, LEAK
	Plugin  string `json:"plugin,omitempty"`
	Code    uint   `json:"code,omitempty"`
	Msg     string `json:"msg"`
	Cleanup bool   `json:"cleanup,omitempty"` // the DEL a runtime sends after a failed ADD
}

type set struct {
	name, version, binDir string
	cacheDir, dataDir     string
	conf                  []byte
	list                  *libcni.NetworkConfigList
	cni                   *libcni.CNIConfig
	exec                  *benchExec
	add, del, total       []time.Duration
	addRest, delRest      []time.Duration // op time outside plugin processes
	failures              []Failure
	pods, okPods          int
}

type bench struct {
	o            options
	subnet       netip.Prefix
	bridge       string
	hostNS       string // name
	hostPath     string
	sets         []*set
	podSeq       int
	rootSnap     snapshot
	load0        string // load average when the run started
	floorResults []Floor
	notes        []string
	tempWork     bool          // workdir was created here and is removed at the end
	seen         map[*set]bool // sets that ran their first pod (which may create persistent chains)
}

func main() { os.Exit(run()) }

func run() int {
	var o options
	flag.StringVar(&o.refDir, "ref", "", "directory with the reference plugins (CNI_PATH of the ref set)")
	flag.StringVar(&o.oursDir, "ours", "", "directory with flatnet-cni installed under the plugin names (`make install-cni DESTDIR=...`)")
	flag.StringVar(&o.refVersion, "ref-version", "", "label for the reference set")
	flag.StringVar(&o.oursVer, "ours-version", "", "label for our set")
	flag.IntVar(&o.pods, "pods", 30, "measured pods per set")
	flag.IntVar(&o.warmup, "warmup", 2, "warm-up pods per set, not counted")
	flag.IntVar(&o.tracing, "trace-pods", 1, "pods per set run under strace afterwards to count processes, netlink sends and sysctls (0: off)")
	flag.IntVar(&o.hostRules, "host-rules", 0, "preload this many iptables nat rules into the bench host netns, like kube-proxy's on a busy node (0: an empty ruleset)")
	flag.StringVar(&o.subnet, "subnet", "", "IPv4 pod range (default: the first free 10.2xx.0.0/24)")
	flag.StringVar(&o.cniVersion, "cni-version", "1.0.0", "cniVersion of the conflist")
	flag.StringVar(&o.jsonOut, "json", "", "also write results as JSON to this file (- for stdout)")
	flag.StringVar(&o.updateDoc, "update-doc", "", "rewrite the final-run section of this markdown file (docs/benchmarks.md) with the figures")
	flag.StringVar(&o.prefix, "prefix", "", "name prefix for namespaces and the bridge (default fnb + random hex)")
	flag.StringVar(&o.workdir, "workdir", "", "scratch dir for dataDirs, caches and traces (default: a new temp dir)")
	flag.StringVar(&o.only, "only", "", "run only this set (ref, ours: the classic conflist through flatnet-cni, or flatnet: the flatnet plugin type)")
	flag.BoolVar(&o.verify, "verify", true, "after each ADD check (untimed) that the pod really has its address, shaping qdiscs and port mapping")
	flag.BoolVar(&o.floors, "floors", true, "after the pods, measure the building blocks (process start, nft/iptables exec, link create/delete, conntrack dump) in the bench host netns")
	flag.BoolVar(&o.verbose, "v", false, "print the conflist and every command the traced plugins ran")
	flag.DurationVar(&o.opTimeout, "op-timeout", 2*time.Minute, "timeout for one ADD or DEL")
	flag.Parse()
	if err := o.check(); err != nil {
		fmt.Fprintf(os.Stderr, "cnibench: %v\n", err)
		return 2
	}
	// A closed stdout (| head) must not kill us before cleanup: with SIGPIPE
	// caught, writes just fail.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		sig := <-sigs
		signal.Reset(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP) // a second one kills us; hack/bench-cni.sh still removes the namespaces
		fmt.Fprintf(os.Stderr, "cnibench: %v: finishing the current pod and cleaning up\n", sig)
		cancel()
	}()

	b := &bench{o: o, seen: map[*set]bool{}}
	code := 0
	err := b.setup()
	defer func() {
		if cerr := b.cleanup(); cerr != nil {
			fmt.Fprintf(os.Stderr, "cnibench: cleanup: %v\n", cerr)
		}
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cnibench: setup: %v\n", err)
		return 2
	}
	if o.verbose {
		fmt.Printf("conflist (%s set; ours differs only in dataDir; flatnet is the same options as one plugin of the flatnet type):\n%s\n\n", b.sets[0].name, b.sets[0].conf)
	}
	b.loop(ctx)
	if ctx.Err() == nil && o.tracing > 0 {
		b.trace(ctx)
	}
	if ctx.Err() == nil && o.floors {
		b.floorResults = b.floors()
	}
	if ctx.Err() != nil {
		b.notes = append(b.notes, "interrupted: partial run, figures cover only the pods done")
	}
	b.finalChecks()
	res := b.results()
	printReport(os.Stdout, res, o.verbose)
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, res); err != nil {
			fmt.Fprintf(os.Stderr, "cnibench: %v\n", err)
			code = 2
		}
	}
	if o.updateDoc != "" && ctx.Err() == nil {
		if err := updateDoc(o.updateDoc, res); err != nil {
			fmt.Fprintf(os.Stderr, "cnibench: -update-doc: %v\n", err)
			code = 2
		} else {
			fmt.Printf("\nupdated the final-run section of %s\n", o.updateDoc)
		}
	}
	for _, s := range b.sets {
		if len(s.failures) > 0 {
			code = max(code, 1)
		}
	}
	if ctx.Err() != nil {
		code = max(code, 1)
	}
	return code
}

func (o *options) check() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, bridges, nftables); run `sudo make bench-cni`")
	}
	if o.pods < 1 || o.warmup < 0 || o.tracing < 0 {
		return errors.New("-pods must be >= 1, -warmup and -trace-pods >= 0")
	}
	if o.only != "" && o.only != "ref" && o.only != "ours" && o.only != "flatnet" {
		return fmt.Errorf("-only %q: want ref, ours or flatnet", o.only)
	}
	for _, d := range []struct{ flag, dir string }{{"-ref", o.refDir}, {"-ours", o.oursDir}} {
		if d.dir == "" {
			if o.only == "" || "-"+o.only == d.flag || (o.only == "flatnet" && d.flag == "-ours") {
				return fmt.Errorf("%s is required (a directory with bridge, host-local, bandwidth and portmap)", d.flag)
			}
			continue
		}
		plugins := []string{"bridge", "host-local", "bandwidth", "portmap"}
		if d.flag == "-ours" {
			plugins = append(plugins, "flatnet")
		}
		for _, p := range plugins {
			if _, err := os.Stat(filepath.Join(d.dir, p)); err != nil {
				return fmt.Errorf("%s %s: no %s plugin: %w", d.flag, d.dir, p, err)
			}
		}
	}
	if o.prefix == "" {
		o.prefix = "fnb" + randHex(3)
	}
	if len(o.prefix) > 12 || strings.ContainsAny(o.prefix, "/ ") {
		return fmt.Errorf("-prefix %q: at most 12 characters, no slash or space (names must fit IFNAMSIZ)", o.prefix)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	f, err := os.Open("/dev/urandom")
	if err == nil {
		_, _ = f.Read(b)
		f.Close()
	}
	return fmt.Sprintf("%x", b)
}

// pickSubnet returns the requested range, or the first 10.2xx.0.0/24 that
// the machine's root namespace does not use. This runs before any
// namespace switch, so it reads the root namespace's routes.
func pickSubnet(want string) (netip.Prefix, error) {
	if want != "" {
		p, err := netip.ParsePrefix(want)
		if err != nil {
			return p, fmt.Errorf("-subnet: %w", err)
		}
		return p.Masked(), hostroutes.EnsureFree([]netip.Prefix{p})
	}
	for i := 200; i < 255; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 24)
		if hostroutes.EnsureFree([]netip.Prefix{p}) == nil {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free 10.200-254.0.0/24 range on this machine; pass -subnet")
}

func (b *bench) setup() error {
	o := b.o
	var err error
	if b.subnet, err = pickSubnet(o.subnet); err != nil {
		return err
	}
	b.load0 = loadavg()
	if b.rootSnap, err = takeSnapshot(o.prefix); err != nil {
		return fmt.Errorf("reading the root namespace: %w", err)
	}
	if o.workdir == "" {
		if o.workdir, err = os.MkdirTemp("", "cnibench-"); err != nil {
			return err
		}
		b.o.workdir = o.workdir
		b.tempWork = true
	}
	b.bridge = o.prefix + "br"
	b.hostNS = o.prefix + "h"
	if b.hostPath, err = netns.Create(b.hostNS); err != nil {
		b.hostNS = ""
		return fmt.Errorf("creating bench host netns: %w", err)
	}
	if err := netns.Do(b.hostPath, func() error {
		lo, err := netlinkx.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		return fmt.Errorf("lo up in %s: %w", b.hostNS, err)
	}
	if o.hostRules > 0 {
		if err := b.inHost(func() error { return preloadRules(o.hostRules) }); err != nil {
			return fmt.Errorf("preloading %d rules into %s: %w", o.hostRules, b.hostNS, err)
		}
	}
	type def struct {
		name, dir, version string
		flatnet            bool
	}
	// ours runs the classic three-plugin conflist; flatnet the same
	// binary as one plugin of the flatnet type.
	defs := []def{{"ref", o.refDir, o.refVersion, false}, {"ours", o.oursDir, o.oursVer, false}, {"flatnet", o.oursDir, o.oursVer, true}}
	for _, d := range defs {
		if o.only != "" && o.only != d.name {
			continue
		}
		abs, err := filepath.Abs(d.dir)
		if err != nil {
			return err
		}
		s := &set{name: d.name, version: d.version, binDir: abs,
			cacheDir: filepath.Join(o.workdir, d.name, "cache"),
			dataDir:  filepath.Join(o.workdir, d.name, "ipam")}
		for _, dir := range []string{s.cacheDir, s.dataDir} {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
		}
		s.conf, err = Conflist(ConfOptions{CNIVersion: o.cniVersion, NetName: netName, Bridge: b.bridge, Subnet: b.subnet, DataDir: s.dataDir, Flatnet: d.flatnet})
		if err != nil {
			return err
		}
		if s.list, err = libcni.ConfListFromBytes(s.conf); err != nil {
			return fmt.Errorf("%s conflist: %w", d.name, err)
		}
		s.exec = newBenchExec()
		s.cni = libcni.NewCNIConfigWithCacheDir([]string{abs}, s.cacheDir, s.exec)
		b.sets = append(b.sets, s)
	}
	return nil
}

// loop runs warm-up and measured pods, the sets alternating pod by pod.
func (b *bench) loop(ctx context.Context) {
	total := b.o.warmup + b.o.pods
	for i := 0; i < total && ctx.Err() == nil; i++ {
		for _, s := range b.sets {
			if ctx.Err() != nil {
				return
			}
			b.pod(s, i >= b.o.warmup)
		}
	}
}

// trace runs -trace-pods more pods per set with every plugin under strace.
func (b *bench) trace(ctx context.Context) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		b.notes = append(b.notes, "strace not installed: no process/netlink/sysctl breakdown (hack/deps.sh installs it)")
		return
	}
	for _, s := range b.sets {
		dir := filepath.Join(b.o.workdir, s.name, "trace")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			b.notes = append(b.notes, fmt.Sprintf("trace dir: %v", err))
			return
		}
		s.exec.setTracing(strace, dir)
		for i := 0; i < b.o.tracing && ctx.Err() == nil; i++ {
			b.pod(s, false)
		}
		s.exec.setTracing("", "")
	}
}

// pod runs one pod: fresh netns, ADD (timed), verify (untimed), DEL
// (timed), leak checks (untimed), netns removed.
func (b *bench) pod(s *set, counted bool) {
	b.podSeq++
	idx := b.podSeq
	s.pods++
	fail := func(f Failure) {
		f.Pod = idx
		s.failures = append(s.failures, f)
	}
	ctrName := fmt.Sprintf("%sc%d", b.o.prefix, idx)
	ctrPath, err := netns.Create(ctrName)
	if err != nil {
		fail(Failure{Verb: "SETUP", Msg: fmt.Sprintf("creating container netns: %v", err)})
		return
	}
	defer func() {
		if err := netns.Delete(ctrName); err != nil {
			fail(Failure{Verb: "SETUP", Msg: fmt.Sprintf("deleting container netns %s: %v", ctrName, err)})
		}
	}()
	rt := &libcni.RuntimeConf{
		ContainerID:    fmt.Sprintf("%s-%s-%d", b.o.prefix, s.name, idx),
		NetNS:          ctrPath,
		IfName:         "eth0",
		CapabilityArgs: CapabilityArgs(),
	}
	before, err := b.hostState()
	if err != nil {
		fail(Failure{Verb: "SETUP", Msg: err.Error()})
		return
	}
	s.exec.beginPod(counted)
	ok := false
	defer func() { s.exec.endPod(ok && counted) }()

	var result types.Result
	var addErr, delErr error
	var addDur, delDur time.Duration
	if err := netns.Do(b.hostPath, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), b.o.opTimeout)
		defer cancel()
		start := time.Now()
		result, addErr = s.cni.AddNetworkList(ctx, s.list, rt)
		addDur = time.Since(start)
		return nil
	}); err != nil {
		fail(Failure{Verb: "SETUP", Msg: fmt.Sprintf("entering bench host netns: %v", err)})
		return
	}
	ok = addErr == nil
	if addErr != nil {
		fail(cniFailure("ADD", s.exec, addErr))
	} else if b.o.verify {
		if err := b.verifyAdd(result, ctrPath, rt.ContainerID); err != nil {
			fail(Failure{Verb: "VERIFY", Msg: err.Error()})
			ok = false
		}
	}
	_ = netns.Do(b.hostPath, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), b.o.opTimeout)
		defer cancel()
		start := time.Now()
		delErr = s.cni.DelNetworkList(ctx, s.list, rt)
		delDur = time.Since(start)
		return nil
	})
	if delErr != nil {
		f := cniFailure("DEL", s.exec, delErr)
		f.Cleanup = addErr != nil
		fail(f)
		ok = false
	}
	for _, leak := range b.leaks(s, before, ctrPath, rt.ContainerID) {
		fail(Failure{Verb: "LEAK", Msg: leak})
		ok = false
	}
	if ok {
		s.okPods++
		if counted {
			s.add = append(s.add, addDur)
			s.del = append(s.del, delDur)
			s.total = append(s.total, addDur+delDur)
			s.addRest = append(s.addRest, addDur-s.exec.podPluginTime("ADD"))
			s.delRest = append(s.delRest, delDur-s.exec.podPluginTime("DEL"))
		}
	}
}

// cniFailure names the plugin and verb that failed and keeps the CNI
// error code and message.
func cniFailure(verb string, e *benchExec, err error) Failure {
	plug, v := e.last()
	f := Failure{Verb: verb, Plugin: plug, Msg: err.Error()}
	if v != "" && v != verb {
		f.Plugin += " (" + v + ")"
	}
	var ce *types.Error
	if errors.As(err, &ce) {
		f.Code = ce.Code
		f.Msg = ce.Msg
		if ce.Details != "" {
			f.Msg += ": " + ce.Details
		}
	}
	return f
}

// finalChecks looks for leaked IPAM reservations and for changes to the
// root namespace.
func (b *bench) finalChecks() {
	for _, s := range b.sets {
		dir := filepath.Join(s.dataDir, netName)
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			b.notes = append(b.notes, fmt.Sprintf("%s: reading %s: %v", s.name, dir, err))
			continue
		}
		var left []string
		for _, e := range ents {
			n := e.Name()
			if n == "lock" || strings.HasPrefix(n, "last_reserved_ip") {
				continue
			}
			left = append(left, n)
		}
		if len(left) > 0 {
			s.failures = append(s.failures, Failure{Verb: "LEAK", Plugin: "host-local",
				Msg: fmt.Sprintf("%d reservation(s) left in %s after every DEL: %s", len(left), dir, strings.Join(left, " "))})
		}
	}
	// What DEL parked (internal/cni/parking) goes as the node agent takes
	// it: all at once. Then nothing of any pod may be left.
	if b.hostNS != "" {
		if err := b.inHost(func() error {
			n, err := parkedLinks()
			if err != nil {
				return err
			}
			start := time.Now()
			if _, err := parking.Collect(); err != nil {
				return err
			}
			took := time.Since(start)
			left, err := parkedLinks()
			if err != nil {
				return err
			}
			if left > 0 {
				return fmt.Errorf("%d parked link(s) left after collecting", left)
			}
			b.notes = append(b.notes, fmt.Sprintf("parked links left for a collector at the end: %d, removed in one request in %.1f ms", n, float64(took.Microseconds())/1000))
			return nil
		}); err != nil {
			s := b.sets[len(b.sets)-1] // the reference plugins park nothing
			s.failures = append(s.failures, Failure{Verb: "LEAK", Msg: "collecting parked links: " + err.Error()})
		}
	}
	// The bench host netns goes first, so the root snapshot compares like
	// with like.
	if b.hostNS != "" {
		if err := netns.Delete(b.hostNS); err != nil {
			b.notes = append(b.notes, fmt.Sprintf("deleting bench host netns %s: %v", b.hostNS, err))
		} else {
			b.hostNS = ""
		}
	}
	after, err := takeSnapshot(b.o.prefix)
	if err != nil {
		b.notes = append(b.notes, fmt.Sprintf("root namespace re-read failed: %v", err))
		return
	}
	if d := b.rootSnap.diff(after); d != "" {
		b.notes = append(b.notes, "root namespace changed during the run (other processes may share this machine): "+d)
	} else {
		b.notes = append(b.notes, "root namespace unchanged (links, addresses, routes, nft tables, ip_forward)")
	}
}

func (b *bench) cleanup() error {
	var errs []error
	if b.hostNS != "" {
		if err := netns.Delete(b.hostNS); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range b.sets {
		if err := os.RemoveAll(filepath.Dir(s.cacheDir)); err != nil {
			errs = append(errs, err)
		}
	}
	if b.tempWork {
		errs = append(errs, os.RemoveAll(b.o.workdir))
	}
	// Our namespaces must all be gone.
	if ents, err := os.ReadDir(netns.RunDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), b.o.prefix) {
				errs = append(errs, fmt.Errorf("netns %s still exists", e.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

// loadavg returns the 1-minute load average: other work on the machine
// shows up in the spread of the figures.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func machine() map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version()}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var sb strings.Builder
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			sb.WriteByte(byte(c))
		}
		m["kernel"] = sb.String()
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}
