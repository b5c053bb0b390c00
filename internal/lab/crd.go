package lab

// The lab installs the CustomResourceDefinitions that flatnet enforces but
// Kubernetes does not ship: ClusterNetworkPolicy (sigs.k8s.io/network-policy-api
// v0.3.0, standard channel) and the Gateway API (sigs.k8s.io/gateway-api
// v1.6.3, standard channel); crds/README.md says where the files come from.
// Then the classes flatnet's gateway serves: GatewayClass flatnet and
// IngressClass flatnet (labClasses), which users (and the Gateway API
// conformance suite) name but nothing else creates.
// Each is applied server-side under the lab's field manager, so a second
// `up` changes nothing, and `up` waits until the apiserver serves it
// (Established), so a client may create policies as soon as `up` returns.
// It is applied as soon as the control plane is up, before the controller
// and the agents start (an agent asks the API once, at its start, whether
// it serves ClusterNetworkPolicy), and again at the end of every `up` (a
// lab whose control plane was already up).

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

//go:embed crds/*.yaml
var crdFiles embed.FS

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// crdEstablishTimeout bounds the wait for one CRD to be served; it takes
// well under a second on an idle apiserver.
const crdEstablishTimeout = time.Minute

// labCRDs are the embedded CRDs as objects to apply (status dropped: the
// apiserver owns it).
func labCRDs() ([]*unstructured.Unstructured, error) {
	entries, err := crdFiles.ReadDir("crds")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, e := range entries {
		b, err := crdFiles.ReadFile(path.Join("crds", e.Name()))
		if err != nil {
			return nil, err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("crds/%s: %w", e.Name(), err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" || u.GetName() == "" {
			return nil, fmt.Errorf("crds/%s: want a named CustomResourceDefinition, got kind %q name %q", e.Name(), u.GetKind(), u.GetName())
		}
		unstructured.RemoveNestedField(u.Object, "status")
		out = append(out, u)
	}
	return out, nil
}

// Names of the classes the lab creates for flatnet's gateway.
const (
	GatewayClassName      = "flatnet"
	GatewayControllerName = "flatnet.io/gateway-controller"
	IngressClassName      = "flatnet"
	IngressControllerName = "flatnet.io/ingress-controller"
)

// labClass is one object the lab applies after the CRDs.
type labClass struct {
	gvr schema.GroupVersionResource
	obj *unstructured.Unstructured
}

// labClasses are GatewayClass flatnet and IngressClass flatnet. Only their
// spec is applied: flatnet's gateway writes the GatewayClass status.
func labClasses() []labClass {
	labels := map[string]any{"app.kubernetes.io/managed-by": "flatnet-lab"}
	return []labClass{
		{schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gatewayclasses"},
			&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
				"metadata": map[string]any{"name": GatewayClassName, "labels": labels},
				"spec": map[string]any{"controllerName": GatewayControllerName,
					"description": "flatnet: Gateway API served on every node"},
			}}},
		{schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingressclasses"},
			&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
				"metadata": map[string]any{"name": IngressClassName, "labels": labels},
				"spec":     map[string]any{"controller": IngressControllerName},
			}}},
	}
}

// apply applies obj server-side under the lab's field manager.
func apply(ctx context.Context, res dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
	body, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = res.Patch(ctx, obj.GetName(), types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: "flatnet-lab", Force: &force})
	return err
}

// holds reports whether got has want's labels and spec (fields got has
// beyond want's, defaults say, do not count).
func holds(got, want *unstructured.Unstructured) bool {
	for k, v := range want.GetLabels() {
		if got.GetLabels()[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepDerivative(want.Object["spec"], got.Object["spec"])
}

// ensureCRDs applies every embedded CRD, waits until each is Established,
// then applies the classes.
func ensureCRDs(ctx context.Context, kubeconfig string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	rc.Timeout = 30 * time.Second
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	crds, err := labCRDs()
	if err != nil {
		return err
	}
	res := dc.Resource(crdGVR)
	for _, crd := range crds {
		// Server-side: httproutes is 429 KB, over the 256 KiB a
		// client-side apply's last-applied annotation may hold.
		if err := apply(ctx, res, crd); err != nil {
			return fmt.Errorf("applying CRD %s: %w", crd.GetName(), err)
		}
	}
	for _, crd := range crds {
		name := crd.GetName()
		var last string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, crdEstablishTimeout, true, func(ctx context.Context) (bool, error) {
			got, err := res.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			ok, why := crdEstablished(got)
			last = why
			return ok, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not Established after %s (%s): see the apiserver's log", name, crdEstablishTimeout, last)
		}
	}
	for _, c := range labClasses() {
		// Established can come a moment before the API serves the kind
		// (404): retry that briefly.
		var last error
		res := dc.Resource(c.gvr)
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, crdEstablishTimeout, true, func(ctx context.Context) (bool, error) {
			// Left alone when it holds what we apply: a GatewayClass
			// applied again is written again (a new resourceVersion for
			// its defaulted status), even with nothing changed.
			if got, err := res.Get(ctx, c.obj.GetName(), metav1.GetOptions{}); err == nil && holds(got, c.obj) {
				last = nil
				return true, nil
			}
			last = apply(ctx, res, c.obj)
			return last == nil, nil
		})
		if err != nil {
			return fmt.Errorf("applying %s %s: %w", c.obj.GetKind(), c.obj.GetName(), last)
		}
	}
	return nil
}

// crdEstablished reports whether crd's Established condition is True, and
// what it says otherwise.
func crdEstablished(crd *unstructured.Unstructured) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Established" {
			continue
		}
		if m["status"] == "True" {
			return true, ""
		}
		return false, fmt.Sprintf("Established=%v: %v", m["status"], m["message"])
	}
	return false, "no Established condition yet"
}

// EnsureCRDs is ensureCRDs for tests outside the lab that need the
// lab's CRDs and classes on their own API server.
func EnsureCRDs(ctx context.Context, kubeconfig string) error { return ensureCRDs(ctx, kubeconfig) }
