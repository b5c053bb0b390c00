package tracker

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// FuzzConvert: no API object, however odd, may panic the conversion, and
// every endpoint it keeps has a usable address and port of the family.
func FuzzConvert(f *testing.F) {
	f.Add("10.96.0.10", "10.200.0.1", "10.201.0.1", "10.1.0.2", "http", "http", int32(80), int32(8080), int32(60), "TCP", false)
	f.Add("None", "", "", "fd00::1", "", "", int32(-1), int32(70000), int32(-5), "", true)
	f.Add("::ffff:10.0.0.1", "bad", "1.2.3.4", "::ffff:10.1.0.9", "a", "a", int32(65535), int32(0), int32(0), "UDP", false)
	f.Fuzz(func(t *testing.T, clusterIP, extIP, lbIP, epIP, svcPortName, slicePortName string, port, targetPort, timeout int32, proto string, ipv6 bool) {
		svc := service("web", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIP, []string{clusterIP}
			s.Spec.ExternalIPs = []string{extIP}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP}}
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
			s.Spec.Ports = []v1.ServicePort{{Name: svcPortName, Protocol: v1.Protocol(proto), Port: port, NodePort: port}}
		})
		sl := slice("web", "web-1", targetPort, ep(epIP), ep(epIP), discovery.Endpoint{})
		sl.Ports[0].Name, sl.Ports[0].Protocol = &slicePortName, ptr(v1.Protocol(proto))
		m := Convert(svc, []*discovery.EndpointSlice{sl, {}}, ipv6)
		if m == nil {
			return
		}
		for _, p := range m.Ports {
			switch p.Protocol {
			case "tcp", "udp", "sctp":
			default:
				t.Errorf("port with protocol %q kept", p.Protocol)
			}
			if p.Port == 0 {
				t.Error("port 0 kept")
			}
			for _, e := range p.Endpoints {
				if !e.IP.IsValid() || e.IP.Is6() != ipv6 || e.Port == 0 {
					t.Errorf("bad endpoint %+v", e)
				}
			}
		}
	})
}
