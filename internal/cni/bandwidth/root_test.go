package bandwidth

// Root tests: a test "host" namespace stands in for the node, a second
// namespace for the pod, joined by a veth pair the test makes (the part
// bridge or ptp would do); the plugin runs as the flatnet-cni binary
// through libcni, from inside the host namespace, with the veth in its
// prevResult. Nothing touches the machine's own namespace.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/tc"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// lab is a vethtest.Lab whose conflists (bandwidth with a pod's
// prevResult) are made per call.
type lab struct {
	*vethtest.Lab
	t       testing.TB
	network string
}

func newLab(t testing.TB) *lab {
	t.Helper()
	return &lab{Lab: vethtest.New(t, ""), t: t, network: testutil.Name("fnbw-")}
}

// pod is one container: its netns and the veth pair to the host.
type pod struct {
	id       string
	ns       string
	ifName   string // CNI_IFNAME; "eth0" unless a test changes it
	hostVeth string
	hostIP   net.IP // host end, /30
	podIP    net.IP
	prev     *current.Result
}

// newPod makes a pod netns and a veth pair hostVeth <-> eth0 addressed
// from subnet (a /30 under 10.x that RequireFreeRange has cleared).
func (l *lab) newPod(id, subnet string) *pod {
	l.t.Helper()
	testutil.RequireFreeRange(l.t, subnet)
	_, n, err := net.ParseCIDR(subnet)
	if err != nil {
		l.t.Fatal(err)
	}
	base := n.IP.To4()
	p := &pod{id: id, ns: testutil.NewNetNS(l.t), ifName: "eth0", hostVeth: testutil.Name("fnbv"),
		hostIP: net.IPv4(base[0], base[1], base[2], base[3]+1), podIP: net.IPv4(base[0], base[1], base[2], base[3]+2)}
	testutil.Wire(l.t, l.Host, p.hostVeth, []string{p.hostIP.String() + "/30"}, p.ns, "eth0", []string{p.podIP.String() + "/30"})
	mac := vethtest.Links(l.t, p.ns)["eth0"].Attrs().HardwareAddr.String()
	p.prev = &current.Result{
		CNIVersion: "1.1.0",
		Interfaces: []*current.Interface{{Name: p.hostVeth}, {Name: "eth0", Mac: mac, Sandbox: p.ns}},
		IPs:        []*current.IPConfig{{Interface: current.Int(1), Address: net.IPNet{IP: p.podIP, Mask: net.CIDRMask(30, 32)}}},
	}
	return p
}

// list is a conflist with bandwidth alone, the previous plugin's result
// embedded as its prevResult (libcni keeps a plugin's own keys and only
// injects a prevResult for plugins after the first).
func (l *lab) list(p *pod, static map[string]any) *libcni.NetworkConfigList {
	l.t.Helper()
	plug := map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}}
	for k, v := range static {
		plug[k] = v
	}
	if p != nil {
		plug["prevResult"] = p.prev
	}
	return vethtest.ConfList(l.t, l.network, plug)
}

func (l *lab) rt(p *pod, caps map[string]any) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.id, NetNS: p.ns, IfName: p.ifName, CapabilityArgs: caps}
}

func (l *lab) add(list *libcni.NetworkConfigList, p *pod, caps map[string]any) (*current.Result, error) {
	return l.WithList(list).AddRT(l.rt(p, caps))
}

func (l *lab) del(list *libcni.NetworkConfigList, p *pod, caps map[string]any) error {
	return l.WithList(list).DelRT(l.rt(p, caps))
}

func (l *lab) check(list *libcni.NetworkConfigList, p *pod, caps map[string]any) error {
	return l.WithList(list).CheckRT(l.rt(p, caps))
}

// state describes the host namespace's tc state: per link, its kind, the
// root TBF, whether it has an ingress qdisc, and redirect targets.
type hostState struct {
	links  map[string]tc.Link // but parked ones (DEL parks the IFB)
	parked []string
	root   map[string]*tc.TBF
	ingr   map[string]bool
	redir  map[string][]string
}

func (l *lab) state() hostState {
	l.t.Helper()
	s := hostState{links: map[string]tc.Link{}, root: map[string]*tc.TBF{}, ingr: map[string]bool{}, redir: map[string][]string{}}
	k := tc.Netlink{}
	err := l.InHost(func() error {
		all, err := netlink.LinkList()
		if err != nil {
			return err
		}
		byIndex := map[int]string{}
		for _, nl := range all {
			byIndex[nl.Attrs().Index] = nl.Attrs().Name
		}
		for _, nl := range all {
			name, idx := nl.Attrs().Name, nl.Attrs().Index
			if netlinkx.IsParked(nl) {
				s.parked = append(s.parked, name)
				continue
			}
			li, _, err := k.LinkByIndex(idx)
			if err != nil {
				return err
			}
			s.links[name] = li
			if t, ok, err := k.RootTBF(idx); err != nil {
				return err
			} else if ok {
				s.root[name] = &t
			}
			if s.ingr[name], err = k.HasIngress(idx); err != nil {
				return err
			}
			to, err := k.Redirects(idx)
			if err != nil {
				return err
			}
			for _, i := range to {
				s.redir[name] = append(s.redir[name], byIndex[i])
			}
		}
		return nil
	})
	if err != nil {
		l.t.Fatal(err)
	}
	return s
}

func (s hostState) ifbs() []string {
	var out []string
	for n, li := range s.links {
		if li.Kind == "ifb" {
			out = append(out, n)
		}
	}
	return out
}

const (
	rate10M  = 10_000_000
	burst100 = 100_000
)

func TestAddCheckDel(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-acd", "10.231.0.0/30")
	list := l.list(p, nil)
	caps := map[string]any{"bandwidth": map[string]any{
		"ingressRate": rate10M, "ingressBurst": burst100, "egressRate": 2 * rate10M, "egressBurst": 2 * burst100}}

	r, err := l.add(list, p, caps)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	ifbName := IFBName(l.network, p.id)
	// The result passes prevResult through, plus the IFB (as the reference).
	if len(r.Interfaces) != 3 || r.Interfaces[0].Name != p.hostVeth || r.Interfaces[2].Name != ifbName || r.Interfaces[2].Sandbox != "" || r.Interfaces[2].Mac == "" {
		t.Errorf("ADD result interfaces: %+v", r.Interfaces)
	}
	if len(r.IPs) != 1 || !r.IPs[0].Address.IP.Equal(p.podIP) {
		t.Errorf("ADD result IPs: %+v", r.IPs)
	}

	clock := tc.KernelClock()
	wantIn, _ := clock.TBFFor(rate10M, burst100)
	wantEg, _ := clock.TBFFor(2*rate10M, 2*burst100)
	s := l.state()
	if got := s.root[p.hostVeth]; got == nil || *got != wantIn {
		t.Errorf("host veth root qdisc %v, want TBF %v", got, wantIn)
	}
	ifb, ok := s.links[ifbName]
	if !ok || ifb.Kind != "ifb" {
		t.Fatalf("no IFB %s in the host namespace: %v", ifbName, s.links)
	}
	if ifb.Alias != "flatnet-bw:"+l.network+":"+p.id+":eth0" || ifb.MTU != 1500 || ifb.MAC != r.Interfaces[2].Mac {
		t.Errorf("IFB %+v", ifb)
	}
	if got := s.root[ifbName]; got == nil || *got != wantEg {
		t.Errorf("IFB root qdisc %v, want TBF %v", got, wantEg)
	}
	if !s.ingr[p.hostVeth] || len(s.redir[p.hostVeth]) != 1 || s.redir[p.hostVeth][0] != ifbName {
		t.Errorf("host veth ingress %v redirects %v, want a redirect to %s", s.ingr[p.hostVeth], s.redir[p.hostVeth], ifbName)
	}

	if err := l.check(list, p, caps); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// CHECK with other limits than ADD's fails, naming the difference.
	other := map[string]any{"bandwidth": map[string]any{
		"ingressRate": 2 * rate10M, "ingressBurst": burst100, "egressRate": 2 * rate10M, "egressBurst": 2 * burst100}}
	if err := l.check(list, p, other); vethtest.Code(err) != cnierr.CheckFailed || !strings.Contains(err.Error(), p.hostVeth) {
		t.Errorf("CHECK with another ingress rate: want 106 naming %s, got %v", p.hostVeth, err)
	}
	// CHECK notices a removed IFB qdisc.
	if err := l.InHost(func() error { return tc.Netlink{}.DeleteRoot(ifb.Index) }); err != nil {
		t.Fatal(err)
	}
	if err := l.check(list, p, caps); vethtest.Code(err) != cnierr.CheckFailed || !strings.Contains(err.Error(), ifbName) {
		t.Errorf("CHECK after removing the IFB's TBF: want 106 naming %s, got %v", ifbName, err)
	}

	for i := range 2 {
		if err := l.del(list, p, caps); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
		s := l.state()
		if ifbs := s.ifbs(); len(ifbs) != 0 {
			t.Errorf("after DEL #%d: IFBs left: %v", i+1, ifbs)
		}
		// DEL parks the IFB (down, for a collector) rather than wait
		// for its removal; a collector takes it.
		if len(s.parked) != 1 || s.parked[0] != ifbName {
			t.Errorf("after DEL #%d: parked %v, want the IFB %s", i+1, s.parked, ifbName)
		}
	}
	vethtest.Collect(t, l.Host)
	if s := l.state(); len(s.parked) != 0 {
		t.Errorf("collected, parked links left: %v", s.parked)
	}
}

// Limits in the static config, kubelet-style runtimeConfig overriding one
// direction; and an ingress-only limit makes no IFB.
func TestStaticAndRuntimeLimits(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-static", "10.231.0.4/30")
	list := l.list(p, map[string]any{"ingressRate": rate10M, "ingressBurst": burst100})
	if _, err := l.add(list, p, nil); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	clock := tc.KernelClock()
	want, _ := clock.TBFFor(rate10M, burst100)
	s := l.state()
	if got := s.root[p.hostVeth]; got == nil || *got != want {
		t.Errorf("static ingress: root %v, want %v", got, want)
	}
	if ifbs := s.ifbs(); len(ifbs) != 0 || s.ingr[p.hostVeth] {
		t.Errorf("ingress-only limit made IFBs %v / ingress qdisc %v", ifbs, s.ingr[p.hostVeth])
	}
	if err := l.check(list, p, nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := l.del(list, p, nil); err != nil {
		t.Fatal(err)
	}

	// The same pod again with the kubelet's annotation values: the
	// runtime's burst is MaxUint32 bits, which the kernel caps at 4.29 s.
	caps := map[string]any{"bandwidth": map[string]any{"ingressRate": 3 * rate10M, "ingressBurst": 4294967295}}
	if _, err := l.add(list, p, caps); err != nil {
		t.Fatalf("ADD with runtimeConfig: %v", err)
	}
	want, _ = clock.TBFFor(3*rate10M, 4294967295)
	if got := l.state().root[p.hostVeth]; got == nil || *got != want {
		t.Errorf("runtimeConfig ingress: root %v, want %v", got, want)
	}
	if err := l.check(list, p, caps); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

func TestDelAfterNetnsGone(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-gone", "10.231.0.8/30")
	list := l.list(p, nil)
	caps := map[string]any{"bandwidth": map[string]any{"egressRate": rate10M, "egressBurst": burst100}}
	if _, err := l.add(list, p, caps); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if len(l.state().ifbs()) != 1 {
		t.Fatalf("no IFB after ADD")
	}
	if err := netns.Delete(testutil.NSName(p.ns)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := l.del(list, p, caps); err != nil {
			t.Fatalf("DEL #%d after the netns is gone: %v", i+1, err)
		}
	}
	if ifbs := l.state().ifbs(); len(ifbs) != 0 {
		t.Errorf("IFBs left: %v", ifbs)
	}
}

func TestGCAndStatus(t *testing.T) {
	l := newLab(t)
	keep := l.newPod("ctr-keep", "10.231.0.12/30")
	stale := l.newPod("ctr-stale", "10.231.0.16/30")
	caps := map[string]any{"bandwidth": map[string]any{"egressRate": rate10M, "egressBurst": burst100}}
	for _, p := range []*pod{keep, stale} {
		if _, err := l.add(l.list(p, nil), p, caps); err != nil {
			t.Fatalf("ADD %s: %v", p.id, err)
		}
	}
	// A reference-made IFB (no alias) whose container is gone, and an IFB
	// nobody would call ours.
	refOrphan := IFBName(l.network, "ref-gone")
	if err := l.InHost(func() error {
		for _, n := range []string{refOrphan, "fnbwother"} {
			if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: n}}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Drop libcni's cache so that only the plugin's GC can collect (libcni
	// would otherwise DEL the stale attachment itself).
	if err := os.RemoveAll(filepath.Join(l.CacheDir, "results")); err != nil {
		t.Fatal(err)
	}
	gl := l.WithList(l.list(nil, nil))
	if err := gl.GC(keep.id); err != nil {
		t.Fatalf("GC: %v", err)
	}
	s := l.state()
	if _, ok := s.links[IFBName(l.network, keep.id)]; !ok {
		t.Errorf("GC removed the live pod's IFB")
	}
	if _, ok := s.links["fnbwother"]; !ok {
		t.Errorf("GC removed an IFB that is not a bandwidth IFB")
	}
	for _, n := range []string{IFBName(l.network, stale.id), refOrphan} {
		if _, ok := s.links[n]; ok {
			t.Errorf("GC left stale IFB %s", n)
		}
	}
	// The live pod is still shaped.
	if len(s.redir[keep.hostVeth]) != 1 {
		t.Errorf("live pod's redirect gone: %v", s.redir)
	}

	if err := gl.Status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	// STATUS leaves nothing behind in the namespace it runs in.
	if after := l.state(); len(after.links) != len(s.links) {
		t.Errorf("STATUS changed the host namespace: %d links before, %d after", len(s.links), len(after.links))
	}
}

func TestErrors(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-err", "10.231.0.20/30")
	before := l.state()
	for _, tt := range []struct {
		name   string
		list   *libcni.NetworkConfigList
		caps   map[string]any
		code   uint
		msg    string
		modify func()
	}{
		{name: "rate without burst", list: l.list(p, map[string]any{"egressRate": rate10M}), code: 7, msg: "egressBurst"},
		{name: "runtime burst without rate", list: l.list(p, nil), caps: map[string]any{"bandwidth": map[string]any{"ingressBurst": burst100}}, code: 7, msg: "runtimeConfig.bandwidth.ingressRate"},
		{name: "negative rate", list: l.list(p, map[string]any{"ingressRate": -5, "ingressBurst": burst100}), code: 7, msg: "ingressRate"},
		{name: "burst below the MTU", list: l.list(p, map[string]any{"ingressRate": rate10M, "ingressBurst": 800}), code: 7, msg: "MTU"},
		{name: "no prevResult", list: l.list(nil, map[string]any{"ingressRate": rate10M, "ingressBurst": burst100}), code: 7, msg: "prevResult"},
		{name: "IFB name taken by another attachment", list: l.list(p, nil),
			caps: map[string]any{"bandwidth": map[string]any{"ingressRate": rate10M, "ingressBurst": burst100, "egressRate": rate10M, "egressBurst": burst100}},
			code: 104, msg: "net1",
			modify: func() {
				if err := l.InHost(func() error {
					return netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: IFBName(l.network, p.id)}})
				}); err != nil {
					t.Fatal(err)
				}
				if err := l.InHost(func() error {
					ifb, err := netlink.LinkByName(IFBName(l.network, p.id))
					if err != nil {
						return err
					}
					return netlink.LinkSetAlias(ifb, Owner{l.network, p.id, "net1"}.Alias())
				}); err != nil {
					t.Fatal(err)
				}
				before = l.state()
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.modify != nil {
				tt.modify()
			}
			_, err := l.add(tt.list, p, tt.caps)
			if vethtest.Code(err) != tt.code || !strings.Contains(fmt.Sprint(err), tt.msg) {
				t.Fatalf("want code %d mentioning %q, got %v", tt.code, tt.msg, err)
			}
			after := l.state()
			if fmt.Sprint(after.ifbs()) != fmt.Sprint(before.ifbs()) || after.root[p.hostVeth] != nil || after.ingr[p.hostVeth] {
				t.Errorf("failed ADD left state: IFBs %v (before %v), root %v, ingress %v",
					after.ifbs(), before.ifbs(), after.root[p.hostVeth], after.ingr[p.hostVeth])
			}
		})
	}
	// A missing netns is code 3.
	gone := &pod{id: "ctr-nons", ns: "/run/netns/fnt-does-not-exist", ifName: "eth0", prev: p.prev}
	if _, err := l.add(l.list(gone, map[string]any{"ingressRate": rate10M, "ingressBurst": burst100}), gone, nil); vethtest.Code(err) != 3 {
		t.Errorf("missing netns: want code 3, got %v", err)
	}
}

// The host veth is found from the container's side (its veth peer), also
// when prevResult lists no host interface; a non-veth CNI_IFNAME is 7.
func TestHostVethDiscovery(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-find", "10.231.0.36/30")
	p.prev.Interfaces = p.prev.Interfaces[1:] // only eth0, in the sandbox
	p.prev.IPs[0].Interface = current.Int(0)
	list := l.list(p, map[string]any{"egressRate": rate10M, "egressBurst": burst100})
	if _, err := l.add(list, p, nil); err != nil {
		t.Fatalf("ADD with only the container interface in prevResult: %v", err)
	}
	if s := l.state(); len(s.redir[p.hostVeth]) != 1 {
		t.Errorf("host veth %s not shaped: %v", p.hostVeth, s.redir)
	}
	if err := l.check(list, p, nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := l.del(list, p, nil); err != nil {
		t.Fatal(err)
	}

	lo := &pod{id: "ctr-lo", ns: p.ns, ifName: "lo", prev: p.prev}
	_, err := l.add(l.list(lo, map[string]any{"egressRate": rate10M, "egressBurst": burst100}), lo, nil)
	if vethtest.Code(err) != 7 || !strings.Contains(err.Error(), "veth") {
		t.Errorf("CNI_IFNAME=lo: want code 7 about veth pairs, got %v", err)
	}
	missing := &pod{id: "ctr-missing", ns: p.ns, ifName: "eth9", prev: p.prev}
	_, err = l.add(l.list(missing, map[string]any{"egressRate": rate10M, "egressBurst": burst100}), missing, nil)
	if vethtest.Code(err) != 7 || !strings.Contains(err.Error(), "eth9") {
		t.Errorf("CNI_IFNAME=eth9 (absent): want code 7 naming eth9, got %v", err)
	}
	if ifbs := l.state().ifbs(); len(ifbs) != 0 {
		t.Errorf("failed ADDs left IFBs %v", ifbs)
	}
}

// throughput sends TCP from the namespace `from` to addr (listening in
// namespace `to`) and returns the rate the receiver saw, in bit/s, over
// a fixed window after the first byte.
func throughput(t *testing.T, from, to string, addr net.IP) float64 {
	t.Helper()
	const window = 2 * time.Second
	var ln net.Listener
	if err := netns.Do(to, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		bytes int64
		err   error
	}
	got := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- res{err: err}
			return
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf) // the first bytes start the window
		if err != nil {
			got <- res{err: err}
			return
		}
		_ = n
		var total int64
		_ = c.SetReadDeadline(time.Now().Add(window))
		for {
			n, err := c.Read(buf)
			total += int64(n)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = nil
				}
				got <- res{bytes: total, err: err}
				return
			}
		}
	}()
	var c net.Conn
	if err := netns.Do(from, func() error {
		var err error
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 64<<10)
		_ = c.SetWriteDeadline(time.Now().Add(window + 5*time.Second))
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	r := <-got
	c.Close()
	if r.err != nil && !errors.Is(r.err, io.EOF) {
		t.Fatalf("receiving: %v", r.err)
	}
	return float64(r.bytes) * 8 / window.Seconds()
}

// The limits take effect: TCP toward and from the pod runs near 10 Mbit/s
// with the plugin and far faster without it.
func TestThroughput(t *testing.T) {
	l := newLab(t)
	p := l.newPod("ctr-tput", "10.231.0.24/30")
	list := l.list(p, nil)
	const limit = rate10M

	freeIn := throughput(t, l.Host, p.ns, p.podIP)
	freeOut := throughput(t, p.ns, l.Host, p.hostIP)

	caps := map[string]any{"bandwidth": map[string]any{"ingressRate": limit, "ingressBurst": burst100, "egressRate": limit, "egressBurst": burst100}}
	if _, err := l.add(list, p, caps); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	in := throughput(t, l.Host, p.ns, p.podIP)
	out := throughput(t, p.ns, l.Host, p.hostIP)
	mbit := func(v float64) string { return fmt.Sprintf("%.1f Mbit/s", v/1e6) }
	t.Logf("toward the pod: %s unlimited, %s with ingressRate %s", mbit(freeIn), mbit(in), mbit(limit))
	t.Logf("from the pod:   %s unlimited, %s with egressRate %s", mbit(freeOut), mbit(out), mbit(limit))
	for _, m := range []struct {
		dir        string
		free, shap float64
	}{{"toward the pod (ingress)", freeIn, in}, {"from the pod (egress)", freeOut, out}} {
		if m.shap > 2*limit {
			t.Errorf("%s: %s with a %s limit: not limited", m.dir, mbit(m.shap), mbit(limit))
		}
		if m.shap < 0.5*limit {
			t.Errorf("%s: %s with a %s limit: far below the limit", m.dir, mbit(m.shap), mbit(limit))
		}
		if m.free < 10*limit {
			t.Errorf("%s: unlimited rate %s is not much higher than the limit %s", m.dir, mbit(m.free), mbit(limit))
		}
	}
	if err := l.del(list, p, caps); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// BenchmarkAddDel times one ADD (both directions shaped) and one DEL of
// the bandwidth plugin alone, exec'd through libcni as a runtime does.
func BenchmarkAddDel(b *testing.B) {
	l := newLab(b)
	p := l.newPod("ctr-bench", "10.231.0.28/30")
	list := l.list(p, nil)
	caps := map[string]any{"bandwidth": map[string]any{"ingressRate": rate10M, "ingressBurst": burst100, "egressRate": rate10M, "egressBurst": burst100}}
	for b.Loop() {
		if _, err := l.add(list, p, caps); err != nil {
			b.Fatal(err)
		}
		if err := l.del(list, p, caps); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStatus times STATUS, which probes IFB and TBF in a scratch
// namespace.
func BenchmarkStatus(b *testing.B) {
	l := newLab(b)
	sl := l.WithList(l.list(nil, nil))
	for b.Loop() {
		if err := sl.Status(); err != nil {
			b.Fatal(err)
		}
	}
}

// bandwidth chained after ptp (with host-local) through libcni, the way
// a runtime runs it: the kubelet's annotations arrive as runtimeConfig,
// the previous plugin's result as prevResult. A pod without annotations
// is the unlimited baseline.
func TestChainedAfterPtp(t *testing.T) {
	const subnet = "10.231.1.0/24"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t)
	list := vethtest.ConfList(t, l.network,
		map[string]any{"type": "ptp", "ipMasq": false, "ipam": map[string]any{
			"type": "host-local", "dataDir": t.TempDir(), "ranges": [][]map[string]any{{{"subnet": subnet}}}}},
		map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}})
	const limit = rate10M
	caps := map[string]any{"bandwidth": map[string]any{"ingressRate": limit, "ingressBurst": burst100, "egressRate": limit, "egressBurst": burst100}}
	limited := &pod{id: "ctr-ptp-limited", ns: testutil.NewNetNS(t), ifName: "eth0"}
	free := &pod{id: "ctr-ptp-free", ns: testutil.NewNetNS(t), ifName: "eth0"}
	rl, err := l.add(list, limited, caps)
	if err != nil {
		t.Fatalf("ADD (limited): %v", err)
	}
	rf, err := l.add(list, free, nil)
	if err != nil {
		t.Fatalf("ADD (unlimited): %v", err)
	}
	ifbName := IFBName(l.network, limited.id)
	if n := len(rl.Interfaces); n == 0 || rl.Interfaces[n-1].Name != ifbName {
		t.Errorf("limited pod's result does not end with its IFB %s: %+v", ifbName, rl.Interfaces)
	}
	for _, i := range rf.Interfaces {
		if strings.HasPrefix(i.Name, "bwp") {
			t.Errorf("unlimited pod got an IFB: %+v", rf.Interfaces)
		}
	}
	if ifbs := l.state().ifbs(); len(ifbs) != 1 || ifbs[0] != ifbName {
		t.Errorf("host IFBs %v, want [%s]", ifbs, ifbName)
	}
	for _, p := range []*pod{limited, free} {
		c := caps
		if p == free {
			c = nil
		}
		if err := l.check(list, p, c); err != nil {
			t.Errorf("CHECK %s: %v", p.id, err)
		}
	}

	addrs := func(r *current.Result) (podIP, gw net.IP) {
		if len(r.IPs) == 0 || r.IPs[0].Gateway == nil {
			t.Fatalf("ptp result without an address and gateway: %+v", r)
		}
		return r.IPs[0].Address.IP, r.IPs[0].Gateway
	}
	mbit := func(v float64) string { return fmt.Sprintf("%.1f Mbit/s", v/1e6) }
	lIP, lGW := addrs(rl)
	fIP, fGW := addrs(rf)
	freeIn, freeOut := throughput(t, l.Host, free.ns, fIP), throughput(t, free.ns, l.Host, fGW)
	in, out := throughput(t, l.Host, limited.ns, lIP), throughput(t, limited.ns, l.Host, lGW)
	t.Logf("ptp+bandwidth, toward the pod: %s unlimited, %s limited to %s", mbit(freeIn), mbit(in), mbit(limit))
	t.Logf("ptp+bandwidth, from the pod:   %s unlimited, %s limited to %s", mbit(freeOut), mbit(out), mbit(limit))
	for _, m := range []struct {
		dir        string
		free, shap float64
	}{{"toward the pod", freeIn, in}, {"from the pod", freeOut, out}} {
		if m.shap > 2*limit || m.shap < 0.5*limit {
			t.Errorf("%s: %s with a %s limit", m.dir, mbit(m.shap), mbit(limit))
		}
		if m.free < 10*limit {
			t.Errorf("%s: unlimited pod only reaches %s", m.dir, mbit(m.free))
		}
	}

	for _, p := range []*pod{limited, free} {
		for i := range 2 {
			if err := l.del(list, p, nil); err != nil {
				t.Errorf("DEL #%d %s: %v", i+1, p.id, err)
			}
		}
	}
	if ifbs := l.state().ifbs(); len(ifbs) != 0 {
		t.Errorf("IFBs left after DEL: %v", ifbs)
	}
}
