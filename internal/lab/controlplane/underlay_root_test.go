package controlplane

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/testutil"
)

// The lab's case: the apiserver on a non-loopback address (the underlay's
// .1 on a bridge) with the lease endpoint reconciler, which then publishes
// that address as the kubernetes service's endpoint. The machine's root
// namespace must not get test addresses, so the test runs itself again
// inside a test netns that holds the bridge; etcd and kube-apiserver
// inherit that namespace.
const underlayEnv = "FLATNET_CP_UNDERLAY_STATE"

var underlayAddr = netip.MustParseAddr("10.249.251.1")

func TestUpUnderlayAddr(t *testing.T) {
	if state := os.Getenv(underlayEnv); state != "" {
		underlayInner(t, state)
		return
	}
	testutil.RequireRoot(t)
	requireBinaries(t)
	testutil.RequireFreeRange(t, "10.249.251.0/24")
	nsPath := testutil.NewNetNS(t)
	ns := testutil.NSName(nsPath)
	br := testutil.Name("fnb")
	testutil.Run(t, "ip", "-n", ns, "link", "add", br, "type", "bridge")
	testutil.Run(t, "ip", "-n", ns, "addr", "add", underlayAddr.String()+"/24", "dev", br)
	testutil.Run(t, "ip", "-n", ns, "link", "set", br, "up")
	state := t.TempDir()
	// Whatever the inner run leaves (a crash, a timeout), stopped by PID.
	t.Cleanup(func() {
		if err := Down(state); err != nil {
			t.Errorf("cleanup Down: %v", err)
		}
	})
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestUpUnderlayAddr$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), underlayEnv+"="+state)
	out, err := cmd.CombinedOutput()
	t.Logf("inner run in netns %s:\n%s", ns, out)
	if err != nil {
		t.Fatalf("inner run failed: %v", err)
	}
}

func underlayInner(t *testing.T, state string) {
	bin := requireBinaries(t)
	t.Cleanup(func() {
		if err := Down(state); err != nil {
			t.Errorf("Down: %v", err)
		}
	})
	ctx := context.Background()
	info, err := Up(ctx, Config{StateDir: state, BinDir: bin, Addr: underlayAddr}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("https://%s:%d", underlayAddr, DefaultPort)
	if info.Server != want {
		t.Errorf("server %s, want %s", info.Server, want)
	}
	cs, err := Client(info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// The reconciler writes the endpoint right after start; it is there
	// by the time /readyz passed or very soon after.
	var got []string
	for range 300 { // 30 s: generous on a loaded machine
		// The apiserver's reconciler keeps the "kubernetes" slice itself
		// (no kube-controller-manager here).
		es, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		got = nil
		if err == nil {
			for _, e := range es.Endpoints {
				for _, a := range e.Addresses {
					for _, p := range es.Ports {
						if p.Port != nil {
							got = append(got, fmt.Sprintf("%s:%d", a, *p.Port))
						}
					}
				}
			}
		}
		if slices.Contains(got, fmt.Sprintf("%s:%d", underlayAddr, DefaultPort)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Contains(got, fmt.Sprintf("%s:%d", underlayAddr, DefaultPort)) {
		t.Errorf("kubernetes EndpointSlice %v, want %s:%d", got, underlayAddr, DefaultPort)
	}
	svc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != "10.96.0.1" {
		t.Errorf("kubernetes service ClusterIP %v (%v), want 10.96.0.1", svc.Spec.ClusterIP, err)
	}
	again, err := Up(ctx, Config{StateDir: state, BinDir: bin, Addr: underlayAddr}, nil)
	if err != nil || !again.Reused || again.APIServerPID != info.APIServerPID {
		t.Errorf("second Up: %+v, %v", again, err)
	}
}
