package explain

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flatnet/flatnet/internal/kube"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/netpol/compile"
)

// NewCommand is `flatnet policy`.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Inspect network policy as flatnet enforces it",
	}
	var kubeconfig, labName, from, to string
	explain := &cobra.Command{
		Use:   "explain --from NS/POD|IP --to NS/POD:PORT[/PROTO]|IP:PORT[/PROTO]",
		Short: "Say whether a flow is allowed and which policy rule decides it",
		Long: "Compiles the cluster's NetworkPolicies for the two pods with the node agent's compiler and prints\n" +
			"the source's egress check, the destination's ingress check and the verdict. PORT is the destination\n" +
			"pod's port after Service DNAT (a number, or a container port name of the destination pod);\n" +
			"PROTO is TCP (default), UDP or SCTP. Exit status 0 when allowed, 1 when denied.\n" +
			"In a lab: --lab NAME (the lab's admin kubeconfig).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kubeconfig == "" && labName != "" {
				k, err := lab.Kubeconfig(lab.DefaultStateRoot, labName)
				if err != nil {
					return err
				}
				kubeconfig = k
			}
			if kubeconfig == "" {
				kubeconfig = os.Getenv("KUBECONFIG")
			}
			if kubeconfig == "" {
				return errors.New("no cluster: pass --kubeconfig, set KUBECONFIG, or --lab NAME for a lab")
			}
			client, err := kube.Client(kubeconfig, "flatnet-policy-explain")
			if err != nil {
				return err
			}
			res, err := run(cmd.Context(), client, from, to)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), res)
			if !res.Allowed() {
				cmd.SilenceUsage = true
				return errDenied
			}
			return nil
		},
	}
	explain.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig (default $KUBECONFIG)")
	explain.Flags().StringVar(&labName, "lab", "", "use the admin kubeconfig of the lab with this name (flatnet lab up --name)")
	explain.Flags().StringVar(&from, "from", "", "the client: NAMESPACE/POD, or an IP address")
	explain.Flags().StringVar(&to, "to", "", "the server: NAMESPACE/POD:PORT[/PROTO], or IP:PORT[/PROTO] ([IPv6]:PORT)")
	_ = explain.MarkFlagRequired("from")
	_ = explain.MarkFlagRequired("to")
	cmd.AddCommand(explain)
	return cmd
}

// errDenied makes the command exit 1 after printing a denied verdict.
var errDenied = deniedError{}

type deniedError struct{}

func (deniedError) Error() string { return "the flow is denied" }

func run(ctx context.Context, client kubernetes.Interface, from, to string) (Result, error) {
	target, portProto, ok := cutLast(to)
	if !ok {
		return Result{}, fmt.Errorf("--to %q: want NAMESPACE/POD:PORT[/PROTO] or IP:PORT[/PROTO]", to)
	}
	port, protoName, _ := strings.Cut(portProto, "/")
	proto, err := ParseProtocol(protoName)
	if err != nil {
		return Result{}, fmt.Errorf("--to %q: %w", to, err)
	}
	in := compile.Input{}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("listing pods: %w", err)
	}
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("listing namespaces: %w", err)
	}
	nps, err := client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	for i := range pods.Items {
		in.Pods = append(in.Pods, &pods.Items[i])
	}
	for i := range nss.Items {
		in.Namespaces = append(in.Namespaces, &nss.Items[i])
	}
	for i := range nps.Items {
		in.NetworkPolicies = append(in.NetworkPolicies, &nps.Items[i])
	}
	src, err := endpoint(in.Pods, from)
	if err != nil {
		return Result{}, fmt.Errorf("--from: %w", err)
	}
	dst, err := endpoint(in.Pods, target)
	if err != nil {
		return Result{}, fmt.Errorf("--to: %w", err)
	}
	n, err := ResolvePort(dst, port, proto)
	if err != nil {
		return Result{}, fmt.Errorf("--to: %w", err)
	}
	return Flow(compile.New(in), src, dst, proto, n), nil
}

// cutLast splits "x:port" at its last colon, keeping "[v6]" brackets out.
func cutLast(s string) (host, port string, ok bool) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", "", false
	}
	return strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]"), s[i+1:], true
}

// endpoint finds NAMESPACE/POD among pods (taking its first address for
// the address family of nothing in particular: the first podIP) or
// parses an address.
func endpoint(pods []*corev1.Pod, s string) (Endpoint, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		for _, p := range pods {
			for _, pip := range p.Status.PodIPs {
				if a, err := netip.ParseAddr(pip.IP); err == nil && a == ip && !p.Spec.HostNetwork {
					return Endpoint{Pod: p, IP: ip}, nil
				}
			}
		}
		return Endpoint{IP: ip.Unmap()}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return Endpoint{}, fmt.Errorf("%q is neither NAMESPACE/POD nor an IP address", s)
	}
	for _, p := range pods {
		if p.Namespace == ns && p.Name == name {
			if len(p.Status.PodIPs) == 0 {
				return Endpoint{}, fmt.Errorf("pod %s has no IP yet", s)
			}
			ip, err := netip.ParseAddr(p.Status.PodIPs[0].IP)
			if err != nil {
				return Endpoint{}, fmt.Errorf("pod %s: %w", s, err)
			}
			return Endpoint{Pod: p, IP: ip}, nil
		}
	}
	return Endpoint{}, fmt.Errorf("no pod %s", s)
}
