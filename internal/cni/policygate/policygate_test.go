package policygate

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netpol/gate"
)

const prev = `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"10.244.1.7/24","interface":0}]}`

func conf(socket string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":"flatnet","type":"flatnet-policy","socket":%q,"timeoutSeconds":1,%s}`, socket, prev)
}

func TestAddWaitsForTheAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "p.sock")
	got := make(chan gate.Request, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &gate.Server{Path: sock, Handler: func(_ context.Context, r gate.Request) error { got <- r; return nil }}
	go srv.Serve(ctx)
	args := &skel.CmdArgs{ContainerID: "c1", Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=a;K8S_POD_UID=u1", StdinData: conf(sock)}
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err = cmdAdd(args); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	r := <-got
	if r.String() != "x/a" || len(r.IPs) != 1 || r.IPs[0] != netip.MustParseAddr("10.244.1.7") || r.ContainerID != "c1" || r.UID != "u1" {
		t.Errorf("agent got %+v", r)
	}
	if err := cmdStatus(args); err != nil {
		t.Errorf("STATUS with the agent listening: %v", err)
	}
}

func TestAddWithoutAgentFailsRetryably(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	args := &skel.CmdArgs{ContainerID: "c1", Args: "K8S_POD_NAMESPACE=x;K8S_POD_NAME=a", StdinData: conf(sock)}
	err := cmdAdd(args)
	if code, _ := cnierr.Code(err); code != cnierr.TryAgainLater || !strings.Contains(err.Error(), "none.sock") || !strings.Contains(err.Error(), "x/a") {
		t.Errorf("ADD with no agent: %v (code %d), want code 11 naming the pod and the socket", err, code)
	}
	if code, _ := cnierr.Code(cmdStatus(args)); code != cnierr.PluginNotAvailable {
		t.Errorf("STATUS with no agent: code %d, want 50", code)
	}
	// Not a Kubernetes pod: nothing can select it, so it passes.
	args.Args = ""
	if err := cmdAdd(args); err != nil {
		t.Errorf("ADD for a non-pod container: %v", err)
	}
}

func TestConfig(t *testing.T) {
	if _, err := parseConfig([]byte(`{"type":"flatnet-policy","timeoutSeconds":-1}`)); err == nil {
		t.Error("negative timeout accepted")
	}
	c, err := parseConfig([]byte(`{"type":"flatnet-policy"}`))
	if err != nil || c.Socket != DefaultSocket || c.TimeoutSeconds != 10 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	args := &skel.CmdArgs{Args: "K8S_POD_NAMESPACE=x;K8S_POD_NAME=a", StdinData: []byte(`{"cniVersion":"1.0.0","name":"n","type":"flatnet-policy"}`)}
	if code, _ := cnierr.Code(cmdAdd(args)); code != cnierr.InvalidConfig {
		t.Errorf("ADD without prevResult: code %d, want 7", code)
	}
}
