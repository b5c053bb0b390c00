package loopback

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func loUp(t *testing.T, nsPath string) bool {
	t.Helper()
	var up bool
	err := netns.Do(nsPath, func() error {
		l, err := netlinkx.LinkByName("lo")
		if err != nil {
			return err
		}
		up = l.Attrs().Flags&net.FlagUp != 0
		return nil
	})
	if err != nil {
		t.Fatalf("inspecting lo in %s: %v", nsPath, err)
	}
	return up
}

// dialLoopback listens on 127.0.0.1 inside nsPath and connects to it: it
// only works when lo is really up.
func dialLoopback(nsPath string) error {
	return netns.Do(nsPath, func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func ipv6Enabled(nsPath string) bool {
	v := "1"
	_ = netns.Do(nsPath, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
		if err == nil {
			v = string(b[:1])
		}
		return nil
	})
	return v == "0"
}

func TestRootLoopbackAddCheckDel(t *testing.T) {
	testutil.RequireRoot(t)
	cni := libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, t.TempDir(), nil)
	ctx := context.Background()
	for _, v := range []string{"1.1.0", "1.0.0", "0.4.0"} {
		t.Run(v, func(t *testing.T) {
			nsPath := testutil.NewNetNS(t)
			name := testutil.NSName(nsPath)
			testutil.Run(t, "ip", "-n", name, "link", "set", "lo", "down")
			if err := dialLoopback(nsPath); err == nil {
				t.Fatal("127.0.0.1 reachable with lo down: test cannot tell the plugin's effect")
			}
			list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
				`{"cniVersion":%q,"name":"lotest","plugins":[{"type":"loopback"}]}`, v)))
			if err != nil {
				t.Fatal(err)
			}
			rt := &libcni.RuntimeConf{ContainerID: "lo-" + name, NetNS: nsPath, IfName: "eth0"}

			r, err := cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if r.Version() != v {
				t.Errorf("result version %s, want %s", r.Version(), v)
			}
			res, err := current.NewResultFromResult(r)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" || res.Interfaces[0].Sandbox != nsPath {
				t.Errorf("interfaces = %+v, want lo in %s", res.Interfaces, nsPath)
			}
			got := map[string]bool{}
			for _, ip := range res.IPs {
				got[ip.Address.String()] = true
			}
			want := []string{"127.0.0.1/8"}
			if ipv6Enabled(nsPath) {
				want = append(want, "::1/128")
			}
			for _, w := range want {
				if !got[w] {
					t.Errorf("result ips %v lack %s", got, w)
				}
			}
			if len(got) != len(want) {
				t.Errorf("result ips %v, want %v", got, want)
			}
			if !loUp(t, nsPath) {
				t.Fatal("lo is down after ADD")
			}
			if err := dialLoopback(nsPath); err != nil {
				t.Fatalf("127.0.0.1 unreachable after ADD: %v", err)
			}

			if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("CHECK after ADD: %v", err)
			}
			testutil.Run(t, "ip", "-n", name, "link", "set", "lo", "down")
			err = cni.CheckNetworkList(ctx, list, rt)
			if code, _ := cnierr.Code(err); code != cnierr.CheckFailed {
				t.Fatalf("CHECK with lo down: %v (code %d), want code %d", err, code, cnierr.CheckFailed)
			}
			testutil.Run(t, "ip", "-n", name, "link", "set", "lo", "up")

			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if loUp(t, nsPath) {
				t.Error("lo still up after DEL")
			}
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			if err := netns.Delete(name); err != nil {
				t.Fatal(err)
			}
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("DEL after the netns is gone: %v", err)
			}
		})
	}
}

func TestRootLoopbackMissingNetns(t *testing.T) {
	testutil.RequireRoot(t)
	cni := libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, t.TempDir(), nil)
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"lotest","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: "lo-missing", NetNS: "/run/netns/" + testutil.Name("fntgone"), IfName: "eth0"}
	_, err = cni.AddNetworkList(context.Background(), list, rt)
	if code, _ := cnierr.Code(err); code != cnierr.UnknownContainer {
		t.Fatalf("ADD into a missing netns: %v (code %d), want code %d", err, code, cnierr.UnknownContainer)
	}
}

// A chain of two loopbacks: the second one gets the first one's result as
// prevResult and must pass it through unchanged.
func TestRootLoopbackPrevResultAndGCStatus(t *testing.T) {
	testutil.RequireRoot(t)
	cni := libcni.NewCNIConfigWithCacheDir([]string{testutil.CNIPath(t)}, t.TempDir(), nil)
	ctx := context.Background()
	nsPath := testutil.NewNetNS(t)
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"lotest2","plugins":[{"type":"loopback"},{"type":"loopback"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: "lo-chain", NetNS: nsPath, IfName: "eth0"}
	r, err := cni.AddNetworkList(ctx, list, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" || len(res.IPs) == 0 {
		t.Errorf("chained result = %+v, want the first loopback's result", res)
	}
	if err := cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: rt.ContainerID, IfName: rt.IfName}}}
	if err := cni.GCNetworkList(ctx, list, valid); err != nil {
		t.Errorf("GC: %v", err)
	}
	// GC must leave a valid attachment alone: lo stays up.
	if err := dialLoopback(nsPath); err != nil {
		t.Errorf("127.0.0.1 unreachable after GC: %v", err)
	}
}
