package loopback

// PLACEHOLDER: replaced by the loopback implementation.

import "github.com/flatnet/flatnet/internal/cni/plugin"

// Plugin is loopback as a CNI plugin.
var Plugin = plugin.Plugin{Name: "loopback"}
