package bandwidth

// PLACEHOLDER: replaced by the bandwidth implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is bandwidth as a CNI plugin.
var Plugin = plugin.Plugin{Name: "bandwidth"}
