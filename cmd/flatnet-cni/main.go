// Command flatnet-cni is flatnet's multi-call CNI binary. It answers as
// the plugin named by the name it was invoked as (argv[0], usually a link
// installed by `make install-cni`), or by its first argument.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/flatnet/flatnet/internal/cni/allinone"
	"github.com/flatnet/flatnet/internal/cni/bandwidth"
	"github.com/flatnet/flatnet/internal/cni/bridge"
	"github.com/flatnet/flatnet/internal/cni/hostlocal"
	"github.com/flatnet/flatnet/internal/cni/loopback"
	"github.com/flatnet/flatnet/internal/cni/macvlan"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/cni/policygate"
	"github.com/flatnet/flatnet/internal/cni/portmap"
	"github.com/flatnet/flatnet/internal/cni/ptp"
)

var plugins = map[string]plugin.Plugin{
	"bandwidth":      bandwidth.Plugin,
	"bridge":         bridge.Plugin,
	"flatnet":        allinone.Plugin,
	"flatnet-policy": policygate.Plugin,
	"host-local":     hostlocal.Plugin,
	"loopback":       loopback.Plugin,
	"macvlan":        macvlan.Plugin,
	"portmap":        portmap.Plugin,
	"ptp":            ptp.Plugin,
}

func names() string {
	var n []string
	for k := range plugins {
		n = append(n, k)
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

func main() {
	name := filepath.Base(os.Args[0])
	if p, ok := plugins[name]; ok {
		plugin.Main(p)
		return
	}
	if len(os.Args) > 1 {
		switch a := os.Args[1]; {
		case a == "--version" || a == "version":
			fmt.Printf("flatnet-cni %s\nplugins: %s\nCNI versions: %s\n", plugin.Version, names(),
				strings.Join(plugin.SupportedVersions.SupportedVersions(), ", "))
			return
		case plugins[a].Name != "":
			os.Args = append(os.Args[:1], os.Args[2:]...)
			plugin.Main(plugins[a])
			return
		}
	}
	fmt.Fprintf(os.Stderr, "flatnet-cni: invoked as %q, which is not a plugin this binary provides.\n"+
		"Install it under a plugin name (make install-cni DESTDIR=/opt/cni/bin) or run `flatnet-cni PLUGIN`.\n"+
		"Plugins: %s\n", name, names())
	os.Exit(1)
}
