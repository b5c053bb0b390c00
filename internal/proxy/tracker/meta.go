package tracker

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is the part of an object's metadata the informers and the tracker
// read: the cache's key (namespace/name), the resourceVersion, and
// whether it is being deleted. A metav1.ObjectMeta is a 248-byte struct
// (two maps, three slices, eight strings) of which the proxy used five
// fields; at 10,000 Services and 10,000 slices that difference alone was
// about 4 MB of the proxy's heap. Meta implements metav1.Object, which is
// what the informers' key functions ask for (meta.Accessor); the setters
// of fields it does not keep drop the value, as nothing that caches a
// compact object writes them. The UID is not kept either: the informers
// and the tracker go by namespace/name, and at 10,000 Services and slices
// the UIDs' strings were 1 MB.
type Meta struct {
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

// Fields Meta does not keep.

func (m *Meta) GetUID() types.UID                             { return "" }
func (m *Meta) SetUID(types.UID)                              {}
func (m *Meta) GetGenerateName() string                       { return "" }
func (m *Meta) SetGenerateName(string)                        {}
func (m *Meta) GetGeneration() int64                          { return 0 }
func (m *Meta) SetGeneration(int64)                           {}
func (m *Meta) GetSelfLink() string                           { return "" }
func (m *Meta) SetSelfLink(string)                            {}
func (m *Meta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (m *Meta) SetCreationTimestamp(metav1.Time)              {}
func (m *Meta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (m *Meta) SetDeletionGracePeriodSeconds(*int64)          {}
func (m *Meta) GetLabels() map[string]string                  { return nil }
func (m *Meta) SetLabels(map[string]string)                   {}
func (m *Meta) GetAnnotations() map[string]string             { return nil }
func (m *Meta) SetAnnotations(map[string]string)              {}
func (m *Meta) GetFinalizers() []string                       { return nil }
func (m *Meta) SetFinalizers([]string)                        {}
func (m *Meta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (m *Meta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (m *Meta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (m *Meta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
