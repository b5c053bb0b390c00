package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/netpol/iptables"
	"github.com/flatnet/flatnet/internal/proxy/runner"
)

// TestPolicyControllerIPTables: with --policy-mode=iptables a default-deny
// policy gives the node's selected pod (and no other) an ingress chain
// jumped to from FLATNET-NP; deleting the policy takes it away.
func TestPolicyControllerIPTables(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := policyClient()
	f := ipt.NewFake()
	c := &policyController{node: "n1", client: client, mode: policyModeIPTables, ipt: iptables.NewSyncer(f, ipt.IPv4)}
	c.runner = runner.New(c.syncAndLog, runner.Config{MinInterval: 0, MaxInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	// jumps are FLATNET-NP's jumps to pod chains.
	jumps := func() []string {
		tb, err := f.Save(ctx, ipt.IPv4, iptables.Table)
		if err != nil || !slices.ContainsFunc(tb.RulesIn(iptables.Forward), func(r ipt.Rule) bool { return r.Target() == iptables.ChainTop }) {
			return nil
		}
		out := []string{}
		for _, r := range tb.RulesIn(iptables.ChainTop) {
			if iptables.Ours(r.Target()) {
				out = append(out, strings.Join(r.Args[:2], " "))
			}
		}
		return out
	}
	waitFor := func(what string, want []string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := jumps(); !slices.Equal(got, want); got = jumps() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: jumps %q, want %q\n%s", what, got, want, f.Dump(ipt.IPv4, iptables.Table))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("before any policy", []string{})
	if _, err := client.NetworkingV1().NetworkPolicies("x").Create(ctx, denyIngressA(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("after default deny", []string{"-d 10.244.1.5/32"})
	if err := client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("after delete", []string{})
	if len(f.Dump(ipt.IPv6, iptables.Table)) > len("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n") {
		t.Errorf("an IPv4 cluster wrote ip6tables rules:\n%s", f.Dump(ipt.IPv6, iptables.Table))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestValidPolicyMode(t *testing.T) {
	for _, m := range []string{"", "auto", "nftables", "iptables"} {
		if err := validPolicyMode(m); err != nil {
			t.Errorf("%q: %v", m, err)
		}
	}
	if err := validPolicyMode("ipset"); err == nil || !strings.Contains(err.Error(), "auto, nftables, iptables") {
		t.Errorf("ipset: %v, want an error naming the modes", err)
	}
}

// TestPolicyModeIPTablesBroken: --policy-mode=iptables where iptables does
// not work refuses to start, naming the family and the legacy flavour.
func TestPolicyModeIPTablesBroken(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"iptables-save", "iptables-restore"} {
		script := "#!/bin/sh\necho 'iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Invalid argument' >&2\nexit 4\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	_, _, err := choosePolicyMode(context.Background(), policyModeIPTables, []ipt.Protocol{ipt.IPv4})
	if err == nil || !strings.Contains(err.Error(), "iptables does not work") || !strings.Contains(err.Error(), "iptables-legacy") {
		t.Errorf("got %v, want an error naming iptables and the legacy flavour", err)
	}
	t.Log(err)
}
