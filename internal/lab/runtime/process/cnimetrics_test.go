package process

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakePlugin is a CNI plugin as a shell script: it sleeps, then answers
// ADD with one address, DEL with nothing, or fails every verb but VERSION.
const fakePlugin = `#!/bin/sh
cat >/dev/null
[ "$CNI_COMMAND" = VERSION ] && { echo '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}'; exit 0; }
sleep 0.05
if [ "${0##*/}" = broken ]; then
  echo '{"cniVersion":"1.0.0","code":11,"msg":"broken on purpose"}'; exit 1
fi
[ "$CNI_COMMAND" = ADD ] && echo '{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],"ips":[{"address":"10.1.2.3/24","interface":0}]}'
exit 0
`

// cniNetworkWith writes a conflist of one plugin of type plugin (the
// script above) and returns a network that reads it, timed into m.
func cniNetworkWith(t *testing.T, plugin string, m *CNIMetrics) *cniNetwork {
	t.Helper()
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	for _, d := range []string{bin, conf} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, plugin), []byte(fakePlugin), 0o755); err != nil {
		t.Fatal(err)
	}
	list := `{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"` + plugin + `"}]}`
	if err := os.WriteFile(filepath.Join(conf, "10-test.conflist"), []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	return &cniNetwork{confDir: conf, cacheDir: filepath.Join(dir, "cache"), binDirs: []string{bin}, metrics: m}
}

func registryOf(t *testing.T, m *CNIMetrics) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	return reg
}

// histogramOf returns the count and sum of the CNI histogram for op.
func histogramOf(t *testing.T, m *CNIMetrics, op string) (uint64, time.Duration) {
	t.Helper()
	mfs, err := registryOf(t, m).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != CNIDurationMetric {
			continue
		}
		for _, s := range mf.GetMetric() {
			if s.GetLabel()[0].GetValue() == op {
				h := s.GetHistogram()
				return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second))
			}
		}
	}
	return 0, 0
}

// Every ADD and DEL is timed, around the whole chain; failures too, and
// counted as errors.
func TestCNIMetrics(t *testing.T) {
	ctx := context.Background()
	a := cniAttachment{SandboxID: "sandbox1", NetnsPath: "/run/netns/x", IfName: "eth0"}
	m := NewCNIMetrics()
	if count, _ := histogramOf(t, m, cniAdd); count != 0 {
		t.Fatalf("a new histogram has %d ADDs", count)
	}
	if n, err := testutil.GatherAndCount(registryOf(t, m), CNIDurationMetric, CNIErrorsMetric); err != nil || n != 4 {
		t.Errorf("new metrics: %d series (%v), want ADD and DEL of both, at zero", n, err)
	}
	n := cniNetworkWith(t, "slow", m)
	if ips, err := n.add(ctx, a); err != nil || len(ips) != 1 || ips[0] != "10.1.2.3" {
		t.Fatalf("add = %v, %v", ips, err)
	}
	if err := n.del(ctx, a); err != nil {
		t.Fatalf("del: %v", err)
	}
	for _, op := range []string{cniAdd, cniDel} {
		count, sum := histogramOf(t, m, op)
		// The plugin sleeps 50 ms per call.
		if count != 1 || sum < 50*time.Millisecond || sum > 10*time.Second {
			t.Errorf("%s: %d observations, %s in all; want 1, at least the plugin's 50 ms", op, count, sum)
		}
		if e := testutil.ToFloat64(m.errors.WithLabelValues(op)); e != 0 {
			t.Errorf("%s: %v errors counted for a plugin that succeeded", op, e)
		}
	}

	broken := cniNetworkWith(t, "broken", m)
	if _, err := broken.add(ctx, a); err == nil {
		t.Fatal("add through a failing plugin succeeded")
	}
	if count, _ := histogramOf(t, m, cniAdd); count != 2 {
		t.Errorf("a failed ADD is not timed: %d ADD observations, want 2", count)
	}
	if e := testutil.ToFloat64(m.errors.WithLabelValues(cniAdd)); e != 1 {
		t.Errorf("ADD errors = %v, want 1", e)
	}

	// A network without metrics still works.
	if _, err := cniNetworkWith(t, "slow", nil).add(ctx, a); err != nil {
		t.Errorf("add without metrics: %v", err)
	}
}
