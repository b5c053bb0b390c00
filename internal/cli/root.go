// Package cli assembles the flatnet command tree. Each subcommand lives in
// the package of its idea and exports NewCommand; this package only wires
// them together.
package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// subcommands is filled by register.go so that packages can be added
// without touching NewRoot.
var subcommands []func() *cobra.Command

// NewRoot returns the flatnet root command.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "flatnet",
		Short: "flatnet: Kubernetes networking (CNI plugins, cross-node routing, Services, cluster DNS) and a lab to try it",
		Long: `flatnet: Kubernetes networking in one binary, and a lab to try it.

Built: the CNI plugins (flatnet-cni), cross-node routing (host-gw, VXLAN),
the Service proxy on nftables with an EndpointSlice controller and
LoadBalancer IPs (agent --proxy, --proxy-only), cluster DNS (agent --dns,
--dns-only), node pod CIDRs (controller), and the lab.

Planned, not built yet: NetworkPolicy, Gateway API and
Ingress, the proxy's iptables and userspace modes, lab nodes running the
upstream kubelet and containerd.`,
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.SetErr(os.Stderr)
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the flatnet version",
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "flatnet %s\n", plugin.Version)
		},
	})
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	root.Long += "\n\n" + exitCodesHelp
	markUsageErrors(root)
	return root
}
