package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/testutil"
)

// checkProxyMode restarts the lab's agents in mode and runs the Service
// checks against it.
func checkProxyMode(t *testing.T, l *testLab, clients []labPod, mode string) {
	switchProxyMode(t, l, mode, mode)
	checkServices(t, l, clients, mode)
}

// switchProxyMode runs `lab up --proxy-mode mode` and waits until every
// node's proxy answers /proxyMode with want; then only want's rules are
// on the nodes: no flatnet-proxy table outside nftables mode, no
// FLATNET-SERVICES chain outside iptables mode, no service address on lo
// outside userspace mode.
func switchProxyMode(t *testing.T, l *testLab, mode, want string) {
	s := l.spec
	out := l.mustCLI(t, "up", "--proxy-mode", mode)
	if n := strings.Count(out, "; proxy mode "+mode+", was "); n != len(s.Nodes) {
		t.Fatalf("up --proxy-mode %s restarted %d agents, want %d:\n%s", mode, n, len(s.Nodes), out)
	}
	for _, n := range s.Nodes {
		if err := retry(60*time.Second, func() error {
			got, err := httpGet(lab.NetnsPath(n.Netns), "127.0.0.1:10249", "/proxyMode")
			if err == nil && got != want {
				err = fmt.Errorf("/proxyMode %q", got)
			}
			return err
		}); err != nil {
			t.Fatalf("node %s after up --proxy-mode %s: %v, want %q", n.Name, mode, err, want)
		}
		tables := testutil.RunIn(t, lab.NetnsPath(n.Netns), "nft", "list", "tables")
		if has := strings.Contains(tables, "table ip flatnet-proxy"); has != (want == "nftables") {
			t.Errorf("node %s in %s mode: nft tables:\n%s", n.Name, want, tables)
		}
		nat := testutil.RunIn(t, lab.NetnsPath(n.Netns), "iptables-save", "-t", "nat")
		if has := strings.Contains(nat, ":FLATNET-SERVICES"); has != (want == "iptables") {
			t.Errorf("node %s in %s mode: FLATNET-SERVICES in the nat table: %v", n.Name, want, has)
		}
		lo := testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "-o", "-4", "addr", "show", "dev", "lo")
		if has := strings.Contains(lo, "lo:flatnetsvc"); has != (want == "userspace") {
			t.Errorf("node %s in %s mode: service addresses on lo: %v\n%s", n.Name, want, has, lo)
		}
	}
}
