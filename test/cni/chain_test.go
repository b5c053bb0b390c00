package cni

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/veth/vethtest"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// lab is one test's world (vethtest.Lab): a "host" namespace standing in
// for the node (bridge, host veths, rules and IFBs all live there, never in
// the machine's root namespace), a libcni instance with its own cache, and
// a host-local dataDir. Its runtime configs carry what containerd and
// CRI-O pass.
type lab struct {
	*vethtest.Lab
	t *testing.T
}

func newLab(t *testing.T, conf string) *lab {
	t.Helper()
	return &lab{Lab: vethtest.New(t, conf), t: t}
}

func (l *lab) rt(id, nsPath string, caps map[string]any) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: id, NetNS: nsPath, IfName: "eth0",
		// As containerd and CRI-O do: IgnoreUnknown lets plugins that know
		// no K8S_POD_* keys accept them (the reference host-local needs it).
		Args:           [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", id}},
		CapabilityArgs: caps,
	}
}

func (l *lab) add(id, nsPath string, caps map[string]any) (*current.Result, error) {
	return l.AddRT(l.rt(id, nsPath, caps))
}

func (l *lab) mustAdd(id, nsPath string, caps map[string]any) *current.Result {
	l.t.Helper()
	r, err := l.add(id, nsPath, caps)
	if err != nil {
		l.t.Fatalf("ADD %s: %v", id, err)
	}
	return r
}

func (l *lab) del(id, nsPath string, caps map[string]any) error {
	return l.DelRT(l.rt(id, nsPath, caps))
}

func (l *lab) check(id, nsPath string, caps map[string]any) error {
	return l.CheckRT(l.rt(id, nsPath, caps))
}

// hostLinks lists the link names in the host namespace.
func (l *lab) hostLinks() map[string]bool {
	l.t.Helper()
	out := map[string]bool{}
	for name := range vethtest.Links(l.t, l.Host) {
		out[name] = true
	}
	return out
}

const chainConf = `{
  "cniVersion": "1.1.0",
  "name": "%s",
  "plugins": [
    {"type": "bridge", "bridge": "%s", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "dataDir": "@DATADIR@",
              "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
  ]
}`

// flatnetConf is chainConf as one plugin of the flatnet type: the same
// options and capabilities, bridge, bandwidth and portmap in one process.
const flatnetConf = `{
  "cniVersion": "1.1.0",
  "name": "%s",
  "plugins": [
    {"type": "flatnet", "bridge": "%s", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "dataDir": "@DATADIR@",
              "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]},
     "capabilities": {"bandwidth": true, "portMappings": true}, "snat": true}
  ]
}`

// styles are the conflists the chain tests run on: the classic three
// plugins, and the flatnet type doing their work in one process.
var styles = map[string]string{"classic": chainConf, "flatnet": flatnetConf}

func chain(style, subnet string) string {
	return fmt.Sprintf(styles[style], testutil.Name("fnet-"), testutil.Name("fnb"), subnet)
}

// forEachStyle runs test once per conflist style.
func forEachStyle(t *testing.T, test func(t *testing.T, style string)) {
	for _, style := range []string{"classic", "flatnet"} {
		t.Run(style, func(t *testing.T) { test(t, style) })
	}
}

// The classic config from the CNI README, as users have it in
// /etc/cni/net.d, works unchanged in every result version it may carry.
// Only the network name is made unique, and the bridge lives in the
// test's own host namespace.
func TestClassicConfUnchanged(t *testing.T) {
	for _, v := range []string{"0.2.0", "0.3.1", "0.4.0", "1.0.0"} {
		t.Run(v, func(t *testing.T) {
			testutil.RequireFreeRange(t, "10.22.0.0/16")
			name := testutil.Name("mynet")
			conf := fmt.Sprintf(`{
	"cniVersion": %q,
	"name": %q,
	"type": "bridge",
	"bridge": "cni0",
	"isGateway": true,
	"ipMasq": true,
	"ipam": {
		"type": "host-local",
		"subnet": "10.22.0.0/16",
		"routes": [
			{ "dst": "0.0.0.0/0" }
		]
	}
}`, v, name)
			t.Cleanup(func() { os.RemoveAll(filepath.Join("/var/lib/cni/networks", name)) })
			l := newLab(t, conf)
			pod := testutil.NewNetNS(t)
			r := l.mustAdd("classic", pod, nil)
			ip := vethtest.IPOf(t, r, true)
			if !(&net.IPNet{IP: net.ParseIP("10.22.0.0"), Mask: net.CIDRMask(16, 32)}).Contains(ip) {
				t.Errorf("pod IP %s not in 10.22.0.0/16", ip)
			}
			if !l.hostLinks()["cni0"] {
				t.Errorf("no cni0 bridge in the host namespace")
			}
			// The gateway (first address) answers from the pod.
			testutil.EchoServer(t, l.Host, "10.22.0.1:7001", "gw")
			if got, err := testutil.Ask(pod, "10.22.0.1:7001"); err != nil || got != "gw "+ip.String() {
				t.Errorf("pod -> gateway: %q, %v", got, err)
			}
			if err := l.del("classic", pod, nil); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := l.del("classic", pod, nil); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

func TestFullChain(t *testing.T) { forEachStyle(t, testFullChain) }

func testFullChain(t *testing.T, style string) {
	const subnet = "10.77.0.0/24"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t, chain(style, subnet))
	before := l.hostLinks()
	podA, podB := testutil.NewNetNS(t), testutil.NewNetNS(t)
	caps := func(port int) map[string]any {
		return map[string]any{
			"portMappings": []map[string]any{{"hostPort": port, "containerPort": 8080, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"ingressRate": 100_000_000, "ingressBurst": 1_000_000, "egressRate": 100_000_000, "egressBurst": 1_000_000},
		}
	}
	ra := l.mustAdd("pod-a", podA, caps(18080))
	rb := l.mustAdd("pod-b", podB, caps(18081))
	ipA, ipB := vethtest.IPOf(t, ra, true), vethtest.IPOf(t, rb, true)
	if ipA.Equal(ipB) {
		t.Fatalf("both pods got %s", ipA)
	}
	for id, ns := range map[string]string{"pod-a": podA, "pod-b": podB} {
		if err := l.check(id, ns, caps(map[string]int{"pod-a": 18080, "pod-b": 18081}[id])); err != nil {
			t.Errorf("CHECK %s: %v", id, err)
		}
	}

	// Pod to pod: no NAT, the server sees the client pod's own address.
	testutil.EchoServer(t, podA, ":8080", "a")
	if got, err := testutil.Ask(podB, net.JoinHostPort(ipA.String(), "8080")); err != nil || got != "a "+ipB.String() {
		t.Errorf("pod-b -> pod-a: got %q, %v; want %q", got, err, "a "+ipB.String())
	}
	// hostPort through portmap: the host reaches pod-a at its gateway
	// address on hostPort 18080.
	gw := ra.IPs[0].Gateway
	if gw == nil {
		t.Fatalf("no gateway in result: %+v", ra)
	}
	if got, err := testutil.Ask(l.Host, net.JoinHostPort(gw.String(), "18080")); err != nil || !strings.HasPrefix(got, "a ") {
		t.Errorf("host -> %s:18080 (hostPort): got %q, %v", gw, got, err)
	}
	// Bandwidth left an IFB per pod.
	var ifbs int
	for name := range l.hostLinks() {
		if !before[name] && strings.HasPrefix(name, "bwp") {
			ifbs++
		}
	}
	if ifbs != 2 {
		t.Errorf("want 2 bandwidth IFBs in the host namespace, found %d: %v", ifbs, l.hostLinks())
	}

	for id, ns := range map[string]string{"pod-a": podA, "pod-b": podB} {
		if err := l.del(id, ns, nil); err != nil {
			t.Errorf("DEL %s: %v", id, err)
		}
		if err := l.del(id, ns, nil); err != nil {
			t.Errorf("second DEL %s: %v", id, err)
		}
	}
	l.assertClean(t, before)
}

// assertClean checks that nothing an attachment made is left: only the
// bridge may remain of the links, no address is reserved, and no rule
// names a container. DEL parks links for a collector
// (internal/cni/parking): it runs first, as the agent would, and removes
// only parked links, so any other link left is still found.
func (l *lab) assertClean(t *testing.T, before map[string]bool) {
	t.Helper()
	vethtest.Collect(t, l.Host)
	for name := range l.hostLinks() {
		if !before[name] && !strings.HasPrefix(name, "fnb") && name != "cni0" {
			t.Errorf("link %s left in the host namespace", name)
		}
	}
	if r := l.Reservations(); len(r) != 0 {
		t.Errorf("reservations left: %v", r)
	}
	rules := vethtest.NFT(t, l.Host)
	for _, ip := range []string{"10.77.0.2", "10.77.0.3"} {
		if strings.Contains(rules, ip+" ") || strings.Contains(rules, ip+"\n") {
			t.Errorf("nft rules still mention %s:\n%s", ip, rules)
		}
	}
}

func TestDelAfterNetnsGone(t *testing.T) { forEachStyle(t, testDelAfterNetnsGone) }

func testDelAfterNetnsGone(t *testing.T, style string) {
	const subnet = "10.77.1.0/24"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t, chain(style, subnet))
	before := l.hostLinks()
	name := testutil.Name("fnt")
	pod, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Delete(name) })
	caps := map[string]any{"portMappings": []map[string]any{{"hostPort": 18090, "containerPort": 80, "protocol": "udp"}}}
	l.mustAdd("gone", pod, caps)
	if err := netns.Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := l.del("gone", pod, caps); err != nil {
		t.Fatalf("DEL after the netns is gone: %v", err)
	}
	if err := l.del("gone", pod, caps); err != nil {
		t.Fatalf("second DEL after the netns is gone: %v", err)
	}
	l.assertClean(t, before)
}

func TestConcurrentAdds(t *testing.T) { forEachStyle(t, testConcurrentAdds) }

func testConcurrentAdds(t *testing.T, style string) {
	const subnet = "10.77.2.0/24"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t, chain(style, subnet))
	const n = 20
	pods := make([]string, n)
	for i := range pods {
		pods[i] = testutil.NewNetNS(t)
	}
	ips := make([]net.IP, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l.add(fmt.Sprintf("c%02d", i), pods[i], nil)
			if err == nil {
				ips[i] = vethtest.IPOf(t, r, true)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD c%02d: %v", i, err)
			continue
		}
		if j, dup := seen[ips[i].String()]; dup {
			t.Errorf("c%02d and c%02d both got %s", i, j, ips[i])
		}
		seen[ips[i].String()] = i
	}
	if got := len(l.Reservations()); got != n {
		t.Errorf("%d reservations on disk, want %d", got, n)
	}
	for i := range n {
		if err := l.del(fmt.Sprintf("c%02d", i), pods[i], nil); err != nil {
			t.Errorf("DEL c%02d: %v", i, err)
		}
	}
	if r := l.Reservations(); len(r) != 0 {
		t.Errorf("reservations left after DEL: %v", r)
	}
}

// GC must collect by itself: we drop libcni's cache for the stale pods, so
// libcni cannot synthesize DELs, and only the plugins' GC can free them.
func TestGCCollectsWithoutCache(t *testing.T) { forEachStyle(t, testGCCollectsWithoutCache) }

func testGCCollectsWithoutCache(t *testing.T, style string) {
	const subnet = "10.77.3.0/24"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t, chain(style, subnet))
	before := l.hostLinks()
	caps := func(port int) map[string]any {
		return map[string]any{
			"portMappings": []map[string]any{{"hostPort": port, "containerPort": 80, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": 100_000, "egressRate": 10_000_000, "egressBurst": 100_000},
		}
	}
	keep := testutil.NewNetNS(t)
	l.mustAdd("keep", keep, caps(18100))
	for i := range 2 {
		l.mustAdd(fmt.Sprintf("stale%d", i), testutil.NewNetNS(t), caps(18101+i))
	}
	if err := os.RemoveAll(filepath.Join(l.CacheDir, "results")); err != nil {
		t.Fatal(err)
	}
	if err := l.GC("keep"); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if r := l.Reservations(); len(r) != 1 {
		t.Errorf("after GC want 1 reservation (keep), got %v", r)
	}
	rules := vethtest.NFT(t, l.Host)
	for _, p := range []string{"18101", "18102"} {
		if strings.Contains(rules, p) {
			t.Errorf("portmap rule for stale hostPort %s survived GC:\n%s", p, rules)
		}
	}
	if !strings.Contains(rules, "18100") {
		t.Errorf("GC removed the live pod's hostPort 18100:\n%s", rules)
	}
	var ifbs int
	for name := range l.hostLinks() {
		if !before[name] && strings.HasPrefix(name, "bwp") {
			ifbs++
		}
	}
	if ifbs != 1 {
		t.Errorf("after GC want 1 IFB (keep), got %d", ifbs)
	}
}

func TestStatusAndExhaustion(t *testing.T) { forEachStyle(t, testStatusAndExhaustion) }

func testStatusAndExhaustion(t *testing.T, style string) {
	// A /30 has two usable addresses; the gateway takes one.
	const subnet = "10.77.4.0/30"
	testutil.RequireFreeRange(t, subnet)
	l := newLab(t, chain(style, subnet))
	before := l.hostLinks()
	status := l.Status
	if err := status(); err != nil {
		t.Fatalf("STATUS on an empty range: %v", err)
	}
	l.mustAdd("only", testutil.NewNetNS(t), nil)
	// A full range is no reason to report the network not ready: under
	// containerd that turns into a NotReady node whose pods are evicted.
	if err := status(); err != nil {
		t.Errorf("STATUS on a full range: want ready, got %v", err)
	}
	// The next ADD fails in IPAM and must leave nothing behind.
	pod := testutil.NewNetNS(t)
	_, err := l.add("one-too-many", pod, map[string]any{
		"portMappings": []map[string]any{{"hostPort": 18200, "containerPort": 80, "protocol": "tcp"}},
	})
	if vethtest.Code(err) != 101 {
		t.Fatalf("ADD on a full range: want code 101 (range exhausted), got %v", err)
	}
	if !strings.Contains(err.Error(), "no free IP address left") || !strings.Contains(err.Error(), "larger range") {
		t.Errorf("ADD on a full range: the error should say the range is full and what to do: %v", err)
	}
	after := l.hostLinks()
	var veths []string
	for name := range after {
		if !before[name] && !strings.HasPrefix(name, "fnb") {
			veths = append(veths, name)
		}
	}
	if len(veths) != 1 {
		t.Errorf("want exactly the first pod's veth in the host namespace, found %v", veths)
	}
	if vethtest.Links(t, pod)["eth0"] != nil {
		t.Errorf("failed ADD left eth0 in the pod namespace")
	}
	if strings.Contains(vethtest.NFT(t, l.Host), "18200") {
		t.Errorf("failed ADD left a portmap rule")
	}
	// The runtime still calls DEL after a failed ADD; it must succeed.
	if err := l.del("one-too-many", pod, nil); err != nil {
		t.Errorf("DEL after failed ADD: %v", err)
	}
}

func TestErrorCodes(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name string
		conf string
		ns   func(t *testing.T) string
		want uint
	}{
		{"unknown ipam type", `{"cniVersion":"1.0.0","name":"x","type":"bridge","bridge":"fnbx","ipam":{"type":"no-such-ipam"}}`,
			func(t *testing.T) string { return testutil.NewNetNS(t) }, 7},
		{"missing netns", `{"cniVersion":"1.0.0","name":"x","type":"bridge","bridge":"fnbx","ipam":{"type":"host-local","dataDir":"@DATADIR@","subnet":"10.77.5.0/24"}}`,
			func(t *testing.T) string { return "/run/netns/fnt-does-not-exist" }, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t, c.conf)
			before := l.hostLinks()
			_, err := l.add("codes", c.ns(t), nil)
			if got := vethtest.Code(err); got != c.want {
				t.Errorf("want code %d, got %d (%v)", c.want, got, err)
			}
			for name := range l.hostLinks() {
				if !before[name] && !strings.HasPrefix(name, "fnb") {
					t.Errorf("failed ADD left link %s", name)
				}
			}
		})
	}
}

// A node switching between the classic conflist and the flatnet type:
// a pod set up by one is checked and torn down by the other, leaving
// nothing (same network name, bridge, dataDir and libcni cache).
func TestSwitchConflists(t *testing.T) {
	const subnet = "10.77.6.0/24"
	testutil.RequireFreeRange(t, subnet)
	for _, from := range []string{"classic", "flatnet"} {
		to := map[string]string{"classic": "flatnet", "flatnet": "classic"}[from]
		t.Run(from+"-to-"+to, func(t *testing.T) {
			name, br := testutil.Name("fnet-"), testutil.Name("fnb")
			conf := func(style string) string { return fmt.Sprintf(styles[style], name, br, subnet) }
			l := newLab(t, conf(from))
			before := l.hostLinks()
			caps := map[string]any{
				"portMappings": []map[string]any{{"hostPort": 18300, "containerPort": 80, "protocol": "tcp"}},
				"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": 100_000, "egressRate": 10_000_000, "egressBurst": 100_000},
			}
			pod := testutil.NewNetNS(t)
			ip := vethtest.IPOf(t, l.mustAdd("pod", pod, caps), true)
			if rules := vethtest.NFT(t, l.Host); !strings.Contains(rules, "18300") {
				t.Fatalf("no hostPort rule after ADD by %s:\n%s", from, rules)
			}
			other := &lab{Lab: l.WithConf(conf(to)), t: t}
			if err := other.check("pod", pod, caps); err != nil {
				t.Errorf("CHECK by %s of a pod %s set up: %v", to, from, err)
			}
			if err := other.del("pod", pod, caps); err != nil {
				t.Fatalf("DEL by %s of a pod %s set up: %v", to, from, err)
			}
			other.assertClean(t, before)
			if rules := vethtest.NFT(t, l.Host); strings.Contains(rules, "18300") || strings.Contains(rules, ip.String()+" ") {
				t.Errorf("rules for the pod (%s, hostPort 18300) left after DEL by %s:\n%s", ip, to, rules)
			}
		})
	}
}
