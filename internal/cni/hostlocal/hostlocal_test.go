package hostlocal_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/hostlocal"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// conf is a full network config as a main plugin (or libcni) passes it:
// host-local reads its "ipam" block plus name, cniVersion, args and
// runtimeConfig.
func conf(t *testing.T, dataDir, version, ranges string, extra ...string) []byte {
	t.Helper()
	s := fmt.Sprintf(`{"cniVersion":%q,"name":"testnet","type":"bridge",%s"ipam":{"type":"host-local","dataDir":%q,"ranges":%s}}`,
		version, strings.Join(extra, ""), dataDir, ranges)
	if !json.Valid([]byte(s)) {
		t.Fatalf("bad test config %s", s)
	}
	return []byte(s)
}

const dual = `[[{"subnet":"10.77.0.0/29"}],[{"subnet":"fd00:77::/125"}]]`

func cmdArgs(stdin []byte, id, ifname string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: id, IfName: ifname, Netns: "/var/run/netns/none", StdinData: stdin}
}

func ips(r *current.Result) []string {
	var out []string
	for _, ip := range r.IPs {
		out = append(out, ip.Address.String())
	}
	return out
}

// files lists DIR/testnet as name=content.
func files(t *testing.T, dataDir string) []string {
	t.Helper()
	dir := filepath.Join(dataDir, "testnet")
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out = append(out, e.Name()+"="+string(b))
	}
	sort.Strings(out)
	return out
}

func wantCode(t *testing.T, err error, code uint, mention string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want code %d", code)
	}
	if c, _ := cnierr.Code(err); c != code {
		t.Fatalf("error %q: code %d, want %d", err, c, code)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Fatalf("error %q does not mention %q", err, mention)
	}
}

func TestAddCheckDel(t *testing.T) {
	dd := t.TempDir()
	c := conf(t, dd, "1.1.0", dual, `"runtimeConfig":{},`)
	r1, err := hostlocal.Add(cmdArgs(c, "c1", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := hostlocal.Add(cmdArgs(c, "c2", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.77.0.2/29", "fd00:77::2/125"}, ips(r1)); diff != "" {
		t.Errorf("c1 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.77.0.3/29", "fd00:77::3/125"}, ips(r2)); diff != "" {
		t.Errorf("c2 (-want +got):\n%s", diff)
	}
	if r1.IPs[0].Gateway.String() != "10.77.0.1" || r1.IPs[1].Gateway.String() != "fd00:77::1" {
		t.Errorf("gateways %v %v", r1.IPs[0].Gateway, r1.IPs[1].Gateway)
	}
	want := []string{
		"10.77.0.2=c1\r\neth0", "10.77.0.3=c2\r\neth0",
		"fd00:77::2=c1\r\neth0", "fd00:77::3=c2\r\neth0",
		"last_reserved_ip.0=10.77.0.3", "last_reserved_ip.1=fd00:77::3", "lock=",
	}
	if diff := cmp.Diff(want, files(t, dd)); diff != "" {
		t.Errorf("on disk (-want +got):\n%s", diff)
	}

	// A second ADD of the same attachment is refused and changes nothing.
	_, err = hostlocal.Add(cmdArgs(c, "c1", "eth0"))
	wantCode(t, err, cnierr.AddressInUse, "duplicate allocation")
	if diff := cmp.Diff(want, files(t, dd)); diff != "" {
		t.Errorf("duplicate ADD changed disk (-want +got):\n%s", diff)
	}

	// CHECK without and with prevResult.
	if err := hostlocal.Check(cmdArgs(c, "c1", "eth0")); err != nil {
		t.Fatalf("CHECK c1: %v", err)
	}
	withPrev := func(r *current.Result) []byte {
		var m map[string]any
		json.Unmarshal(c, &m)
		r.CNIVersion = "1.1.0"
		b, _ := json.Marshal(r)
		var pr map[string]any
		json.Unmarshal(b, &pr)
		m["prevResult"] = pr
		out, _ := json.Marshal(m)
		return out
	}
	if err := hostlocal.Check(cmdArgs(withPrev(r1), "c1", "eth0")); err != nil {
		t.Fatalf("CHECK c1 with its prevResult: %v", err)
	}
	err = hostlocal.Check(cmdArgs(withPrev(r2), "c1", "eth0"))
	wantCode(t, err, cnierr.CheckFailed, "10.77.0.3")
	partial := &current.Result{IPs: r1.IPs[:1]}
	err = hostlocal.Check(cmdArgs(withPrev(partial), "c1", "eth0"))
	wantCode(t, err, cnierr.CheckFailed, "fd00:77::2 is reserved")
	err = hostlocal.Check(cmdArgs(c, "c1", "eth1"))
	wantCode(t, err, cnierr.CheckFailed, `interface "eth1"`)
	err = hostlocal.Check(cmdArgs(c, "nobody", "eth0"))
	wantCode(t, err, cnierr.CheckFailed, `container "nobody"`)

	// DEL releases exactly c1/eth0, is idempotent, and round robin goes on
	// after the last reserved address rather than reusing c1's.
	for i := 0; i < 2; i++ {
		if err := hostlocal.Del(cmdArgs(c, "c1", "eth0")); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if err := hostlocal.Del(cmdArgs(c, "never-added", "eth0")); err != nil {
		t.Fatalf("DEL of nothing: %v", err)
	}
	err = hostlocal.Check(cmdArgs(c, "c1", "eth0"))
	wantCode(t, err, cnierr.CheckFailed, "no address reserved")
	r3, err := hostlocal.Add(cmdArgs(c, "c3", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.77.0.4/29", "fd00:77::4/125"}, ips(r3)); diff != "" {
		t.Errorf("c3 (-want +got):\n%s", diff)
	}
}

func TestDelOfNeverUsedDataDir(t *testing.T) {
	dd := filepath.Join(t.TempDir(), "not", "yet")
	if err := hostlocal.Del(cmdArgs(conf(t, dd, "1.0.0", dual), "c1", "eth0")); err != nil {
		t.Fatal(err)
	}
}

func TestExhaustionAndStatus(t *testing.T) {
	dd := t.TempDir()
	c := conf(t, dd, "1.1.0", `[[{"subnet":"10.78.0.0/29","rangeStart":"10.78.0.4"}],[{"subnet":"fd00:78::/64"}]]`)
	if err := hostlocal.Status(cmdArgs(c, "", "")); err != nil {
		t.Fatalf("STATUS of an empty network: %v", err)
	}
	for i := 4; i <= 6; i++ {
		if _, err := hostlocal.Add(cmdArgs(c, fmt.Sprint("c", i), "eth0")); err != nil {
			t.Fatal(err)
		}
	}
	before := files(t, dd)
	_, err := hostlocal.Add(cmdArgs(c, "c7", "eth0"))
	wantCode(t, err, cnierr.RangeExhausted, "10.78.0.4-10.78.0.6")
	if !strings.Contains(err.Error(), "ipam.ranges[0]") {
		t.Errorf("error %q does not name the range set", err)
	}
	if diff := cmp.Diff(before, files(t, dd)); diff != "" {
		t.Errorf("failed ADD left reservations (-before +after):\n%s", diff)
	}
	for _, what := range []string{"usable addresses: 3, all reserved", filepath.Join(dd, "testnet"), "larger range"} {
		if !strings.Contains(err.Error(), what) {
			t.Errorf("error %q does not say %q", err, what)
		}
	}
	// A full range is no reason to call the network not ready: under
	// containerd that makes the node NotReady and evicts its pods.
	if err := hostlocal.Status(cmdArgs(c, "", "")); err != nil {
		t.Errorf("STATUS of a full network: %v, want ready", err)
	}
	if err := hostlocal.Del(cmdArgs(c, "c5", "eth0")); err != nil {
		t.Fatal(err)
	}
	if err := hostlocal.Status(cmdArgs(c, "", "")); err != nil {
		t.Fatalf("STATUS after a DEL: %v", err)
	}
	// The only free address is found by the next ADD.
	r, err := hostlocal.Add(cmdArgs(c, "c8", "eth0"))
	if err != nil || r.IPs[0].Address.IP.String() != "10.78.0.5" {
		t.Fatalf("got %v, %v", r, err)
	}
}

func TestStatusDataDirNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "afile")
	os.WriteFile(file, nil, 0o600)
	err := hostlocal.Status(cmdArgs(conf(t, file, "1.1.0", dual), "", ""))
	wantCode(t, err, cnierr.PluginNotAvailable, "dataDir")
	if os.Geteuid() != 0 { // root ignores mode bits
		ro := t.TempDir()
		os.MkdirAll(filepath.Join(ro, "testnet"), 0o755)
		os.Chmod(filepath.Join(ro, "testnet"), 0o555)
		t.Cleanup(func() { os.Chmod(filepath.Join(ro, "testnet"), 0o755) })
		err := hostlocal.Status(cmdArgs(conf(t, ro, "1.1.0", dual), "", ""))
		wantCode(t, err, cnierr.PluginNotAvailable, "not writable")
	}
	// Bad config is still code 7, not 50.
	err = hostlocal.Status(cmdArgs(conf(t, t.TempDir(), "1.1.0", `[[{"subnet":"10.0.0.0/40"}]]`), "", ""))
	wantCode(t, err, cnierr.InvalidConfig, "subnet")
}

func TestStaticRequests(t *testing.T) {
	dd := t.TempDir()
	c := conf(t, dd, "1.0.0", dual, `"runtimeConfig":{"ips":["10.77.0.5/29","fd00:77::6"]},`)
	r, err := hostlocal.Add(cmdArgs(c, "c1", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.77.0.5/29", "fd00:77::6/125"}, ips(r)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	_, err = hostlocal.Add(cmdArgs(c, "c2", "eth0"))
	wantCode(t, err, cnierr.AddressInUse, `10.77.0.5 is already reserved by container "c1"`)

	plain := conf(t, dd, "1.0.0", dual)
	a := cmdArgs(plain, "c3", "eth0")
	a.Args = "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.99.0.1"
	_, err = hostlocal.Add(a)
	wantCode(t, err, cnierr.AddressNotInRange, "10.99.0.1 is not in any range set")
	a.Args = "IP=10.77.0.6"
	r, err = hostlocal.Add(a)
	if err != nil || r.IPs[0].Address.String() != "10.77.0.6/29" {
		t.Fatalf("IP= arg: %v %v", r, err)
	}
	ac := cmdArgs(conf(t, dd, "1.0.0", dual, `"args":{"cni":{"ips":["10.77.0.1"]}},`), "c4", "eth0")
	_, err = hostlocal.Add(ac)
	wantCode(t, err, cnierr.AddressInUse, "gateway")
}

func TestIPRangesCapability(t *testing.T) {
	dd := t.TempDir()
	// Runtime ranges are prepended (set 0), as in the reference.
	c := conf(t, dd, "1.0.0", `[[{"subnet":"fd00:79::/64"}]]`, `"runtimeConfig":{"ipRanges":[[{"subnet":"10.79.3.0/24","rangeStart":"10.79.3.100"}]]},`)
	r, err := hostlocal.Add(cmdArgs(c, "c1", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.79.3.100/24", "fd00:79::2/64"}, ips(r)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestResolvConfAndRoutes(t *testing.T) {
	dd := t.TempDir()
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(rc, []byte("# comment\nnameserver 10.0.0.10\nnameserver fd00::10\ndomain example.test\nsearch a.test b.test\noptions ndots:5\n"), 0o644)
	c := []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"testnet","ipam":{"type":"host-local","dataDir":%q,
		"subnet":"10.80.0.0/24","resolvConf":%q,"routes":[{"dst":"0.0.0.0/0"},{"dst":"10.81.0.0/16","gw":"10.80.0.254"}]}}`, dd, rc))
	r, err := hostlocal.Add(cmdArgs(c, "c1", "eth0"))
	if err != nil {
		t.Fatal(err)
	}
	wantDNS := `{"nameservers":["10.0.0.10","fd00::10"],"domain":"example.test","search":["a.test","b.test"],"options":["ndots:5"]}`
	if b, _ := json.Marshal(r.DNS); string(b) != wantDNS {
		t.Errorf("DNS %s, want %s", b, wantDNS)
	}
	var routes []string
	for _, rt := range r.Routes {
		routes = append(routes, rt.String())
	}
	if len(r.Routes) != 2 || r.Routes[1].GW.String() != "10.80.0.254" || r.Routes[1].Dst.String() != "10.81.0.0/16" {
		t.Errorf("routes %v", routes)
	}
	// Missing resolv.conf: code 7, nothing reserved.
	bad := []byte(strings.Replace(string(c), rc, rc+".missing", 1))
	_, err = hostlocal.Add(cmdArgs(bad, "c2", "eth0"))
	wantCode(t, err, cnierr.InvalidConfig, "resolvConf")
}

func TestGC(t *testing.T) {
	for _, key := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		t.Run(key, func(t *testing.T) {
			dd := t.TempDir()
			c := conf(t, dd, "1.1.0", dual)
			for _, id := range []string{"keep", "drop1", "drop2"} {
				if _, err := hostlocal.Add(cmdArgs(c, id, "eth0")); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := hostlocal.Add(cmdArgs(c, "keep", "net1")); err != nil {
				t.Fatal(err)
			}
			// Files as the reference writes them (and a legacy one from
			// before ifnames were recorded), plus files that are not
			// reservations.
			dir := filepath.Join(dd, "testnet")
			os.WriteFile(filepath.Join(dir, "10.77.0.7"), []byte("refmade\r\neth0"), 0o600)
			os.WriteFile(filepath.Join(dir, "fd00:77::7"), []byte("oldkeep"), 0o600)
			os.WriteFile(filepath.Join(dir, "fd00:77::6"), []byte("olddrop"), 0o600)
			os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("drop1\r\neth0"), 0o600)

			gc := conf(t, dd, "1.1.0", dual, fmt.Sprintf(`%q:[{"containerID":"keep","ifname":"eth0"},{"containerID":"oldkeep","ifname":"eth0"},{"containerID":"gone","ifname":"eth0"}],`, key))
			if err := hostlocal.GC(cmdArgs(gc, "", "")); err != nil {
				t.Fatal(err)
			}
			want := []string{
				"10.77.0.2=keep\r\neth0",
				"fd00:77::2=keep\r\neth0",
				"fd00:77::7=oldkeep",
				"last_reserved_ip.0=10.77.0.5", "last_reserved_ip.1=fd00:77::5",
				"lock=", "notes.txt=drop1\r\neth0",
			}
			if diff := cmp.Diff(want, files(t, dd)); diff != "" {
				t.Errorf("after GC (-want +got):\n%s", diff)
			}
			// The freed addresses are usable again.
			if err := hostlocal.Status(cmdArgs(c, "", "")); err != nil {
				t.Fatal(err)
			}
			// No list at all is refused, not read as "nothing in use".
			held := files(t, dd)
			wantCode(t, hostlocal.GC(cmdArgs(c, "", "")), cnierr.InvalidConfig, "cni.dev/valid-attachments")
			if diff := cmp.Diff(held, files(t, dd)); diff != "" {
				t.Errorf("GC without a list freed reservations (-before +after):\n%s", diff)
			}
			// An empty list frees everything.
			gc = conf(t, dd, "1.1.0", dual, fmt.Sprintf(`%q:[],`, key))
			if err := hostlocal.GC(cmdArgs(gc, "", "")); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"last_reserved_ip.0=10.77.0.5", "last_reserved_ip.1=fd00:77::5", "lock=", "notes.txt=drop1\r\neth0"}, files(t, dd)); diff != "" {
				t.Errorf("after empty GC (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBadConfigCodes(t *testing.T) {
	dd := t.TempDir()
	for _, tc := range []struct {
		conf    []byte
		code    uint
		mention string
	}{
		{conf(t, dd, "1.0.0", `[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.1"}]]`), cnierr.InvalidConfig, "ipam.ranges[0][0].rangeStart"},
		{conf(t, dd, "1.0.0", `[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.128/25"}]]`), cnierr.InvalidConfig, "overlaps"},
		{conf(t, dd, "1.0.0", `[[{"subnet":"10.0.0.0/24x"}]]`), cnierr.InvalidConfig, "ipam.ranges[0][0].subnet"},
		{[]byte(`{"cniVersion":"1.0.0","name":"n","ipam":`), cnierr.DecodingFailure, "decoding"},
	} {
		for verb, fn := range map[string]func(*skel.CmdArgs) error{
			"ADD": func(a *skel.CmdArgs) error { _, err := hostlocal.Add(a); return err },
			"DEL": hostlocal.Del, "CHECK": hostlocal.Check, "GC": hostlocal.GC, "STATUS": hostlocal.Status,
		} {
			t.Run(verb, func(t *testing.T) {
				wantCode(t, fn(cmdArgs(tc.conf, "c1", "eth0")), tc.code, tc.mention)
			})
		}
	}
	if es, _ := os.ReadDir(dd); len(es) != 0 {
		t.Errorf("bad configs created state in dataDir: %v", es)
	}
}

func testutilCNIPath(t *testing.T) string { return testutil.CNIPath(t) }
