package backend

import (
	"errors"
	"fmt"

	"github.com/flatnet/flatnet/internal/agent/routes"
	"github.com/flatnet/flatnet/internal/agent/vxlan"
)

// Kernel is what Apply programs: the routing table and the VXLAN device
// (&routes.Netlink{} and vxlan.Netlink{} for real; the Fakes in tests).
type Kernel struct {
	Routes routes.Kernel
	VXLAN  vxlan.Kernel
}

// Result says what Apply changed.
type Result struct {
	// VXLAN is what the device sync did (nil: the State had no device).
	VXLAN *vxlan.Result
	// RemovedDevice is set when a VXLAN device was deleted (the State has
	// none: another backend now).
	RemovedDevice bool
	Routes        routes.Plan
}

// Apply makes the kernel match st, in the order that keeps traffic
// flowing: the VXLAN device and its entries first (routes through it need
// it), then the routes (a route moving between host-gw and the overlay is
// one replace), and last the removal of a device st no longer has (its
// routes are replaced by then). It returns every failure, joined.
func Apply(k Kernel, st State) (Result, error) {
	var (
		res  Result
		errs []error
	)
	if st.VXLAN != nil {
		r, err := vxlan.Sync(k.VXLAN, *st.VXLAN)
		res.VXLAN = &r
		if err != nil {
			errs = append(errs, fmt.Errorf("vxlan: %w", err))
		}
	}
	plan, err := routes.Sync(k.Routes, st.Routes)
	res.Routes = plan
	if err != nil {
		errs = append(errs, fmt.Errorf("routes: %w", err))
	}
	if st.VXLAN == nil {
		removed, err := vxlan.Remove(k.VXLAN, vxlan.DeviceName)
		res.RemovedDevice = removed
		if err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}
