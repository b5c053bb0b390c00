package lab

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The embedded CRD is the one the ClusterNetworkPolicy conformance suite
// v0.3.0 accepts: it refuses a cluster whose CRDs carry another bundle
// version or channel annotation.
func TestLabCRDs(t *testing.T) {
	crds, err := labCRDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 1 {
		t.Fatalf("want 1 CRD, got %d", len(crds))
	}
	c := crds[0]
	if c.GetName() != "clusternetworkpolicies.policy.networking.k8s.io" {
		t.Errorf("name %q", c.GetName())
	}
	a := c.GetAnnotations()
	if a["policy.networking.k8s.io/bundle-version"] != "v0.3.0" || a["policy.networking.k8s.io/channel"] != "standard" {
		t.Errorf("annotations %v: want bundle-version v0.3.0, channel standard", a)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(c.Object, "status"); found {
		t.Error("status is still set: the apiserver owns it")
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
