package subnet

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestRootConflistPassesCheck: the conflist the agent writes, loaded from
// the conf dir as a runtime does, works with the plugins: ADD gives the
// pod an address of the node's subnet with the node as gateway, CHECK
// passes, CHECK notices a broken pod, DEL cleans up. The node is a test
// namespace (cni0 lives there). Both styles.
func TestRootConflistPassesCheck(t *testing.T) {
	testutil.RequireRoot(t)
	for _, style := range Styles {
		t.Run(style, func(t *testing.T) { testConflistPassesCheck(t, style) })
	}
}

func testConflistPassesCheck(t *testing.T, style string) {
	const podCIDR = "10.253.7.0/24"
	testutil.RequireFreeRange(t, podCIDR)
	host, pod := testutil.NewNetNS(t), testutil.NewNetNS(t)
	confDir := filepath.Join(t.TempDir(), "net.d")
	dataDir := filepath.Join(t.TempDir(), "networks")
	data, err := Render(Config{Style: style, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(podCIDR)}, DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(confDir, FileName, data); err != nil {
		t.Fatal(err)
	}
	files, err := libcni.ConfFiles(confDir, []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) != 1 {
		t.Fatalf("conf files %v, %v", files, err)
	}
	list, err := libcni.ConfListFromFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{
		ContainerID: "agent-check", NetNS: pod, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "p"}},
		CapabilityArgs: map[string]any{
			"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"ingressRate": 10_000_000, "ingressBurst": 1_000_000, "egressRate": 10_000_000, "egressBurst": 1_000_000},
		},
	}
	ctx := context.Background()
	inHost := func(fn func() error) error { return netns.Do(host, fn) }

	var res *current.Result
	if err := inHost(func() error {
		r, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(r)
		return err
	}); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { inHost(func() error { return cni.DelNetworkList(ctx, list, rt) }) })

	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.253.7.2/24" || res.IPs[0].Gateway.String() != "10.253.7.1" {
		t.Fatalf("ADD result IPs %+v", res.IPs)
	}
	if got := testutil.RunIn(t, pod, "ip", "-4", "addr", "show", "eth0"); !strings.Contains(got, "10.253.7.2/24") {
		t.Errorf("pod eth0: %s", got)
	}
	if got := testutil.RunIn(t, pod, "ip", "route", "show", "default"); !strings.Contains(got, "via 10.253.7.1") {
		t.Errorf("pod default route: %q", got)
	}
	if got := testutil.RunIn(t, host, "ip", "-4", "addr", "show", "cni0"); !strings.Contains(got, "10.253.7.1/24") {
		t.Errorf("node cni0: %s", got)
	}
	if _, err := os.Stat(filepath.Join(dataDir, NetworkName, "10.253.7.2")); err != nil {
		t.Errorf("host-local did not use the conflist's dataDir: %v", err)
	}
	if got := testutil.RunIn(t, host, "nft", "list", "ruleset"); !strings.Contains(got, "18080") {
		t.Errorf("portmap rule for hostPort 18080 missing:\n%s", got)
	}
	if got := testutil.RunIn(t, host, "tc", "qdisc", "show"); !strings.Contains(got, "tbf") {
		t.Errorf("bandwidth qdisc missing:\n%s", got)
	}

	if err := inHost(func() error { return cni.CheckNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	// CHECK must be able to fail: take the pod's address away.
	testutil.RunIn(t, pod, "ip", "addr", "del", "10.253.7.2/24", "dev", "eth0")
	err = inHost(func() error { return cni.CheckNetworkList(ctx, list, rt) })
	if code, _ := cnierr.Code(err); err == nil || code != cnierr.CheckFailed {
		t.Fatalf("CHECK without the pod's address: %v, want code %d", err, cnierr.CheckFailed)
	}

	if err := inHost(func() error { return cni.DelNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, NetworkName, "10.253.7.2")); !os.IsNotExist(err) {
		t.Errorf("DEL left the address reserved: %v", err)
	}
}
