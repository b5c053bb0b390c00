// Command coredns is upstream CoreDNS (the version pinned in go.mod) with
// only the plugins hack/bench-dns.sh configures, built into the cache make
// k8s uses; never committed as a binary. A module of its own, so the
// project's go.mod does not carry CoreDNS's dependencies.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins the benchmark's Corefiles name; registering them is all
	// an import does (their order in a server block comes from
	// dnsserver.Directives, upstream's list, not from here).
	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/template"
)

func main() { coremain.Run() }
