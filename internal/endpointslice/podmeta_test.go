package endpointslice

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestPodMetaAsObject: a cached Pod answers the informer's key and
// namespace index functions through metav1.Object, and a DeepCopy's
// metadata can be written without touching the original.
func TestPodMetaAsObject(t *testing.T) {
	grace := int64(30)
	del := metav1.NewTime(time.Unix(1700000000, 0))
	p := PodOf(realisticPod(3))
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &del, &grace

	m, err := meta.Accessor(p)
	if err != nil {
		t.Fatal(err)
	}
	if m.GetName() != p.Name || m.GetNamespace() != p.Namespace || m.GetUID() != p.UID || m.GetResourceVersion() != p.ResourceVersion {
		t.Errorf("accessor: %s/%s %s %s, want %s/%s %s %s", m.GetNamespace(), m.GetName(), m.GetUID(), m.GetResourceVersion(), p.Namespace, p.Name, p.UID, p.ResourceVersion)
	}
	if key, err := cache.MetaNamespaceKeyFunc(p); err != nil || key != p.Namespace+"/"+p.Name {
		t.Errorf("key %q (%v), want %s/%s", key, err, p.Namespace, p.Name)
	}
	if ns, err := cache.MetaNamespaceIndexFunc(p); err != nil || len(ns) != 1 || ns[0] != p.Namespace {
		t.Errorf("namespace index %v (%v), want [%s]", ns, err, p.Namespace)
	}

	c := p.DeepCopy()
	if !c.Equal(p) {
		t.Fatalf("copy differs: %+v", c)
	}
	c.Labels["new"] = "x"
	c.DeletionTimestamp.Time = time.Unix(0, 0)
	*c.DeletionGracePeriodSeconds = 1
	if _, ok := p.Labels["new"]; ok || !p.DeletionTimestamp.Equal(&del) || *p.DeletionGracePeriodSeconds != 30 {
		t.Errorf("writing the copy changed the original: %+v", p)
	}
}
