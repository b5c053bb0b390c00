package controller

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/flatnet/flatnet/deploy"
	"github.com/flatnet/flatnet/internal/controller/nodeipam"
	"github.com/flatnet/flatnet/internal/httpserver"
)

func TestMetricsFlags(t *testing.T) {
	cmd := NewCommand()
	for name, want := range map[string]string{"metrics-bind-address": DefaultMetricsBindAddress, "profiling": "false"} {
		if f := cmd.Flags().Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("--%s: %+v, want a flag defaulting to %q", name, f, want)
		}
	}
}

// get GETs url and returns the status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// sample is the value of the sample line `series value` in a /metrics
// text, and whether there is one.
func sample(text, series string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// The controller serves on its listener while it runs: /healthz, /metrics
// with the Go runtime's and node IPAM's queue metrics once the queue took
// a Node, and with profiling /debug/pprof/. It stops serving when it stops.
func TestServeWhileRunning(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	o := DefaultOptions()
	o.Profiling = true
	cfg := nodeipam.Config{ClusterCIDR: netip.MustParsePrefix(o.ClusterCIDR), NodeMaskSize: o.NodeCIDRMaskSize}
	ln, err := httpserver.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- withServer(ctx, ln, o.Profiling, func(ctx context.Context) error { return run(ctx, client, cfg, o) })
	}()

	// Node IPAM's queue has had n1 once it is patched.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err == nil && n.Spec.PodCIDR != "", nil
	})
	if err != nil {
		t.Fatalf("n1 got no podCIDR: %v", err)
	}
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	code, text := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, text)
	}
	if _, ok := sample(text, "go_goroutines"); !ok {
		t.Error("/metrics has no go_goroutines")
	}
	if _, ok := sample(text, "process_start_time_seconds"); !ok {
		t.Error("/metrics has no process_start_time_seconds")
	}
	if v, ok := sample(text, `workqueue_adds_total{name="nodeipam"}`); !ok || v < 1 {
		t.Errorf("workqueue_adds_total of nodeipam: %v (found %t), want at least 1", v, ok)
	}
	if _, ok := sample(text, `workqueue_queue_duration_seconds_count{name="nodeipam"}`); !ok {
		t.Error("no workqueue_queue_duration_seconds of nodeipam")
	}
	if code, body := get(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ with profiling: %d %.200s", code, body)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("after the context ended: %v", err)
	}
	if resp, err := http.Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("/healthz still answers after the controller stopped")
	}
}

// /debug/pprof/ is served only with profiling; /healthz always.
func TestMuxProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		mux := newMux(on)
		serve := func(path string) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			return rec
		}
		if rec := serve("/debug/pprof/"); (rec.Code == http.StatusOK) != on {
			t.Errorf("profiling %t: /debug/pprof/ answered %d", on, rec.Code)
		}
		if rec := serve("/healthz"); rec.Code != http.StatusOK || rec.Body.String() != "ok" {
			t.Errorf("profiling %t: /healthz answered %d %q", on, rec.Code, rec.Body)
		}
	}
}

// A taken --metrics-bind-address fails the start, naming the flag and the
// address, before anything connects (the kubeconfig does not exist).
func TestMetricsAddressTaken(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	cmd := NewCommand()
	cmd.SetArgs([]string{"--metrics-bind-address", addr, "--kubeconfig", "/nonexistent"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err = cmd.Execute()
	if err == nil || !strings.HasPrefix(err.Error(), "--metrics-bind-address: listening on "+addr+": ") {
		t.Fatalf("controller on a taken address: %v, want an error naming --metrics-bind-address and %s", err, addr)
	}
}

// deploy/flatnet.yaml's liveness probe asks the controller where it
// serves by default, and its command leaves that default as it is.
func TestManifestLivenessProbe(t *testing.T) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(deploy.Manifest), 4096)
	for {
		var d appsv1.Deployment
		if err := dec.Decode(&d); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" || d.Name != "flatnet-controller" {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		p := c.LivenessProbe
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("container %s has no HTTP liveness probe", c.Name)
		}
		if got := net.JoinHostPort(p.HTTPGet.Host, p.HTTPGet.Port.String()); got != DefaultMetricsBindAddress || p.HTTPGet.Path != "/healthz" {
			t.Errorf("liveness probe GETs %s%s, want %s/healthz", got, p.HTTPGet.Path, DefaultMetricsBindAddress)
		}
		for _, a := range c.Command {
			if strings.HasPrefix(a, "--metrics-bind-address") {
				t.Errorf("the command sets %s: the probe wants the default", a)
			}
		}
		return
	}
	t.Fatal("deploy/flatnet.yaml has no Deployment flatnet-controller")
}
