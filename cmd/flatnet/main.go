// Command flatnet is flatnet's node agent, cluster controller, lab and
// test workload in one binary; see `flatnet --help` (which lists the exit
// codes).
package main

import (
	"os"

	"github.com/flatnet/flatnet/internal/cli"
)

func main() {
	os.Exit(cli.Run(os.Args[1:], os.Stdout, os.Stderr))
}
