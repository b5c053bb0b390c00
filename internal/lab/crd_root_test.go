package lab

import (
	"bytes"
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/lab/controlplane/cptest"
)

// TestEnsureCRDsRoot applies the lab's CRDs and classes to a real
// kube-apiserver twice: the CRDs are Established with the annotations the
// conformance suites check (httproutes, 429 KB, goes in server-side), the
// classes name flatnet's controllers, and the second call changes
// nothing (same resourceVersions).
func TestEnsureCRDsRoot(t *testing.T) {
	kubeconfig, _ := cptest.Start(t, 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	if err := EnsureCRDs(ctx, kubeconfig); err != nil {
		t.Fatal(err)
	}
	t.Logf("CRDs Established and classes applied in %s", time.Since(start).Round(time.Millisecond))

	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	versions := func() map[string]string {
		out := map[string]string{}
		crds, err := labCRDs()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range crds {
			got, err := dc.Resource(crdGVR).Get(ctx, c.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.GetAnnotations() {
				if got.GetAnnotations()[k] != v {
					t.Errorf("CRD %s: annotation %s=%q, want %q", c.GetName(), k, got.GetAnnotations()[k], v)
				}
			}
			out["crd "+c.GetName()] = got.GetResourceVersion()
		}
		for _, c := range labClasses() {
			got, err := dc.Resource(c.gvr).Get(ctx, c.obj.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s %s: %v", c.obj.GetKind(), c.obj.GetName(), err)
			}
			if got.Object["spec"] == nil || !bytes.Contains([]byte(got.GetManagedFields()[0].Manager), []byte("flatnet-lab")) {
				t.Errorf("%s %s: %v", c.obj.GetKind(), c.obj.GetName(), got.Object)
			}
			out[c.obj.GetKind()] = got.GetResourceVersion()
		}
		return out
	}
	first := versions()
	if err := EnsureCRDs(ctx, kubeconfig); err != nil {
		t.Fatal(err)
	}
	for k, v := range versions() {
		if first[k] != v {
			t.Errorf("%s: resourceVersion %s after the second call, was %s", k, v, first[k])
		}
	}
	gc, err := dc.Resource(labClasses()[0].gvr).Get(ctx, GatewayClassName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := gc.Object["spec"].(map[string]any); spec["controllerName"] != GatewayControllerName {
		t.Errorf("GatewayClass spec %v", spec)
	}
}
