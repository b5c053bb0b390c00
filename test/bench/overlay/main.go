// Command overlaybench is the Go side of `make bench-overlay`
// (hack/bench-overlay.sh): a TCP request/response ("ping-pong") server and
// client for latency, since iperf3 measures only throughput, a reader of
// iperf3's JSON, and the report that puts every path side by side.
//
// Every measurement is one JSON line (a Record) labelled with its target
// (baseline, host-gw, vxlan, ...) and repetition, appended by the script to
// one results file; `report` reads that file. The script runs `ping` and
// `iperf3` inside the lab's pods and node namespaces (through `flatnet lab
// exec` and `ip netns exec`); nothing here touches the network setup.
//
//	overlaybench serve  -listen :7000
//	overlaybench ping   -to 10.244.1.2:7000 -duration 5s -target vxlan -rep 1
//	iperf3 -J -c ... | overlaybench iperf3 -target vxlan -rep 1
//	overlaybench info   -target vxlan -mtu 1450
//	overlaybench report results.jsonl
package main

import (
	"fmt"
	"os"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: overlaybench serve|ping|iperf3|info|report [flags]; see the package comment or hack/bench-overlay.sh")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		err = serveMain(args)
	case "ping":
		err = pingMain(args)
	case "iperf3":
		err = iperfMain(args)
	case "info":
		err = infoMain(args)
	case "report":
		err = reportMain(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlaybench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
