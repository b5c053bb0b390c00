// Package vethtest holds the root-test helpers of the CNI plugins (bridge,
// ptp, macvlan, bandwidth, portmap and the end-to-end tests): a test
// "host" namespace driving the plugins through libcni with its own cache
// and host-local dataDir, readers of namespace state, and traffic checks
// done with Go sockets opened inside namespaces (no ping binary needed).
package vethtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

// Lab is one test's world: a host namespace standing in for the node, a
// libcni instance with its own cache dir, and a host-local dataDir.
type Lab struct {
	T        testing.TB
	Host     string
	CNI      *libcni.CNIConfig
	CacheDir string // CNI's cache dir
	List     *libcni.NetworkConfigList
	DataDir  string
}

// New parses conf (a conflist, or a single plugin config, as libcni-based
// runtimes load them) after replacing @DATADIR@ with the lab's dataDir.
// With conf "", give each call its list with WithList.
func New(t testing.TB, conf string) *Lab {
	t.Helper()
	testutil.RequireRoot(t)
	l := &Lab{T: t, Host: testutil.NewNetNS(t), DataDir: t.TempDir(), CacheDir: t.TempDir()}
	// Parked links die with the namespace; collecting also removes the
	// namespace's marker (internal/cni/parking), which would outlive it.
	t.Cleanup(func() { _ = netns.Do(l.Host, func() error { _, err := parking.Collect(); return err }) })
	if conf != "" {
		l.List = l.parse(conf)
	}
	l.CNI = libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, l.CacheDir, nil)
	return l
}

// WithCache returns a lab like l with a libcni cache of its own (libcni's
// GC sends DEL for what its cache knows; a separate cache keeps an
// attachment for the plugin's own GC to find).
func (l *Lab) WithCache() *Lab {
	o := *l
	o.CacheDir = l.T.TempDir()
	o.CNI = libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(l.T)}, o.CacheDir, nil)
	return &o
}

// WithConf returns a lab sharing l's host namespace, libcni cache and
// dataDir, for another network config.
func (l *Lab) WithConf(conf string) *Lab {
	l.T.Helper()
	return l.WithList(l.parse(conf))
}

// WithList is WithConf for a parsed config.
func (l *Lab) WithList(list *libcni.NetworkConfigList) *Lab {
	o := *l
	o.List = list
	return &o
}

func (l *Lab) parse(conf string) *libcni.NetworkConfigList {
	l.T.Helper()
	conf = strings.ReplaceAll(conf, "@DATADIR@", l.DataDir)
	var (
		list *libcni.NetworkConfigList
		err  error
	)
	if strings.Contains(conf, `"plugins"`) {
		list, err = libcni.NetworkConfFromBytes([]byte(conf))
	} else {
		var c *libcni.PluginConfig
		if c, err = libcni.ConfFromBytes([]byte(conf)); err == nil {
			list, err = libcni.ConfListFromConf(c)
		}
	}
	if err != nil {
		l.T.Fatalf("parsing config: %v\n%s", err, conf)
	}
	return list
}

// ConfList is a CNI 1.1.0 conflist called name with plugins (JSON-able
// values, e.g. maps).
func ConfList(t testing.TB, name string, plugins ...any) *libcni.NetworkConfigList {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatalf("conflist: %v\n%s", err, b)
	}
	return list
}

// RT is the runtime config for container id in nsPath.
func RT(id, nsPath string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: nsPath, IfName: "eth0"}
}

// InHost runs fn in the lab's host namespace; plugins exec'd from there
// inherit it.
func (l *Lab) InHost(fn func() error) error { return netns.Do(l.Host, fn) }

// Add runs ADD for id in nsPath.
func (l *Lab) Add(id, nsPath string) (*current.Result, error) {
	return l.AddRT(RT(id, nsPath))
}

// AddRT runs ADD with a full runtime config.
func (l *Lab) AddRT(rt *libcni.RuntimeConf) (*current.Result, error) {
	res, err := l.AddRaw(rt)
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// AddRaw is AddRT returning the result in the version the config asked
// for.
func (l *Lab) AddRaw(rt *libcni.RuntimeConf) (types.Result, error) {
	var res types.Result
	err := l.InHost(func() error {
		var err error
		res, err = l.CNI.AddNetworkList(context.Background(), l.List, rt)
		return err
	})
	if err == nil && res == nil {
		err = fmt.Errorf("ADD %s returned no result and no error", rt.ContainerID)
	}
	return res, err
}

// MustAdd is Add that fails the test on error.
func (l *Lab) MustAdd(id, nsPath string) *current.Result {
	l.T.Helper()
	r, err := l.Add(id, nsPath)
	if err != nil {
		l.T.Fatalf("ADD %s: %v", id, err)
	}
	return r
}

// Del runs DEL.
func (l *Lab) Del(id, nsPath string) error { return l.DelRT(RT(id, nsPath)) }

// DelRT runs DEL with a full runtime config.
func (l *Lab) DelRT(rt *libcni.RuntimeConf) error {
	return l.InHost(func() error { return l.CNI.DelNetworkList(context.Background(), l.List, rt) })
}

// Check runs CHECK.
func (l *Lab) Check(id, nsPath string) error { return l.CheckRT(RT(id, nsPath)) }

// CheckRT runs CHECK with a full runtime config.
func (l *Lab) CheckRT(rt *libcni.RuntimeConf) error {
	return l.InHost(func() error { return l.CNI.CheckNetworkList(context.Background(), l.List, rt) })
}

// GC runs GC with the given valid container IDs (ifname eth0).
func (l *Lab) GC(valid ...string) error {
	var atts []types.GCAttachment
	for _, id := range valid {
		atts = append(atts, types.GCAttachment{ContainerID: id, IfName: "eth0"})
	}
	return l.GCArgs(&libcni.GCArgs{ValidAttachments: atts})
}

// GCArgs runs GC with full arguments.
func (l *Lab) GCArgs(args *libcni.GCArgs) error {
	return l.InHost(func() error { return l.CNI.GCNetworkList(context.Background(), l.List, args) })
}

// Status runs STATUS.
func (l *Lab) Status() error {
	return l.InHost(func() error { return l.CNI.GetStatusNetworkList(context.Background(), l.List) })
}

// Links lists the links of namespace ns by name.
func Links(t testing.TB, ns string) map[string]netlink.Link {
	t.Helper()
	out := map[string]netlink.Link{}
	if err := netns.Do(ns, func() error {
		links, err := netlinkx.LinkList()
		for _, k := range links {
			out[k.Attrs().Name] = k
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// Veths lists the names of the veths in ns, but for parked ones (DEL
// parks a pod's veth for a collector: internal/cni/parking; Parked lists
// them).
func Veths(t testing.TB, ns string) []string {
	t.Helper()
	var out []string
	for name, l := range Links(t, ns) {
		if l.Type() == "veth" && !netlinkx.IsParked(l) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Parked lists the names of the parked links in ns.
func Parked(t testing.TB, ns string) []string {
	t.Helper()
	var out []string
	for name, l := range Links(t, ns) {
		if netlinkx.IsParked(l) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Collect removes the parked links of ns, as a collector does.
func Collect(t testing.TB, ns string) {
	t.Helper()
	if err := netns.Do(ns, func() error { _, err := parking.Collect(); return err }); err != nil {
		t.Fatal(err)
	}
}

// Addrs lists "ip/len" of ifName in ns (global scope only).
func Addrs(t testing.TB, ns, ifName string) []string {
	t.Helper()
	var out []string
	if err := netns.Do(ns, func() error {
		link, err := netlinkx.LinkByName(ifName)
		if err != nil {
			return err
		}
		addrs, err := netlinkx.AddrList(link, netlink.FAMILY_ALL)
		for _, a := range addrs {
			if a.IP.IsGlobalUnicast() {
				out = append(out, a.IPNet.String())
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// NFT returns ns's nftables ruleset as text.
func NFT(t testing.TB, ns string) string {
	t.Helper()
	return testutil.RunIn(t, ns, "nft", "list", "ruleset")
}

// Sysctl reads a sysctl in ns.
func Sysctl(t testing.TB, ns, path string) string {
	t.Helper()
	b, err := exec.Command("ip", "netns", "exec", testutil.NSName(ns), "cat", filepath.Join("/proc/sys", path)).CombinedOutput()
	if err != nil {
		t.Fatalf("reading %s in %s: %v: %s", path, ns, err, b)
	}
	return strings.TrimSpace(string(b))
}

// Reservations lists the IPs reserved in the lab's dataDir.
func (l *Lab) Reservations() []string {
	l.T.Helper()
	entries, err := os.ReadDir(filepath.Join(l.DataDir, l.List.Name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		l.T.Fatal(err)
	}
	var ips []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	sort.Strings(ips)
	return ips
}

// IPOf returns r's first address of the family (v4 true: IPv4).
func IPOf(t testing.TB, r *current.Result, v4 bool) net.IP {
	t.Helper()
	for _, ip := range r.IPs {
		if (ip.Address.IP.To4() != nil) == v4 {
			return ip.Address.IP
		}
	}
	t.Fatalf("result has no address of that family: %+v", r)
	return nil
}

// Code returns the CNI error code of err, or 0.
func Code(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// Echo is a UDP echo server in a namespace. It records the source of
// every datagram it receives.
type Echo struct {
	Addr    *net.UDPAddr
	conn    *net.UDPConn
	sources chan string
}

// ServeUDP starts an echo server on ip (port chosen by the kernel) in ns.
// The socket belongs to ns because it is created inside it.
func ServeUDP(t testing.TB, ns string, ip net.IP) *Echo {
	t.Helper()
	var conn *net.UDPConn
	if err := netns.Do(ns, func() error {
		var err error
		conn, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip})
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", ip, ns, err)
	}
	e := &Echo{Addr: conn.LocalAddr().(*net.UDPAddr), conn: conn, sources: make(chan string, 100)}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			select {
			case e.sources <- from.IP.String():
			default:
			}
			_, _ = conn.WriteToUDP(buf[:n], from)
		}
	}()
	return e
}

// LastSource returns the source of the last datagram received, or "".
func (e *Echo) LastSource() string {
	last := ""
	for {
		select {
		case s := <-e.sources:
			last = s
		default:
			return last
		}
	}
}

// Exchange sends a datagram from ns to dst and waits for the echo. It
// retries a few times (the first packet may wait for neighbour
// resolution).
func Exchange(ns string, dst *net.UDPAddr) error {
	var conn *net.UDPConn
	if err := netns.Do(ns, func() error {
		var err error
		conn, err = net.DialUDP("udp", nil, dst)
		return err
	}); err != nil {
		return fmt.Errorf("dialing %s from %s: %w", dst, ns, err)
	}
	defer conn.Close()
	msg := []byte("flatnet")
	buf := make([]byte, 64)
	var last error
	for range 10 {
		if _, err := conn.Write(msg); err != nil {
			last = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := conn.Read(buf)
		if err == nil && string(buf[:n]) == string(msg) {
			return nil
		}
		last = err
	}
	return fmt.Errorf("no echo from %s (from %s): %v", dst, ns, last)
}

// MustExchange is Exchange that fails the test.
func MustExchange(t testing.TB, ns string, dst *net.UDPAddr) {
	t.Helper()
	if err := Exchange(ns, dst); err != nil {
		t.Fatal(err)
	}
}

// Outside connects ns (a lab host) to a new namespace standing for the
// world outside the node: a veth with hostIP/30 on the host side and
// outsideIP/30 outside. The outside namespace has no route back to the
// pods, so only masqueraded traffic can be answered.
func Outside(t testing.TB, host string, hostIP, outsideIP string) string {
	t.Helper()
	out := testutil.NewNetNS(t)
	testutil.Wire(t, host, testutil.Name("fno"), []string{hostIP + "/30"}, out, "eth0", []string{outsideIP + "/30"})
	return out
}
