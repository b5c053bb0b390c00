// Command coredns is upstream CoreDNS (the version pinned in go.mod) with
// only the plugins hack/bench-dns.sh and the e2e suite configure, built by
// hack/build-coredns.sh into the cache make k8s uses; never committed as a
// binary. The lab's agnhost image carries it as /coredns, as upstream's
// does. A module of its own, so the project's go.mod does not carry
// CoreDNS's dependencies.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins the benchmark's Corefiles name, and hosts and log for
	// the e2e suite's (generateCoreDNSConfigmap in test/e2e/network/
	// dns_common.go), and whoami for the Gateway API conformance suite's
	// coredns Deployment (its Corefile: forward, log, errors, whoami; the lab
	// tags this binary registry.k8s.io/coredns/coredns:v1.12.2 too);
	// registering them is all an import does (their order
	// in a server block comes from dnsserver.Directives, upstream's list,
	// not from here).
	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/template"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func main() { coremain.Run() }
