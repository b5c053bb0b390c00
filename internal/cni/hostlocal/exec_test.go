package hostlocal_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/flatnet/flatnet/internal/cni/hostlocal"
)

// execPlugin runs a host-local binary the way a runtime does. On failure
// it returns the CNI error the plugin printed.
func execPlugin(bin, command string, stdin []byte, id, ifname, cniArgs string) ([]byte, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command, "CNI_CONTAINERID="+id, "CNI_NETNS=/var/run/netns/none",
		"CNI_IFNAME="+ifname, "CNI_PATH="+filepath.Dir(bin), "CNI_ARGS="+cniArgs)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var te types.Error
		if json.Unmarshal(stdout.Bytes(), &te) == nil && te.Code != 0 {
			return nil, &te
		}
		return nil, fmt.Errorf("%s %s: %v\nstdout: %s\nstderr: %s", bin, command, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// firstIPs extracts the addresses of a printed result of any version.
func resultIPs(t *testing.T, out []byte) []string {
	t.Helper()
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address)
	}
	return s
}

func ourBinary(t *testing.T) string { return filepath.Join(testutilCNIPath(t), hostlocal.Name) }

func TestBinaryResultVersions(t *testing.T) {
	bin := ourBinary(t)
	dd := t.TempDir()
	for i, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		out, err := execPlugin(bin, "ADD", conf(t, dd, v, dual), fmt.Sprint("c", i), "eth0", "")
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		var got struct {
			CNIVersion string `json:"cniVersion"`
		}
		json.Unmarshal(out, &got)
		if got.CNIVersion != v {
			t.Errorf("printed cniVersion %q for a %s config:\n%s", got.CNIVersion, v, out)
		}
		want := []string{fmt.Sprintf("10.77.0.%d/29", i+2), fmt.Sprintf("fd00:77::%d/125", i+2)}
		if diff := cmp.Diff(want, resultIPs(t, out)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", v, diff)
		}
	}
	// 0.2.0 prints the old ip4/ip6 shape.
	dd2 := t.TempDir()
	out, err := execPlugin(bin, "ADD", conf(t, dd2, "0.2.0", dual), "old", "eth0", "")
	if err != nil {
		t.Fatal(err)
	}
	var old struct {
		IP4 struct{ IP string } `json:"ip4"`
		IP6 struct{ IP string } `json:"ip6"`
	}
	json.Unmarshal(out, &old)
	if old.IP4.IP != "10.77.0.2/29" || old.IP6.IP != "fd00:77::2/125" {
		t.Errorf("0.2.0 result %s", out)
	}

	out, err = execPlugin(bin, "VERSION", []byte(`{"cniVersion":"1.1.0"}`), "", "", "")
	if err != nil || !strings.Contains(string(out), `"1.1.0"`) || !strings.Contains(string(out), `"1.0.0"`) {
		t.Errorf("VERSION: %s %v", out, err)
	}
	for _, verb := range []string{"CHECK", "DEL", "DEL"} {
		if _, err := execPlugin(bin, verb, conf(t, dd, "1.1.0", dual), "c3", "eth0", ""); err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
	}
	if _, err := execPlugin(bin, "STATUS", conf(t, dd, "1.1.0", dual), "", "", ""); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	if _, err := execPlugin(bin, "GC", conf(t, dd, "1.1.0", dual, `"cni.dev/valid-attachments":[{"containerID":"c0","ifname":"eth0"}],`), "", "", ""); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if diff := cmp.Diff([]string{
		"10.77.0.2=c0\r\neth0", "fd00:77::2=c0\r\neth0",
		"last_reserved_ip.0=10.77.0.5", "last_reserved_ip.1=fd00:77::5", "lock=",
	}, files(t, dd)); diff != "" {
		t.Errorf("after GC (-want +got):\n%s", diff)
	}
}

func TestBinaryErrorCodes(t *testing.T) {
	bin := ourBinary(t)
	dd := t.TempDir()
	small := conf(t, dd, "1.1.0", `[[{"subnet":"10.82.0.0/30"}]]`)
	if _, err := execPlugin(bin, "ADD", small, "a", "eth0", ""); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dd, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		verb   string
		conf   []byte
		id     string
		args   string
		code   uint
		phrase string
	}{
		{"ADD", small, "b", "", 101, "range set 10.82.0.1-10.82.0.2"},
		{"STATUS", small, "", "", 0, ""}, // full, but not broken: ready
		{"STATUS", conf(t, notDir, "1.1.0", `[[{"subnet":"10.82.0.0/30"}]]`), "", "", 50, "dataDir"},
		{"ADD", small, "b", "IP=10.82.0.2", 102, "already reserved"},
		{"ADD", small, "b", "IP=10.83.0.2", 103, "not in any range set"},
		{"ADD", conf(t, dd, "1.1.0", `[[{"subnet":"10.82.0.0/33"}]]`), "b", "", 7, "ipam.ranges[0][0].subnet"},
		{"ADD", small, "b", "BOGUS=1", 4, "unknown args"},
		{"CHECK", small, "b", "", 106, "no address reserved"},
	} {
		_, err := execPlugin(bin, tc.verb, tc.conf, tc.id, "eth0", tc.args)
		if tc.code == 0 {
			if err != nil {
				t.Errorf("%s %s: %v, want success", tc.verb, tc.args, err)
			}
			continue
		}
		te, ok := err.(*types.Error)
		if !ok || te.Code != tc.code || !strings.Contains(te.Msg, tc.phrase) {
			t.Errorf("%s %s: got %v, want code %d mentioning %q", tc.verb, tc.args, err, tc.code, tc.phrase)
		}
	}
}

// TestConcurrentAdds: 20 ADDs at once (goroutines in this process, exec'd
// processes, and both mixed) on one dataDir get 20 distinct addresses.
func TestConcurrentAdds(t *testing.T) {
	bin := ourBinary(t)
	for _, mode := range []string{"goroutines", "processes", "mixed"} {
		t.Run(mode, func(t *testing.T) {
			dd := t.TempDir()
			c := conf(t, dd, "1.1.0", `[[{"subnet":"10.84.0.0/27"}],[{"subnet":"fd00:84::/120"}]]`)
			var mu sync.Mutex
			var got []string
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for i := 0; i < 20; i++ {
				wg.Add(1)
				inProc := mode == "goroutines" || (mode == "mixed" && i%2 == 0)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("ctr-%02d", i)
					var addrs []string
					if inProc {
						r, err := hostlocal.Add(cmdArgs(c, id, "eth0"))
						if err != nil {
							errs <- err
							return
						}
						addrs = ips(r)
					} else {
						out, err := execPlugin(bin, "ADD", c, id, "eth0", "")
						if err != nil {
							errs <- err
							return
						}
						addrs = resultIPs(t, out)
					}
					mu.Lock()
					got = append(got, addrs...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			seen := map[string]bool{}
			for _, a := range got {
				if seen[a] {
					t.Errorf("%s handed out twice", a)
				}
				seen[a] = true
			}
			if len(seen) != 40 {
				t.Errorf("got %d distinct addresses, want 40 (20 v4 + 20 v6): %v", len(seen), got)
			}
			// The disk agrees: 40 reservation files, each naming its holder.
			n := 0
			for _, f := range files(t, dd) {
				name := f[:strings.Index(f, "=")]
				if _, err := netip.ParseAddr(name); err == nil {
					n++
				}
			}
			if n != 40 {
				t.Errorf("%d reservation files on disk, want 40", n)
			}
		})
	}
}
