package endpointslice

// PodMeta is the part of a pod's metadata the controller keeps: a cached
// Pod embeds it instead of a metav1.ObjectMeta, whose 256 bytes are
// mostly fields a pod of this cache never has a use for (generateName,
// selfLink, creation time, annotations, owners, finalizers, managed
// fields). At 100,000 pods that is 16 MB of live heap, and about twice
// that of RSS. It implements metav1.Object, as the informer's key and
// index functions need, with kube.NoMeta answering for the fields it
// does not keep.

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/kube"
)

// PodMeta: name, namespace, uid, resourceVersion, labels, and the
// deletion timestamp and grace period.
type PodMeta struct {
	kube.NoMeta
	Name, Namespace            string
	UID                        types.UID
	ResourceVersion            string
	Labels                     map[string]string
	DeletionTimestamp          *metav1.Time
	DeletionGracePeriodSeconds *int64
}

var _ metav1.Object = (*PodMeta)(nil)

func (m *PodMeta) GetNamespace() string                { return m.Namespace }
func (m *PodMeta) SetNamespace(namespace string)       { m.Namespace = namespace }
func (m *PodMeta) GetName() string                     { return m.Name }
func (m *PodMeta) SetName(name string)                 { m.Name = name }
func (m *PodMeta) GetUID() types.UID                   { return m.UID }
func (m *PodMeta) SetUID(uid types.UID)                { m.UID = uid }
func (m *PodMeta) GetResourceVersion() string          { return m.ResourceVersion }
func (m *PodMeta) SetResourceVersion(version string)   { m.ResourceVersion = version }
func (m *PodMeta) GetLabels() map[string]string        { return m.Labels }
func (m *PodMeta) SetLabels(labels map[string]string)  { m.Labels = labels }
func (m *PodMeta) GetDeletionTimestamp() *metav1.Time  { return m.DeletionTimestamp }
func (m *PodMeta) SetDeletionTimestamp(t *metav1.Time) { m.DeletionTimestamp = t }
func (m *PodMeta) GetDeletionGracePeriodSeconds() *int64 {
	return m.DeletionGracePeriodSeconds
}
func (m *PodMeta) SetDeletionGracePeriodSeconds(s *int64) { m.DeletionGracePeriodSeconds = s }
