// Command proxybench measures flatnet's Service proxy against upstream
// kube-proxy in its nftables mode, in one run against one apiserver
// (hack/bench-proxy.sh; results in docs/benchmarks.md).
//
// Design. Next to a running lab (its apiserver and underlay bridge), two
// network namespaces of this run's own, each with a veth on the lab's
// bridge, stand for two nodes: one runs `kube-proxy --config`, the other
// `flatnet agent --proxy-only --config`, from the same
// KubeProxyConfiguration (only hostnameOverride differs). Both read the
// same Services and EndpointSlices: selector-less ClusterIP Services, one
// TCP port each, with EndpointSlices written here directly (managed-by
// proxybench.flatnet.io), so no pods are needed. The lab's own node agent
// (a third proxy, flatnet's) is stopped with SIGSTOP while measuring and
// resumed at the end, so it takes no CPU from the two measured.
//
// For each size N (ascending; the objects of a size are kept for the next):
//
//  1. churn: both proxies running, the Services and slices up to N are
//     created; for each proxy, the time from the last create's return to
//     all N service ports being in its kernel map (service-ips).
//  2. for each min sync period, for each proxy alone (the other stopped,
//     its tables deleted first): cold start (process start to all N in the
//     kernel, its full-sync metric, CPU seconds, RSS), the table's size,
//     then REPS partial updates: one endpoint of one Service replaced,
//     timed from the API call to the new endpoint being in the kernel
//     (polling the Service's chain with nft), with the proxy's own sync
//     duration and network programming latency from its metrics.
//
// Every nft and curl runs inside the proxy's namespace through
// `ip netns exec`; nothing touches the root namespace but the two veths on
// the lab's bridge. Results are JSON lines; `report` prints the table.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runCmd(os.Args[2:])
	case "report":
		err = reportCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: proxybench run [flags] | proxybench report -in results.jsonl")
	os.Exit(2)
}
