package macvlan

// PLACEHOLDER: replaced by the macvlan implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is macvlan as a CNI plugin.
var Plugin = plugin.Plugin{Name: "macvlan"}
