package lab

import (
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/ipt"
)

func TestBridgeFirewallWarning(t *testing.T) {
	table := func(save string) *ipt.Table {
		tb, err := ipt.ParseSave([]byte(save), "filter")
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	drop := table("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n")
	accept := table("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n")
	if got := bridgeFirewallWarning("1", drop, "fl-x"); !strings.Contains(got, "iptables -I FORWARD -i fl-x -o fl-x -j ACCEPT") {
		t.Errorf("DROP policy with br_netfilter: %q", got)
	}
	if got := bridgeFirewallWarning("0", drop, "fl-x"); got != "" {
		t.Errorf("br_netfilter off: %q", got)
	}
	if got := bridgeFirewallWarning("1", accept, "fl-x"); got != "" {
		t.Errorf("ACCEPT policy: %q", got)
	}
}
