package process

import (
	"encoding/json"
	"math"
	"net"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		val     string
		want    uint64
		wantErr string
	}{
		{"10M", 10_000_000, ""},
		{"1k", 1000, ""},
		{"1.5G", 1_500_000_000, ""},
		{" 100Mi ", 100 * 1024 * 1024, ""},
		{"1P", 1_000_000_000_000_000, ""},
		{"999", 0, "unreasonably small"},
		{"2P", 0, "unreasonably large"},
		{"10 Mbit", 0, "want a quantity"},
		{"", 0, "want a quantity"},
		{"-5M", 0, "unreasonably small"},
		{"e77777777", 0, "exponent too large"},
		{"1e-300", 0, "exponent too large"},
		{"1e6", 1_000_000, ""},
	} {
		got, ok, err := parseBandwidth(map[string]string{ingressBandwidthAnnotation: tc.val}, ingressBandwidthAnnotation)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), ingressBandwidthAnnotation) {
				t.Errorf("%q: err = %v, want one naming the annotation and %q", tc.val, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !ok || got != tc.want {
			t.Errorf("%q: got %d ok=%v err=%v, want %d", tc.val, got, ok, err, tc.want)
		}
	}
	if _, ok, err := parseBandwidth(nil, ingressBandwidthAnnotation); ok || err != nil {
		t.Errorf("absent: ok=%v err=%v", ok, err)
	}
}

func TestPodAttachment(t *testing.T) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "p", UID: "uid-1", Annotations: map[string]string{
			ingressBandwidthAnnotation: "10M",
			egressBandwidthAnnotation:  "1M",
		}},
		Spec: v1.PodSpec{Containers: []v1.Container{
			{Name: "a", Ports: []v1.ContainerPort{
				{ContainerPort: 8080, HostPort: 30080},
				{ContainerPort: 8081, HostPort: 30081, Protocol: v1.ProtocolUDP, HostIP: "10.250.0.11"},
				{ContainerPort: 9000}, // no host port: not mapped
			}},
			{Name: "b", Ports: []v1.ContainerPort{{ContainerPort: 53, HostPort: 5353, Protocol: v1.ProtocolSCTP}}},
		}},
	}
	a, err := podAttachment(pod, "sb1", "/run/netns/x")
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := [][2]string{
		{"IgnoreUnknown", "1"},
		{"K8S_POD_NAMESPACE", "ns1"},
		{"K8S_POD_NAME", "p"},
		{"K8S_POD_INFRA_CONTAINER_ID", "sb1"},
		{"K8S_POD_UID", "uid-1"},
	}
	if d := cmp.Diff(wantArgs, a.Args); d != "" {
		t.Errorf("args (-want +got):\n%s", d)
	}
	if a.SandboxID != "sb1" || a.NetnsPath != "/run/netns/x" || a.IfName != "eth0" {
		t.Errorf("attachment %+v", a)
	}
	// What the plugins read: the capabilities as JSON.
	b, _ := json.Marshal(a.Caps)
	var caps map[string]any
	_ = json.Unmarshal(b, &caps)
	want := map[string]any{
		"portMappings": []any{
			map[string]any{"hostPort": 30080.0, "containerPort": 8080.0, "protocol": "tcp"},
			map[string]any{"hostPort": 30081.0, "containerPort": 8081.0, "protocol": "udp", "hostIP": "10.250.0.11"},
			map[string]any{"hostPort": 5353.0, "containerPort": 53.0, "protocol": "sctp"},
		},
		"bandwidth": map[string]any{
			"ingressRate": 1e7, "ingressBurst": float64(math.MaxUint32),
			"egressRate": 1e6, "egressBurst": float64(math.MaxUint32),
		},
	}
	if d := cmp.Diff(want, caps); d != "" {
		t.Errorf("capabilities (-want +got):\n%s", d)
	}

	// Only one direction; no ports.
	pod.Annotations = map[string]string{egressBandwidthAnnotation: "5M"}
	pod.Spec.Containers = []v1.Container{{Name: "a"}}
	a, err = podAttachment(pod, "sb1", "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(a.Caps)
	if string(b) != `{"bandwidth":{"egressRate":5000000,"egressBurst":4294967295}}` {
		t.Errorf("egress only: %s", b)
	}

	pod.Annotations = map[string]string{ingressBandwidthAnnotation: "lots"}
	if _, err := podAttachment(pod, "sb1", "/x"); err == nil {
		t.Error("a bad annotation was accepted")
	}
}

func FuzzParseBandwidth(f *testing.F) {
	for _, s := range []string{"10M", "1k", "1e3", "0.5G", "", "1P", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok, err := parseBandwidth(map[string]string{egressBandwidthAnnotation: s}, egressBandwidthAnnotation)
		if err == nil && (!ok || v < 1000 || v > 1_000_000_000_000_000) {
			t.Fatalf("%q accepted as %d (ok=%v)", s, v, ok)
		}
	})
}

func TestResultIPs(t *testing.T) {
	idx := func(i int) *int { return &i }
	mustCIDR := func(s string) net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return *n
	}
	res := &current.Result{
		CNIVersion: "1.0.0",
		Interfaces: []*current.Interface{{Name: "cni0"}, {Name: "veth1"}, {Name: "eth0", Sandbox: "/run/netns/x"}},
		IPs: []*current.IPConfig{
			{Interface: idx(0), Address: mustCIDR("10.244.1.1/24")}, // the bridge's, not the pod's
			{Interface: idx(2), Address: mustCIDR("fd00::5/64")},
			{Interface: idx(2), Address: mustCIDR("10.244.1.5/24")},
			{Interface: idx(2), Address: mustCIDR("10.244.1.6/24")}, // a second IPv4: the API takes one per family
		},
	}
	got, err := resultIPs(res, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"10.244.1.5", "fd00::5"}, got); d != "" {
		t.Errorf("pod IPs (-want +got):\n%s", d)
	}
	// No interface index (old plugins): every IP counts.
	res.IPs = []*current.IPConfig{{Address: mustCIDR("10.9.0.3/16")}}
	if got, err := resultIPs(res, "eth0"); err != nil || len(got) != 1 || got[0] != "10.9.0.3" {
		t.Errorf("no interface index: %v %v", got, err)
	}
	res.IPs = nil
	if _, err := resultIPs(res, "eth0"); err == nil {
		t.Error("a result without IPs was accepted")
	}
}
