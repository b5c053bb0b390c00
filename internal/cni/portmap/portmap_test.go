package portmap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/nft"
)

// testEnv runs the verbs against fakes.
type testEnv struct {
	env
	nft         *nft.Fake
	ipt         *ipt.Fake
	out, log    bytes.Buffer
	nftMissing  bool
	iptMissing  bool
	probeErr    error
	localnet    []netip.Addr
	localnetErr error
	flushed     []string
	flushErr    error
}

func newTestEnv() *testEnv {
	te := &testEnv{nft: nft.NewFake(knftables.InetFamily, nftTable), ipt: ipt.NewFake()}
	te.env = env{
		newNFT: func() (nft.Interface, error) {
			if te.nftMissing {
				// What ipmasq.NewNFT returns when nf_tables does not answer.
				return nil, cnierr.New(cnierr.KernelFeatureMissing, "nftables is not available over netlink (test)")
			}
			return te.nft, nil
		},
		probeNFT: func(context.Context) error { return te.probeErr },
		ipt:      te.ipt,
		iptAvailable: func(ipt.Protocol) error {
			if te.iptMissing {
				return fmt.Errorf("%w: test", ipt.ErrNoIPTables)
			}
			return nil
		},
		routeLocalnet: func(a netip.Addr) error {
			te.localnet = append(te.localnet, a)
			return te.localnetErr
		},
		flushUDP: func(ports4, ports6 []uint16) error {
			if len(ports4)+len(ports6) > 0 {
				te.flushed = append(te.flushed, fmt.Sprintf("v4 %v v6 %v", ports4, ports6))
			}
			return te.flushErr
		},
		lock:   func() (func(), error) { return func() {}, nil },
		stdout: &te.out,
		stderr: &te.log,
	}
	return te
}

const prevResult = `{"cniVersion":"1.0.0",
	"interfaces":[{"name":"vethhost"},{"name":"eth0","sandbox":"/var/run/netns/x"}],
	"ips":[{"address":"10.9.9.9/24","interface":0},{"address":"10.1.0.2/24","interface":1},{"address":"fd00::2/64","interface":1}]}`

func conf(extra, mappings string, withPrev bool) []byte {
	s := `{"cniVersion":"1.0.0","name":"net1","type":"portmap"` + extra
	if mappings != "" {
		s += `,"runtimeConfig":{"portMappings":[` + mappings + `]}`
	}
	if withPrev {
		s += `,"prevResult":` + prevResult
	}
	return []byte(s + "}")
}

const mapsA = `{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":5353,"containerPort":53,"protocol":"udp","hostIP":"10.0.0.1"}`

func args(stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "ctr1", Netns: "/var/run/netns/x", IfName: "eth0", StdinData: stdin}
}

func wantCode(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("succeeded, want code %d", code)
	}
	if got, _ := cnierr.Code(err); got != code || !strings.Contains(err.Error(), msg) {
		t.Fatalf("got code %d %q, want %d mentioning %q", got, err, code, msg)
	}
}

func TestVerbsNFT(t *testing.T) {
	te := newTestEnv()
	if err := te.cmdAdd(args(conf("", mapsA, true))); err != nil {
		t.Fatal(err)
	}
	// ADD passes prevResult through.
	var got current.Result
	if err := json.Unmarshal(te.out.Bytes(), &got); err != nil || len(got.IPs) != 3 || got.IPs[1].Address.String() != "10.1.0.2/24" {
		t.Fatalf("ADD output %s: %v", te.out.String(), err)
	}
	wantDump(t, "ADD", te.nft.Dump(), nftA)
	if fmt.Sprint(te.localnet) != "[10.1.0.2]" {
		t.Errorf("route_localnet for %v, want [10.1.0.2]", te.localnet)
	}
	if fmt.Sprint(te.flushed) != "[v4 [5353] v6 []]" {
		t.Errorf("UDP conntrack flushed for %v", te.flushed)
	}
	if err := te.cmdCheck(args(conf("", mapsA, true))); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := te.cmdDel(args(conf("", mapsA, false))); err != nil {
		t.Fatalf("DEL without prevResult: %v", err)
	}
	if d := te.nft.Dump(); strings.Contains(d, "dnat-") || !strings.Contains(d, "chain inet flatnet-portmap hostports") {
		t.Fatalf("after DEL, want the skeleton only:\n%s", d)
	}
	if err := te.cmdDel(args(conf("", mapsA, false))); err != nil {
		t.Fatalf("DEL twice: %v", err)
	}
	wantCode(t, te.cmdCheck(args(conf("", mapsA, true))), cnierr.CheckFailed, "jump rules")
}

// DEL flushes the UDP flows of the families the pod had an address of,
// to the ports mapped in them; without prevResult, every family a mapping
// allows.
func TestDelFlushesThePodsFamilies(t *testing.T) {
	const v4Only = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.1.0.2/24","interface":0}]}`
	const anyIP = `{"hostPort":5353,"containerPort":53,"protocol":"udp"},{"hostPort":8080,"containerPort":80,"protocol":"tcp"}`
	for _, c := range []struct {
		name, mappings, prev, want string
	}{
		{"dual-stack pod", anyIP, prevResult, "[v4 [5353] v6 [5353]]"},
		{"IPv4 pod", anyIP, v4Only, "[v4 [5353] v6 []]"},
		{"no prevResult", anyIP, "", "[v4 [5353] v6 [5353]]"},
		{"no prevResult, an IPv4 hostIP", mapsA, "", "[v4 [5353] v6 []]"},
		{"a broken prevResult", anyIP, `{"cniVersion":"1.0.0","ips":"none"}`, "[v4 [5353] v6 [5353]]"},
	} {
		te := newTestEnv()
		stdin := conf("", c.mappings, false)
		if c.prev != "" {
			stdin = []byte(strings.TrimSuffix(string(stdin), "}") + `,"prevResult":` + c.prev + "}")
		}
		if err := te.cmdDel(args(stdin)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := fmt.Sprint(te.flushed); got != c.want {
			t.Errorf("%s: flushed %s, want %s", c.name, got, c.want)
		}
	}
}

func TestVerbsIPTables(t *testing.T) {
	te := newTestEnv()
	if err := te.cmdAdd(args(conf(`,"backend":"iptables"`, mapsA, true))); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "ADD v4", te.ipt.Dump(ipt.IPv4, "nat"), iptAv4)
	wantDump(t, "ADD v6", te.ipt.Dump(ipt.IPv6, "nat"), iptAv6)
	if te.nft.Dump() != "" {
		t.Errorf("iptables backend wrote nftables rules:\n%s", te.nft.Dump())
	}
	if err := te.cmdCheck(args(conf(`,"backend":"iptables"`, mapsA, true))); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := te.cmdDel(args(conf(`,"backend":"iptables"`, mapsA, false))); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{te.ipt.Dump(ipt.IPv4, "nat"), te.ipt.Dump(ipt.IPv6, "nat")} {
		if strings.Contains(d, iptChainPrefix) || !strings.Contains(d, ":"+iptTopDNAT) {
			t.Fatalf("after DEL, want the skeleton only:\n%s", d)
		}
	}
}

func TestFallbackToIPTables(t *testing.T) {
	te := newTestEnv()
	te.nftMissing = true
	if err := te.cmdAdd(args(conf("", mapsA, true))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(te.log.String(), "falling back to the iptables backend") {
		t.Errorf("no fallback note on stderr: %q", te.log.String())
	}
	wantDump(t, "ADD v4", te.ipt.Dump(ipt.IPv4, "nat"), iptAv4)
	if err := te.cmdDel(args(conf("", mapsA, true))); err != nil {
		t.Fatal(err)
	}
	if d := te.ipt.Dump(ipt.IPv4, "nat"); strings.Contains(d, iptChainPrefix) {
		t.Fatalf("after DEL:\n%s", d)
	}

	// An explicit nftables backend does not fall back.
	wantCode(t, te.cmdAdd(args(conf(`,"backend":"nftables"`, mapsA, true))), cnierr.KernelFeatureMissing, "nftables backend is not available")
}

func TestNoBackend(t *testing.T) {
	te := newTestEnv()
	te.nftMissing, te.iptMissing = true, true
	wantCode(t, te.cmdAdd(args(conf("", mapsA, true))), cnierr.KernelFeatureMissing, "neither nftables nor iptables")
	wantCode(t, te.cmdStatus(args(conf("", "", false))), cnierr.PluginNotAvailable, "neither nftables nor iptables")
	if err := te.cmdDel(args(conf("", mapsA, true))); err != nil {
		t.Fatalf("DEL with no backend: %v", err)
	}
	if err := te.cmdGC(args([]byte(`{"cniVersion":"1.1.0","name":"net1","cni.dev/valid-attachments":[]}`))); err != nil {
		t.Fatalf("GC with no backend: %v", err)
	}
}

func TestAddErrors(t *testing.T) {
	te := newTestEnv()
	wantCode(t, te.cmdAdd(args(conf("", mapsA, false))), cnierr.InvalidConfig, "no prevResult")
	wantCode(t, te.cmdAdd(args(conf("", `{"hostPort":80,"containerPort":80},{"hostPort":70000,"containerPort":80,"protocol":"udp"}`, true))),
		cnierr.InvalidConfig, `portMappings[1] {"hostPort":70000`)
	wantCode(t, te.cmdAdd(args(conf("", `{"hostPort":80,"containerPort":80,"protocol":"icmp"}`, true))), cnierr.InvalidConfig, "icmp")
	if te.nft.Dump() != "" {
		t.Fatalf("rules after failed ADDs:\n%s", te.nft.Dump())
	}
	// DEL after such a failed ADD succeeds.
	if err := te.cmdDel(args(conf("", `{"hostPort":70000,"containerPort":80}`, false))); err != nil {
		t.Fatalf("DEL of an invalid config: %v", err)
	}
}

func TestFailedAddLeavesNoRule(t *testing.T) {
	te := newTestEnv()
	te.localnetErr = errors.New("injected sysctl failure")
	wantCode(t, te.cmdAdd(args(conf("", mapsA, true))), cnierr.Internal, "injected sysctl failure")
	wantDump(t, "nft after failed ADD", te.nft.Dump(), "")

	te = newTestEnv()
	te.localnetErr = errors.New("injected sysctl failure")
	wantCode(t, te.cmdAdd(args(conf(`,"backend":"iptables"`, mapsA, true))), cnierr.Internal, "injected")
	wantDump(t, "ipt v4 after failed ADD", te.ipt.Dump(ipt.IPv4, "nat"), iptEmpty)
	wantDump(t, "ipt v6 after failed ADD", te.ipt.Dump(ipt.IPv6, "nat"), iptEmpty)

	// The IPv6 restore fails after the IPv4 one was applied.
	te = newTestEnv()
	te.ipt.FailRestore = nil
	orig := te.ipt
	te.env.ipt = &failNth{Fake: orig, n: 2}
	wantCode(t, te.cmdAdd(args(conf(`,"backend":"iptables"`, mapsA, true))), cnierr.Internal, "injected restore failure")
	wantDump(t, "ipt v4 after failed v6", orig.Dump(ipt.IPv4, "nat"), iptEmpty)
}

// failNth fails the n-th Restore.
type failNth struct {
	*ipt.Fake
	n, calls int
}

func (f *failNth) Restore(ctx context.Context, proto ipt.Protocol, data []byte) error {
	f.calls++
	if f.calls == f.n {
		return errors.New("injected restore failure")
	}
	return f.Fake.Restore(ctx, proto, data)
}

func TestConntrackFailureIsInformative(t *testing.T) {
	te := newTestEnv()
	te.flushErr = errors.New("no conntrack")
	if err := te.cmdAdd(args(conf("", mapsA, true))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(te.log.String(), "no conntrack") {
		t.Errorf("conntrack failure not logged: %q", te.log.String())
	}
}

func TestNoMappings(t *testing.T) {
	te := newTestEnv()
	if err := te.cmdAdd(args(conf("", "", true))); err != nil {
		t.Fatal(err)
	}
	if te.nft.Dump() != "" || te.out.Len() == 0 {
		t.Fatalf("ADD without mappings: rules %q, output %q", te.nft.Dump(), te.out.String())
	}
	if err := te.cmdCheck(args(conf("", "", true))); err != nil {
		t.Fatal(err)
	}
	if err := te.cmdDel(args(conf("", "", false))); err != nil {
		t.Fatal(err)
	}
}

func TestGCVerb(t *testing.T) {
	te := newTestEnv()
	for _, id := range []string{"ctr1", "ctr2", "ctr3"} {
		a := args(conf("", mapsA, true))
		a.ContainerID = id
		if err := te.cmdAdd(a); err != nil {
			t.Fatal(err)
		}
		a.StdinData = conf(`,"backend":"iptables"`, mapsA, true)
		if err := te.cmdAdd(a); err != nil {
			t.Fatal(err)
		}
	}
	// Both spellings of the attachment list count.
	gc := `{"cniVersion":"1.1.0","name":"net1","type":"portmap",
		"cni.dev/valid-attachments":[{"containerID":"ctr1","ifname":"eth0"}],
		"cni.dev/attachments":[{"containerID":"ctr3","ifname":"eth0"}]}`
	if err := te.cmdGC(args([]byte(gc))); err != nil {
		t.Fatal(err)
	}
	ctr2 := attachmentID("net1", "ctr2", "eth0")
	for _, dump := range []string{te.nft.Dump(), te.ipt.Dump(ipt.IPv4, "nat"), te.ipt.Dump(ipt.IPv6, "nat")} {
		if strings.Contains(dump, "id=ctr2") || strings.Contains(strings.ToLower(dump), ctr2.String()) {
			t.Errorf("ctr2 survived GC:\n%s", dump)
		}
		if !strings.Contains(dump, "id=ctr1") || !strings.Contains(dump, "id=ctr3") {
			t.Errorf("GC removed a valid attachment:\n%s", dump)
		}
	}
	// Another network's GC does not touch net1's rules.
	before := te.nft.Dump()
	if err := te.cmdGC(args([]byte(`{"cniVersion":"1.1.0","name":"net2","cni.dev/valid-attachments":[]}`))); err != nil {
		t.Fatal(err)
	}
	wantDump(t, "GC of net2", te.nft.Dump(), before)
}

func TestStatus(t *testing.T) {
	te := newTestEnv()
	if err := te.cmdStatus(args(conf("", "", false))); err != nil {
		t.Fatal(err)
	}
	te.probeErr = errors.New("permission denied")
	wantCode(t, te.cmdStatus(args(conf("", "", false))), cnierr.PluginNotAvailable, "permission denied")
	if err := te.cmdStatus(args(conf(`,"backend":"iptables"`, "", false))); err != nil {
		t.Fatalf("STATUS iptables: %v", err)
	}
	te.iptMissing = true
	wantCode(t, te.cmdStatus(args(conf(`,"backend":"iptables"`, "", false))), cnierr.PluginNotAvailable, "iptables backend is not available")
}

func TestCheckFailsWhenRulesGone(t *testing.T) {
	te := newTestEnv()
	a := args(conf("", mapsA, true))
	if err := te.cmdAdd(a); err != nil {
		t.Fatal(err)
	}
	tx := te.nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: nftChain(attachmentID("net1", "ctr1", "eth0"))})
	if err := te.nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	wantCode(t, te.cmdCheck(a), cnierr.CheckFailed, "has rules")
	wantCode(t, te.cmdCheck(args(conf("", mapsA, false))), cnierr.InvalidConfig, "no prevResult")
}
