package bridge

// PLACEHOLDER: replaced by the bridge implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is bridge as a CNI plugin.
var Plugin = plugin.Plugin{Name: "bridge"}
