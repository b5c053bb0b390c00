// Command flatnet-pause is the pod sandbox's process in the lab's images
// (internal/pause).
package main

import (
	"os"

	"github.com/flatnet/flatnet/internal/pause"
)

func main() { os.Exit(pause.Run()) }
