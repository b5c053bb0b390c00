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
		err := Run(context.Background(), Options{EndpointSlices: true, MaxEndpointsPerSlice: max, Workers: 1, Kubeconfig: "/nonexistent"})
		if err == nil || !strings.Contains(err.Error(), "--max-endpoints-per-slice") {
			t.Errorf("max %d: %v, want an error naming --max-endpoints-per-slice", max, err)
		}
	}
	// --endpointslices alone is something to do.
	err := Run(context.Background(), Options{EndpointSlices: true, MaxEndpointsPerSlice: 100, Workers: 1, Kubeconfig: "/nonexistent"})
	if err == nil || strings.Contains(err.Error(), "nothing to do") {
		t.Errorf("--endpointslices only: %v, want a connection error, not 'nothing to do'", err)
	}
}
