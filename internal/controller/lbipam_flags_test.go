package controller

import (
	"context"
	"strings"
	"testing"
)

func TestLoadBalancerPoolFlags(t *testing.T) {
	cmd := NewCommand()
	for _, name := range []string{"load-balancer-ip-pool", "load-balancer-ip-pool-configmap"} {
		if f := cmd.Flags().Lookup(name); f == nil || f.DefValue != "" {
			t.Errorf("--%s: %+v, want a flag defaulting to empty", name, f)
		}
	}
	if f := cmd.Flags().Lookup("load-balancer-ip-pool"); !strings.Contains(f.Usage, "flatnet.io/lb") {
		t.Errorf("--load-balancer-ip-pool's help does not name the class: %q", f.Usage)
	}
	// Bad values fail before connecting, naming the flag and what is wrong.
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{LoadBalancerIPPool: "10.251.0.1/24"}, `--load-balancer-ip-pool: invalid load-balancer IP pool: item 1 "10.251.0.1/24": host bits set; did you mean 10.251.0.0/24?`},
		{Options{LoadBalancerIPPool: "10.251.0.0/25,10.251.0.9-10.251.0.1"}, `item 2 "10.251.0.9-10.251.0.1": the range ends (10.251.0.1) before it starts (10.251.0.9)`},
		{Options{LoadBalancerIPPoolConfigMap: "flatnet-lb"}, `--load-balancer-ip-pool-configmap: ConfigMap "flatnet-lb": want namespace/name`},
	} {
		c.o.Workers, c.o.KubeAPIQPS, c.o.KubeAPIBurst, c.o.Kubeconfig = 1, DefaultKubeAPIQPS, DefaultKubeAPIBurst, "/nonexistent"
		err := Run(context.Background(), c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.o, err, c.want)
		}
	}
	// A pool alone is something to do.
	for _, o := range []Options{{LoadBalancerIPPool: "10.251.0.0/25"}, {LoadBalancerIPPoolConfigMap: "kube-system/lb"}} {
		o.Workers, o.KubeAPIQPS, o.KubeAPIBurst, o.Kubeconfig = 1, DefaultKubeAPIQPS, DefaultKubeAPIBurst, "/nonexistent"
		if err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
			t.Errorf("%+v: %v, want a connection error", o, err)
		}
	}
}
