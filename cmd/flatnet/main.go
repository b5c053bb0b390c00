// Command flatnet is flatnet's node agent, cluster controller, lab and
// test workload in one binary; see `flatnet --help`.
package main

import (
	"os"

	"github.com/flatnet/flatnet/internal/cli"
)

func main() {
	if err := cli.NewRoot().Execute(); err != nil {
		os.Exit(cli.ExitCode(err))
	}
}
