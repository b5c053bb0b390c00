package lab

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The embedded CRDs are the ones the conformance suites accept: both
// refuse a cluster whose CRDs carry another bundle version or channel
// annotation (ClusterNetworkPolicy v0.3.0, Gateway API v1.6.3).
func TestLabCRDs(t *testing.T) {
	crds, err := labCRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"clusternetworkpolicies.policy.networking.k8s.io": "policy.networking.k8s.io/=v0.3.0",
	}
	for _, r := range []string{"backendtlspolicies", "gatewayclasses", "gateways", "grpcroutes", "httproutes",
		"listenersets", "referencegrants", "tcproutes", "tlsroutes", "udproutes"} {
		want[r+".gateway.networking.k8s.io"] = "gateway.networking.k8s.io/=v1.6.3"
	}
	got := map[string]bool{}
	for _, c := range crds {
		name := c.GetName()
		got[name] = true
		w, ok := want[name]
		if !ok {
			t.Errorf("unexpected CRD %s", name)
			continue
		}
		prefix, version, _ := strings.Cut(w, "=")
		a := c.GetAnnotations()
		if a[prefix+"bundle-version"] != version || a[prefix+"channel"] != "standard" {
			t.Errorf("%s: annotations %v: want %sbundle-version %s, channel standard", name, a, prefix, version)
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(c.Object, "status"); found {
			t.Errorf("%s: status is still set: the apiserver owns it", name)
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("CRD %s missing", name)
		}
	}
}

// The classes name flatnet's controllers, and each is served by a CRD the
// lab installs or by Kubernetes itself.
func TestLabClasses(t *testing.T) {
	crds, err := labCRDs()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{"networking.k8s.io/ingressclasses": true}
	for _, c := range crds {
		group, _, _ := unstructured.NestedString(c.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(c.Object, "spec", "names", "plural")
		served[group+"/"+plural] = true
	}
	want := map[string]string{"GatewayClass": "flatnet.io/gateway-controller", "IngressClass": "flatnet.io/ingress-controller"}
	for _, c := range labClasses() {
		if !served[c.gvr.Group+"/"+c.gvr.Resource] {
			t.Errorf("%s: %s not served", c.obj.GetKind(), c.gvr)
		}
		field := "controllerName"
		if c.obj.GetKind() == "IngressClass" {
			field = "controller"
		}
		got, _, _ := unstructured.NestedString(c.obj.Object, "spec", field)
		if c.obj.GetName() != "flatnet" || got != want[c.obj.GetKind()] {
			t.Errorf("%s %s: spec.%s %q, want name flatnet, %q", c.obj.GetKind(), c.obj.GetName(), field, got, want[c.obj.GetKind()])
		}
		delete(want, c.obj.GetKind())
	}
	if len(want) != 0 {
		t.Errorf("missing %v", want)
	}
}

func TestCRDEstablished(t *testing.T) {
	for _, tc := range []struct {
		conds []any
		want  bool
	}{
		{nil, false},
		{[]any{map[string]any{"type": "NamesAccepted", "status": "True"}}, false},
		{[]any{map[string]any{"type": "Established", "status": "False", "message": "installing"}}, false},
		{[]any{map[string]any{"type": "NamesAccepted", "status": "True"}, map[string]any{"type": "Established", "status": "True"}}, true},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"conditions": tc.conds}}}
		if got, why := crdEstablished(u); got != tc.want {
			t.Errorf("conditions %v: got %v (%s), want %v", tc.conds, got, why, tc.want)
		}
	}
}

func TestHolds(t *testing.T) {
	want := labClasses()[0].obj
	got := want.DeepCopy()
	if !holds(got, want) {
		t.Error("a copy does not hold it")
	}
	got.Object["status"] = map[string]any{"conditions": []any{}}
	got.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "flatnet-lab", "other": "x"})
	if err := unstructured.SetNestedField(got.Object, "more", "spec", "extra"); err != nil {
		t.Fatal(err)
	}
	if !holds(got, want) {
		t.Error("status, another label or another spec field make it differ")
	}
	for _, change := range []func(u *unstructured.Unstructured){
		func(u *unstructured.Unstructured) { u.SetLabels(nil) },
		func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "x/y", "spec", "controllerName")
		},
		func(u *unstructured.Unstructured) { unstructured.RemoveNestedField(u.Object, "spec", "description") },
	} {
		got := want.DeepCopy()
		change(got)
		if holds(got, want) {
			t.Errorf("%v holds %v", got.Object, want.Object)
		}
	}
}
