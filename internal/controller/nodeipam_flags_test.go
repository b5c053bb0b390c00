package controller

import (
	"context"
	"strings"
	"testing"
)

func TestRateFlags(t *testing.T) {
	cmd := NewCommand()
	for name, want := range map[string]string{"kube-api-qps": "300", "kube-api-burst": "600", "node-ipam-workers": "16", "endpointslice-workers": "16", "workers": "2"} {
		if f := cmd.Flags().Lookup(name); f == nil || f.DefValue != want {
			t.Errorf("--%s: %+v, want a flag defaulting to %s", name, f, want)
		}
	}
	// Bad values fail before connecting, naming the flag.
	for _, c := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.KubeAPIQPS = 0 }, "--kube-api-qps must be more than 0 (got 0)"},
		{func(o *Options) { o.KubeAPIQPS = -1 }, "--kube-api-qps must be more than 0 (got -1)"},
		{func(o *Options) { o.KubeAPIBurst = 0 }, "--kube-api-burst must be at least 1 (got 0)"},
		{func(o *Options) { o.NodeIPAMWorkers = 0 }, "--node-ipam-workers must be 1..256 (got 0)"},
		{func(o *Options) { o.NodeIPAMWorkers = 257 }, "--node-ipam-workers must be 1..256 (got 257)"},
		{func(o *Options) { o.EndpointSlices, o.EndpointSliceWorkers = true, 0 }, "--endpointslice-workers must be 1..256 (got 0)"},
		{func(o *Options) { o.EndpointSlices, o.EndpointSliceWorkers = true, 257 }, "--endpointslice-workers must be 1..256 (got 257)"},
	} {
		o := DefaultOptions()
		o.Kubeconfig = "/nonexistent"
		c.set(&o)
		if err := Run(context.Background(), o); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", o, err, c.want)
		}
	}
	// Node IPAM workers do not matter when it is off. (A free port for
	// the metrics server: the default may be taken on this machine.)
	o := DefaultOptions()
	o.AllocateNodeCIDRs, o.BindPods, o.NodeIPAMWorkers, o.Kubeconfig, o.MetricsBindAddress = false, true, 0, "/nonexistent", "127.0.0.1:0"
	if err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("--bind-pods --node-ipam-workers=0 --allocate-node-cidrs=false: %v, want a connection error", err)
	}
	// The defaults connect.
	o = DefaultOptions()
	o.Kubeconfig, o.MetricsBindAddress = "/nonexistent", "127.0.0.1:0"
	if err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("defaults: %v, want a connection error", err)
	}
}
