package lab

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// warnBridgeFirewall warns when the host's firewall will see, and drop,
// the lab's node-to-node traffic: with br_netfilter loaded and
// bridge-nf-call-iptables on, frames bridged on the underlay pass the root
// namespace's FORWARD chain, and a DROP policy there (as Docker sets)
// silently breaks pod-to-pod traffic across nodes. The lab never changes
// the host's firewall, so it only says so. It reads; it never fails up.
func warnBridgeFirewall(out io.Writer, bridge string) {
	nfCall, err := sysctl.Get("net.bridge.bridge-nf-call-iptables")
	if err != nil || nfCall != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	filter, err := ipt.New().Save(ctx, ipt.IPv4, "filter")
	if err != nil {
		return
	}
	fmt.Fprint(out, bridgeFirewallWarning(nfCall, filter, bridge))
}

// bridgeFirewallWarning is warnBridgeFirewall's text ("" for none) from
// the sysctl's value and the host's filter table.
func bridgeFirewallWarning(nfCallIptables string, filter *ipt.Table, bridge string) string {
	if nfCallIptables != "1" || filter.Policies["FORWARD"] != "DROP" {
		return ""
	}
	return fmt.Sprintf("warning: br_netfilter is on and the host's iptables FORWARD policy is DROP: traffic between lab nodes\n"+
		"crosses bridge %s through that chain and may be dropped; allow it (iptables -I FORWARD -i %s -o %s -j ACCEPT)\n"+
		"or set net.bridge.bridge-nf-call-iptables=0. The lab does not change the host's firewall.\n", bridge, bridge, bridge)
}
