package macvlan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netns"
)

// fakeLink is a macvlan (or another interface) in the fake kernel.
type fakeLink struct {
	kind   string
	parent int
	mode   netlink.MacvlanMode
	mac    string
	conf   *current.Result
	up     bool
}

// fakeKernel keeps interfaces per netns path; "" is the runtime's netns,
// where the masters live.
type fakeKernel struct {
	ns      map[string]map[string]*fakeLink
	masters map[string]master
	dflt    string           // default route's interface in the runtime netns
	fail    map[string]error // method name -> injected error
	calls   []string
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{
		ns:      map[string]map[string]*fakeLink{"/run/netns/c": {"lo": {kind: "device"}}},
		masters: map[string]master{"eth1": {Name: "eth1", Index: 7, MTU: 1500}},
		dflt:    "eth1",
		fail:    map[string]error{},
	}
}

func (f *fakeKernel) step(name string) error {
	f.calls = append(f.calls, name)
	return f.fail[name]
}

func (f *fakeKernel) links(path string) (map[string]*fakeLink, error) {
	l, ok := f.ns[path]
	if !ok {
		return nil, fmt.Errorf("%w: %s", netns.ErrNotExist, path)
	}
	return l, nil
}

func (f *fakeKernel) CheckNetNS(path string) error {
	if err := f.step("CheckNetNS"); err != nil {
		return err
	}
	if _, err := f.links(path); err != nil {
		return cnierr.Wrap(cnierr.UnknownContainer, err, "container netns")
	}
	return nil
}

func (f *fakeKernel) Master(name, in string) (master, error) {
	if err := f.step("Master"); err != nil {
		return master{}, err
	}
	if name == "" {
		name = f.dflt
	}
	m, ok := f.masters[name]
	if !ok {
		return master{}, cnierr.New(cnierr.InvalidConfig, "master interface %q not found", name)
	}
	return m, nil
}

func (f *fakeKernel) Exists(path, ifName string) (bool, error) {
	if err := f.step("Exists"); err != nil {
		return false, err
	}
	l, err := f.links(path)
	if err != nil {
		return false, err
	}
	_, ok := l[ifName]
	return ok, nil
}

func (f *fakeKernel) Create(p linkPlan, path string, inContainer bool) error {
	if err := f.step("Create"); err != nil {
		return err
	}
	l, err := f.links(path)
	if err != nil {
		return err
	}
	mac := "02:00:00:00:00:aa"
	if p.MAC != nil {
		mac = p.MAC.String()
	}
	l[p.TmpName] = &fakeLink{kind: "macvlan", parent: p.ParentIndex, mode: p.Mode, mac: mac}
	return nil
}

func (f *fakeKernel) Rename(path, from, to string) (*current.Interface, error) {
	if err := f.step("Rename"); err != nil {
		return nil, err
	}
	l, err := f.links(path)
	if err != nil {
		return nil, err
	}
	if _, ok := l[to]; ok {
		return nil, cnierr.New(cnierr.InterfaceExists, "%s exists", to)
	}
	l[to] = l[from]
	delete(l, from)
	return &current.Interface{Name: to, Mac: l[to].mac, Sandbox: path}, nil
}

func (f *fakeKernel) Configure(path, ifName string, res *current.Result) error {
	if err := f.step("Configure"); err != nil {
		return err
	}
	l, err := f.links(path)
	if err != nil {
		return err
	}
	l[ifName].conf = res
	l[ifName].up = true
	return nil
}

func (f *fakeKernel) Delete(path, name string) error {
	if err := f.step("Delete"); err != nil {
		return err
	}
	l, err := f.links(path)
	if err != nil {
		return err
	}
	if k, ok := l[name]; ok && k.kind == "macvlan" {
		delete(l, name)
	}
	return nil
}

func (f *fakeKernel) Observe(path, ifName string) (*observed, error) {
	if err := f.step("Observe"); err != nil {
		return nil, err
	}
	l, err := f.links(path)
	if err != nil {
		return nil, err
	}
	k, ok := l[ifName]
	if !ok {
		return nil, fmt.Errorf("%w: %s", errLinkNotFound, ifName)
	}
	o := &observed{Kind: k.kind, ParentIndex: k.parent, Mode: k.mode, MAC: k.mac}
	if k.conf != nil {
		for _, ip := range k.conf.IPs {
			o.Addrs = append(o.Addrs, ip.Address)
		}
		for _, r := range k.conf.Routes {
			d := r.Dst
			o.Routes = append(o.Routes, route{Dst: &d, GW: r.GW})
		}
	}
	return o, nil
}

// fakeIPAM hands out 10.9.0.N per (container, ifname).
type fakeIPAM struct {
	held  map[string]string
	next  int
	fail  map[string]error
	calls []string
}

func newFakeIPAM() *fakeIPAM {
	return &fakeIPAM{held: map[string]string{}, next: 2, fail: map[string]error{}}
}

func key(a *skel.CmdArgs) string { return a.ContainerID + "/" + a.IfName }

func (f *fakeIPAM) Add(_ context.Context, a *skel.CmdArgs) (*current.Result, error) {
	f.calls = append(f.calls, "Add")
	if err := f.fail["Add"]; err != nil {
		return nil, err
	}
	ip := fmt.Sprintf("10.9.0.%d", f.next)
	f.next++
	f.held[key(a)] = ip
	_, n, _ := net.ParseCIDR(ip + "/24")
	n.IP = net.ParseIP(ip)
	return &current.Result{CNIVersion: "1.1.0", IPs: []*current.IPConfig{{Address: *n, Gateway: net.ParseIP("10.9.0.1")}}}, nil
}

func (f *fakeIPAM) Del(_ context.Context, a *skel.CmdArgs) error {
	f.calls = append(f.calls, "Del")
	if err := f.fail["Del"]; err != nil {
		return err
	}
	delete(f.held, key(a))
	return nil
}

func (f *fakeIPAM) Check(_ context.Context, a *skel.CmdArgs) error {
	f.calls = append(f.calls, "Check")
	if _, ok := f.held[key(a)]; !ok {
		return cnierr.New(cnierr.CheckFailed, "no reservation for %s", key(a))
	}
	return nil
}

func (f *fakeIPAM) GC(context.Context, *skel.CmdArgs) error {
	f.calls = append(f.calls, "GC")
	return f.fail["GC"]
}

func (f *fakeIPAM) Status(context.Context, *skel.CmdArgs) error {
	f.calls = append(f.calls, "Status")
	return f.fail["Status"]
}

type fixture struct {
	k *fakeKernel
	i *fakeIPAM
	d deps
}

func newFixture() *fixture {
	k, i := newFakeKernel(), newFakeIPAM()
	return &fixture{k: k, i: i, d: deps{k: k, ipam: i, tmpName: func() string { return "fmvtmp" }}}
}

const l3Conf = `{"cniVersion":"1.1.0","name":"mv","type":"macvlan","master":"eth1","ipam":{"type":"host-local"}}`

func cmdArgs(conf string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/c", IfName: "eth0", StdinData: []byte(conf)}
}

// links lists the container netns's interfaces other than lo.
func (f *fixture) links() []string {
	var out []string
	for n := range f.k.ns["/run/netns/c"] {
		if n != "lo" {
			out = append(out, n)
		}
	}
	return out
}

func TestAddSuccessL3(t *testing.T) {
	f := newFixture()
	n := load(t, l3Conf)
	r, err := add(f.d, n, cmdArgs(l3Conf))
	if err != nil {
		t.Fatal(err)
	}
	l := f.k.ns["/run/netns/c"]["eth0"]
	if l == nil || !l.up || l.parent != 7 || l.mode != netlink.MACVLAN_MODE_BRIDGE || l.conf == nil || len(l.conf.IPs) != 1 {
		t.Fatalf("link after ADD = %+v", l)
	}
	if len(r.Interfaces) != 1 || r.Interfaces[0].Sandbox != "/run/netns/c" || r.IPs[0].Address.String() != "10.9.0.2/24" {
		t.Errorf("result = %+v", r)
	}
	if f.i.held["c1/eth0"] != "10.9.0.2" {
		t.Errorf("reservations = %v", f.i.held)
	}
	if got := strings.Join(f.k.calls, ","); got != "CheckNetNS,Master,Exists,Create,Rename,Configure" {
		t.Errorf("kernel steps = %s", got)
	}
}

func TestAddL2(t *testing.T) {
	f := newFixture()
	conf := `{"cniVersion":"1.1.0","name":"mv","type":"macvlan","ipam":{}}`
	r, err := add(f.d, load(t, conf), cmdArgs(conf))
	if err != nil {
		t.Fatal(err)
	}
	l := f.k.ns["/run/netns/c"]["eth0"]
	if l == nil || !l.up || l.conf != nil || len(r.IPs) != 0 || len(f.i.calls) != 0 {
		t.Fatalf("L2 ADD: link %+v, result %+v, ipam calls %v", l, r, f.i.calls)
	}
}

// Every failure after the link exists must leave neither a link nor a
// reservation behind.
func TestAddRollback(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		set  func(f *fixture)
	}{
		{"rename", func(f *fixture) { f.k.fail["Rename"] = boom }},
		{"ipam add", func(f *fixture) { f.i.fail["Add"] = cnierr.New(cnierr.RangeExhausted, "full") }},
		{"configure", func(f *fixture) { f.k.fail["Configure"] = boom }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture()
			tc.set(f)
			_, err := add(f.d, load(t, l3Conf), cmdArgs(l3Conf))
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			if got := f.links(); len(got) != 0 {
				t.Errorf("links left behind: %v", got)
			}
			if len(f.i.held) != 0 {
				t.Errorf("reservations left behind: %v", f.i.held)
			}
			if tc.name == "ipam add" {
				if code, _ := cnierr.Code(err); code != cnierr.RangeExhausted {
					t.Errorf("IPAM's code lost: %v", err)
				}
				if strings.Contains(strings.Join(f.i.calls, ","), "Del") {
					t.Error("IPAM DEL after a failed IPAM ADD could release another attachment's address")
				}
			}
		})
	}
}

func TestAddRollbackFailureIsReported(t *testing.T) {
	f := newFixture()
	f.k.fail["Configure"] = errors.New("configure broke")
	f.k.fail["Delete"] = errors.New("delete broke")
	_, err := add(f.d, load(t, l3Conf), cmdArgs(l3Conf))
	if err == nil || !strings.Contains(err.Error(), "configure broke") || !strings.Contains(err.Error(), "delete broke") {
		t.Fatalf("err = %v", err)
	}
	if len(f.i.held) != 0 {
		t.Error("the reservation must be released even when deleting the link failed")
	}
}

func TestAddRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		conf string
		set  func(f *fixture)
		code uint
		msg  string
	}{
		{"ifname exists", l3Conf, func(f *fixture) { f.k.ns["/run/netns/c"]["eth0"] = &fakeLink{kind: "veth"} }, cnierr.InterfaceExists, "eth0 already exists"},
		{"missing master", strings.Replace(l3Conf, `"eth1"`, `"eth9"`, 1), func(*fixture) {}, cnierr.InvalidConfig, `"eth9"`},
		{"no default route", `{"cniVersion":"1.1.0","name":"mv","type":"macvlan"}`, func(f *fixture) { f.k.dflt = "" }, cnierr.InvalidConfig, "not found"},
		{"missing netns", l3Conf, func(f *fixture) { delete(f.k.ns, "/run/netns/c") }, cnierr.UnknownContainer, "/run/netns/c"},
		{"mtu above master", strings.Replace(l3Conf, `"master"`, `"mtu":9000,"master"`, 1), func(*fixture) {}, cnierr.InvalidConfig, "MTU 1500"},
		{"kernel without macvlan", l3Conf, func(f *fixture) {
			f.k.fail["Create"] = cnierr.New(cnierr.KernelFeatureMissing, "no macvlan")
		}, cnierr.KernelFeatureMissing, "no macvlan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture()
			tc.set(f)
			err := cmdAdd(f.d, cmdArgs(tc.conf))
			code, _ := cnierr.Code(err)
			if code != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v (code %d), want %d mentioning %q", err, code, tc.code, tc.msg)
			}
			if len(f.i.held) != 0 || strings.Contains(strings.Join(f.i.calls, ","), "Add") {
				t.Errorf("IPAM touched: %v", f.i.calls)
			}
			for _, l := range f.links() {
				if f.k.ns["/run/netns/c"][l].kind == "macvlan" {
					t.Errorf("macvlan %s left behind", l)
				}
			}
		})
	}
}

func TestDel(t *testing.T) {
	f := newFixture()
	args := cmdArgs(l3Conf)
	if _, err := add(f.d, load(t, l3Conf), args); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := cmdDel(f.d, args); err != nil {
			t.Fatalf("DEL %d: %v", i+1, err)
		}
		if len(f.links()) != 0 || len(f.i.held) != 0 {
			t.Fatalf("after DEL %d: links %v, reservations %v", i+1, f.links(), f.i.held)
		}
	}
	// Netns gone, or not given: the reservation is still released.
	if _, err := add(f.d, load(t, l3Conf), args); err != nil {
		t.Fatal(err)
	}
	delete(f.k.ns, "/run/netns/c")
	if err := cmdDel(f.d, args); err != nil {
		t.Fatalf("DEL with the netns gone: %v", err)
	}
	if len(f.i.held) != 0 {
		t.Errorf("reservation kept: %v", f.i.held)
	}
	noNS := *args
	noNS.Netns = ""
	f.i.held["c1/eth0"] = "10.9.0.9"
	if err := cmdDel(f.d, &noNS); err != nil || len(f.i.held) != 0 {
		t.Errorf("DEL without CNI_NETNS: %v, reservations %v", err, f.i.held)
	}
	// A config ADD refused (bad mode) must still DEL cleanly.
	if err := cmdDel(f.d, cmdArgs(`{"cniVersion":"1.1.0","name":"mv","mode":"bogus","ipam":{"type":"host-local"}}`)); err != nil {
		t.Errorf("DEL with an invalid mode: %v", err)
	}
}

func TestDelLeavesForeignInterface(t *testing.T) {
	f := newFixture()
	f.k.ns["/run/netns/c"]["eth0"] = &fakeLink{kind: "veth"}
	if err := cmdDel(f.d, cmdArgs(l3Conf)); err != nil {
		t.Fatal(err)
	}
	if f.k.ns["/run/netns/c"]["eth0"] == nil {
		t.Error("DEL removed a veth it did not create")
	}
}

func TestCheck(t *testing.T) {
	f := newFixture()
	args := cmdArgs(l3Conf)
	own, err := add(f.d, load(t, l3Conf), args)
	if err != nil {
		t.Fatal(err)
	}
	withPrev := func(r *current.Result) *skel.CmdArgs {
		b, _ := r.GetAsVersion("1.1.0")
		js := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mv","type":"macvlan","master":"eth1","ipam":{"type":"host-local"},"prevResult":%s}`, mustJSON(t, b))
		a := *args
		a.StdinData = []byte(js)
		return &a
	}
	if err := cmdCheck(f.d, withPrev(own)); err != nil {
		t.Fatalf("CHECK right after ADD: %v", err)
	}
	// prevResult missing: a config error.
	if err := cmdCheck(f.d, args); err == nil {
		t.Error("CHECK without prevResult passed")
	}
	for _, tc := range []struct {
		name string
		set  func(f *fixture)
		code uint
	}{
		{"link gone", func(f *fixture) { delete(f.k.ns["/run/netns/c"], "eth0") }, cnierr.CheckFailed},
		{"mode changed", func(f *fixture) { f.k.ns["/run/netns/c"]["eth0"].mode = netlink.MACVLAN_MODE_PRIVATE }, cnierr.CheckFailed},
		{"master gone", func(f *fixture) { delete(f.k.masters, "eth1") }, cnierr.CheckFailed},
		{"reservation gone", func(f *fixture) { delete(f.i.held, "c1/eth0") }, cnierr.CheckFailed},
		{"netns gone", func(f *fixture) { delete(f.k.ns, "/run/netns/c") }, cnierr.UnknownContainer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture()
			own, err := add(f.d, load(t, l3Conf), args)
			if err != nil {
				t.Fatal(err)
			}
			tc.set(f)
			err = cmdCheck(f.d, withPrev(own))
			if code, _ := cnierr.Code(err); code != tc.code {
				t.Fatalf("err = %v (code %d), want %d", err, code, tc.code)
			}
		})
	}
}

func TestGCAndStatus(t *testing.T) {
	f := newFixture()
	gc := cmdArgs(`{"cniVersion":"1.1.0","name":"mv","type":"macvlan","master":"eth1","ipam":{"type":"host-local"},"cni.dev/valid-attachments":[]}`)
	if err := cmdGC(f.d, gc); err != nil || strings.Join(f.i.calls, ",") != "GC" {
		t.Fatalf("GC: %v, ipam calls %v", err, f.i.calls)
	}
	f.i.fail["GC"] = cnierr.New(cnierr.IOFailure, "disk")
	if err := cmdGC(f.d, gc); err == nil {
		t.Error("IPAM GC error swallowed")
	}
	f = newFixture()
	if err := cmdGC(f.d, cmdArgs(`{"cniVersion":"1.1.0","name":"mv","type":"macvlan","cni.dev/valid-attachments":[]}`)); err != nil || len(f.i.calls) != 0 {
		t.Errorf("L2 GC: %v, ipam calls %v", err, f.i.calls)
	}

	if err := cmdStatus(f.d, cmdArgs(l3Conf)); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	f.i.fail["Status"] = cnierr.New(cnierr.PluginNotAvailable, "range full")
	if err := cmdStatus(f.d, cmdArgs(l3Conf)); err == nil || !strings.Contains(err.Error(), "range full") {
		t.Errorf("IPAM STATUS error not passed on: %v", err)
	}
	f = newFixture()
	delete(f.k.masters, "eth1")
	err := cmdStatus(f.d, cmdArgs(l3Conf))
	if code, _ := cnierr.Code(err); code != cnierr.PluginNotAvailable || !strings.Contains(err.Error(), `"eth1"`) {
		t.Errorf("STATUS with the master missing: %v (code %d), want 50 naming eth1", err, code)
	}
	inCont := `{"cniVersion":"1.1.0","name":"mv","type":"macvlan","master":"eth1","linkInContainer":true}`
	if err := cmdStatus(f.d, cmdArgs(inCont)); err != nil {
		t.Errorf("STATUS with linkInContainer cannot see the master and must not fail: %v", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
