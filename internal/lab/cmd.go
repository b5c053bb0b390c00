package lab

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flatnet/flatnet/internal/agent/subnet"
	"github.com/flatnet/flatnet/internal/lab/images"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
)

// NewCommand returns `flatnet lab` and its subcommands. The commands and
// flags are a contract (tooling outside the repo uses exactly them).
func NewCommand() *cobra.Command {
	var root, name string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A real multi-node Kubernetes network on this machine (kube-apiserver, etcd, nodes and pods in network namespaces)",
		Long: "flatnet lab runs upstream etcd and kube-apiserver, and N nodes as network namespaces on an\n" +
			"underlay bridge, each with a flatnet agent that runs pods as processes in their own\n" +
			"namespaces, networked by flatnet's CNI plugins (host-gw routes or a VXLAN overlay between\n" +
			"nodes; --subnets 2 puts the nodes on two subnets joined by a router).\n" +
			"Needs root, `make build` (bin/flatnet, bin/flatnet-cni) and `make k8s`. See docs/lab.md.",
	}
	cmd.PersistentFlags().StringVar(&root, "state-dir", DefaultStateRoot, "directory holding one state dir per lab (<state-dir>/<name>)")
	cmd.PersistentFlags().StringVar(&name, "name", DefaultName, "lab name (labs with different names run side by side)")

	cmd.AddCommand(newUp(&root, &name), newStatus(&root, &name), newKubeconfig(&root, &name),
		newKubectl(&root, &name), newExec(&root, &name), newDown(&root, &name), images.NewCommand())
	return cmd
}

func newUp(root, name *string) *cobra.Command {
	o := Options{}
	cfg := UpConfig{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Bring a lab up (creates only what is missing; on a running lab it changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Name, o.StateRoot = *name, *root
			if o.CNIPluginDir != "" {
				// The agents run elsewhere: a relative path means here.
				abs, err := filepath.Abs(o.CNIPluginDir)
				if err != nil {
					return fmt.Errorf("--cni-bin-dir %s: %w", o.CNIPluginDir, err)
				}
				o.CNIPluginDir = abs
			}
			changed := map[string]bool{}
			cmd.Flags().Visit(func(f *pflag.Flag) { changed[f.Name] = true })
			cfg.Out = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s, err := Up(ctx, Request{Options: o, Changed: changed}, cfg)
			if err != nil {
				return err
			}
			st, err := GetStatus(ctx, filepath.Dir(s.StateDir), s.Name)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout())
			st.Print(cmd.OutOrStdout())
			PrintUsage(cmd.OutOrStdout(), st)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", DefaultNodes, "number of nodes (a running lab keeps its nodes unless this asks for more)")
	f.StringVar(&o.Backend, "backend", DefaultBackend, "cross-node backend: "+strings.Join(Backends, ", ")+
		" (on a running lab, another backend restarts the agents with it; pods made before keep their MTU)")
	f.StringVar(&o.ProxyMode, "proxy-mode", "auto", "how the agents serve Services: "+strings.Join(ProxyModes, ", ")+
		" (on a running lab, another mode restarts the agents with it; each removes the old mode's rules)")
	f.StringVar(&o.CNIConflist, "cni-conflist", subnet.StyleFlatnet, "the agents' CNI conflist: "+subnet.StyleFlatnet+" (one plugin doing bridge, host-local, bandwidth and portmap) or "+
		subnet.StyleClassic+" (the chain of the three) (on a running lab, the other style restarts the agents with it; pods made under either are torn down under the other)")
	f.StringVar(&o.CNIPluginDir, "cni-bin-dir", "", "a directory of CNI plugins the agents search before the lab's own (e.g. the reference plugins of containernetworking/plugins): "+
		"it must hold every plugin of the conflist; flatnet-policy still comes from the lab. \"\" is the lab's own alone (on a running lab, another dir restarts the agents with it; process runtime only)")
	f.StringVar(&o.ClusterCIDR, "cluster-cidr", DefaultClusterCIDR, "pod network; each node gets a subnet of it")
	f.StringVar(&o.ServiceCIDR, "service-cidr", DefaultServiceCIDR, "service cluster IP range")
	f.IntVar(&o.NodeCIDRMaskSize, "node-cidr-mask-size", DefaultNodeMask, "prefix length of each node's pod subnet")
	f.StringVar(&o.Underlay, "underlay-cidr", "", "underlay network of the nodes and the host (default 10.250.0.0/24 for the default lab, 10.250.N.0/24 for others); with --subnets 2, A,B names both")
	f.IntVar(&o.Subnets, "subnets", 1, "1: every node on one underlay; 2: odd nodes on the first, even nodes on a second underlay behind a router namespace (needs --backend vxlan or vxlan-direct)")
	f.BoolVar(&o.External, "external", false, "add an external host on the underlay (.250, outside every cluster range) serving netexec on :8080 (HTTP, /clientip) and :8081 (UDP), to see egress masquerade")
	f.StringVar(&o.LBPool, "lb-pool", DefaultLBPool, "load-balancer range, routed from the external host to the nodes (ECMP): its lower half is the controller's pool for "+
		"Services of type LoadBalancer, its upper half is left for spec.externalIPs; \"\" for none (a running lab keeps its range; one from before this flag gets it)")
	f.StringVar(&o.Runtime, "runtime", RuntimeProcess, "what runs the nodes' pods: "+RuntimeProcess+" (flatnet's lab runtime in each agent: pods are processes of this machine, no images) or "+
		RuntimeContainerd+" (upstream containerd, runc and kubelet per node, images imported offline; needs make node and hack/build-k8s.sh kubelet agnhost); a running lab keeps its runtime")
	f.StringVar(&o.Install, "install", InstallProcess, "how flatnet gets onto the nodes: "+InstallProcess+" (the lab runs flatnet's controller and agents) or "+
		InstallManifest+" (with --runtime containerd: the nodes come up without a pod network, NotReady, and the lab applies deploy/flatnet.yaml with this lab's settings, as a user would); a running lab keeps it")
	f.IntVar(&o.SimulatedNodes, "simulated-nodes", 0, "simulated nodes besides the real ones: Node objects kwok (make kwok) keeps Ready, whose pods kwok marks Running with IPs from the node's pod CIDR "+
		"and which answer nothing; the real agents route to each. A running lab grows or shrinks to this many (deleting a node deletes its pods); 0 removes them and stops kwok. See docs/lab.md")
	f.StringVar(&o.SimulatedNodeRange, "simulated-node-range", simnodes.DefaultIPRange.String(), "the simulated nodes' InternalIPs (node i gets the i-th address): no interface holds them; "+
		"each real node has the range on-link inside its namespace, never in this machine's")
	f.StringVar(&cfg.K8sBinDir, "k8s-bin-dir", "", "directory with kube-apiserver, etcd and kubectl (default: where make k8s builds them)")
	f.DurationVar(&cfg.ReadyTimeout, "timeout", 2*time.Minute, "how long to wait for the nodes to be Ready")
	return cmd
}

func newStatus(root, name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show a lab's nodes, pods and IPs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := GetStatus(cmd.Context(), *root, *name)
			if err != nil {
				if others := Labs(*root); len(others) > 0 {
					return fmt.Errorf("%w (labs here: %s)", err, strings.Join(others, ", "))
				}
				return err
			}
			st.Print(cmd.OutOrStdout())
			return nil
		},
	}
}

func newKubeconfig(root, name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the path of a lab's admin kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := Kubeconfig(*root, *name)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), p)
			return nil
		},
	}
}

func newKubectl(root, name *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubectl -- ARGS...",
		Short: "Run kubectl (built with the apiserver) against a lab",
		RunE: func(cmd *cobra.Command, args []string) error {
			err := Kubectl(*root, *name, args)
			if _, ok := err.(*ExitError); ok {
				cmd.SilenceErrors = true
			}
			return err
		},
	}
	return cmd
}

func newExec(root, name *string) *cobra.Command {
	var namespace, container string
	cmd := &cobra.Command{
		Use:   "exec [-n NAMESPACE] POD [-c CONTAINER] -- CMD [ARGS...]",
		Short: "Run a command inside a pod's namespaces; its exit code passes through",
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 1 || len(args) < 2 {
				return fmt.Errorf("usage: flatnet lab exec [-n NAMESPACE] POD [-c CONTAINER] -- CMD [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if s, lerr := LoadSpec(*root, *name); lerr == nil && s.Containerd() {
				// Real nodes: through the apiserver and the kubelet, as
				// any cluster execs.
				err = ExecKubectl(*root, *name, namespace, args[0], container, args[1:])
			} else {
				var t *ExecTarget
				if t, err = FindContainer(cmd.Context(), *root, *name, namespace, args[0], container); err != nil {
					return err
				}
				err = Exec(t, args[1:])
			}
			if _, ok := err.(*ExitError); ok {
				cmd.SilenceErrors = true
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "the pod's namespace")
	cmd.Flags().StringVarP(&container, "container", "c", "", "container (default: the pod's default or first container)")
	return cmd
}

func newDown(root, name *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop a lab and remove everything it made (namespaces, interfaces, processes, state dir)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Down(*root, *name, cmd.OutOrStdout())
		},
	}
}
