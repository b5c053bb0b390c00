// Command policybench measures NetworkPolicy enforcement in the lab:
// flatnet's (`flatnet agent --network-policy`) against the reference
// implementation, sigs.k8s.io/kube-network-policies v0.8.0 (first packet
// of every new flow to userspace over NFQUEUE), in one run, on one lab
// (hack/bench-policy.sh; results in docs/benchmarks.md, NetworkPolicy).
//
// Design. A running lab of three or more process-runtime nodes. The
// benchmark writes the workload into its API: workload namespaces with
// team/env labels, pods serving TCP (flatnet netexec) spread round-robin
// over the nodes, and policies of ten kinds dealt over the namespaces
// (objects.go); plus a client pod on node 1 and, on node 2 (the enforcer
// node), the probe targets, a connection-rate target selected by five
// policies (one admitting the client), and a canary in a default-deny
// namespace. Enforcers take turns on node 2, alone (each on that one node
// only: the client is selected by no policy, so its node has nothing to
// enforce), so neither takes CPU from the other on a machine whose cores
// all nodes share, and both see the same pods:
//
//	none                   every agent without --network-policy: the
//	                       baseline (first and again last)
//	kube-network-policies  the same, plus kube-network-policies in node 2's
//	                       namespace (its in-cluster config from a token;
//	                       enforcer.go)
//	flatnet                node 2's agent restarted with --network-policy
//
// Node 2's agent is restarted at the start of every turn (without the
// policy flag for the first two) so its memory peak is the turn's. Per
// turn: time from start until the canary is denied (every policy
// compiled), `nft list ruleset | wc -l` in node 2's namespace, then
// SAMPLES cycles on a probe target t that no policy selects: create a
// policy selecting t that admits nothing (deny: timed until new
// connections from the client fail), create one admitting the client's
// namespace (allow: timed until they connect), delete both. Times run
// from just before the create call to the start of the first probe that
// saw the new state; probes are new TCP connections from inside the
// client pod's network namespace every 10 ms, each waiting at most 200
// ms (probe.go), so a time is exact to about 10 ms. Then new TCP
// connections per second from the client to the rate target (opened and
// reset, several workers, the median of a few runs), and the enforcer
// process's CPU time and RSS from /proc (for flatnet the whole agent,
// which also proxies Services, serves DNS and runs pods: the `none` row
// is the same agent without policy).
//
// Results: one JSON document and a markdown table (report).
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
		fmt.Fprintln(os.Stderr, "policybench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: policybench run [flags] | policybench report -in result.json")
	os.Exit(2)
}
