package ipam

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

// fakeIPAM writes an IPAM plugin named typ into a new CNI_PATH dir: a
// shell script that saves its stdin and environment next to itself and
// runs body.
func fakeIPAM(t *testing.T, typ, body string) (dir string) {
	t.Helper()
	dir = t.TempDir()
	script := "#!/bin/sh\ncat > \"$(dirname \"$0\")/stdin\"\ntr '\\0' '\\n' < /proc/$$/environ > \"$(dirname \"$0\")/env\"\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(dir, typ), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func delegateArgs(dir, conf string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "ctr1", Netns: "/var/run/netns/x", IfName: "eth0", Args: "K8S_POD_NAME=p", Path: dir, StdinData: []byte(conf)}
}

const fakeConf = `{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{"type":"fake-ipam"}}`

func TestDelegateAdd(t *testing.T) {
	t.Setenv("CNI_COMMAND", "VERSION") // inherited ones are replaced
	t.Setenv("FLATNET_TEST_KEEP", "kept")
	dir := fakeIPAM(t, "fake-ipam", `echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1"}]}'`)
	res, err := Add(context.Background(), delegateArgs(dir, fakeConf))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.2.3/24" || res.IPs[0].Gateway.String() != "10.1.2.1" {
		t.Fatalf("result %+v", res)
	}
	stdin, _ := os.ReadFile(filepath.Join(dir, "stdin"))
	if string(stdin) != fakeConf {
		t.Errorf("plugin read %q, want the config", stdin)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env"))
	want := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=ctr1", "CNI_NETNS=/var/run/netns/x", "CNI_IFNAME=eth0", "CNI_ARGS=K8S_POD_NAME=p", "CNI_PATH=" + dir, "FLATNET_TEST_KEEP=kept"}
	lines := strings.Split(string(env), "\n")
	for _, w := range want {
		found := 0
		name, _, _ := strings.Cut(w, "=")
		for _, l := range lines {
			if l == w {
				found++
			} else if strings.HasPrefix(l, name+"=") {
				t.Errorf("plugin env has %q besides %q", l, w)
			}
		}
		if found != 1 {
			t.Errorf("plugin env has %q %d times, want once", w, found)
		}
	}
}

func TestDelegateResultWithoutVersion(t *testing.T) {
	// A result without cniVersion is in the config's version (libcni's
	// fixup): here 0.4.0, whose result type has per-IP versions.
	conf := strings.Replace(fakeConf, "1.0.0", "0.4.0", 1)
	dir := fakeIPAM(t, "fake-ipam", `echo '{"ips":[{"version":"4","address":"10.1.2.3/24"}]}'`)
	res, err := Add(context.Background(), delegateArgs(dir, conf))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.1.2.3/24" {
		t.Fatalf("result %+v", res)
	}
}

func TestDelegateErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		code       uint
		msg        string
	}{
		{"CNI error on stdout", `echo '{"cniVersion":"1.0.0","code":11,"msg":"no addresses left","details":"range full"}'; exit 1`, 11, "no addresses left"},
		{"stderr only", `echo boom >&2; exit 3`, 0, `netplugin failed: "boom\n"`},
		{"nothing", `exit 4`, 0, "netplugin failed with no error message"},
		{"garbage on stdout", `echo 'not json'; exit 1`, 0, "error parsing its diagnostic message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fakeIPAM(t, "fake-ipam", tc.body)
			_, err := Add(context.Background(), delegateArgs(dir, fakeConf))
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "ipam plugin fake-ipam ADD") {
				t.Errorf("error %q, want it to name the plugin and contain %q", err, tc.msg)
			}
			if tc.code != 0 {
				if c, ok := cnierr.Code(err); !ok || c != tc.code {
					t.Errorf("code %d (%v), want %d", c, ok, tc.code)
				}
				var ce *types.Error
				if !errors.As(err, &ce) {
					t.Errorf("%v is no CNI error", err)
				}
			}
			// The verbs without a result report the same way.
			if err := Del(context.Background(), delegateArgs(dir, fakeConf)); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("DEL: %v, want %q", err, tc.msg)
			}
		})
	}
}

func TestDelegateNoResultVerbs(t *testing.T) {
	dir := fakeIPAM(t, "fake-ipam", `true`)
	for verb, f := range map[string]func(context.Context, *skel.CmdArgs) error{"DEL": Del, "CHECK": Check, "GC": GC, "STATUS": Status} {
		if err := f(context.Background(), delegateArgs(dir, fakeConf)); err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		env, _ := os.ReadFile(filepath.Join(dir, "env"))
		if !strings.Contains(string(env), "CNI_COMMAND="+verb+"\n") {
			t.Errorf("%s: the plugin was not run for it:\n%s", verb, env)
		}
	}
}

func TestDelegateUnknownType(t *testing.T) {
	_, err := Add(context.Background(), delegateArgs(t.TempDir(), fakeConf))
	if c, ok := cnierr.Code(err); !ok || c != cnierr.InvalidConfig || !strings.Contains(err.Error(), `unknown ipam type "fake-ipam"`) {
		t.Fatalf("error %v (code %d), want code %d naming the type", err, c, cnierr.InvalidConfig)
	}
	// A directory of that name is no plugin.
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "fake-ipam"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Add(context.Background(), delegateArgs(dir, fakeConf)); err == nil {
		t.Fatal("a directory was taken for the plugin")
	}
}
