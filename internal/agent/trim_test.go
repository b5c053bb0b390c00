package agent

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// kubeletNode is a Node as a kubelet and the control plane leave it:
// labels, managedFields, conditions, images, node info and annotations
// besides what the agent reads.
func kubeletNode(i int) *corev1.Node {
	n := vxlanNode(fmt.Sprintf("node-%05d", i), fmt.Sprintf("10.%d.%d.0/24", 160+i/256, i%256), fmt.Sprintf("10.249.%d.%d", i/250, 1+i%250))
	n.UID = "0b4e6d2c-5a9f-4a55-8f0e-6c1b7d3e9a10"
	n.Labels = map[string]string{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"node.kubernetes.io/instance-type": "n2-standard-8", "topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "region-1"}
	n.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
	n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	fields := `{"f:metadata":{"f:annotations":{".":{},"f:node.alpha.kubernetes.io/ttl":{}}},"f:status":{"f:conditions":{"k:{\"type\":\"DiskPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"MemoryPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"PIDPressure\"}":{"f:lastHeartbeatTime":{}},"k:{\"type\":\"Ready\"}":{"f:lastHeartbeatTime":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{}}},"f:images":{},"f:nodeInfo":{"f:bootID":{}}}}`
	for _, m := range []string{"kubelet", "kube-controller-manager", "flatnet-agent", "kubectl"} {
		n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}})
	}
	for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: "False", Reason: "Kubelet" + string(c), Message: "kubelet has no " + strings.ToLower(string(c))})
	}
	for j := range 30 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: 1 << 24,
			Names: []string{fmt.Sprintf("registry.example/team/app-%d@sha256:%064x", j, j), fmt.Sprintf("registry.example/team/app-%d:v1.%d.0", j, j)}})
	}
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: "5c2f0e4d9b8a4f3e8d7c6b5a49382716", SystemUUID: "5c2f0e4d-9b8a-4f3e-8d7c-6b5a49382716",
		BootID: "1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d", KernelVersion: "6.18.0", OSImage: "Debian GNU/Linux 13", ContainerRuntimeVersion: "containerd://2.1.0",
		KubeletVersion: "v1.37.2", KubeProxyVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"}
	n.Status.Capacity = corev1.ResourceList{}
	return n
}

// TestTrimNode: the transform keeps exactly what the agent reads.
func TestTrimNode(t *testing.T) {
	n := kubeletNode(7)
	got, err := trimNode(n.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	g := got.(*corev1.Node)
	if d := cmp.Diff(backendNode(n), backendNode(g)); d != "" {
		t.Errorf("what the backends read changed (-before +after):\n%s", d)
	}
	if g.Name != n.Name || g.ResourceVersion != n.ResourceVersion || len(g.ManagedFields)+len(g.Status.Images)+len(g.Status.Conditions)+len(g.Labels) != 0 || len(g.Annotations) != 3 {
		t.Errorf("trimmed node keeps more or less than it should: %+v", g)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "x", Obj: n}
	if got, _ := trimNode(tomb); got != tomb {
		t.Errorf("tombstone changed: %v", got)
	}
}

// BenchmarkNodeCache: the heap the agent's Node informer holds for 1,000
// Nodes, with and without trimNode.
func BenchmarkNodeCache(b *testing.B) {
	const n = 1000
	for _, trim := range []bool{false, true} {
		b.Run(map[bool]string{false: "raw", true: "trimmed"}[trim], func(b *testing.B) {
			client := fake.NewClientset()
			for i := range n {
				if err := client.Tracker().Add(kubeletNode(i)); err != nil {
					b.Fatal(err)
				}
			}
			var per float64
			for i := 0; i < b.N; i++ {
				before := heap()
				var opts []informers.SharedInformerOption
				if trim {
					opts = append(opts, informers.WithTransform(trimNode))
				}
				ctx, cancel := context.WithCancel(context.Background())
				f := informers.NewSharedInformerFactoryWithOptions(client, 0, opts...)
				inf := f.Core().V1().Nodes().Informer()
				f.Start(ctx.Done())
				if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
					b.Fatal("no sync")
				}
				if got := len(inf.GetStore().List()); got != n {
					b.Fatalf("%d nodes cached", got)
				}
				per = float64(heap() - before)
				runtime.KeepAlive(inf)
				cancel()
				f.Shutdown()
			}
			b.ReportMetric(per, "heapB/1000nodes")
		})
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// kubeletPod is a pod as a Deployment and a kubelet leave it: owner,
// labels, a container with resources, env, a token volume, four
// conditions and a container status.
func kubeletPod(i int) *corev1.Pod {
	ns := fmt.Sprintf("ns-%d", i%50)
	tr := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-7d9f8c6b5d-%05d", i), Namespace: ns, UID: "u", ResourceVersion: "1",
			GenerateName: "web-7d9f8c6b5d-", Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5d", "tier": "frontend"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8c6b5d", UID: "o", Controller: &tr}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", FieldsV1: &metav1.FieldsV1{Raw: []byte(strings.Repeat("{}", 400))}},
				{Manager: "kubelet", Operation: "Update", Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(strings.Repeat("{}", 500))}}}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%100), ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
				Args:                   []string{"netexec", "--http-port=8080"},
				Ports:                  []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env:                    []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}, {Name: "C", Value: "3"}},
				VolumeMounts:           []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				TerminationMessagePath: "/dev/termination-log", ImagePullPolicy: corev1.PullIfNotPresent}},
			Volumes: []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.250.0.11", PodIP: fmt.Sprintf("10.244.%d.%d", i/250, i%250+2),
			PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.244.%d.%d", i/250, i%250+2)}}, QOSClass: corev1.PodQOSBestEffort,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
				ImageID: "registry.k8s.io/e2e-test-images/agnhost@sha256:" + strings.Repeat("ab", 32), ContainerID: "containerd://" + strings.Repeat("cd", 32)}}},
	}
}

// BenchmarkPolicyPodCache: the policy's pod informer heap per 1,000 pods,
// with managedFields stripped only (as before) and with trimPod.
func BenchmarkPolicyPodCache(b *testing.B) {
	const n = 1000
	for _, c := range []struct {
		name  string
		trans cache.TransformFunc
	}{{"managedFieldsOnly", func(o any) (any, error) { o.(metav1.Object).SetManagedFields(nil); return o, nil }}, {"trimmed", policyTransform}} {
		b.Run(c.name, func(b *testing.B) {
			client := fake.NewClientset()
			for i := range n {
				if err := client.Tracker().Add(kubeletPod(i)); err != nil {
					b.Fatal(err)
				}
			}
			var per float64
			for i := 0; i < b.N; i++ {
				before := heap()
				ctx, cancel := context.WithCancel(context.Background())
				f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(c.trans))
				inf := f.Core().V1().Pods().Informer()
				f.Start(ctx.Done())
				if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
					b.Fatal("no sync")
				}
				if got := len(inf.GetStore().List()); got != n {
					b.Fatalf("%d pods cached", got)
				}
				per = float64(heap() - before)
				runtime.KeepAlive(inf)
				cancel()
				f.Shutdown()
			}
			b.ReportMetric(per, "heapB/1000pods")
		})
	}
}
