package portmap

// PLACEHOLDER: replaced by the portmap implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is portmap as a CNI plugin.
var Plugin = plugin.Plugin{Name: "portmap"}
