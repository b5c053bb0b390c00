package process

import (
	"fmt"
	"math"
	"regexp"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What a pod asks of CNI, computed as data the way containerd's CRI plugin
// does (toCNIPortMappings, toCNIBandWidth): CNI_ARGS with the K8S_POD_*
// keys, and the portMappings and bandwidth capabilities.

const (
	ingressBandwidthAnnotation = "kubernetes.io/ingress-bandwidth"
	egressBandwidthAnnotation  = "kubernetes.io/egress-bandwidth"
	podIfName                  = "eth0"
)

// cniAttachment is one CNI call's runtime side.
type cniAttachment struct {
	SandboxID string
	NetnsPath string
	IfName    string
	Args      [][2]string
	Caps      map[string]any
}

// portMapping is the portMappings capability's entry.
type portMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// bandwidthCap is the bandwidth capability (rates in bit/s, bursts in bits).
type bandwidthCap struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

var (
	minBandwidth = resource.MustParse("1k")
	maxBandwidth = resource.MustParse("1P")
	bigExponent  = regexp.MustCompile(`[eE][+-]?[0-9]{3,}`)
)

// parseBandwidth reads one bandwidth annotation as a resource quantity in
// bit/s ("10M"), with the kubelet's bounds. ok is false when it is absent.
func parseBandwidth(annotations map[string]string, key string) (bps uint64, ok bool, err error) {
	s, found := annotations[key]
	if !found {
		return 0, false, nil
	}
	// A decimal exponent of three digits or more is nobody's bandwidth, and
	// comparing such a quantity makes apimachinery compute 10^exponent
	// (35 s of CPU for "e77777777", found by FuzzParseBandwidth).
	if bigExponent.MatchString(s) {
		return 0, false, fmt.Errorf("annotation %s=%q: exponent too large (want a quantity in bit/s such as 10M)", key, s)
	}
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return 0, false, fmt.Errorf("annotation %s=%q: %w (want a quantity in bit/s such as 10M)", key, s, err)
	}
	if q.Cmp(minBandwidth) < 0 {
		return 0, false, fmt.Errorf("annotation %s=%q is unreasonably small (< 1kbit)", key, s)
	}
	if q.Cmp(maxBandwidth) > 0 {
		return 0, false, fmt.Errorf("annotation %s=%q is unreasonably large (> 1Pbit)", key, s)
	}
	return uint64(q.Value()), true, nil
}

// podBandwidth is the bandwidth capability from the pod's annotations, or
// nil. The burst is containerd's (math.MaxUint32 bits): the annotations
// only carry a rate.
func podBandwidth(annotations map[string]string) (*bandwidthCap, error) {
	in, inOK, err := parseBandwidth(annotations, ingressBandwidthAnnotation)
	if err != nil {
		return nil, err
	}
	eg, egOK, err := parseBandwidth(annotations, egressBandwidthAnnotation)
	if err != nil {
		return nil, err
	}
	if !inOK && !egOK {
		return nil, nil
	}
	bw := &bandwidthCap{}
	if inOK {
		bw.IngressRate, bw.IngressBurst = in, math.MaxUint32
	}
	if egOK {
		bw.EgressRate, bw.EgressBurst = eg, math.MaxUint32
	}
	return bw, nil
}

// podPortMappings lists the container ports that ask for a host port.
func podPortMappings(pod *v1.Pod) []portMapping {
	var out []portMapping
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort <= 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			out = append(out, portMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: proto, HostIP: p.HostIP})
		}
	}
	return out
}

// podAttachment computes the CNI runtime configuration of pod's sandbox.
func podAttachment(pod *v1.Pod, sandboxID, netnsPath string) (cniAttachment, error) {
	a := cniAttachment{
		SandboxID: sandboxID,
		NetnsPath: netnsPath,
		IfName:    podIfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", sandboxID},
			{"K8S_POD_UID", string(pod.UID)},
		},
		Caps: map[string]any{},
	}
	if pm := podPortMappings(pod); len(pm) > 0 {
		a.Caps["portMappings"] = pm
	}
	bw, err := podBandwidth(pod.Annotations)
	if err != nil {
		return cniAttachment{}, err
	}
	if bw != nil {
		a.Caps["bandwidth"] = bw
	}
	return a, nil
}
