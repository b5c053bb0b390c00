package cli

import (
	"github.com/flatnet/flatnet/internal/agent"
	"github.com/flatnet/flatnet/internal/controller"
	gateway "github.com/flatnet/flatnet/internal/gateway/controller"
	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/runtime/process/containerinit"
	"github.com/flatnet/flatnet/internal/netexec"
	"github.com/flatnet/flatnet/internal/netpol/explain"
)

// Subcommands, one line each. Packages: internal/lab (lab), internal/agent
// (agent), internal/controller (controller), internal/netexec (netexec), internal/netpol/explain (policy),
// internal/lab/runtime/process (the hidden container-init helper),
// internal/gateway/controller (gateway).
func init() {
	subcommands = append(subcommands, netexec.NewCommand)
	subcommands = append(subcommands, containerinit.NewCommand)
	subcommands = append(subcommands, controller.NewCommand)
	subcommands = append(subcommands, agent.NewCommand)
	subcommands = append(subcommands, lab.NewCommand)
	subcommands = append(subcommands, explain.NewCommand)
	subcommands = append(subcommands, gateway.NewCommand)
}
