// Command dnsbench is the Go half of hack/bench-dns.sh, which measures
// flatnet's cluster DNS against upstream CoreDNS with its kubernetes plugin
// (results in docs/benchmarks.md, "Cluster DNS vs CoreDNS").
//
// Design. The script owns processes (the lab, each server under taskset,
// dnsperf) and their cleanup; this program owns the data:
//
//   - objects: 100 namespaces × 100 ClusterIP Services (port http 80/TCP,
//     a selector no pod matches), 32 workers, then waits until the lab's
//     controller has written an EndpointSlice for each; and one Pod in ns0
//     bound to a node that does not exist with status.podIP 127.0.0.1, the
//     address dnsperf sends from, so both servers' autopath know the
//     client's namespace (nothing runs that Pod).
//   - queries: the query files, one per case (cases below), the same for
//     both servers.
//   - ready: waits until a server answers the last Service created (its
//     informers have synced) and checks a few answers, the autopath CNAME
//     included, so a misconfigured server fails the run instead of being
//     measured answering SERVFAIL.
//   - parse: one dnsperf -v run → one JSON line: QPS from dnsperf's
//     summary, latency percentiles from the per-query lines, rcodes,
//     the server's RSS and CPU passed in by the script.
//   - report: the table (median of the runs per case and server).
//
// Everything is on 127.0.0.1; nothing here opens a socket elsewhere.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmds := map[string]func([]string) error{
		"objects": objectsCmd,
		"queries": queriesCmd,
		"ready":   readyCmd,
		"parse":   parseCmd,
		"report":  reportCmd,
	}
	cmd, ok := cmds[os.Args[1]]
	if !ok {
		usage()
	}
	if err := cmd(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "dnsbench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: dnsbench objects|queries|ready|parse|report [flags] (hack/bench-dns.sh runs them)")
	os.Exit(2)
}
