package process

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestProbeCounter(t *testing.T) {
	type step struct {
		ok      bool
		verdict bool
		changed bool
	}
	for _, tc := range []struct {
		name       string
		succ, fail int32
		steps      []step
	}{
		{"defaults: one success decides, three failures undo", 0, 0, []step{
			{false, false, false}, {false, false, false}, {true, true, true}, {true, true, false},
			{false, true, false}, {false, true, false}, {false, false, true}, {false, false, false}, {true, true, true},
		}},
		{"three failures decide the first verdict", 1, 3, []step{
			{false, false, false}, {false, false, false}, {false, false, true}, {false, false, false},
		}},
		{"success threshold 2, failure 1", 2, 1, []step{
			{true, false, false}, {true, true, true}, {false, false, true}, {true, false, false}, {false, false, false}, {true, false, false}, {true, true, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1.Probe{SuccessThreshold: tc.succ, FailureThreshold: tc.fail}
			var c probeCounter
			for i, s := range tc.steps {
				v, ch := c.observe(s.ok, p)
				if v != s.verdict || ch != s.changed {
					t.Fatalf("step %d (ok=%v): verdict %v changed %v, want %v %v", i, s.ok, v, ch, s.verdict, s.changed)
				}
			}
		})
	}
}

func TestRealProberHTTPAndTCP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			if r.Header.Get("X-Test") != "yes" || !strings.HasPrefix(r.UserAgent(), "kube-probe/") {
				w.WriteHeader(400)
			}
		case "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			w.WriteHeader(503)
			_, _ = w.Write([]byte("not yet"))
		}
	}))
	defer srv.Close()
	host, portS, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portS)
	c := &v1.Container{Name: "c", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	target := probeTarget{PodIP: host, Container: c}
	pr := realProber{}
	hdr := []v1.HTTPHeader{{Name: "X-Test", Value: "yes"}}
	for _, tc := range []struct {
		name    string
		probe   v1.Probe
		want    bool
		wantMsg string
	}{
		{"http ok by name", v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/ok", Port: intstr.FromString("http"), HTTPHeaders: hdr}}}, true, ""},
		{"http redirect counts as success", v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/redirect", Port: intstr.FromInt32(int32(port))}}}, true, ""},
		{"http 503", v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/x", Port: intstr.FromInt32(int32(port))}}}, false, "statuscode: 503 not yet"},
		{"tcp ok", v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(int32(port))}}}, true, ""},
		{"tcp refused", v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(1)}}}, false, "dial tcp"},
		{"unknown named port", v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromString("nope")}}}, false, "not a number nor a named port"},
		{"grpc", v1.Probe{ProbeHandler: v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: 1}}}, false, "not supported"},
		{"exec without a process", v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}}, false, "not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, msg := pr.probe(context.Background(), &tc.probe, target)
			if ok != tc.want || !strings.Contains(msg, tc.wantMsg) {
				t.Fatalf("probe: ok=%v msg=%q, want ok=%v msg containing %q", ok, msg, tc.want, tc.wantMsg)
			}
		})
	}
}
