package tracker

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
)

// richService sets every field of a Service that Convert reads, and many
// it does not.
func richService(typ v1.ServiceType) *v1.Service {
	local := v1.ServiceInternalTrafficPolicyLocal
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "42", UID: "u",
			Labels:        map[string]string{"app": "web"},
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
			Finalizers:    []string{"service.kubernetes.io/load-balancer-cleanup"}},
		Spec: v1.ServiceSpec{
			Type: typ, Selector: map[string]string{"app": "web"},
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00::10"},
			ExternalIPs:              []string{"10.200.0.1", "fd00::200"},
			LoadBalancerSourceRanges: []string{"192.168.0.0/16", " 10.0.0.0/8", "fd00::/8"},
			SessionAffinity:          v1.ServiceAffinityClientIP,
			SessionAffinityConfig:    &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}},
			ExternalTrafficPolicy:    v1.ServiceExternalTrafficPolicyLocal,
			InternalTrafficPolicy:    &local,
			HealthCheckNodePort:      32000,
			IPFamilies:               []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080, TargetPort: intstr.FromString("web"), AppProtocol: ptr("http")},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053, TargetPort: intstr.FromInt32(5353)},
			},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: "10.201.0.1", Hostname: "lb.example.com", IPMode: ptr(v1.LoadBalancerIPModeVIP)}, {IP: "fd00::201"}, {Hostname: "only-a-name"},
		}}},
	}
}

func richSlice(name string, at time.Time, fam discovery.AddressType, addrs ...string) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "7",
			Labels:        map[string]string{discovery.LabelServiceName: "web", discovery.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations:   map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano), "other": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
		},
		AddressType: fam,
		Ports: []discovery.EndpointPort{
			{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080)), AppProtocol: ptr("http")},
			{Name: ptr("dns"), Protocol: ptr(v1.ProtocolUDP), Port: ptr(int32(5353))},
		},
	}
	for i, a := range addrs {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{a, "10.9.9.9"},
			Conditions: discovery.EndpointConditions{Ready: ptr(i%2 == 0), Serving: ptr(true), Terminating: ptr(i%2 == 1)},
			NodeName:   ptr("node-a"), Hostname: ptr("h"), Zone: ptr("z"),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p"},
			Hints:     &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z"}}},
		})
	}
	return s
}

// TestSlimKeepsTheModel: a slimmed Service and its slices give the same
// model, the same changes and the same trigger times as the originals,
// for both families and every service type; slimming twice changes
// nothing more.
func TestSlimKeepsTheModel(t *testing.T) {
	at := time.Now().Add(time.Minute)
	for _, typ := range []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName} {
		for _, ipv6 := range []bool{false, true} {
			objs := func() (*v1.Service, []*discovery.EndpointSlice) {
				return richService(typ), []*discovery.EndpointSlice{
					richSlice("web-1", at, discovery.AddressTypeIPv4, "10.1.0.2", "10.1.0.3"),
					richSlice("web-2", at, discovery.AddressTypeIPv6, "fd00::2", "fd00::3"),
				}
			}
			svc, sls := objs()
			var slimSvc *Svc
			var slimSls []*Slice
			for _, o := range append([]any{svc, cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: svc}}, toAny(sls)...) {
				got, err := Slim(o)
				if err != nil {
					t.Fatal(err)
				}
				switch x := got.(type) {
				case *Svc:
					slimSvc = x
				case *Slice:
					slimSls = append(slimSls, x)
				case cache.DeletedFinalStateUnknown:
					if _, ok := x.Obj.(*Svc); !ok {
						t.Errorf("Slim of a DeletedFinalStateUnknown Service: %T inside", x.Obj)
					}
				}
			}
			if slimSvc == nil || len(slimSls) != len(sls) {
				t.Fatalf("Slim made %v and %d Slices of %d EndpointSlices", slimSvc, len(slimSls), len(sls))
			}
			if diff := cmp.Diff(Convert(svc, sls, ipv6), convert(slimSvc, slimSls, ipv6), addrs); diff != "" {
				t.Errorf("%s ipv6=%v: model differs after Slim (-orig +slim):\n%s", typ, ipv6, diff)
			}
			full, slim := New(ipv6), New(ipv6)
			full.OnService(svc)
			slim.OnSvc(slimSvc)
			for i := range sls {
				full.OnEndpointSlice(sls[i])
				slim.OnSlice(slimSls[i])
			}
			fs, fe := full.PendingChanges()
			ss, se := slim.PendingChanges()
			if fs != ss || fe != se {
				t.Errorf("%s ipv6=%v: pending changes %d, %d after Slim, %d, %d before", typ, ipv6, ss, se, fs, fe)
			}
			if diff := cmp.Diff(full.Take(), slim.Take(), addrs); diff != "" {
				t.Errorf("%s ipv6=%v: round differs after Slim (-orig +slim):\n%s", typ, ipv6, diff)
			}
			if slimSvc.Name != "web" || slimSvc.ResourceVersion != "42" || slimSls[0].Service != "web" || !slimSls[0].TriggerTime.Equal(at) {
				t.Errorf("%s: Slim lost what the tracker or the informer reads: %+v %+v", typ, slimSvc.Meta, slimSls[0])
			}
			// The informers' cache keys compact objects as it keys API ones.
			for _, o := range []any{slimSvc, slimSls[0]} {
				want, _ := cache.MetaNamespaceKeyFunc(map[bool]any{true: svc, false: sls[0]}[o == any(slimSvc)])
				if got, err := cache.MetaNamespaceKeyFunc(o); err != nil || got != want {
					t.Errorf("%s: informer key of %T: %q, %v; want %q", typ, o, got, err, want)
				}
			}
			// A deleted slice whose last state the informer missed is
			// compacted inside its wrapper.
			if got, err := Slim(cache.DeletedFinalStateUnknown{Key: "ns/web-1", Obj: richSlice("web-1", at, discovery.AddressTypeIPv4, "10.1.0.2")}); err != nil {
				t.Fatal(err)
			} else if _, ok := got.(cache.DeletedFinalStateUnknown).Obj.(*Slice); !ok {
				t.Errorf("Slim of a DeletedFinalStateUnknown slice: %T inside", got.(cache.DeletedFinalStateUnknown).Obj)
			}
			if again, err := Slim(slimSvc); err != nil || again != any(slimSvc) {
				t.Errorf("%s: Slim is not idempotent: %v, %v", typ, again, err)
			}
		}
	}
}

var addrs = cmp.Options{cmp.Comparer(func(x, y netip.Addr) bool { return x == y }), cmp.Comparer(func(x, y netip.Prefix) bool { return x == y })}

func toAny[T any](s []T) []any {
	out := make([]any, len(s))
	for i := range s {
		out[i] = s[i]
	}
	return out
}
