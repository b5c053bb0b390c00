package tracker

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/kube"
)

// Meta is the part of an object's metadata the informers and the tracker
// read: the cache's key (namespace/name), the resourceVersion, and
// whether it is being deleted. A metav1.ObjectMeta is a 248-byte struct
// (two maps, three slices, eight strings) of which the proxy used five
// fields; at 10,000 Services and 10,000 slices that difference alone was
// about 4 MB of the proxy's heap. Meta implements metav1.Object, which is
// what the informers' key functions ask for (meta.Accessor), with
// kube.NoMeta answering for the fields it does not keep (their setters
// drop the value: nothing that caches a compact object writes them). The
// UID is not kept either: the informers and the tracker go by
// namespace/name, and at 10,000 Services and slices the UIDs' strings
// were 1 MB.
type Meta struct {
	kube.NoMeta
	Name              string
	Namespace         string
	ResourceVersion   string
	DeletionTimestamp *metav1.Time
}

var _ metav1.Object = &Meta{}

// metaOf keeps what Meta keeps of m.
func metaOf(m *metav1.ObjectMeta) Meta {
	return Meta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp}
}

func (m *Meta) GetNamespace() string                { return m.Namespace }
func (m *Meta) SetNamespace(namespace string)       { m.Namespace = namespace }
func (m *Meta) GetName() string                     { return m.Name }
func (m *Meta) SetName(name string)                 { m.Name = name }
func (m *Meta) GetResourceVersion() string          { return m.ResourceVersion }
func (m *Meta) SetResourceVersion(version string)   { m.ResourceVersion = version }
func (m *Meta) GetDeletionTimestamp() *metav1.Time  { return m.DeletionTimestamp }
func (m *Meta) SetDeletionTimestamp(t *metav1.Time) { m.DeletionTimestamp = t }
