package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// NoMeta answers metav1.Object for an object that keeps none of it: every
// getter returns the zero value and every setter drops its value.
//
// A compact object that an informer caches instead of the API's type
// (tracker.Meta in the proxy, endpointslice.PodMeta) needs metav1.Object
// for the informer's key and index functions (meta.Accessor), but keeps
// only a few of its fields: an ObjectMeta is ~250 bytes per object,
// mostly fields those caches never read. It embeds NoMeta as its first
// field (zero size, no padding) and defines the accessors of the fields
// it keeps, which take precedence over these.
type NoMeta struct{}

var _ metav1.Object = NoMeta{}

func (NoMeta) GetNamespace() string                          { return "" }
func (NoMeta) SetNamespace(string)                           {}
func (NoMeta) GetName() string                               { return "" }
func (NoMeta) SetName(string)                                {}
func (NoMeta) GetGenerateName() string                       { return "" }
func (NoMeta) SetGenerateName(string)                        {}
func (NoMeta) GetUID() types.UID                             { return "" }
func (NoMeta) SetUID(types.UID)                              {}
func (NoMeta) GetResourceVersion() string                    { return "" }
func (NoMeta) SetResourceVersion(string)                     {}
func (NoMeta) GetGeneration() int64                          { return 0 }
func (NoMeta) SetGeneration(int64)                           {}
func (NoMeta) GetSelfLink() string                           { return "" }
func (NoMeta) SetSelfLink(string)                            {}
func (NoMeta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (NoMeta) SetCreationTimestamp(metav1.Time)              {}
func (NoMeta) GetDeletionTimestamp() *metav1.Time            { return nil }
func (NoMeta) SetDeletionTimestamp(*metav1.Time)             {}
func (NoMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (NoMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (NoMeta) GetLabels() map[string]string                  { return nil }
func (NoMeta) SetLabels(map[string]string)                   {}
func (NoMeta) GetAnnotations() map[string]string             { return nil }
func (NoMeta) SetAnnotations(map[string]string)              {}
func (NoMeta) GetFinalizers() []string                       { return nil }
func (NoMeta) SetFinalizers([]string)                        {}
func (NoMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (NoMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (NoMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (NoMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
