package lab

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NodeLocalDNS is the link-local address every lab agent also serves DNS
// on (NodeLocal DNSCache's convention; pods use the ClusterIP).
const NodeLocalDNS = "169.254.20.10"

// KubeDNSIP is the kube-dns Service's ClusterIP: the service CIDR's tenth
// address, as kubeadm picks it (10.96.0.10 for 10.96.0.0/16). The lab's
// agents take it on every node and serve DNS on it.
func (s *Spec) KubeDNSIP() netip.Addr {
	a := s.ServiceCIDR.Masked().Addr()
	for range 10 {
		a = a.Next()
	}
	return a
}

// kubeDNSService is the lab's kube-system/kube-dns: the name and address
// clusters give their DNS. Nothing selects pods for it (no DNS pods run:
// every agent answers on the ClusterIP itself).
func kubeDNSService(s *Spec) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns",
			Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "flatnet-dns", "app.kubernetes.io/managed-by": "flatnet-lab"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: s.KubeDNSIP().String(),
			Selector:  map[string]string{"k8s-app": "kube-dns"},
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
			},
		},
	}
}

// ensureKubeDNS creates kube-system/kube-dns unless it exists; an existing
// one with another ClusterIP is an error (pods would be told one address,
// the agents serve another).
func ensureKubeDNS(ctx context.Context, s *Spec, kubeconfig string) error {
	c, _, err := Client(kubeconfig)
	if err != nil {
		return err
	}
	want := kubeDNSService(s)
	got, err := c.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = c.CoreV1().Services("kube-system").Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return ensureKubeDNS(ctx, s, kubeconfig)
		}
		if err != nil {
			return fmt.Errorf("creating Service kube-system/kube-dns at %s: %w", want.Spec.ClusterIP, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading Service kube-system/kube-dns: %w", err)
	}
	if got.Spec.ClusterIP != want.Spec.ClusterIP {
		return fmt.Errorf("Service kube-system/kube-dns has ClusterIP %s, but the lab's DNS serves %s: delete it (kubectl -n kube-system delete service kube-dns) and run lab up again",
			got.Spec.ClusterIP, want.Spec.ClusterIP)
	}
	return nil
}
