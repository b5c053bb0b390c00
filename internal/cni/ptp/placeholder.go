package ptp

// PLACEHOLDER: replaced by the ptp implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is ptp as a CNI plugin.
var Plugin = plugin.Plugin{Name: "ptp"}
