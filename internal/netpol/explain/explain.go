// Package explain answers "may this flow pass, and which rule says so?"
// for `flatnet policy explain`. It runs the agent's compiler
// (internal/netpol/compile) over the same API objects and asks the
// compiled rules the renderer turns into nftables (netpol.Rules.Check), so
// its answer is the kernel's, rule for rule.
package explain

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/netpol/compile"
)

// Endpoint is one end of a flow: a pod, or an address outside the pod
// network (Pod nil).
type Endpoint struct {
	Pod *corev1.Pod
	IP  netip.Addr
}

func (e Endpoint) String() string {
	if e.Pod == nil {
		return e.IP.String()
	}
	return fmt.Sprintf("%s/%s (%s)", e.Pod.Namespace, e.Pod.Name, e.IP)
}

// Result is the answer for one flow.
type Result struct {
	From, To Endpoint
	Proto    netpol.Protocol
	Port     uint16
	// Egress is the source pod's check, Ingress the destination pod's;
	// nil when that end is not a pod (nothing to check there).
	Egress, Ingress *netpol.Decision
}

// Allowed reports whether both checks pass.
func (r Result) Allowed() bool {
	return (r.Egress == nil || r.Egress.Allowed) && (r.Ingress == nil || r.Ingress.Allowed)
}

func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s -> %s %s/%d\n", r.From, r.To, r.Proto, r.Port)
	if r.Egress != nil {
		fmt.Fprintf(&b, "  egress of %s: %s\n", r.From, r.Egress)
	} else {
		fmt.Fprintf(&b, "  egress: %s is not a pod: no check\n", r.From)
	}
	if r.Ingress != nil {
		fmt.Fprintf(&b, "  ingress of %s: %s\n", r.To, r.Ingress)
	} else {
		fmt.Fprintf(&b, "  ingress: %s is not a pod: no check\n", r.To)
	}
	if r.Allowed() {
		b.WriteString("ALLOWED\n")
	} else {
		b.WriteString("DENIED (the packet is dropped)\n")
	}
	return b.String()
}

// ParseProtocol reads TCP, UDP or SCTP (any case).
func ParseProtocol(s string) (netpol.Protocol, error) {
	switch strings.ToUpper(s) {
	case "TCP", "":
		return netpol.ProtoTCP, nil
	case "UDP":
		return netpol.ProtoUDP, nil
	case "SCTP":
		return netpol.ProtoSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", s)
}

// ResolvePort turns port (a number, or a container port name of the
// destination pod, as policies resolve names) into a number.
func ResolvePort(to Endpoint, port string, proto netpol.Protocol) (uint16, error) {
	if n, err := strconv.ParseUint(port, 10, 16); err == nil && n > 0 {
		return uint16(n), nil
	}
	if to.Pod == nil {
		return 0, fmt.Errorf("port %q is not a number, and a name needs a destination pod to resolve it", port)
	}
	for _, c := range to.Pod.Spec.Containers {
		for _, p := range c.Ports {
			pp, err := ParseProtocol(string(p.Protocol))
			if p.Name == port && err == nil && pp == proto {
				return uint16(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("pod %s/%s has no %s container port named %q", to.Pod.Namespace, to.Pod.Name, proto, port)
}

// Flow explains one flow with c's compiled rules.
func Flow(c *compile.Compiler, from, to Endpoint, proto netpol.Protocol, port uint16) Result {
	r := Result{From: from, To: to, Proto: proto, Port: port}
	if from.Pod != nil {
		p := c.Pod(from.Pod)
		d := p.Egress.Check(to.IP, proto, port)
		r.Egress = &d
	}
	if to.Pod != nil {
		p := c.Pod(to.Pod)
		d := p.Ingress.Check(from.IP, proto, port)
		r.Ingress = &d
	}
	return r
}
