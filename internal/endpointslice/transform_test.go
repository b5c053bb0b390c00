package endpointslice

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
)

// realisticPod is a Deployment's pod as the API server returns it: owner,
// annotations, managedFields of the writers (controller, scheduler,
// kubelet), two containers with env, resources, probes and a volume, and
// a kubelet-written status.
func realisticPod(i int) *corev1.Pod {
	name := fmt.Sprintf("web-%d", i)
	ts := metav1.Unix(1.7e9, 0)
	fields := func(n int) *metav1.FieldsV1 {
		var b strings.Builder
		b.WriteString(`{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{}},"f:spec":{`)
		for c := range n {
			fmt.Fprintf(&b, `"k:{\"name\":\"c%d\"}":{".":{},"f:env":{"k:{\"name\":\"A\"}":{}},"f:image":{},"f:ports":{"k:{\"containerPort\":8080}":{}},"f:resources":{"f:limits":{"f:cpu":{}}}},`, c)
		}
		b.WriteString(`"f:dnsPolicy":{},"f:restartPolicy":{},"f:terminationGracePeriodSeconds":{}}}`)
		return &metav1.FieldsV1{Raw: []byte(b.String())}
	}
	container := func(c int) corev1.Container {
		return corev1.Container{
			Name: fmt.Sprintf("c%d", c), Image: "registry.example/team/web:1.2.3",
			Ports: []corev1.ContainerPort{{Name: fmt.Sprintf("http%d", c), ContainerPort: int32(8080 + c), Protocol: corev1.ProtocolTCP}},
			Env:   []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			},
			ReadinessProbe:           &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready"}}, PeriodSeconds: 5},
			VolumeMounts:             []corev1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
			TerminationMessagePath:   "/dev/termination-log",
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		}
	}
	status := func(c int) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: fmt.Sprintf("c%d", c), Ready: true, Image: "registry.example/team/web:1.2.3",
			ImageID:     "registry.example/team/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			ContainerID: fmt.Sprintf("containerd://%064d", i),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ts}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: fmt.Sprintf("ns-%d", i%50), UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)),
			ResourceVersion: fmt.Sprint(1000 + i), CreationTimestamp: ts, GenerateName: "web-",
			Labels:          map[string]string{"app": fmt.Sprintf("svc-%d", i/10), "pod-template-hash": "5d4f8b7c9"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d4f8b7c9", UID: "rs-uid"}},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", FieldsV1: fields(2)},
				{Manager: "kube-scheduler", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{".":{},"k:{\"type\":\"PodScheduled\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}}}}`)}, Subresource: "status"},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"10.1.2.3\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`)}, Subresource: "status"},
			},
		},
		Spec: corev1.PodSpec{
			NodeName: fmt.Sprintf("node-%d", i%5000), ServiceAccountName: "default", DNSPolicy: corev1.DNSClusterFirst,
			RestartPolicy: corev1.RestartPolicyAlways, SchedulerName: "default-scheduler",
			Containers: []corev1.Container{container(0), container(1)},
			Volumes: []corev1.Volume{{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			}}}}},
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: "192.0.2.10", PodIP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
			PodIPs:    []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}},
			StartTime: &ts, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: ts},
			},
			ContainerStatuses: []corev1.ContainerStatus{status(0), status(1)},
		},
	}
}

func TestTransform(t *testing.T) {
	full := realisticPod(7)
	got, err := Transform(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	p := got.(*Pod)
	if len(p.Ports) != 2 || len(p.SidecarPorts) != 0 {
		t.Errorf("ports: %+v %+v, want the two containers' ports", p.Ports, p.SidecarPorts)
	}
	for i := range full.Spec.Containers {
		sp := &corev1.ServicePort{Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString(full.Spec.Containers[i].Ports[0].Name)}
		if got, ok := FindPort(p, sp); !ok || got != full.Spec.Containers[i].Ports[0].ContainerPort {
			t.Errorf("port %q: %d %v, want %d", sp.TargetPort.StrVal, got, ok, full.Spec.Containers[i].Ports[0].ContainerPort)
		}
	}
	// What the controller reads is all there.
	want := &Pod{
		PodMeta:  PodMeta{Name: full.Name, Namespace: full.Namespace, UID: full.UID, ResourceVersion: full.ResourceVersion, Labels: full.Labels},
		NodeName: full.Spec.NodeName, Phase: corev1.PodRunning, IPs: []string{full.Status.PodIP},
		Ready: corev1.ConditionTrue, ReadySince: full.Status.Conditions[1].LastTransitionTime.UnixNano(),
		Ports: []corev1.ContainerPort{full.Spec.Containers[0].Ports[0], full.Spec.Containers[1].Ports[0]},
	}
	if d := cmp.Diff(want, p); d != "" {
		t.Errorf("transformed pod (-want +got):\n%s", d)
	}
	// Twice is once, also inside a tombstone.
	again, err := Transform(cache.DeletedFinalStateUnknown{Key: "k", Obj: p.DeepCopy()})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(p, again.(cache.DeletedFinalStateUnknown).Obj); d != "" {
		t.Errorf("transform not idempotent (-once +twice):\n%s", d)
	}

	n := node("n1", "zone-a")
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/big:1"}, SizeBytes: 1 << 30}}
	n.ManagedFields = full.ManagedFields
	gotN, _ := Transform(n)
	if d := cmp.Diff(node("n1", "zone-a"), gotN); d != "" {
		t.Errorf("node (-want +got):\n%s", d)
	}
	svc := service("s")
	svc.ManagedFields = full.ManagedFields
	svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "keep": "me"}
	gotS, _ := Transform(svc)
	if s := gotS.(*corev1.Service); len(s.ManagedFields) != 0 || !cmp.Equal(s.Annotations, map[string]string{"keep": "me"}) || s.Spec.Selector["app"] != "s" {
		t.Errorf("service: %+v", s)
	}
}

// BenchmarkPodCacheHeap is the heap a pod cache holds at 50,000
// realistic pods (MiB after GC, reported as the metric MiB; run with
// -benchtime 1x): "raw", corev1.Pods in an informer's store; "indexer",
// Transform's Pods in a store with client-go indexes by label pair and by
// node besides the factory's by namespace (the controller until
// 2026-12-04); "podindex", the controller's now: a store without indexes
// and podIndex.
func BenchmarkPodCacheHeap(b *testing.B) {
	const pods = 50000
	byLabel := func(obj any) ([]string, error) {
		pod := obj.(*Pod)
		out := make([]string, 0, len(pod.Labels))
		for k, v := range pod.Labels {
			out = append(out, pod.Namespace+"/"+k+"="+v)
		}
		return out, nil
	}
	byNode := func(obj any) ([]string, error) { return []string{obj.(*Pod).NodeName}, nil }
	b.Run("raw", func(b *testing.B) {
		reportHeap(b, func() any {
			store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			for i := range pods {
				if err := store.Add(realisticPod(i)); err != nil {
					b.Fatal(err)
				}
			}
			return store
		})
	})
	b.Run("indexer", func(b *testing.B) {
		reportHeap(b, func() any {
			store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, "label": byLabel, "node": byNode})
			for i := range pods {
				obj, _ := Transform(realisticPod(i))
				if err := store.Add(obj); err != nil {
					b.Fatal(err)
				}
			}
			return store
		})
	})
	b.Run("podindex", func(b *testing.B) {
		reportHeap(b, func() any {
			store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			index := newPodIndex()
			for i := range pods {
				obj, _ := Transform(realisticPod(i))
				if err := store.Add(obj); err != nil {
					b.Fatal(err)
				}
				index.update(nil, obj.(*Pod))
			}
			return []any{store, index}
		})
	})
}

// reportHeap reports, as the metric MiB, the heap in use after GC that
// what build returns holds (the last of b.N builds).
func reportHeap(b *testing.B, build func() any) {
	var mib float64
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		kept := build()
		runtime.GC()
		runtime.ReadMemStats(&after)
		mib = float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / (1 << 20)
		runtime.KeepAlive(kept)
	}
	b.ReportMetric(mib, "MiB")
}
