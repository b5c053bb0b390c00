package controller

import (
	"context"
	"strings"
	"testing"
)

func TestEndpointSlicesFlag(t *testing.T) {
	cmd := NewCommand()
	f := cmd.Flags().Lookup("endpointslices")
	if f == nil || f.DefValue != "false" {
		t.Fatalf("--endpointslices: %+v, want a flag defaulting to false", f)
	}
	if m := cmd.Flags().Lookup("max-endpoints-per-slice"); m == nil || m.DefValue != "100" {
		t.Fatalf("--max-endpoints-per-slice: %+v, want default 100", m)
	}
	// Bad values fail before connecting to anything.
	for _, max := range []int{0, 1001} {
		o := DefaultOptions()
		o.AllocateNodeCIDRs, o.EndpointSlices, o.MaxEndpointsPerSlice, o.Kubeconfig = false, true, max, "/nonexistent"
		err := Run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "--max-endpoints-per-slice") {
			t.Errorf("max %d: %v, want an error naming --max-endpoints-per-slice", max, err)
		}
	}
	// --endpointslices alone is something to do.
	o := DefaultOptions()
	o.AllocateNodeCIDRs, o.EndpointSlices, o.Kubeconfig, o.MetricsBindAddress = false, true, "/nonexistent", "127.0.0.1:0"
	err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("--endpointslices only: %v, want a connection error, not 'nothing to do'", err)
	}
}
