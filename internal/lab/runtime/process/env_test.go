package process

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(ns, name, ip string, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{ClusterIP: ip, Ports: ports},
	}
}

func TestServiceEnv(t *testing.T) {
	services := []*v1.Service{
		svc("default", "kubernetes", "10.96.0.1", v1.ServicePort{Name: "https", Port: 443, Protocol: v1.ProtocolTCP}),
		svc("app", "my-web", "10.96.3.4",
			v1.ServicePort{Name: "http", Port: 80},
			v1.ServicePort{Name: "dns-udp", Port: 53, Protocol: v1.ProtocolUDP}),
		svc("app", "headless", v1.ClusterIPNone, v1.ServicePort{Port: 80}),
		svc("other", "elsewhere", "10.96.9.9", v1.ServicePort{Port: 1}),
	}
	got := serviceEnv(services, "app", true)
	want := map[string]string{
		"KUBERNETES_SERVICE_HOST":       "10.96.0.1",
		"KUBERNETES_SERVICE_PORT":       "443",
		"KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT":               "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP":       "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_443_TCP_PORT":  "443",
		"KUBERNETES_PORT_443_TCP_ADDR":  "10.96.0.1",

		"MY_WEB_SERVICE_HOST":         "10.96.3.4",
		"MY_WEB_SERVICE_PORT":         "80",
		"MY_WEB_SERVICE_PORT_HTTP":    "80",
		"MY_WEB_SERVICE_PORT_DNS_UDP": "53",
		"MY_WEB_PORT":                 "tcp://10.96.3.4:80",
		"MY_WEB_PORT_80_TCP":          "tcp://10.96.3.4:80",
		"MY_WEB_PORT_80_TCP_PROTO":    "tcp",
		"MY_WEB_PORT_80_TCP_PORT":     "80",
		"MY_WEB_PORT_80_TCP_ADDR":     "10.96.3.4",
		"MY_WEB_PORT_53_UDP":          "udp://10.96.3.4:53",
		"MY_WEB_PORT_53_UDP_PROTO":    "udp",
		"MY_WEB_PORT_53_UDP_PORT":     "53",
		"MY_WEB_PORT_53_UDP_ADDR":     "10.96.3.4",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("service env (-want +got):\n%s", d)
	}
	// enableServiceLinks: false keeps only the master service.
	got = serviceEnv(services, "app", false)
	for k := range got {
		if !strings.HasPrefix(k, "KUBERNETES_") {
			t.Errorf("enableServiceLinks=false still sets %s", k)
		}
	}
	if got["KUBERNETES_SERVICE_HOST"] != "10.96.0.1" {
		t.Errorf("enableServiceLinks=false dropped the kubernetes service: %v", got)
	}
	// IPv6 cluster IPs are bracketed in URLs.
	got = serviceEnv([]*v1.Service{svc("app", "v6", "fd00::10", v1.ServicePort{Port: 8080})}, "app", true)
	if got["V6_PORT"] != "tcp://[fd00::10]:8080" || got["V6_SERVICE_HOST"] != "fd00::10" {
		t.Errorf("IPv6 service env: %v", got)
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	lookup := func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
	for in, want := range map[string]string{
		"$(A)":            "1",
		"x$(A)y$(B)z":     "x1ytwoz",
		"$$(A)":           "$(A)",
		"$(MISSING)":      "$(MISSING)",
		"$(A":             "$(A",
		"$A":              "$A",
		"$":               "$",
		"a$$b":            "a$b",
		"$($(A))":         "$($(A))",
		"100$":            "100$",
		"$(A)$(A)$$(B)$B": "11$(B)$B",
	} {
		if got := expand(in, lookup); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestContainerEnv(t *testing.T) {
	f := false
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-1", UID: "u-1", Labels: map[string]string{"run": "web"}},
		Spec: v1.PodSpec{
			NodeName:           "lab-node1",
			ServiceAccountName: "sa",
			EnableServiceLinks: nil, // default true
			Containers: []v1.Container{{
				Name: "c",
				EnvFrom: []v1.EnvFromSource{
					{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}, Prefix: "CM_"},
					{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "missing"}, Optional: ptrTo(true)}},
				},
				Env: []v1.EnvVar{
					{Name: "GREETING", Value: "hello $(MY_WEB_SERVICE_HOST) $(CM_k)"},
					{Name: "POD_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
					{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_NS", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
					{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
					{Name: "HOST_IP", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
					{Name: "RUN", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels['run']"}}},
					{Name: "FROM_CM", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "k"}}},
					{Name: "OPT", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "nokey", Optional: ptrTo(true)}}},
					{Name: "MY_WEB_SERVICE_PORT", Value: "override"},
				},
			}},
		},
	}
	errNotFound := errors.New("not found")
	in := envInput{
		Pod: pod, Container: &pod.Spec.Containers[0],
		PodIPs: []string{"10.244.1.5"}, NodeIP: "10.250.0.11", Hostname: "web-1",
		Services: []*v1.Service{svc("app", "my-web", "10.96.3.4", v1.ServicePort{Port: 80})},
		PodPath:  "/lab/bin",
		Sources: envSources{
			ConfigMap: func(ns, name string) (*v1.ConfigMap, error) {
				if ns == "app" && name == "cm" {
					return &v1.ConfigMap{Data: map[string]string{"k": "v"}}, nil
				}
				return nil, errNotFound
			},
			Secret:     func(ns, name string) (*v1.Secret, error) { return nil, errNotFound },
			IsNotFound: func(err error) bool { return errors.Is(err, errNotFound) },
		},
	}
	got, err := containerEnv(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"CM_k=v",
		"GREETING=hello 10.96.3.4 v",
		"POD_IP=10.244.1.5",
		"POD_NAME=web-1",
		"POD_NS=app",
		"NODE=lab-node1",
		"HOST_IP=10.250.0.11",
		"RUN=web",
		"FROM_CM=v",
		"MY_WEB_SERVICE_PORT=override",
		"MY_WEB_PORT=tcp://10.96.3.4:80",
		"MY_WEB_PORT_80_TCP=tcp://10.96.3.4:80",
		"MY_WEB_PORT_80_TCP_ADDR=10.96.3.4",
		"MY_WEB_PORT_80_TCP_PORT=80",
		"MY_WEB_PORT_80_TCP_PROTO=tcp",
		"MY_WEB_SERVICE_HOST=10.96.3.4",
		"PATH=/lab/bin:" + defaultPath,
		"HOSTNAME=web-1",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("env (-want +got):\n%s", d)
	}

	// Service links off; a missing required ConfigMap is an error.
	pod.Spec.EnableServiceLinks = &f
	pod.Spec.Containers[0].EnvFrom = nil
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "nope"}, Key: "k"}}}}
	if _, err := containerEnv(in); err == nil || !strings.Contains(err.Error(), "env X") {
		t.Errorf("missing configMap: err = %v", err)
	}
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "PATH", Value: "/mine"}}
	got, err = containerEnv(in)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"PATH=/mine", "HOSTNAME=web-1"}, got); d != "" {
		t.Errorf("links off, own PATH (-want +got):\n%s", d)
	}
}

func TestCommandLine(t *testing.T) {
	c := &v1.Container{Name: "c", Command: []string{"flatnet", "netexec"}, Args: []string{"--http-port=$(PORT)", "$$(PORT)"}}
	got, err := commandLine(c, []string{"PORT=8080"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"flatnet", "netexec", "--http-port=8080", "$(PORT)"}, got); d != "" {
		t.Error(d)
	}
	if _, err := commandLine(&v1.Container{Name: "img", Args: []string{"x"}}, nil); err == nil || !strings.Contains(err.Error(), "set command") {
		t.Errorf("no command: %v", err)
	}
}

func ptrTo[T any](v T) *T { return &v }

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"$(A)", "$$", "$(", "a$(b)c$$(d)", "$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := expand(s, func(string) (string, bool) { return "", false })
		// With nothing defined, only $$ escapes change the text.
		if !strings.Contains(s, "$$") && out != s {
			t.Fatalf("expand(%q) = %q with no variables", s, out)
		}
	})
}
