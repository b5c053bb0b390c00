// Command proxybench measures flatnet's Service proxy in each of its
// modes against upstream kube-proxy in its nftables and iptables modes, in
// one run against one apiserver (hack/bench-proxy.sh; results in
// docs/benchmarks.md).
//
// Design. Next to a running lab (its apiserver and underlay bridge), each
// proxy runs alone, at each size, on a site of its own (site.go: a node
// namespace on the lab's bridge, a pod-like client namespace and an
// endpoint namespace behind it, made fresh and removed after): either
// `kube-proxy --config` or `flatnet agent --proxy-only --config`, from the
// same KubeProxyConfiguration but for mode and hostnameOverride. They read
// selector-less ClusterIP Services, one TCP port each, with EndpointSlices
// written here directly (managed-by proxybench.flatnet.io), so no pods are
// needed; every endpoint address is real: the endpoint namespace answers
// on all of them and says which one a connection reached (probe.go). The
// lab's own node agent (another proxy) is stopped with SIGSTOP for the run
// and resumed at the end.
//
// "Programmed" is seen without polling rule listings: nftables modes by
// `nft monitor` (service-ips elements, then any object naming the new
// endpoint), iptables modes by the same monitor (iptables-nft rules are
// nftables rules: "ip daddr <ClusterIP> ... dport 80", "dnat to
// <endpoint>:8080"), userspace by its listening sockets (ss) and by
// connecting. Every step is also confirmed by connecting from the client
// namespace.
//
// Sizes: first 10 Services (the data path's baseline), then each N of
// -sizes (objects kept from one size to the next). Per proxy and size:
//
//  1. cold start: process start to every Service programmed, then the
//     first and last Service answering; the proxy's CPU until programmed
//     (children included: kube-proxy's nft and iptables-restore), its RSS
//     2 s later, its full-sync metric.
//  2. REPS single endpoint changes (one address of one Service's slice
//     replaced), each timed from the API call to programmed and to the
//     new endpoint answering through the ClusterIP, with the proxy's
//     sync and network programming metrics.
//  3. a burst: BURST changes to as many Services issued evenly over one
//     second; from the last update's return to all programmed, and the
//     proxy's CPU for it.
//  4. the data path: new TCP connections (connect, then reset) to Service
//     0's ClusterIP from the client, a fixed number at a time, for a
//     bounded time or count: rate and connect latency p50/p99.
//
// At the baseline size only 1 and 4. A proxy that exits before programming
// anything is "not available" (its last log line recorded) and skipped for
// the rest of the run; any other failure is recorded for that proxy and
// size and the run goes on. Results are JSON lines; `report` prints the
// table.
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
	case "serve":
		err = serveCmd(os.Args[2:])
	case "prober":
		err = proberCmd(os.Args[2:])
	case "watch":
		err = watchCmd(os.Args[2:])
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
